package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type recorder struct {
	mu    sync.Mutex
	runs  map[string]int // run id + attempt → executions
	early []string
	byJob map[int64][]*cluster.Run
	n     atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{runs: map[string]int{}, byJob: map[int64][]*cluster.Run{}}
}

func (r *recorder) onRun(run *cluster.Run, _ *messages.RunResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[fmt.Sprintf("%s#%d", run.ID, run.Attempt)]++
	if run.StartMs < run.DueMs {
		r.early = append(r.early, fmt.Sprintf("%s started %d ms early", run.ID, run.DueMs-run.StartMs))
	}
	r.byJob[run.JobID] = append(r.byJob[run.JobID], run)
	r.n.Add(1)
}

type env struct {
	node   *cluster.Node
	worker *cluster.Worker
	client *cluster.Client
	rec    *recorder
	dir    string
}

func start(t *testing.T, dir string) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: dir, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "orders", Capacity: 128,
		Log: quietLog(), OnRun: rec.onRun})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { return nil })
	w.HandleFunc("fail", func(ctx context.Context, r *cluster.Run) error { return errors.New("boom") })
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{node: n, worker: w, client: c, rec: rec, dir: dir}
	t.Cleanup(e.stop)
	return e
}

func (e *env) stop() {
	e.client.Close()
	e.worker.Stop()
	_ = e.node.Close()
}

func once(delayMs int64) *messages.Job {
	return &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: delayMs}}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTenThousandOneShots: every handler runs exactly once, none before its due time.
func TestTenThousandOneShots(t *testing.T) {
	e := start(t, "")
	const n = 10_000
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make(chan int64, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	next := atomic.Int64{}
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				in := once(i * 3000 / n)
				j, err := e.client.Create(ctx, in)
				if err != nil {
					failed.Add(1)
					t.Errorf("create %d: %v", i, err)
					return
				}
				// The job as stored, whether its reply was lean (batched) or full.
				if j.Id == 0 || j.App != in.App || j.Handler != in.Handler || !proto.Equal(j.Schedule, in.Schedule) ||
					j.State != messages.JobState_ACTIVE || j.Version != 1 || j.CreatedMs == 0 || j.UpdatedMs != j.CreatedMs ||
					j.NextDueMs != j.CreatedMs+in.Schedule.DelayMs || j.Runs != 0 {
					failed.Add(1)
					t.Errorf("create %d returned %v", i, j)
					return
				}
				ids <- j.Id
			}
		}()
	}
	wg.Wait()
	close(ids)
	if failed.Load() > 0 {
		t.FailNow()
	}
	// 64 creates at a time to one shard, at most 4 requests in flight to it: they
	// went in batches (cluster/batch.go), all but the first few before a route.
	if b, k := e.client.CreateBatches(); k < n-100 || k < 2*b {
		t.Errorf("%d of %d creates went in %d batches: want nearly all, two or more a batch on average", k, n, b)
	} else if p := e.client.PackedBatches(); p == 0 || p >= b {
		// The shard's first reply says it takes packed batches; the client sends
		// the first plain.
		t.Errorf("%d of %d batches went packed: want all but the first few", p, b)
	}
	waitFor(t, 30*time.Second, "10,000 runs", func() bool { return e.rec.n.Load() >= n })
	time.Sleep(500 * time.Millisecond) // a duplicate would show up now
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	if len(e.rec.early) > 0 {
		t.Fatalf("%d runs started early, e.g. %s", len(e.rec.early), e.rec.early[0])
	}
	for id := range ids {
		if got := len(e.rec.byJob[id]); got != 1 {
			t.Fatalf("job %d ran %d times, want exactly 1", id, got)
		}
	}
	for k, c := range e.rec.runs {
		if c != 1 {
			t.Fatalf("run %s executed %d times", k, c)
		}
	}
}

// TestWorkerResultsAreAcknowledged: every result a worker sends is acknowledged by its
// shard within a moment, so the worker forgets it instead of sending it again every
// ResultResendMs (a shard that answered the result's sender, which proto.actor's Send
// leaves empty, never acknowledged one).
func TestWorkerResultsAreAcknowledged(t *testing.T) {
	e := start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 200
	for i := 0; i < n; i++ {
		if _, err := e.client.Create(ctx, once(0)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "200 runs", func() bool { return e.rec.n.Load() >= n })
	// Well within ResultResendMs (2 s): acks, not resends, empty the worker.
	waitFor(t, 1500*time.Millisecond, "every result acknowledged", func() bool {
		st, err := e.worker.Stats(time.Second)
		return err == nil && st.Unacknowledged == 0 && st.Busy == 0
	})
}

// TestCronSecondsAndDelete: a cron job with seconds fires every second; a deleted job
// never fires.
func TestCronSecondsAndDelete(t *testing.T) {
	e := start(t, "")
	ctx := context.Background()
	cj, err := e.client.Create(ctx, &messages.Job{App: "orders", Handler: "echo",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "* * * * * *", Tz: "Asia/Shanghai"}})
	if err != nil {
		t.Fatal(err)
	}
	del, err := e.client.Create(ctx, once(1200))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Delete(ctx, "orders", del.Id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 8*time.Second, "4 cron fires", func() bool {
		e.rec.mu.Lock()
		defer e.rec.mu.Unlock()
		return len(e.rec.byJob[cj.Id]) >= 4
	})
	time.Sleep(300 * time.Millisecond)
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	runs := e.rec.byJob[cj.Id]
	for i, r := range runs {
		if r.DueMs%1000 != 0 {
			t.Fatalf("cron run due at %d, not on a second", r.DueMs)
		}
		if i > 0 && r.DueMs-runs[i-1].DueMs != 1000 {
			t.Fatalf("cron runs %d and %d are %d ms apart, want 1000", i-1, i, r.DueMs-runs[i-1].DueMs)
		}
	}
	if n := len(e.rec.byJob[del.Id]); n != 0 {
		t.Fatalf("deleted job fired %d times", n)
	}
	if _, err := e.client.Get(ctx, "orders", del.Id); !errors.Is(err, kerr.ErrNotFound) {
		t.Fatalf("get of a deleted job: %v, want not found", err)
	}
}

// TestBadInput: each malformed request gets a typed error naming the field.
func TestBadInput(t *testing.T) {
	e := start(t, "")
	ctx := context.Background()
	cases := []struct {
		name  string
		job   *messages.Job
		is    error
		field string
	}{
		{"invalid cron", &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "61 * * * *"}}, kerr.ErrInvalidArgument, "schedule.cron"},
		{"unknown zone", &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "@hourly", Tz: "Mars/Olympus"}}, kerr.ErrInvalidArgument, "schedule.tz"},
		{"negative delay", &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: -5}}, kerr.ErrInvalidArgument, "schedule.delay"},
		{"zero interval", &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE}}, kerr.ErrInvalidArgument, "schedule.every"},
		{"oversized params", &messages.Job{App: "orders", Handler: "echo", Params: make([]byte, 70_000), Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 5}}, kerr.ErrInvalidArgument, "params"},
		{"no handler", &messages.Job{App: "orders", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 5}}, kerr.ErrInvalidArgument, "handler"},
		{"bad app", &messages.Job{App: "no spaces", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE}}, kerr.ErrInvalidArgument, "app"},
		{"handler not UTF-8", &messages.Job{App: "orders", Handler: "echo\xff", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 5}}, kerr.ErrInvalidArgument, "handler"},
		{"zone not UTF-8", &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "@hourly", Tz: "\xc0"}}, kerr.ErrInvalidArgument, "schedule.tz"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.Create(ctx, tc.job)
			var ke *kerr.Error
			if !errors.Is(err, tc.is) || !errors.As(err, &ke) || ke.Field != tc.field {
				t.Fatalf("got %v, want %v naming field %q", err, tc.is, tc.field)
			}
			if strings.HasSuffix(tc.name, "UTF-8") {
				_, err := e.client.Update(ctx, tc.job)
				if !errors.Is(err, tc.is) || !errors.As(err, &ke) || ke.Field != tc.field {
					t.Fatalf("update: got %v, want %v naming field %q", err, tc.is, tc.field)
				}
			}
		})
	}
	_, err := e.client.Get(ctx, "orders", 12345)
	var ke *kerr.Error
	if !errors.Is(err, kerr.ErrNotFound) || !errors.As(err, &ke) || ke.Field != "id" {
		t.Fatalf("unknown id: %v", err)
	}
}

// TestRestartKeepsJobs: jobs acknowledged before a restart fire after it.
func TestRestartKeepsJobs(t *testing.T) {
	dir := t.TempDir()
	e := start(t, dir)
	ctx := context.Background()
	var ids []int64
	for i := 0; i < 50; i++ {
		j, err := e.client.Create(ctx, once(1500+int64(i)*10))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.Id)
	}
	e.stop()
	e2 := start(t, dir)
	waitFor(t, 15*time.Second, "50 runs after restart", func() bool { return e2.rec.n.Load() >= 50 })
	for _, id := range ids {
		e2.rec.mu.Lock()
		n := len(e2.rec.byJob[id])
		e2.rec.mu.Unlock()
		if n != 1 {
			t.Fatalf("job %d ran %d times after restart", id, n)
		}
	}
}

// TestGiveUpKeepsTheLastError: a client that runs out of time says so
// (context.DeadlineExceeded) and keeps the last error it saw reachable with
// errors.Is and errors.As: a lease refused while the NameServer warms up, a get
// whose node went away; a create still waiting for its batch's reply says where the
// batch went.
func TestGiveUpKeepsTheLastError(t *testing.T) {
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()}); err == nil {
		t.Fatal("a lease was granted while the NameServer warmed up")
	} else {
		var ke *kerr.Error
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ke) || ke.Code != messages.Code_UNAVAILABLE {
			t.Fatalf("NewClient gave up with %v (kjob error %v), want the deadline and the last UNAVAILABLE", err, ke)
		}
	}

	e := start(t, "")
	j, err := e.client.Create(context.Background(), once(60_000))
	if err != nil {
		t.Fatal(err)
	}
	_ = e.node.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	_, err = e.client.Get(ctx2, "orders", j.Id)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get against a closed node: %v, want the deadline", err)
	}
	multi, _ := err.(interface{ Unwrap() []error })
	if multi == nil {
		t.Fatalf("Get gave up with %v (%T), which wraps no last error", err, err)
	}
	var causes int
	for _, c := range multi.Unwrap() {
		if !errors.Is(c, context.DeadlineExceeded) {
			causes++
		}
	}
	if causes != 1 {
		t.Fatalf("Get gave up with %v: %d wrapped errors besides the deadline, want the last one", err, causes)
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), time.Second)
	defer cancel3()
	_, err = e.client.Create(ctx3, once(60_000))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), e.node.Address()) {
		t.Fatalf("Create against a closed node: %v, want the deadline and the node's address", err)
	}
}

// TestTraceIDsDifferAcrossNodes: two nodes (or two starts of one) give the first
// run of a shard of the same name different trace ids. The core's randomness is
// seeded for the simulator; unseeded, every node drew the same sequence, and a
// tracing backend merged unrelated runs into one trace.
func TestTraceIDsDifferAcrossNodes(t *testing.T) {
	var traces []string
	for i := 0; i < 2; i++ {
		e := start(t, "")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := e.client.Create(ctx, once(10)); err != nil {
			t.Fatal(err)
		}
		cancel()
		waitFor(t, 10*time.Second, "the run", func() bool { return e.rec.n.Load() == 1 })
		e.rec.mu.Lock()
		for _, runs := range e.rec.byJob {
			traces = append(traces, runs[0].Traceparent)
		}
		e.rec.mu.Unlock()
		e.stop()
	}
	if len(traces) != 2 || traces[0] == "" || traces[0] == traces[1] {
		t.Fatalf("first runs' trace ids on two nodes: %q; want two different ones", traces)
	}
}
