package core_test

import (
	"testing"

	"github.com/kjob/kjob/messages"
)

// What a fire and its result allocate on the shard's goroutine: at 20,000 fires a
// second every allocation a fire is 20,000 a second for the garbage collector, whose
// cycles are where fires are late. The bounds are today's counts; a change that adds
// to them should say what it buys. Journal records are marshalled into a buffer the
// shard reuses (Env.Append), the run id is built in one allocation and Tick's scratch
// is kept, which took a fire (one a tick) from 13 allocations to 8 and a result from 4 to 3.
func TestFireAndResultAllocs(t *testing.T) {
	const (
		runs           = 500
		maxFireAllocs  = 8 // the fullJob of a compact job, RunState, its run, run id, trace id, Dispatch, wheel and map growth
		maxResultAlloc = 3 // RunRecord, ResultAck, the packed job's room
	)
	env := &fakeEnv{keep: true}
	c := newBenchCore(env)
	c.SetWorkers(benchT0Ms, []*messages.WorkerInfo{benchWorker}, env)
	first := int64(benchT0Ms + 1000)
	n := runs + 1 // AllocsPerRun runs once more, to warm up
	for i := range n {
		c.Handle(benchT0Ms, benchClient, &messages.CreateJob{Job: benchJob(int64(i+1), first+int64(i))}, env)
	}
	c.Durable(env.lsn, nil, env)
	now := first
	fire := func() {
		c.Tick(now, env)
		c.Durable(env.lsn, nil, env)
		now++
	}
	if a := testing.AllocsPerRun(runs, fire); a > maxFireAllocs {
		t.Errorf("a fire and its dispatch allocate %v times, want at most %d", a, maxFireAllocs)
	}
	if len(env.dispatches) != n {
		t.Fatalf("%d dispatches, want %d", len(env.dispatches), n)
	}
	results := make([]*messages.RunResult, n)
	for i, d := range env.dispatches {
		results[i] = &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Shard: d.Shard, Epoch: d.Epoch, Attempt: d.Attempt,
			DueMs: d.DueMs, Outcome: messages.Outcome_SUCCEEDED, StartMs: d.DueMs + 1, EndMs: d.DueMs + 1,
			WorkerId: benchWorker.WorkerId, Worker: benchWorker.Ref}
	}
	i := 0
	result := func() {
		c.Handle(now, benchWorker.Ref, results[i], env)
		c.Durable(env.lsn, nil, env)
		i++
	}
	if a := testing.AllocsPerRun(runs, result); a > maxResultAlloc {
		t.Errorf("a result and its ack allocate %v times, want at most %d", a, maxResultAlloc)
	}
	if env.acks != n || c.InFlight() != 0 {
		t.Fatalf("acks %d, in flight %d, want %d and 0", env.acks, c.InFlight(), n)
	}
}
