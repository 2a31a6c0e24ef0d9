package core_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// The shard core's hot paths, without an actor, a network or a disk:
//
//	go test -run '^$' -bench . -benchmem ./actors/shard/core
//
// Each benchmark also reports x-marshal: its time per operation divided by the
// time to proto.Marshal the journal record that operation writes, measured in the
// same run. That ratio is the core's overhead over the one thing it cannot avoid
// (encoding its record), and it survives a noisy machine better than ns/op.

const (
	benchT0Ms        = 1_800_000_000_000 // an arbitrary "now"
	benchFiresPerMs  = 20                // 20,000 fires per second, the fire target
	benchBaselineOps = 20_000
)

// fakeEnv is a journal that is durable the moment it is appended to, and a network
// that only counts (and optionally keeps) what is sent.
type fakeEnv struct {
	lsn        uint64
	replies    int
	acks       int
	dispatches []*messages.Dispatch
	keep       bool // keep dispatches (for the result benchmark)
	dispatched int
}

func (e *fakeEnv) Append(es []persistence.Entry) (uint64, error) {
	e.lsn += uint64(len(es))
	return e.lsn, nil
}

func (e *fakeEnv) Send(_ *messages.Ref, m proto.Message) {
	switch x := m.(type) {
	case *messages.Dispatch:
		e.dispatched++
		if e.keep {
			e.dispatches = append(e.dispatches, x)
		}
	case *messages.ResultAck:
		e.acks++
	default:
		e.replies++
	}
}

var (
	benchClient = &messages.Ref{Address: "127.0.0.1:1", Id: "client"}
	benchWorker = &messages.WorkerInfo{WorkerId: "w1", App: "bench", Capacity: 1 << 20,
		Ref: &messages.Ref{Address: "127.0.0.1:2", Id: "kjob-worker"}}
)

func newBenchCore(env *fakeEnv) *core.Core {
	c := core.New(core.Config{Shard: route.Root("bench"), Self: &messages.Ref{Address: "127.0.0.1:3", Id: "shard"}}, benchT0Ms, 1)
	c.Open(env)
	c.Durable(env.lsn, nil, env)
	return c
}

func benchJob(id, atMs int64) *messages.Job {
	return &messages.Job{Id: id, App: "bench", Handler: "noop", Params: []byte(fmt.Sprintf("%-16d", id)),
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: atMs}}
}

// marshalNs is the baseline: nanoseconds to proto.Marshal m once.
func marshalNs(m proto.Message) float64 {
	t0 := time.Now()
	for range benchBaselineOps {
		if _, err := proto.Marshal(m); err != nil {
			panic(err)
		}
	}
	return float64(time.Since(t0).Nanoseconds()) / benchBaselineOps
}

func reportRatio(b *testing.B, elapsed time.Duration, n int, baselineNs float64) {
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n)/baselineNs, "x-marshal")
}

// populate creates n one-shot jobs due from firstDueMs on, benchFiresPerMs per ms.
func populate(b *testing.B, c *core.Core, env *fakeEnv, n int, firstDueMs int64) {
	for i := range n {
		c.Handle(benchT0Ms, benchClient, &messages.CreateJob{Job: benchJob(int64(i+1), firstDueMs+int64(i/benchFiresPerMs))}, env)
	}
	c.Durable(env.lsn, nil, env)
	if env.replies < n {
		b.Fatalf("%d replies to %d creates", env.replies, n)
	}
}

// fireAll gives c a worker and n one-shot jobs due from a second after benchT0Ms
// on, benchFiresPerMs per ms, and fires them all (their dispatches durable): the last
// due.
func fireAll(b *testing.B, c *core.Core, env *fakeEnv, n int) int64 {
	c.SetWorkers(benchT0Ms, []*messages.WorkerInfo{benchWorker}, env)
	first := int64(benchT0Ms + 1000)
	populate(b, c, env, n, first)
	last := first + int64((n-1)/benchFiresPerMs)
	for now := first; now <= last; now++ {
		c.Tick(now, env)
	}
	c.Durable(env.lsn, nil, env)
	return last
}

// succeeded is benchWorker's result for d: started and finished a ms after its due.
func succeeded(d *messages.Dispatch) *messages.RunResult {
	return &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Shard: d.Shard, Epoch: d.Epoch, Attempt: d.Attempt,
		DueMs: d.DueMs, Outcome: messages.Outcome_SUCCEEDED, StartMs: d.DueMs + 1, EndMs: d.DueMs + 1,
		WorkerId: benchWorker.WorkerId, Worker: benchWorker.Ref}
}

// benchReqID0 is a snowflake of 2026 (time in the bits above 22).
const benchReqID0 = int64(1_700_000_000_000) << 22

// BenchmarkCreate: validate, journal (JOB_PUT) and reply to one create (with its
// request id, entered in the shard's request window).
func BenchmarkCreate(b *testing.B) {
	env := &fakeEnv{}
	c := newBenchCore(env)
	due := int64(benchT0Ms + time.Hour.Milliseconds())
	base := marshalNs(benchJob(1, due))
	reqs := make([]*messages.CreateJob, b.N)
	for i := range reqs {
		// Request ids as the Go client takes them: snowflakes, in the order taken.
		reqs[i] = &messages.CreateJob{Job: benchJob(int64(i+1), due), RequestId: benchReqID0 + int64(i)<<12}
	}
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	for i := range b.N {
		c.Handle(benchT0Ms, benchClient, reqs[i], env)
		c.Durable(env.lsn, nil, env)
	}
	el := time.Since(t0)
	b.StopTimer()
	if env.replies != b.N || c.Pending() != b.N {
		b.Fatalf("replies %d, pending %d, want %d", env.replies, c.Pending(), b.N)
	}
	reportRatio(b, el, b.N, base)
}

// BenchmarkFireDispatch: one job's fire: the wheel hands it over, RUN_DISPATCHED
// is journaled and the dispatch released, at benchFiresPerMs fires per tick.
func BenchmarkFireDispatch(b *testing.B) {
	env := &fakeEnv{}
	c := newBenchCore(env)
	c.SetWorkers(benchT0Ms, []*messages.WorkerInfo{benchWorker}, env)
	first := int64(benchT0Ms + 1000)
	populate(b, c, env, b.N, first)
	base := marshalNs(&messages.RunState{RunId: "1234567890123456789:1800000001000", JobId: 1234567890123456789,
		DueMs: first, Attempt: 1, DispatchedMs: first, DeadlineMs: first + 65_000, Level: -1,
		TraceId: "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01", Version: 1, Fire: true, JobRuns: 1,
		Handler: "noop", App: "bench"})
	last := first + int64((b.N-1)/benchFiresPerMs)
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	for now := first; now <= last; now++ {
		c.Tick(now, env)
		c.Durable(env.lsn, nil, env)
	}
	el := time.Since(t0)
	b.StopTimer()
	if env.dispatched != b.N || c.InFlight() != b.N {
		b.Fatalf("dispatched %d, in flight %d, want %d", env.dispatched, c.InFlight(), b.N)
	}
	reportRatio(b, el, b.N, base)
}

// BenchmarkResult: one worker result: RUN_FINISHED journaled, run dropped, ack released.
func BenchmarkResult(b *testing.B) {
	env := &fakeEnv{keep: true}
	c := newBenchCore(env)
	last := fireAll(b, c, env, b.N)
	if len(env.dispatches) != b.N {
		b.Fatalf("%d dispatches, want %d", len(env.dispatches), b.N)
	}
	results := make([]*messages.RunResult, b.N)
	for i, d := range env.dispatches {
		results[i] = succeeded(d)
	}
	d := env.dispatches[0]
	base := marshalNs(&messages.RunRecord{RunId: d.RunId, JobId: d.JobId, DueMs: d.DueMs, DispatchedMs: d.DispatchedMs,
		StartMs: d.DueMs + 1, EndMs: d.DueMs + 1, Attempt: 1, WorkerId: benchWorker.WorkerId,
		Outcome: messages.Outcome_SUCCEEDED, TraceId: d.Traceparent})
	env.dispatches = nil
	now := last + 1
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	for i := range b.N {
		c.Handle(now, benchWorker.Ref, results[i], env)
		c.Durable(env.lsn, nil, env)
	}
	el := time.Since(t0)
	b.StopTimer()
	if env.acks != b.N || c.InFlight() != 0 {
		b.Fatalf("acks %d, in flight %d, want %d and 0", env.acks, c.InFlight(), b.N)
	}
	reportRatio(b, el, b.N, base)
}

// BenchmarkSnapshotView: what a snapshot costs the shard actor's goroutine, at
// benchSnapshotJobs pending jobs: freezing the state (SnapshotView) stalls it; encoding
// the view runs on a goroutine of its own. x-encode is the view's time over the whole
// encode's, measured in the same run.
func BenchmarkSnapshotView(b *testing.B) {
	env := &fakeEnv{}
	c := newBenchCore(env)
	populate(b, c, env, benchSnapshotJobs, benchT0Ms+time.Hour.Milliseconds())
	t0 := time.Now()
	n := len(c.Snapshot())
	encodeNs := float64(time.Since(t0).Nanoseconds())
	b.ReportAllocs()
	b.ResetTimer()
	t0 = time.Now()
	for range b.N {
		_ = c.SnapshotView()
	}
	el := time.Since(t0)
	b.StopTimer()
	b.ReportMetric(float64(el.Nanoseconds())/float64(b.N)/encodeNs, "x-encode")
	b.ReportMetric(float64(n), "snapshot-bytes")
}

// BenchmarkSnapshotViewInFlight: the freeze of a shard with benchSnapshotJobs/2 runs
// dispatched and not yet answered (a slow handler, a burst): each run's state is
// copied into the view, as the shard goes on changing it.
func BenchmarkSnapshotViewInFlight(b *testing.B) {
	n := benchSnapshotJobs / 2
	env := &fakeEnv{}
	c := newBenchCore(env)
	fireAll(b, c, env, n)
	if c.InFlight() != n {
		b.Fatalf("%d runs in flight, want %d", c.InFlight(), n)
	}
	benchViews(b, c)
}

// BenchmarkSnapshotViewPeriodic: the freeze of a shard of benchSnapshotJobs periodic
// jobs (every one a full job), each view encoded in turn as the shell does. The
// view copies Core.views, one slice; it walked the jobs map, 0.3 µs a job.
func BenchmarkSnapshotViewPeriodic(b *testing.B) {
	env := &fakeEnv{}
	c := newBenchCore(env)
	for i := range benchSnapshotJobs {
		j := benchJob(int64(i+1), 0)
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 3_600_000}
		c.Handle(benchT0Ms, benchClient, &messages.CreateJob{Job: j}, env)
	}
	c.Durable(env.lsn, nil, env)
	if c.Jobs() != benchSnapshotJobs {
		b.Fatalf("%d jobs, want %d", c.Jobs(), benchSnapshotJobs)
	}
	benchViews(b, c)
}

// BenchmarkSnapshotViewPacked: the freeze of a shard whose benchSnapshotJobs
// one-shots have all run (DONE, kept packed for DoneRetentionMs), each view encoded in
// turn as the shell does: a walk over the packed jobs' index collecting their
// encodings, into the last view's buffer.
func BenchmarkSnapshotViewPacked(b *testing.B) {
	n := benchSnapshotJobs
	env := &fakeEnv{keep: true}
	c := newBenchCore(env)
	last := fireAll(b, c, env, n)
	for _, d := range env.dispatches {
		c.Handle(last+1, benchWorker.Ref, succeeded(d), env)
		c.Durable(env.lsn, nil, env)
	}
	env.dispatches = nil
	if c.PackedJobs() != n {
		b.Fatalf("%d jobs packed, want %d", c.PackedJobs(), n)
	}
	benchViews(b, c)
}

// benchViews times b.N snapshot views of c, each encoded (off the clock) before the
// next, as the shell does on a goroutine of its own: Encode gives the view's buffers
// back for the next one.
func benchViews(b *testing.B, c *core.Core) {
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		v := c.SnapshotView()
		b.StopTimer()
		v.Encode()
		b.StartTimer()
	}
}

const benchSnapshotJobs = 200_000

// BenchmarkLoadSnapshot: recovery's first step, a snapshot of benchSnapshotJobs
// pending jobs decoded and applied into an empty shard. x-unmarshal is its time over
// a bare proto.Unmarshal of the same snapshot, measured in the same run.
func BenchmarkLoadSnapshot(b *testing.B) {
	env := &fakeEnv{}
	c := newBenchCore(env)
	populate(b, c, env, benchSnapshotJobs, benchT0Ms+time.Hour.Milliseconds())
	data := c.Snapshot()
	t0 := time.Now()
	if err := proto.Unmarshal(data, &messages.ShardSnapshot{}); err != nil {
		b.Fatal(err)
	}
	base := float64(time.Since(t0).Nanoseconds())
	b.ReportAllocs()
	b.ResetTimer()
	t0 = time.Now()
	for range b.N {
		r := core.New(core.Config{Shard: route.Root("bench")}, benchT0Ms, 1)
		if err := r.LoadSnapshot(data, env.lsn); err != nil {
			b.Fatal(err)
		}
		if r.Pending() != benchSnapshotJobs {
			b.Fatalf("%d pending after the load, want %d", r.Pending(), benchSnapshotJobs)
		}
	}
	el := time.Since(t0)
	b.StopTimer()
	b.ReportMetric(float64(el.Nanoseconds())/float64(b.N)/base, "x-unmarshal")
	b.ReportMetric(float64(benchSnapshotJobs)*float64(b.N)/el.Seconds(), "jobs/s")
}

// BenchmarkCreateBatchLarge: creates in batches of 52 (CreateJobs, lean replies,
// as the Go client sends them at 256 in flight) into a shard that already holds a
// million compact jobs, so a create's lookup of its id (a miss) meets a cold index
// far larger than the caches, as it does in `kjob bench`. Job and request ids are
// snowflakes, in the order taken.
func BenchmarkCreateBatchLarge(b *testing.B) {
	const held, batch = 1_000_000, 52
	env := &fakeEnv{}
	c := newBenchCore(env)
	due := int64(benchT0Ms + time.Hour.Milliseconds())
	snow := func(i int) int64 { return benchReqID0 + int64(i/4096)<<22 + int64(i%4096) }
	mk := func(from, n int) *messages.CreateJobs {
		m := &messages.CreateJobs{Jobs: make([]*messages.CreateJob, n), LeanReplies: true}
		for k := range m.Jobs {
			i := from + k
			m.Jobs[k] = &messages.CreateJob{Job: benchJob(snow(2*i), due), RequestId: snow(2*i + 1)}
		}
		return m
	}
	for i := 0; i < held; i += 256 {
		c.Handle(benchT0Ms, benchClient, mk(i, min(256, held-i)), env)
		c.Durable(env.lsn, nil, env)
	}
	batches := make([]*messages.CreateJobs, 0, b.N/batch+1)
	for i := 0; i < b.N; i += batch {
		batches = append(batches, mk(held+i, min(batch, b.N-i)))
	}
	replies := env.replies
	b.ReportAllocs()
	b.ResetTimer()
	for _, m := range batches {
		c.Handle(benchT0Ms, benchClient, m, env)
		c.Durable(env.lsn, nil, env)
	}
	b.StopTimer()
	if env.replies-replies != len(batches) || c.Pending() != held+b.N {
		b.Fatalf("replies %d, pending %d, want %d and %d", env.replies-replies, c.Pending(), len(batches), held+b.N)
	}
}
