package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// runLine is the JSON line the demo worker prints per executed run.
type runLine struct {
	RunID   string `json:"run_id"`
	JobID   int64  `json:"job_id"`
	Handler string `json:"handler"`
	DueMs   int64  `json:"due_ms"`
	StartMs int64  `json:"start_ms"`
	Attempt int    `json:"attempt"`
	Outcome string `json:"outcome"`
	LateMs  int64  `json:"late_ms"`
	Trace   string `json:"traceparent,omitempty"`
}

// demoHandlers are the built-in handlers: echo, sleep (params: a duration) and fail.
func demoHandlers(w *cluster.Worker) {
	w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { return nil })
	w.HandleFunc("sleep", func(ctx context.Context, r *cluster.Run) error {
		d, err := time.ParseDuration(string(r.Params))
		if err != nil {
			d = time.Second
		}
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	w.HandleFunc("fail", func(ctx context.Context, r *cluster.Run) error {
		return errors.New("fail handler always fails")
	})
}

func printer() func(r *cluster.Run, res *messages.RunResult) {
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	return func(r *cluster.Run, res *messages.RunResult) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(runLine{RunID: r.ID, JobID: r.JobID, Handler: r.Handler, DueMs: r.DueMs, StartMs: r.StartMs,
			Attempt: r.Attempt, Outcome: res.Outcome.String(), LateMs: r.StartMs - r.DueMs, Trace: r.Traceparent})
	}
}

func workerCmd() *cobra.Command {
	var app, id string
	var capacity int
	c := &cobra.Command{Use: "worker", Short: "run a demo worker (handlers echo, sleep, fail); prints one JSON line per run", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if app == "" {
				return invalid("app", "is required")
			}
			tl, err := clusterTLS()
			if err != nil {
				return err
			}
			w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: splitList(g.servers), App: app, ID: id, Capacity: capacity,
				Log: logger(), OnRun: printer(), TLS: tl})
			if err != nil {
				return err
			}
			demoHandlers(w)
			if err := w.Start(); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "kjob worker %s for app %s started\n", w.ID(), app)
			ctx, cancel := signalContext()
			defer cancel()
			<-ctx.Done()
			w.Stop()
			return nil
		}}
	c.Flags().StringVar(&app, "app", "", "app to work for (required)")
	c.Flags().StringVar(&id, "id", "", fmt.Sprintf("worker id, at most %d bytes (default: generated)", nscore.MaxWorkerIDLen))
	c.Flags().IntVar(&capacity, "capacity", 64, fmt.Sprintf("handler pool size, 1 to %d", nscore.MaxWorkerCapacity))
	return c
}
