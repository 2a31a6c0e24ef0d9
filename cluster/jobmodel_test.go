package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

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
	upMs   int64 // when StartNode returned: the node serves
}

func startModel(t *testing.T, dir string, hooks []shard.AlertHook, failing bool) *model {
	t.Helper()
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: dir, Log: quietLog(), AlertHooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{node: n, ends: map[string]int64{}, upMs: time.Now().UnixMilli()}
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
	w.HandleFunc("fail", func(ctx context.Context, r *cluster.Run) error { record(r); return errors.New("always fails") })
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

// hookSink is an alert webhook endpoint that keeps every request it receives.
type hookSink struct {
	srv   *httptest.Server
	mu    sync.Mutex
	posts []hookPost
}

type hookPost struct {
	method, contentType string
	body                []byte
}

func newHookSink(t *testing.T) *hookSink {
	t.Helper()
	h := &hookSink{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.posts = append(h.posts, hookPost{method: r.Method, contentType: r.Header.Get("Content-Type"), body: b})
		h.mu.Unlock()
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookSink) hooks() []shard.AlertHook { return []shard.AlertHook{shard.Webhook{URL: h.srv.URL}} }

func (h *hookSink) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.posts)
}

// letters checks that every request was a JSON POST and returns the decoded bodies
// as generic JSON, so the wire names (proto names, int64 as a string) are what is checked.
func (h *hookSink) letters(t *testing.T) []map[string]any {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]map[string]any, 0, len(h.posts))
	for _, p := range h.posts {
		var m map[string]any
		if p.method != http.MethodPost || p.contentType != "application/json" || json.Unmarshal(p.body, &m) != nil {
			t.Fatalf("webhook got %s %q with body %q; want a JSON POST", p.method, p.contentType, p.body)
		}
		out = append(out, m)
	}
	return out
}

// checkLetterBody checks a webhook body against the dead letter the client lists.
func checkLetterBody(t *testing.T, got map[string]any, d *messages.DeadLetter) {
	t.Helper()
	want := map[string]any{"run_id": d.RunId, "job_id": strconv.FormatInt(d.JobId, 10), "app": d.App,
		"handler": d.Handler, "attempts": float64(d.Attempts), "last_error": d.LastError}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("webhook body %s = %v (%T), want %v; body %v", k, got[k], got[k], v, got)
		}
	}
}

// TestRetryLadderToDeadLetterAcrossRestart: a failing handler climbs the ladder with
// the exact attempts and delays, the node restarts in between (and attempt 2 still
// keeps its delay from attempt 1's end), the run lands in the dead-letter queue
// exactly once, the alert hook hears of it exactly once, the dead letter survives
// another restart unchanged, and replay succeeds.
func TestRetryLadderToDeadLetterAcrossRestart(t *testing.T) {
	sink := newHookSink(t)
	dir := t.TempDir()
	m := startModel(t, dir, sink.hooks(), true)
	ctx := context.Background()
	ladder := []int64{2000, 600} // level 1 is long enough that attempt 2 waits out the restart
	j, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "flaky",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 100},
		Policy:   &messages.Policy{Attempts: 3, LadderMs: ladder}})
	if err != nil {
		t.Fatal(err)
	}
	// Attempt 1's failure is in the run history before the node stops, behind attempt
	// 2 waiting on level 0: attempt 1's end is where level 0's delay starts.
	var rec1 *messages.RunRecord
	waitFor(t, 10*time.Second, "attempt 1's failure in the run history", func() bool {
		rs, err := m.client.Runs(ctx, "model", j.Id, 10)
		if err != nil || len(rs) != 2 || rs[1].Outcome != messages.Outcome_FAILED {
			return false
		}
		if w := rs[0]; w.Attempt != 2 || w.Outcome != messages.Outcome_OUTCOME_UNSPECIFIED || w.Error != "flaky failed" {
			t.Fatalf("history %v: want attempt 2 waiting with attempt 1's error first", rs)
		}
		rec1 = rs[1]
		return true
	})
	time.Sleep(100 * time.Millisecond) // its failure is journaled; attempt 2 waits on level 0
	first := m.runsOf(j.Id)
	if len(first) != 1 || rec1.Attempt != 1 || rec1.RunId != first[0].ID || rec1.EndMs == 0 {
		t.Fatalf("before the restart: runs %v, history %v; want attempt 1 failed", first, rec1)
	}
	m.mu.Lock()
	workerEnd1 := m.ends[first[0].ID+"#1"]
	m.mu.Unlock()
	if workerEnd1 != rec1.EndMs {
		t.Fatalf("attempt 1 ended at %d by the worker, %d by the history", workerEnd1, rec1.EndMs)
	}
	m.stop()
	m = startModel(t, dir, sink.hooks(), true)
	waitFor(t, 20*time.Second, "the dead letter", func() bool {
		ds, _, err := m.client.DeadLetters(ctx, "model", "", 10)
		return err == nil && len(ds) == 1
	})
	runs := m.runsOf(j.Id)
	if len(runs) != 2 {
		t.Fatalf("after the restart %d attempts ran, want 2 (attempts 2 and 3)", len(runs))
	}
	if runs[0].Attempt != 2 || runs[1].Attempt != 3 {
		t.Fatalf("attempts 1, %d, %d; want 1, 2, 3", runs[0].Attempt, runs[1].Attempt)
	}
	for _, r := range runs {
		if r.ID != first[0].ID {
			t.Fatalf("run id changed across attempts: %s vs %s", r.ID, first[0].ID)
		}
	}
	// attempt 2 starts no earlier than ladder[0] after attempt 1 ended (a restart
	// neither drops nor shortens the wait: the level is rebuilt from the journal),
	// and not much later than that or than the node serving again, whichever is
	// later (a retry lost by the restart, or left to some slow sweep, would miss it).
	const lateSlackMs = 3000
	startedAfter, upAfter := runs[0].StartMs-rec1.EndMs, m.upMs-rec1.EndMs
	t.Logf("attempt 2 started %d ms after attempt 1 ended; the node served again after %d ms", startedAfter, upAfter)
	if startedAfter < ladder[0] || startedAfter > max(ladder[0], upAfter)+lateSlackMs {
		t.Fatalf("attempt 2 started %d ms after attempt 1 ended, the node served again after %d ms; want ladder level 1 (%d ms) and at most %d ms more",
			startedAfter, upAfter, ladder[0], lateSlackMs)
	}
	// attempt 3 starts no earlier than ladder[1] after attempt 2 ended.
	m.mu.Lock()
	end2 := m.ends[first[0].ID+"#2"]
	m.mu.Unlock()
	if gap := runs[1].StartMs - end2; gap < ladder[1] || gap > ladder[1]+1500 {
		t.Fatalf("attempt 3 started %d ms after attempt 2 ended; ladder level 2 is %d ms", gap, ladder[1])
	}
	ds, _, err := m.client.DeadLetters(ctx, "model", "", 10)
	if err != nil || len(ds) != 1 || ds[0].Attempts != 3 || ds[0].JobId != j.Id || ds[0].RunId != first[0].ID ||
		ds[0].App != "model" || ds[0].Handler != "flaky" || ds[0].LastError != "flaky failed" {
		t.Fatalf("dead letters %v %v", ds, err)
	}
	waitFor(t, 5*time.Second, "the webhook alert", func() bool { return sink.count() >= 1 })
	time.Sleep(1200 * time.Millisecond) // nothing more may arrive: no attempt, no second alert
	if n := len(m.runsOf(j.Id)); n != 2 {
		t.Fatalf("%d attempts after the dead letter, want none", n-2)
	}
	bodies := sink.letters(t)
	if len(bodies) != 1 {
		t.Fatalf("%d webhook POSTs for one dead letter, want exactly 1: %v", len(bodies), bodies)
	}
	checkLetterBody(t, bodies[0], ds[0])

	// The dead letter survives a restart unchanged, is not announced again, and the
	// restart runs nothing of the dead run.
	m.stop()
	m = startModel(t, dir, sink.hooks(), true)
	after, _, err := m.client.DeadLetters(ctx, "model", "", 10)
	if err != nil || len(after) != 1 || !proto.Equal(after[0], ds[0]) {
		t.Fatalf("after another restart the dead letters are %v (%v), want exactly %v", after, err, ds[0])
	}
	if got, err := m.client.DeadLetter(ctx, "model", ds[0].RunId); err != nil || got.Attempts != 3 {
		t.Fatalf("inspect after the restart: %v %v", got, err)
	}
	time.Sleep(500 * time.Millisecond) // the worker is connected: a re-dispatch would show
	if n := len(m.runsOf(j.Id)); n != 0 || sink.count() != 1 {
		t.Fatalf("the restart ran %d attempts of a dead run and sent %d webhook POSTs in all, want 0 and 1", n, sink.count())
	}

	// replay: a fresh attempt that succeeds now.
	m.fail.Store(false)
	if _, err := m.client.Replay(ctx, "model", ds[0].RunId); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replayed run", func() bool { return len(m.runsOf(j.Id)) >= 1 })
	if rs := m.runsOf(j.Id); len(rs) != 1 || rs[0].Attempt != 1 || rs[0].ID == ds[0].RunId {
		t.Fatalf("replayed runs %v, want one fresh attempt 1 with a new run id", rs)
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
	if n := sink.count(); n != 1 {
		t.Fatalf("%d webhook POSTs in all, want 1 (a successful replay is no new dead letter)", n)
	}
}

// TestDeleteWhileOnTheLadder: a job deleted while its failed run waits on a retry
// ladder level is gone for good: the level lets the run go (Ladder.Release), and no
// later attempt, dead letter or alert comes of it, before or after a restart.
func TestDeleteWhileOnTheLadder(t *testing.T) {
	sink := newHookSink(t)
	dir := t.TempDir()
	m := startModel(t, dir, sink.hooks(), true)
	ctx := context.Background()
	const levelMs = 1500
	j, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "fail",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 50},
		Policy:   &messages.Policy{Attempts: 2, LadderMs: []int64{levelMs}}})
	if err != nil {
		t.Fatal(err)
	}
	var end1 int64
	waitFor(t, 10*time.Second, "attempt 2 waiting on the ladder", func() bool {
		rs, err := m.client.Runs(ctx, "model", j.Id, 10)
		if err != nil || len(rs) != 2 || rs[0].Attempt != 2 || rs[1].Outcome != messages.Outcome_FAILED {
			return false
		}
		end1 = rs[1].EndMs
		return true
	})
	if err := m.client.Delete(ctx, "model", j.Id); err != nil {
		t.Fatal(err)
	}
	if left := time.Until(time.UnixMilli(end1 + levelMs)); left < 300*time.Millisecond {
		t.Fatalf("the delete came %v before attempt 2 was due: the machine is too slow for this test's ladder", left)
	}
	// Past attempt 2's due, with room for a late one.
	time.Sleep(time.Until(time.UnixMilli(end1 + levelMs + 1000)))
	if rs := m.runsOf(j.Id); len(rs) != 1 {
		t.Fatalf("%d attempts ran, want only attempt 1 (attempt 2 was deleted with its job)", len(rs))
	}
	if _, err := m.client.Get(ctx, "model", j.Id); !errors.Is(err, kerr.ErrNotFound) {
		t.Fatalf("get of the deleted job: %v, want not found", err)
	}
	if ds, _, err := m.client.DeadLetters(ctx, "model", "", 10); err != nil || len(ds) != 0 {
		t.Fatalf("dead letters %v (%v), want none", ds, err)
	}
	// A restart rebuilds the ladder from the journal: the deleted run is not in it.
	m.stop()
	m = startModel(t, dir, sink.hooks(), true)
	time.Sleep(time.Second)
	if rs := m.runsOf(j.Id); len(rs) != 0 || sink.count() != 0 {
		t.Fatalf("after a restart %d attempts ran and %d alerts were sent, want none", len(rs), sink.count())
	}
}

// TestOperations: pause/resume, trigger with params, update, list filters and
// pagination, run history, dead-letter pagination and alerts, and an update of a
// deleted job.
func TestOperations(t *testing.T) {
	sink := newHookSink(t)
	m := startModel(t, t.TempDir(), sink.hooks(), false)
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

	// Dead letters, listed a page at a time: three jobs that fail their only attempt.
	dead := map[int64]bool{}
	for i := 0; i < 3; i++ {
		d, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "fail",
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE}, Policy: &messages.Policy{Attempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		dead[d.Id] = true
	}
	var letters []*messages.DeadLetter
	waitFor(t, 10*time.Second, "three dead letters", func() bool {
		ds, _, err := m.client.DeadLetters(ctx, "model", "", 10)
		letters = ds
		return err == nil && len(ds) == 3
	})
	page1, next, err := m.client.DeadLetters(ctx, "model", "", 2)
	if err != nil || len(page1) != 2 || next != page1[1].RunId {
		t.Fatalf("dead letters page 1: %v next %q %v; want 2 and a cursor at the second", page1, next, err)
	}
	page2, next2, err := m.client.DeadLetters(ctx, "model", next, 2)
	if err != nil || len(page2) != 1 || next2 != "" {
		t.Fatalf("dead letters page 2: %v next %q %v; want the last one and no cursor", page2, next2, err)
	}
	for i, d := range append(page1, page2...) {
		if d.RunId != letters[i].RunId || !dead[d.JobId] || d.Attempts != 1 || d.LastError != "always fails" {
			t.Fatalf("paged dead letter %d is %v; the full listing is %v", i, d, letters)
		}
		if i > 0 && d.RunId <= letters[i-1].RunId {
			t.Fatalf("dead letters not in run id order: %v", letters)
		}
	}
	// One alert per new dead letter, each naming its own run.
	waitFor(t, 5*time.Second, "three webhook alerts", func() bool { return sink.count() >= 3 })
	time.Sleep(300 * time.Millisecond) // a duplicate would arrive by now
	alerted := map[string]int{}
	for _, b := range sink.letters(t) {
		rid, _ := b["run_id"].(string)
		alerted[rid]++
	}
	for _, d := range letters {
		if alerted[d.RunId] != 1 {
			t.Fatalf("webhook POSTs by run %v; want exactly one for each of %v", alerted, letters)
		}
	}
	if len(alerted) != 3 || sink.count() != 3 {
		t.Fatalf("%d webhook POSTs (%v) for 3 dead letters", sink.count(), alerted)
	}

	// State filters: exactly the active jobs (the dead-lettered one-shots are done),
	// then exactly the paused one.
	ids := func(js []*messages.Job) map[int64]bool {
		out := map[int64]bool{}
		for _, j := range js {
			out[j.Id] = true
		}
		return out
	}
	paged, _, err := m.client.List(ctx, "model", cluster.ListOptions{Handler: "paged"})
	if err != nil || len(paged) != 5 {
		t.Fatalf("paged jobs: %v %v", paged, err)
	}
	wantActive := ids(paged)
	wantActive[rate.Id], wantActive[api.Id] = true, true
	active, _, err := m.client.List(ctx, "model", cluster.ListOptions{State: messages.JobState_ACTIVE})
	if err != nil || len(active) != len(wantActive) || !maps.Equal(ids(active), wantActive) {
		t.Fatalf("active filter: %v %v; want ids %v", active, err, wantActive)
	}
	for _, j := range active {
		if j.State != messages.JobState_ACTIVE {
			t.Fatalf("active filter returned %v", j)
		}
	}
	paused, _, err := m.client.List(ctx, "model", cluster.ListOptions{State: messages.JobState_PAUSED})
	if err != nil || len(paused) != 0 {
		t.Fatalf("paused filter: %v %v", paused, err)
	}
	if _, err := m.client.Pause(ctx, "model", paged[2].Id); err != nil {
		t.Fatal(err)
	}
	paused, _, err = m.client.List(ctx, "model", cluster.ListOptions{State: messages.JobState_PAUSED})
	if err != nil || len(paused) != 1 || paused[0].Id != paged[2].Id || paused[0].State != messages.JobState_PAUSED {
		t.Fatalf("paused filter after a pause: %v %v; want only job %d", paused, err, paged[2].Id)
	}
	if js, _, err := m.client.List(ctx, "model", cluster.ListOptions{State: messages.JobState_PAUSED, Handler: "echo"}); err != nil || len(js) != 0 {
		t.Fatalf("paused echo jobs: %v %v; want none (the paused job is a paged one)", js, err)
	}
	active, _, err = m.client.List(ctx, "model", cluster.ListOptions{State: messages.JobState_ACTIVE})
	delete(wantActive, paged[2].Id)
	if err != nil || !maps.Equal(ids(active), wantActive) {
		t.Fatalf("active filter after a pause: %v %v; want ids %v", active, err, wantActive)
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

// TestBadPolicyAndWindow: a malformed routing policy, window or fixed-delay interval
// is refused on create and on update with a typed error naming the field, and
// nothing of it is stored.
func TestBadPolicyAndWindow(t *testing.T) {
	m := startModel(t, t.TempDir(), nil, false)
	ctx := context.Background()
	hourMs := time.Hour.Milliseconds()
	nowMs := time.Now().UnixMilli()
	every := &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 1000}
	cases := []struct {
		name     string
		schedule *messages.Schedule
		policy   *messages.Policy
		field    string
		says     string // in the message: the limit or the reason
	}{
		{"consistent hash without a key", every, &messages.Policy{Route: messages.Route_CONSISTENT_HASH}, "policy.route_key", "route key"},
		{"unknown route", every, &messages.Policy{Route: messages.Route(99)}, "policy.route", "99"},
		{"window ends before it starts", &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 1000,
			NotBeforeMs: nowMs + 2*hourMs, NotAfterMs: nowMs + hourMs}, nil, "schedule.not_after", "before it starts"},
		{"cron window ends before it starts", &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "@hourly",
			NotBeforeMs: nowMs + 2*hourMs, NotAfterMs: nowMs + hourMs}, nil, "schedule.not_after", "before it starts"},
		{"fixed delay of zero", &messages.Schedule{Kind: messages.ScheduleKind_FIXED_DELAY}, nil, "schedule.every", "0 ms is outside"},
		{"negative fixed delay", &messages.Schedule{Kind: messages.ScheduleKind_FIXED_DELAY, EveryMs: -1000}, nil, "schedule.every", "-1000 ms is outside"},
	}
	check := func(t *testing.T, op string, err error, field, says string) {
		t.Helper()
		var ke *kerr.Error
		if !errors.Is(err, kerr.ErrInvalidArgument) || !errors.As(err, &ke) || ke.Field != field || !strings.Contains(ke.Message, says) {
			t.Fatalf("%s: got %v, want %v naming field %q and saying %q", op, err, kerr.ErrInvalidArgument, field, says)
		}
	}
	good, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "echo",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_API_ONLY}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.client.Create(ctx, &messages.Job{App: "model", Handler: "echo", Schedule: tc.schedule, Policy: tc.policy})
			check(t, "create", err, tc.field, tc.says)
			_, err = m.client.Update(ctx, &messages.Job{Id: good.Id, App: "model", Handler: "echo", Schedule: tc.schedule, Policy: tc.policy})
			check(t, "update", err, tc.field, tc.says)
		})
	}
	js, _, err := m.client.List(ctx, "model", cluster.ListOptions{})
	if err != nil || len(js) != 1 || js[0].Id != good.Id || js[0].Version != 1 || !proto.Equal(js[0].Schedule, good.Schedule) {
		t.Fatalf("after the refused requests the jobs are %v (%v); want only job %d unchanged at version 1", js, err, good.Id)
	}
}
