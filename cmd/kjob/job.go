package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/schedule"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

func invalid(field, format string, args ...any) error {
	return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: field, Message: fmt.Sprintf(format, args...)}
}

type jobFlags struct {
	app, handler, params, in, at, cron, tz, every, everyAfter string
	apiOnly                                                   bool
	notBefore, notAfter                                       string
	maxRuns                                                   int64
	attempts                                                  int
	ladder, timeout, misfire, concurrency, routing, routeKey  string
	paused                                                    bool
}

func (f *jobFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.app, "app", "", "app (namespace) of the job (required)")
	fl.StringVar(&f.handler, "handler", "", "handler name registered on the app's workers (required)")
	fl.StringVar(&f.params, "params", "", "params passed to the handler (at most 64 KiB)")
	fl.StringVar(&f.in, "in", "", "one-shot after a delay, e.g. 15m")
	fl.StringVar(&f.at, "at", "", "one-shot at a time: RFC 3339 or unix milliseconds")
	fl.StringVar(&f.cron, "cron", "", "cron: 5 fields, 6 with seconds, or @hourly etc.")
	fl.StringVar(&f.tz, "tz", "", "IANA time zone of --cron (default UTC)")
	fl.StringVar(&f.every, "every", "", "fixed rate, e.g. 30s")
	fl.StringVar(&f.everyAfter, "every-after", "", "fixed delay: the next run this long after the previous one finished")
	fl.BoolVar(&f.apiOnly, "api-only", false, "fires only when triggered")
	fl.StringVar(&f.notBefore, "not-before", "", "lifecycle window start (RFC 3339 or unix ms)")
	fl.StringVar(&f.notAfter, "not-after", "", "lifecycle window end (RFC 3339 or unix ms)")
	fl.Int64Var(&f.maxRuns, "max-runs", 0, "maximum number of runs (0 = unlimited)")
	fl.IntVar(&f.attempts, "attempts", 0, "attempts including the first (0 = default 5)")
	fl.StringVar(&f.ladder, "ladder", "", "retry delays, e.g. 1s,5s,30s,2m (default)")
	fl.StringVar(&f.timeout, "timeout", "", "execution timeout, e.g. 30s (default 60s)")
	fl.StringVar(&f.misfire, "misfire", "", "fire_once (default), skip or fire_all")
	fl.StringVar(&f.concurrency, "concurrency", "", "allow (default) or forbid")
	fl.StringVar(&f.routing, "route", "", "round_robin (default), random, least_busy, consistent_hash, broadcast")
	fl.StringVar(&f.routeKey, "route-key", "", "params JSON field hashed by consistent_hash")
	fl.BoolVar(&f.paused, "paused", false, "create the job paused")
}

func parseTime(field, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return 0, invalid(field, "%q is neither RFC 3339 nor unix milliseconds", s)
	}
	return t.UnixMilli(), nil
}

func parseDur(field, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid(field, "%q is not a duration (e.g. 500ms, 30s, 15m)", s)
	}
	return d.Milliseconds(), nil
}

// build turns the flags into a job definition, refusing bad input with the flag name.
func (f *jobFlags) build() (*messages.Job, error) {
	if f.app == "" {
		return nil, invalid("app", "is required")
	}
	if f.handler == "" {
		return nil, invalid("handler", "is required")
	}
	s := &messages.Schedule{Tz: f.tz}
	kinds := 0
	var err error
	if f.in != "" {
		kinds++
		s.Kind = messages.ScheduleKind_ONCE
		if s.DelayMs, err = parseDur("in", f.in); err != nil {
			return nil, err
		}
		if s.DelayMs < 0 {
			return nil, invalid("in", "must not be negative, got %s", f.in)
		}
	}
	if f.at != "" {
		kinds++
		s.Kind = messages.ScheduleKind_ONCE
		if s.AtMs, err = parseTime("at", f.at); err != nil {
			return nil, err
		}
	}
	if f.cron != "" {
		kinds++
		s.Kind, s.Cron = messages.ScheduleKind_CRON, f.cron
	}
	if f.every != "" {
		kinds++
		s.Kind = messages.ScheduleKind_FIXED_RATE
		if s.EveryMs, err = parseDur("every", f.every); err != nil {
			return nil, err
		}
		if s.EveryMs <= 0 {
			return nil, invalid("every", "must be positive, got %s", f.every)
		}
	}
	if f.everyAfter != "" {
		kinds++
		s.Kind = messages.ScheduleKind_FIXED_DELAY
		if s.EveryMs, err = parseDur("every-after", f.everyAfter); err != nil {
			return nil, err
		}
		if s.EveryMs <= 0 {
			return nil, invalid("every-after", "must be positive, got %s", f.everyAfter)
		}
	}
	if f.apiOnly {
		kinds++
		s.Kind = messages.ScheduleKind_API_ONLY
	}
	if kinds != 1 {
		return nil, invalid("schedule", "give exactly one of --in, --at, --cron, --every, --every-after, --api-only (got %d)", kinds)
	}
	if f.tz != "" && f.cron == "" {
		return nil, invalid("tz", "applies to --cron only")
	}
	if s.NotBeforeMs, err = parseTime("not-before", f.notBefore); err != nil {
		return nil, err
	}
	if s.NotAfterMs, err = parseTime("not-after", f.notAfter); err != nil {
		return nil, err
	}
	if f.maxRuns < 0 {
		return nil, invalid("max-runs", "must not be negative, got %d", f.maxRuns)
	}
	s.MaxRuns = f.maxRuns
	p := &messages.Policy{Attempts: int32(f.attempts)}
	if f.attempts < 0 {
		return nil, invalid("attempts", "must not be negative, got %d", f.attempts)
	}
	if f.ladder != "" {
		if p.LadderMs, err = schedule.ParseLadder(f.ladder); err != nil {
			return nil, invalid("ladder", "%v", err)
		}
	}
	if p.TimeoutMs, err = parseDur("timeout", f.timeout); err != nil {
		return nil, err
	}
	switch f.misfire {
	case "", "fire_once":
	case "skip":
		p.Misfire = messages.Misfire_SKIP
	case "fire_all":
		p.Misfire = messages.Misfire_FIRE_ALL
	default:
		return nil, invalid("misfire", "%q: use fire_once, skip or fire_all", f.misfire)
	}
	switch f.concurrency {
	case "", "allow":
	case "forbid":
		p.Concurrency = messages.Concurrency_FORBID
	default:
		return nil, invalid("concurrency", "%q: use allow or forbid", f.concurrency)
	}
	switch f.routing {
	case "", "round_robin":
	case "random":
		p.Route = messages.Route_RANDOM
	case "least_busy":
		p.Route = messages.Route_LEAST_BUSY
	case "consistent_hash":
		p.Route = messages.Route_CONSISTENT_HASH
	case "broadcast":
		p.Route = messages.Route_BROADCAST
	default:
		return nil, invalid("route", "%q: use round_robin, random, least_busy, consistent_hash or broadcast", f.routing)
	}
	p.RouteKey = f.routeKey
	j := &messages.Job{App: f.app, Handler: f.handler, Params: []byte(f.params), Schedule: s, Policy: p}
	if f.paused {
		j.State = messages.JobState_PAUSED
	}
	return j, nil
}

func withClient(fn func(ctx context.Context, c *cluster.Client) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := newClient(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

func printJob(j *messages.Job, asJSON bool) {
	if asJSON {
		printJSON(j)
		return
	}
	fmt.Printf("%d\tapp=%s\thandler=%s\tstate=%s\tversion=%d\tnext=%s\truns=%d\n", j.Id, j.App, j.Handler,
		strings.ToLower(j.State.String()), j.Version, ms(j.NextDueMs), j.Runs)
}

func jobCmd() *cobra.Command {
	c := &cobra.Command{Use: "job", Short: "create, change, inspect and delete jobs"}
	var asJSON bool
	c.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")

	var cf jobFlags
	create := &cobra.Command{Use: "create", Short: "create a job (durable before it returns)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			j, err := cf.build()
			if err != nil {
				return err
			}
			return withClient(func(ctx context.Context, cl *cluster.Client) error {
				out, err := cl.Create(ctx, j)
				if err != nil {
					return err
				}
				printJob(out, asJSON)
				return nil
			})
		}}
	cf.register(create)

	var uf jobFlags
	var uid int64
	update := &cobra.Command{Use: "update", Short: "replace a job's definition (bumps its version)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			j, err := uf.build()
			if err != nil {
				return err
			}
			if uid <= 0 {
				return invalid("id", "is required")
			}
			if uf.paused {
				return invalid("paused", "an update keeps the job's state; use kjob job pause or resume")
			}
			j.Id = uid
			return withClient(func(ctx context.Context, cl *cluster.Client) error {
				out, err := cl.Update(ctx, j)
				if err != nil {
					return err
				}
				printJob(out, asJSON)
				return nil
			})
		}}
	uf.register(update)
	// An update replaces the definition, not the state: pause and resume do that.
	_ = update.Flags().MarkHidden("paused")
	update.Flags().Int64Var(&uid, "id", 0, "job id (required)")

	byID := func(use, short string, fn func(ctx context.Context, cl *cluster.Client, app string, id int64) error) *cobra.Command {
		var app string
		cmd := &cobra.Command{Use: use + " ID", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				id, err := strconv.ParseInt(args[0], 10, 64)
				if err != nil || id <= 0 {
					return invalid("id", "%q is not a job id", args[0])
				}
				if app == "" {
					return invalid("app", "is required")
				}
				return withClient(func(ctx context.Context, cl *cluster.Client) error { return fn(ctx, cl, app, id) })
			}}
		cmd.Flags().StringVar(&app, "app", "", "app of the job (required)")
		return cmd
	}
	get := byID("get", "show a job", func(ctx context.Context, cl *cluster.Client, app string, id int64) error {
		j, err := cl.Get(ctx, app, id)
		if err != nil {
			return err
		}
		printJob(j, asJSON)
		return nil
	})
	del := byID("delete", "delete a job (it never fires again once this returns)", func(ctx context.Context, cl *cluster.Client, app string, id int64) error {
		if err := cl.Delete(ctx, app, id); err != nil {
			return err
		}
		fmt.Printf("deleted %d\n", id)
		return nil
	})
	pause := byID("pause", "pause a job", func(ctx context.Context, cl *cluster.Client, app string, id int64) error {
		j, err := cl.Pause(ctx, app, id)
		if err == nil {
			printJob(j, asJSON)
		}
		return err
	})
	resume := byID("resume", "resume a paused job", func(ctx context.Context, cl *cluster.Client, app string, id int64) error {
		j, err := cl.Resume(ctx, app, id)
		if err == nil {
			printJob(j, asJSON)
		}
		return err
	})
	var tparams string
	var tset bool
	trigger := byID("trigger", "fire a job now", func(ctx context.Context, cl *cluster.Client, app string, id int64) error {
		var p []byte
		if tset {
			p = []byte(tparams)
		}
		j, err := cl.Trigger(ctx, app, id, p)
		if err == nil {
			printJob(j, asJSON)
		}
		return err
	})
	trigger.Flags().StringVar(&tparams, "params", "", "params for this run only")
	trigger.PreRun = func(cmd *cobra.Command, _ []string) { tset = cmd.Flags().Changed("params") }
	var rlimit int
	runs := byID("runs", "show a job's recent runs", func(ctx context.Context, cl *cluster.Client, app string, id int64) error {
		rs, err := cl.Runs(ctx, app, id, rlimit)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if asJSON {
				printJSON(r)
				continue
			}
			fmt.Printf("%s\tattempt=%d\tdue=%s\tstart=%s\tend=%s\tworker=%s\toutcome=%s\t%s\n", r.RunId, r.Attempt, ms(r.DueMs),
				ms(r.StartMs), ms(r.EndMs), r.WorkerId, strings.ToLower(r.Outcome.String()), r.Error)
		}
		return nil
	})
	runs.Flags().IntVar(&rlimit, "limit", 20, "at most this many runs")

	var lapp, lstate, lhandler string
	var lafter int64
	var llimit int
	list := &cobra.Command{Use: "list", Short: "list an app's jobs", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lapp == "" {
				return invalid("app", "is required")
			}
			var st messages.JobState
			switch lstate {
			case "":
			case "active":
				st = messages.JobState_ACTIVE
			case "paused":
				st = messages.JobState_PAUSED
			case "done":
				st = messages.JobState_DONE
			default:
				return invalid("state", "%q: use active, paused or done", lstate)
			}
			return withClient(func(ctx context.Context, cl *cluster.Client) error {
				js, next, err := cl.List(ctx, lapp, cluster.ListOptions{State: st, Handler: lhandler, AfterID: lafter, Limit: llimit})
				if err != nil {
					return err
				}
				for _, j := range js {
					printJob(j, asJSON)
				}
				if next != 0 {
					nextPage(asJSON, strconv.FormatInt(next, 10))
				}
				return nil
			})
		}}
	list.Flags().StringVar(&lapp, "app", "", "app (required)")
	list.Flags().StringVar(&lstate, "state", "", "only jobs in this state: active, paused, done")
	list.Flags().StringVar(&lhandler, "handler", "", "only jobs with this handler")
	list.Flags().Int64Var(&lafter, "after", 0, "page: jobs with ids after this one")
	list.Flags().IntVar(&llimit, "limit", 100, "page size (at most 1000)")
	c.AddCommand(create, update, get, list, del, pause, resume, trigger, runs)
	return c
}
