package cluster_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// Example_client shows the Go client: start (or connect to) a node, create a
// one-shot job durably, read it back, delete it.
func Example_client() {
	dir, _ := os.MkdirTemp("", "kjob-example-")
	defer os.RemoveAll(dir)
	node, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: dir, Log: quietLog()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{node.Address()}, Log: quietLog()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	job, err := c.Create(ctx, &messages.Job{
		App: "shop", Handler: "order.timeout", Params: []byte(`{"order":42}`),
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 15 * 60 * 1000},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	got, _ := c.Get(ctx, "shop", job.Id)
	fmt.Println(got.Handler, got.State, got.NextDueMs-got.CreatedMs)
	fmt.Println(c.Delete(ctx, "shop", job.Id))
	// Output:
	// order.timeout ACTIVE 900000
	// <nil>
}

// Example_worker shows a worker: handlers are registered by name, like
// http.HandleFunc; each gets the run and a context carrying the job's timeout.
func Example_worker() {
	dir, _ := os.MkdirTemp("", "kjob-example-")
	defer os.RemoveAll(dir)
	node, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: dir, Log: quietLog()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()

	done := make(chan string, 1)
	w, _ := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{node.Address()}, App: "shop", Log: quietLog()})
	w.HandleFunc("order.timeout", func(ctx context.Context, r *cluster.Run) error {
		done <- fmt.Sprintf("order.timeout ran with %s (attempt %d, on time: %v)", r.Params, r.Attempt, r.StartMs >= r.DueMs)
		return nil
	})
	if err := w.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer w.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{node.Address()}, Log: quietLog()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if _, err := c.Create(ctx, &messages.Job{App: "shop", Handler: "order.timeout", Params: []byte(`{"order":42}`),
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 200}}); err != nil {
		fmt.Println(err)
		return
	}
	select {
	case s := <-done:
		fmt.Println(s)
	case <-ctx.Done():
		fmt.Println("no run")
	}
	// Output:
	// order.timeout ran with {"order":42} (attempt 1, on time: true)
}
