package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

func printLetter(d *messages.DeadLetter, asJSON bool) {
	if asJSON {
		printJSON(d)
		return
	}
	fmt.Printf("%s\tjob=%d\thandler=%s\tattempts=%d\tdead=%s\terror=%s\n", d.RunId, d.JobId, d.Handler, d.Attempts, ms(d.DeadMs), d.LastError)
}

func dlqCmd() *cobra.Command {
	c := &cobra.Command{Use: "dlq", Short: "inspect, replay and purge the dead-letter queue"}
	var asJSON bool
	var app string
	c.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	c.PersistentFlags().StringVar(&app, "app", "", "app (required)")
	need := func() error {
		if app == "" {
			return invalid("app", "is required")
		}
		return nil
	}
	var after string
	var limit int
	list := &cobra.Command{Use: "list", Short: "list dead letters", Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error {
		if err := need(); err != nil {
			return err
		}
		return withClient(func(ctx context.Context, cl *cluster.Client) error {
			ds, next, err := cl.DeadLetters(ctx, app, after, limit)
			if err != nil {
				return err
			}
			for _, d := range ds {
				printLetter(d, asJSON)
			}
			if next != "" {
				nextPage(asJSON, next)
			}
			return nil
		})
	}}
	list.Flags().StringVar(&after, "after", "", "page: run ids after this one")
	list.Flags().IntVar(&limit, "limit", 100, "page size")
	one := func(use, short string, fn func(ctx context.Context, cl *cluster.Client, runID string) error) *cobra.Command {
		return &cobra.Command{Use: use + " RUN_ID", Short: short, Args: cobra.ExactArgs(1), RunE: func(cmd *cobra.Command, args []string) error {
			if err := need(); err != nil {
				return err
			}
			return withClient(func(ctx context.Context, cl *cluster.Client) error { return fn(ctx, cl, args[0]) })
		}}
	}
	show := one("show", "show one dead letter", func(ctx context.Context, cl *cluster.Client, id string) error {
		d, err := cl.DeadLetter(ctx, app, id)
		if err == nil {
			printLetter(d, asJSON)
		}
		return err
	})
	replay := one("replay", "run a dead letter again (a fresh attempt through the ladder)", func(ctx context.Context, cl *cluster.Client, id string) error {
		d, err := cl.Replay(ctx, app, id)
		if err == nil {
			fmt.Printf("replayed %s\n", d.RunId)
		}
		return err
	})
	var all bool
	purge := &cobra.Command{Use: "purge [RUN_ID]", Short: "delete one dead letter, or all of the app's with --all", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := need(); err != nil {
				return err
			}
			id := ""
			if len(args) == 1 {
				id = args[0]
			} else if !all {
				return invalid("run_id", "give a run id, or --all to purge every dead letter of the app")
			}
			return withClient(func(ctx context.Context, cl *cluster.Client) error {
				n, err := cl.Purge(ctx, app, id)
				if err == nil {
					fmt.Printf("purged %d\n", n)
				}
				return err
			})
		}}
	purge.Flags().BoolVar(&all, "all", false, "purge all dead letters of the app")
	c.AddCommand(list, show, replay, purge)
	return c
}

func clusterCmd() *cobra.Command {
	c := &cobra.Command{Use: "cluster", Short: "cluster information"}
	var asJSON bool
	status := &cobra.Command{Use: "status", Short: "servers with their shards and load; apps with workers and shards", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withClient(func(ctx context.Context, cl *cluster.Client) error {
				s, err := cl.Status(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					printJSON(s)
					return nil
				}
				fmt.Printf("nameserver %s  route version %d  complete %v\n", s.Nameserver, s.RouteVersion, s.Complete)
				for _, sv := range s.Servers {
					var fires int64
					for _, sh := range sv.Shards {
						fires += sh.FiresWindow
					}
					fmt.Printf("server %s %s cpu=%.2f mem=%.2f fires_window=%d\n", sv.ServerId, sv.Address, sv.Cpu, sv.Mem, fires)
					if sv.JournalError != "" {
						fmt.Printf("  journal failed (restart the server; it takes no shard until then): %s\n", sv.JournalError)
					}
					if sv.JournalNoRoom {
						fmt.Println("  journal out of disk space: new work refused, no shard taken, until space is freed")
					}
					for _, sh := range sv.Opening {
						fmt.Printf("  shard %s opening (its record not known durable: the app waits for this server)\n", sh)
					}
					for _, sh := range sv.Shards {
						state := ""
						if sh.Frozen {
							state = " frozen"
						}
						fmt.Printf("  shard %s epoch=%d pending=%d fires_window=%d fires_total=%d%s\n", sh.Shard, sh.Epoch, sh.Pending, sh.FiresWindow, sh.FiresTotal, state)
					}
				}
				for _, a := range s.Apps {
					fmt.Printf("app %s workers=%d shards=%v\n", a.App, a.Workers, a.Shards)
				}
				for _, m := range s.Moves {
					if m.Split {
						fmt.Printf("split %s on %s (since %s)\n", m.Shard, m.From, time.UnixMilli(m.StartedMs).UTC().Format(time.RFC3339))
					} else {
						fmt.Printf("move %s %s -> %s (since %s)\n", m.Shard, m.From, m.To, time.UnixMilli(m.StartedMs).UTC().Format(time.RFC3339))
					}
				}
				return nil
			})
		}}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(status)
	return c
}
