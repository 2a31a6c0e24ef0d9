package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// TestAppSplitsByWorkers: an app whose live workers pass the threshold (here 2 per
// shard) is split by its owner, live, until no shard has more than the threshold;
// jobs acknowledged before and during the splits fire exactly once, none early, and
// after the splits every run goes to a worker of its own shard's group.
func TestAppSplitsByWorkers(t *testing.T) {
	addr := freeAddrs(t, 1)[0]
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: addr, DataDir: t.TempDir(), Log: quietLog(),
		Split: nscore.SplitPolicy{Workers: 2, Fires: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	const app = "wide"
	rec := newRecorder()
	var mu sync.Mutex
	ranOn := map[string]string{} // run id#attempt → worker id
	var infos []*messages.WorkerInfo
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("%s-w%d", app, i)
		infos = append(infos, &messages.WorkerInfo{WorkerId: id, App: app})
		w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{addr}, App: app, ID: id, Log: quietLog(),
			OnRun: func(r *cluster.Run, res *messages.RunResult) {
				mu.Lock()
				ranOn[fmt.Sprintf("%s#%d", r.ID, r.Attempt)] = id
				mu.Unlock()
				rec.onRun(r, res)
			}})
		if err != nil {
			t.Fatal(err)
		}
		w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { return nil })
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{addr}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var acked []int64
	create := func(delayMs int64) {
		j, err := c.Create(ctx, &messages.Job{App: app, Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: delayMs}})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		acked = append(acked, j.Id)
	}
	for i := 0; i < 40; i++ {
		create(int64(100 + i*200)) // firing across the splits
	}
	// 5 workers, 2 per shard: 1 shard → 2 → 3 (one half splits again), then stop.
	var shards []route.Shard
	deadline := time.Now().Add(60 * time.Second)
	for {
		create(50) // a steady stream while it splits
		st, err := c.Status(ctx)
		if err == nil && len(st.Moves) == 0 {
			shards = shards[:0]
			for _, a := range st.Apps {
				if a.App == app {
					for _, s := range a.Shards {
						sh, err := route.Parse(s)
						if err != nil {
							t.Fatal(err)
						}
						shards = append(shards, sh)
					}
				}
			}
			if len(shards) == 3 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("app did not split to 3 shards in 60 s: %v (status %v)", shards, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("shards after splitting: %v", shards)
	time.Sleep(2 * time.Second) // let every shard get its group's worker list
	afterFrom := len(acked)
	for i := 0; i < 60; i++ {
		create(int64(50 + i*10))
	}
	ids := append([]int64(nil), acked...)
	waitFor(t, 60*time.Second, fmt.Sprintf("all %d acknowledged jobs to fire", len(ids)), func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, id := range ids {
			if len(rec.byJob[id]) == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(500 * time.Millisecond)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.early) > 0 {
		t.Fatalf("%d runs early: %s", len(rec.early), rec.early[0])
	}
	for k, n := range rec.runs {
		if n != 1 {
			t.Fatalf("run %s executed %d times", k, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids[afterFrom:] {
		sh, ok := route.Lookup(shards, id)
		if !ok {
			t.Fatalf("job %d in no shard of %v", id, shards)
		}
		group := map[string]bool{}
		for _, w := range route.Group(sh, shards, infos) {
			group[w.WorkerId] = true
		}
		for _, r := range rec.byJob[id] {
			if w := ranOn[fmt.Sprintf("%s#%d", r.ID, r.Attempt)]; !group[w] {
				t.Fatalf("job %d of shard %s ran on %s, outside its group %v", id, sh, w, group)
			}
		}
	}
}
