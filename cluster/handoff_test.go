package cluster_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var ls []net.Listener
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

// TestSkewMovesAShardLive: three nodes, one app with ten times the others' load on
// a server that also holds another app's shard; the NameServer moves a shard away by
// a live handoff (epoch 2 on its new owner) while jobs keep being created, and every
// acknowledged job fires exactly once, none early.
func TestSkewMovesAShardLive(t *testing.T) {
	addrs := freeAddrs(t, 3)
	for _, a := range addrs {
		n, err := cluster.StartNode(cluster.NodeConfig{Listen: a, Peers: addrs, DataDir: t.TempDir(), Log: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
	}
	apps := []string{"a1", "a2", "a3", "a4"}
	rec := newRecorder()
	for _, app := range apps {
		w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: addrs, App: app, Log: quietLog(), OnRun: rec.onRun})
		if err != nil {
			t.Fatal(err)
		}
		w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { return nil })
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: addrs, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	var acked []int64
	create := func(app string, delayMs int64) {
		j, err := c.Create(ctx, &messages.Job{App: app, Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: delayMs}})
		if err != nil {
			t.Errorf("create in %s: %v", app, err)
			return
		}
		mu.Lock()
		acked = append(acked, j.Id)
		mu.Unlock()
	}
	for _, app := range apps {
		create(app, 10)
	}
	// The server holding two shards gets the skew.
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var hot, light string
	for _, s := range st.Servers {
		if len(s.Shards) == 2 {
			hot, light = strings.Split(s.Shards[0].Shard, "/")[0], strings.Split(s.Shards[1].Shard, "/")[0]
		}
	}
	if hot == "" {
		t.Fatalf("no server with two shards: %v", st)
	}
	for i := 0; i < 400; i++ {
		create(hot, int64(i*10))
	}
	for _, app := range apps {
		if app != hot {
			for i := 0; i < 15; i++ {
				create(app, int64(i*100))
			}
		}
	}
	// Keep a steady stream going while the NameServer decides and the shard moves.
	moved := ""
	deadline := time.Now().Add(60 * time.Second)
	for moved == "" && time.Now().Before(deadline) {
		for _, app := range apps {
			create(app, 50)
		}
		if s, err := c.Status(ctx); err == nil {
			for _, sv := range s.Servers {
				for _, sh := range sv.Shards {
					if sh.Epoch >= 2 {
						moved = fmt.Sprintf("%s to %s at epoch %d", sh.Shard, sv.Address, sh.Epoch)
					}
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if moved == "" {
		t.Fatalf("no shard moved in 60 s (hot app %s, light %s)", hot, light)
	}
	t.Logf("moved %s", moved)
	for i := 0; i < 20; i++ { // and after it
		for _, app := range apps {
			create(app, 20)
		}
	}
	mu.Lock()
	ids := append([]int64(nil), acked...)
	mu.Unlock()
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
}
