package cluster_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/shard"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// model is a node + worker + client whose handlers the test controls.
type model struct {
	node   *cluster.Node
	worker *cluster.Worker
	client *cluster.Client
	mu     sync.Mutex
	runs   []*cluster.Run
	ends   map[string]int64 // run#attempt → end ms
	fail   atomic.Bool
}

func startModel(t *testing.T, dir string, hooks []shard.AlertHook, failing bool) *model {
	t.Helper()
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: dir, Log: quietLog(), AlertHooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{node: n, ends: map[string]int64{}}
	m.fail.Store(failing)
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "model", Log: quietLog(),
		OnRun: func(r *cluster.Run, res *messages.RunResult) {
			m.mu.Lock()
			m.ends[r.ID+"#"+string(rune('0'+r.Attempt))] = res.EndMs
			m.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	record := func(r *cluster.Run) {
		m.mu.Lock()
		m.runs = append(m.runs, r)
		m.mu.Unlock()
	}
	w.HandleFunc("flaky", func(ctx context.Context, r *cluster.Run) error {
		record(r)
		if m.fail.Load() {
			return errors.New("flaky failed")
		}
		return nil
	})
	w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { record(r); return nil })
	w.HandleFunc("slow", func(ctx context.Context, r *cluster.Run) error {
		record(r)
		select {
		case <-time.After(200 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	m.worker, m.client = w, c
	t.Cleanup(m.stop)
	return m
}

func (m *model) stop() {
	m.client.Close()
	m.worker.Stop()
	_ = m.node.Close()
}

func (m *model) runsOf(id int64) []*cluster.Run {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*cluster.Run
	for _, r := range m.runs {
		if r.JobID == id {
			out = append(out, r)
		}
	}
	return out
}

// TestRetryLadderToDeadLetterAcrossRestart: a failing handler climbs the ladder with
// the exact attempts and delays, the node restarts in between, the run lands in the
// dead-letter queue exactly once, the alert hook hears of it, and replay succeeds.
func TestRetryLadderToDeadLetterAcrossRestart(t *testing.T) {
	var hooked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hooked.Add(1)
	}))
	defer srv.Close()
	hooks := []shard.AlertHook{shard.Webhook{URL: srv.URL}}
	dir := t.TempDir()
	m := startModel(t, dir, hooks, true)
	ctx := context.Background()
	ladder := []int64{2000, 600} // level 1 is long enough that attempt 2 waits out the restart
	j, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "flaky",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 100},
		Policy:   &messages.Policy{Attempts: 3, LadderMs: ladder}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "attempt 1", func() bool { return len(m.runsOf(j.Id)) >= 1 })
	time.Sleep(100 * time.Millisecond) // its failure is journaled; attempt 2 waits on level 0
	first := m.runsOf(j.Id)[0]
	m.stop()
	m = startModel(t, dir, hooks, true)
	waitFor(t, 20*time.Second, "the dead letter", func() bool {
		ds, _, err := m.client.DeadLetters(ctx, "model", "", 10)
		return err == nil && len(ds) == 1
	})
	runs := m.runsOf(j.Id)
	if len(runs) != 2 {
		t.Fatalf("after the restart %d attempts ran, want 2 (attempts 2 and 3)", len(runs))
	}
	if runs[0].Attempt != 2 || runs[1].Attempt != 3 || first.Attempt != 1 {
		t.Fatalf("attempts %d, %d, %d; want 1, 2, 3", first.Attempt, runs[0].Attempt, runs[1].Attempt)
	}
	for _, r := range append([]*cluster.Run{first}, runs...) {
		if r.ID != first.ID {
			t.Fatalf("run id changed across attempts: %s vs %s", r.ID, first.ID)
		}
	}
	// attempt 3 starts no earlier than ladder[1] after attempt 2 ended.
	m.mu.Lock()
	end2 := m.ends[first.ID+"#2"]
	m.mu.Unlock()
	if gap := runs[1].StartMs - end2; gap < ladder[1] || gap > ladder[1]+1500 {
		t.Fatalf("attempt 3 started %d ms after attempt 2 ended; ladder level 2 is %d ms", gap, ladder[1])
	}
	ds, _, err := m.client.DeadLetters(ctx, "model", "", 10)
	if err != nil || len(ds) != 1 || ds[0].Attempts != 3 || ds[0].JobId != j.Id || ds[0].LastError != "flaky failed" {
		t.Fatalf("dead letters %v %v", ds, err)
	}
	waitFor(t, 5*time.Second, "the webhook alert", func() bool { return hooked.Load() >= 1 })
	time.Sleep(1200 * time.Millisecond) // nothing more may arrive
	if n := len(m.runsOf(j.Id)); n != 2 {
		t.Fatalf("%d attempts after the dead letter, want none", n-2)
	}
	// replay: a fresh attempt that succeeds now.
	m.fail.Store(false)
	if _, err := m.client.Replay(ctx, "model", ds[0].RunId); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replayed run", func() bool { return len(m.runsOf(j.Id)) == 3 })
	if r := m.runsOf(j.Id)[2]; r.Attempt != 1 {
		t.Fatalf("replayed run is attempt %d, want a fresh attempt 1", r.Attempt)
	}
	if ds, _, _ := m.client.DeadLetters(ctx, "model", "", 10); len(ds) != 0 {
		t.Fatalf("dead letter still listed after replay: %v", ds)
	}
	_, err = m.client.Replay(ctx, "model", ds[0].RunId)
	if !errors.Is(err, kerr.ErrNotFound) {
		t.Fatalf("second replay: %v, want not found", err)
	}
	if n, err := m.client.Purge(ctx, "model", ""); err != nil || n != 0 {
		t.Fatalf("purge: %d %v", n, err)
	}
}

// TestOperations: pause/resume, trigger with params, update, list filters and
// pagination, run history, and an update of a deleted job.
func TestOperations(t *testing.T) {
	m := startModel(t, t.TempDir(), nil, false)
	ctx := context.Background()
	rate, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "echo",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 200}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "two fixed-rate fires", func() bool { return len(m.runsOf(rate.Id)) >= 2 })
	p, err := m.client.Pause(ctx, "model", rate.Id)
	if err != nil || p.State != messages.JobState_PAUSED {
		t.Fatalf("pause: %v %v", p, err)
	}
	time.Sleep(100 * time.Millisecond)
	n := len(m.runsOf(rate.Id))
	time.Sleep(700 * time.Millisecond)
	if got := len(m.runsOf(rate.Id)); got != n {
		t.Fatalf("paused job fired %d times", got-n)
	}
	if _, err := m.client.Resume(ctx, "model", rate.Id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "fires after resume", func() bool { return len(m.runsOf(rate.Id)) >= n+2 })

	api, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "echo", Params: []byte("base"),
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_API_ONLY}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.Trigger(ctx, "model", api.Id, []byte("other")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.Trigger(ctx, "model", api.Id, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "two triggered runs", func() bool { return len(m.runsOf(api.Id)) == 2 })
	got := map[string]bool{}
	for _, r := range m.runsOf(api.Id) {
		got[string(r.Params)] = true
	}
	if !got["other"] || !got["base"] {
		t.Fatalf("triggered params %v, want other and base", got)
	}
	waitFor(t, 5*time.Second, "run history", func() bool {
		rs, err := m.client.Runs(ctx, "model", api.Id, 10)
		return err == nil && len(rs) == 2 && rs[0].Outcome == messages.Outcome_SUCCEEDED
	})

	up := &messages.Job{Id: api.Id, App: "model", Handler: "slow", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_API_ONLY}}
	u, err := m.client.Update(ctx, up)
	if err != nil || u.Version != 2 || u.Handler != "slow" {
		t.Fatalf("update: %v %v", u, err)
	}
	for i := 0; i < 5; i++ {
		if _, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "paged",
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 3_600_000}}); err != nil {
			t.Fatal(err)
		}
	}
	var all []*messages.Job
	after := int64(0)
	for page := 0; page < 10; page++ {
		js, next, err := m.client.List(ctx, "model", cluster.ListOptions{Handler: "paged", Limit: 2, AfterID: after})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, js...)
		if next == 0 {
			break
		}
		after = next
	}
	if len(all) != 5 {
		t.Fatalf("paged listing returned %d jobs, want 5", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i].Id <= all[i-1].Id {
			t.Fatal("listing not in id order")
		}
	}
	paused, _, err := m.client.List(ctx, "model", cluster.ListOptions{State: messages.JobState_PAUSED})
	if err != nil || len(paused) != 0 {
		t.Fatalf("paused filter: %v %v", paused, err)
	}
	if err := m.client.Delete(ctx, "model", api.Id); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.Update(ctx, up); !errors.Is(err, kerr.ErrNotFound) {
		t.Fatalf("update of a deleted job: %v, want not found", err)
	}
	if _, err := m.client.Replay(ctx, "model", "123:456"); !errors.Is(err, kerr.ErrNotFound) {
		t.Fatalf("replay of a missing dead letter: %v", err)
	}
}

// TestTimeoutAndFixedDelay: a handler past its timeout is cancelled and retried; a
// fixed-delay job's next run is scheduled after the previous one finished.
func TestTimeoutAndFixedDelay(t *testing.T) {
	m := startModel(t, t.TempDir(), nil, false)
	ctx := context.Background()
	to, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "slow",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE},
		Policy:   &messages.Policy{TimeoutMs: 50, Attempts: 2, LadderMs: []int64{100}}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a timed-out run in the dead-letter queue", func() bool {
		ds, _, err := m.client.DeadLetters(ctx, "model", "", 10)
		return err == nil && len(ds) == 1 && ds[0].JobId == to.Id
	})
	if rs := m.runsOf(to.Id); len(rs) != 2 {
		t.Fatalf("%d attempts of the timed-out job, want 2", len(rs))
	}
	fd, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "slow",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_DELAY, EveryMs: 300, MaxRuns: 3}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "three fixed-delay runs", func() bool { return len(m.runsOf(fd.Id)) >= 3 })
	rs := m.runsOf(fd.Id)
	for i := 1; i < len(rs); i++ {
		if gap := rs[i].DueMs - rs[i-1].StartMs; gap < 200+300 {
			t.Fatalf("fixed-delay run %d due %d ms after the previous started; want ≥ 200 ms run + 300 ms delay", i, gap)
		}
	}
	time.Sleep(1200 * time.Millisecond)
	if n := len(m.runsOf(fd.Id)); n != 3 {
		t.Fatalf("max_runs 3 but %d runs", n)
	}
}
