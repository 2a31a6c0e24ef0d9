package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

func demoCmd() *cobra.Command {
	var data, listen string
	c := &cobra.Command{Use: "demo", Short: "start an embedded node and worker, create a few jobs, show them firing, exit", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				d, err := os.MkdirTemp("", "kjob-demo-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(d)
				data = d
			}
			log := logger()
			// The demo tears everything down at the end; proto.actor's connection-lost
			// errors at that moment are noise, so only the demo's own lines show.
			quiet := slog.LevelError + 4
			n, err := cluster.StartNode(cluster.NodeConfig{Listen: listen, DataDir: data, Log: log, ActorLogLevel: quiet})
			if err != nil {
				return err
			}
			defer n.Close()
			servers := []string{n.Address()}
			var mu sync.Mutex
			var lines []string
			fired := make(chan struct{}, 64)
			w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: servers, App: "demo", Log: log, ActorLogLevel: quiet,
				OnRun: func(r *cluster.Run, res *messages.RunResult) {
					mu.Lock()
					lines = append(lines, fmt.Sprintf("fired %-6s job %d run %s attempt %d: due %s, started %s, late %d ms, %s",
						r.Handler, r.JobID, r.ID, r.Attempt, time.UnixMilli(r.DueMs).Format("15:04:05.000"),
						time.UnixMilli(r.StartMs).Format("15:04:05.000"), r.StartMs-r.DueMs, res.Outcome))
					fmt.Println(lines[len(lines)-1])
					mu.Unlock()
					fired <- struct{}{}
				}})
			if err != nil {
				return err
			}
			demoHandlers(w)
			if err := w.Start(); err != nil {
				return err
			}
			defer w.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cl, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: servers, Log: log, ActorLogLevel: quiet})
			if err != nil {
				return err
			}
			defer cl.Close()
			jobs := []*messages.Job{
				{App: "demo", Handler: "echo", Params: []byte(`{"order":42}`), Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 500}},
				{App: "demo", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 1500}},
				{App: "demo", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "* * * * * *", MaxRuns: 3}},
				{App: "demo", Handler: "sleep", Params: []byte("200ms"), Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 700, MaxRuns: 3}},
			}
			want := 1 + 1 + 3 + 3
			for _, j := range jobs {
				out, err := cl.Create(ctx, j)
				if err != nil {
					return err
				}
				fmt.Printf("created job %d (%s, %s), next fire %s\n", out.Id, out.Handler, scheduleText(out.Schedule), time.UnixMilli(out.NextDueMs).Format("15:04:05.000"))
			}
			for i := 0; i < want; i++ {
				select {
				case <-fired:
				case <-ctx.Done():
					return fmt.Errorf("demo: only %d of %d runs fired within the time limit", i, want)
				}
			}
			mu.Lock()
			sort.Strings(lines)
			mu.Unlock()
			fmt.Printf("all %d runs fired; demo done\n", want)
			return nil
		}}
	c.Flags().StringVar(&data, "data", "", "data directory (default: a temporary one)")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "remote address of the embedded node")
	return c
}

func scheduleText(s *messages.Schedule) string {
	switch s.GetKind() {
	case messages.ScheduleKind_ONCE:
		if s.DelayMs > 0 {
			return fmt.Sprintf("once in %s", time.Duration(s.DelayMs)*time.Millisecond)
		}
		return "once at " + ms(s.AtMs)
	case messages.ScheduleKind_CRON:
		return "cron " + s.Cron
	case messages.ScheduleKind_FIXED_RATE:
		return fmt.Sprintf("every %s", time.Duration(s.EveryMs)*time.Millisecond)
	}
	return s.GetKind().String()
}
