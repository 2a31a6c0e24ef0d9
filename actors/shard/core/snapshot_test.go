package core

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// A view encodes the state as it was when taken, whatever the core did since: fires,
// results, updates, pauses and deletes change jobs and runs in place.
func TestSnapshotViewIsFrozen(t *testing.T) {
	c, e := newCore(1000)
	for id := int64(1); id <= 20; id++ {
		j := onceJob(id, 10*id)
		if id%2 == 0 {
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 30}
		}
		c.Handle(1000, client, &messages.CreateJob{Job: j}, e)
	}
	c.Durable(e.lsn, nil, e)
	c.Tick(1100, e)
	c.Durable(e.lsn, nil, e)
	finish := func(now int64) {
		for _, s := range e.take() {
			if d, ok := s.m.(*messages.Dispatch); ok && d.JobId%3 != 0 {
				c.Handle(now, wref, &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Attempt: d.Attempt, Epoch: d.Epoch,
					Outcome: messages.Outcome_SUCCEEDED, StartMs: now, EndMs: now, WorkerId: "w1"}, e)
			}
		}
		c.Durable(e.lsn, nil, e)
	}
	finish(1100)
	if !c.Quiescent() || c.InFlight() == 0 {
		t.Fatalf("setup: quiescent %v, in flight %d", c.Quiescent(), c.InFlight())
	}
	want := c.Snapshot()
	v := c.SnapshotView()

	for now := int64(1101); now < 1400; now += 7 {
		c.Tick(now, e)
		c.Durable(e.lsn, nil, e)
		finish(now)
	}
	c.Handle(1400, client, &messages.PauseJob{App: "app", Id: 2}, e)
	c.Handle(1400, client, &messages.DeleteJob{App: "app", Id: 4}, e)
	c.Handle(1400, client, &messages.UpdateJob{Job: &messages.Job{Id: 6, App: "app", Handler: "h2",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 50}}}, e)
	c.Durable(e.lsn, nil, e)
	if now := c.Snapshot(); bytes.Equal(now, want) {
		t.Fatal("the state did not change after the view: the test proves nothing")
	}
	if got := v.Encode(); !bytes.Equal(got, want) {
		a, b := &messages.ShardSnapshot{}, &messages.ShardSnapshot{}
		_ = proto.Unmarshal(got, a)
		_ = proto.Unmarshal(want, b)
		t.Fatalf("the view changed after it was taken:\n got %v\nwant %v", a, b)
	}
}

// The shard name is read from the meta field alone, as a full decode would read it.
func TestShardNameOfSnapshot(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(1, 10)}, e)
	c.Durable(e.lsn, nil, e)
	name, epoch, err := ShardNameOfSnapshot(c.Snapshot())
	if err != nil || name != c.Shard().String() || epoch != c.Epoch() {
		t.Fatalf("got %q %d %v, want %q %d", name, epoch, err, c.Shard().String(), c.Epoch())
	}
	if _, _, err := ShardNameOfSnapshot([]byte{0x0a, 0x05, 0x01}); err == nil {
		t.Fatal("a truncated snapshot was read without an error")
	}
}

// A snapshot loads back to the state it was taken from, through the parallel job
// decoding of a large snapshot as through the inline one of a small one.
func TestLoadSnapshotRoundTrip(t *testing.T) {
	for _, n := range []int64{10, loadParallelJobs + 3*loadChunkJobs + 7} {
		c, e := newCore(1000)
		for id := int64(1); id <= n; id++ {
			c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 10+id%50)}, e)
		}
		c.Durable(e.lsn, nil, e)
		c.Tick(1030, e)
		c.Durable(e.lsn, nil, e)
		want := c.Snapshot()
		r := New(Config{Shard: c.Shard()}, 1000, 1)
		if err := r.LoadSnapshot(want, e.lsn); err != nil {
			t.Fatal(err)
		}
		if r.Jobs() != int(n) || r.InFlight() != c.InFlight() || r.Pending() != c.Pending() {
			t.Fatalf("n=%d: loaded %d jobs, %d in flight, %d pending; want %d, %d, %d", n, r.Jobs(), r.InFlight(), r.Pending(), n, c.InFlight(), c.Pending())
		}
		ref := New(Config{Shard: c.Shard()}, 1000, 1)
		refLoad(t, ref, want, e.lsn)
		if got := r.Snapshot(); !bytes.Equal(got, ref.Snapshot()) {
			t.Fatalf("n=%d: the loaded state differs from a plain decode's", n)
		} else if !bytes.Equal(got, want) {
			t.Fatalf("n=%d: the loaded shard's snapshot differs from the one it loaded", n)
		}
		if err := New(Config{Shard: c.Shard()}, 1000, 1).LoadSnapshot(want[:len(want)-3], e.lsn); err == nil {
			t.Fatalf("n=%d: a truncated snapshot loaded without an error", n)
		}
	}
}

// refLoad is LoadSnapshot as a plain proto.Unmarshal of the whole snapshot.
func refLoad(t *testing.T, c *Core, data []byte, lsn uint64) {
	s := &messages.ShardSnapshot{}
	if err := proto.Unmarshal(data, s); err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Requests {
		c.reqs.add(r.RequestId, r.JobId, r.AtMs)
	}
	c.loadRuns = map[int64]int{}
	for _, st := range s.Runs {
		c.loadRuns[st.JobId]++
	}
	for _, j := range s.Jobs {
		c.apply(messages.RecordType_JOB_PUT, j)
	}
	c.loadRuns = nil
	for _, h := range s.History {
		if j := c.jobs[h.JobId]; j != nil {
			j.history = append(j.history, h)
		}
	}
	for _, st := range s.Runs {
		if st.Level >= 0 {
			c.apply(messages.RecordType_RETRY_SCHEDULED, st)
		} else {
			st2 := proto.Clone(st).(*messages.RunState)
			st2.Fire = false
			c.apply(messages.RecordType_RUN_DISPATCHED, st2)
			st2.Fire = st.Fire
		}
	}
	for _, d := range s.Dead {
		c.dead[d.RunId] = d
	}
	if len(s.FireWindow) == len(c.fireWin) && len(s.FireWindowSec) == len(c.fireWin) {
		copy(c.fireWin[:], s.FireWindow)
		copy(c.fireWinSec[:], s.FireWindowSec)
	}
	c.appended, c.durable = lsn, lsn
}

// A view shares the in-flight runs' states (it does not copy them); the core copies
// a run's state before it changes it in place — a run that waited for a worker,
// placed when one comes — so the view still encodes the runs as they were when it
// was taken, on another goroutine while the core goes on (as the shell does; under
// -race a change in place would be reported).
func TestSnapshotViewSharesRunsCopyOnWrite(t *testing.T) {
	c, e := newCore(1000)
	c.SetWorkers(1000, nil, e) // no worker: the runs wait for one
	for id := int64(1); id <= 6; id++ {
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 10)}, e)
	}
	c.Durable(e.lsn, nil, e)
	c.Tick(1010, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	if c.InFlight() != 6 || !c.Quiescent() {
		t.Fatalf("setup: %d in flight (want 6, waiting for a worker), quiescent %v", c.InFlight(), c.Quiescent())
	}
	want := c.Snapshot()
	v := c.SnapshotView()
	encoded := make(chan []byte)
	go func() { encoded <- v.Encode() }()
	// A worker comes: the waiting runs go to it, their states changed in place.
	c.SetWorkers(1100, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 64}}, e)
	c.Tick(1100, e)
	c.Durable(e.lsn, nil, e)
	n := 0
	for _, s := range e.take() {
		if _, ok := s.m.(*messages.Dispatch); ok {
			n++
		}
	}
	if n != 6 {
		t.Fatalf("%d runs went to the new worker, want 6: the test proves nothing", n)
	}
	if now := c.Snapshot(); bytes.Equal(now, want) {
		t.Fatal("the state did not change after the view: the test proves nothing")
	}
	if got := <-encoded; !bytes.Equal(got, want) {
		a, b := &messages.ShardSnapshot{}, &messages.ShardSnapshot{}
		_ = proto.Unmarshal(got, a)
		_ = proto.Unmarshal(want, b)
		t.Fatalf("a run changed in the view after it was taken:\n got %v\nwant %v", a.Runs, b.Runs)
	}
}

// A view shares the full jobs' definitions and histories (it copies neither); the
// core copies a job's before it changes them in place — a fire's runs and due, a
// finish, a history trimmed to Config.History, a one-shot turned DONE — so the view
// still encodes the jobs as they were when it was taken, on another goroutine while
// the core goes on (under -race a change in place would be reported). Deletes and
// packing move other jobs' entries in Core.views; every view checks them (checkViews).
func TestSnapshotViewSharesJobsCopyOnWrite(t *testing.T) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, History: 2, DoneRetentionMs: 60_000}, 1000, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(1000, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 64}}, e)
	for id := int64(1); id <= 12; id++ {
		j := onceJob(id, 40*id)
		if id%3 != 0 {
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 20}
		}
		c.Handle(1000, client, &messages.CreateJob{Job: j}, e)
	}
	c.Durable(e.lsn, nil, e)
	// Each step answers the runs the last one dispatched, then fires what is due:
	// a view between two steps has runs out, whose finishes change their jobs.
	var out []*messages.Dispatch
	step := func(now int64) {
		for _, d := range out {
			c.Handle(now, wref, &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Attempt: d.Attempt, Epoch: d.Epoch,
				Outcome: messages.Outcome_SUCCEEDED, StartMs: now, EndMs: now + 1, WorkerId: "w1"}, e)
		}
		out = out[:0]
		c.Durable(e.lsn, nil, e)
		c.Tick(now, e)
		c.Durable(e.lsn, nil, e)
		for _, s := range e.take() {
			if d, ok := s.m.(*messages.Dispatch); ok {
				out = append(out, d)
			}
		}
	}
	for now := int64(1000); now <= 1100; now += 10 {
		step(now) // the periodic jobs' histories are full: the next finish trims in place
	}
	if !c.Quiescent() || c.InFlight() == 0 {
		t.Fatalf("setup: quiescent %v, %d runs out", c.Quiescent(), c.InFlight())
	}
	want := c.Snapshot()
	v := c.SnapshotView()
	encoded := make(chan []byte)
	go func() { encoded <- v.Encode() }()
	for now := int64(1110); now <= 1500; now += 10 {
		step(now)
	}
	c.Handle(1500, client, &messages.PauseJob{App: "app", Id: 1}, e)
	c.Handle(1500, client, &messages.DeleteJob{App: "app", Id: 2}, e)
	c.Handle(1500, client, &messages.UpdateJob{Job: &messages.Job{Id: 4, App: "app", Handler: "h2",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 50}}}, e)
	c.Durable(e.lsn, nil, e)
	now := c.Snapshot() // a view of its own, after the deletes and packing: checkViews
	if bytes.Equal(now, want) {
		t.Fatal("the state did not change after the view: the test proves nothing")
	}
	if got := <-encoded; !bytes.Equal(got, want) {
		a, b := &messages.ShardSnapshot{}, &messages.ShardSnapshot{}
		_ = proto.Unmarshal(got, a)
		_ = proto.Unmarshal(want, b)
		t.Fatalf("a job changed in the view after it was taken:\n got %v %v\nwant %v %v", a.Jobs, a.History, b.Jobs, b.History)
	}
	// The state loads back as it is, and its own view encodes the same.
	c2, e2 := newCore(1500)
	if err := c2.LoadSnapshot(now, e.lsn); err != nil {
		t.Fatal(err)
	}
	_ = e2
	if again := c2.Snapshot(); !bytes.Equal(again, now) {
		t.Fatal("a loaded snapshot encodes differently")
	}
}

// A fixed-delay job waits for its run's finish for its next due. A snapshot taken
// while that run is out — dispatched, or waiting on the ladder after a failure —
// must load as the job it was: active, its run's finish setting the next due. It
// loaded as DONE (the job went in before its runs, so it looked to have none and
// no next due), and never fired again; and a loaded run lost its fire flag. Found
// by the simulator's snapshots (sim seed 4).
func TestLoadSnapshotKeepsAFixedDelayJobWaitingForItsRun(t *testing.T) {
	for _, failFirst := range []bool{false, true} {
		c, e := newCore(1000)
		j := &messages.Job{Id: 7, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_DELAY, EveryMs: 500},
			Policy: &messages.Policy{Attempts: 3, LadderMs: []int64{200}}}
		c.Handle(1000, client, &messages.CreateJob{Job: j}, e)
		c.Durable(e.lsn, nil, e)
		c.Tick(1500, e) // the first due: dispatched
		c.Durable(e.lsn, nil, e)
		var d *messages.Dispatch
		for _, m := range e.take() {
			if x, ok := m.m.(*messages.Dispatch); ok {
				d = x
			}
		}
		if d == nil {
			t.Fatal("the first due was not dispatched")
		}
		now := int64(1600)
		if failFirst { // the first attempt fails: the run waits on the ladder
			c.Handle(now, wref, &messages.RunResult{RunId: d.RunId, Attempt: 1, Epoch: 1, WorkerId: "w1", Outcome: messages.Outcome_FAILED, StartMs: 1500, EndMs: now}, e)
			c.Durable(e.lsn, nil, e)
			e.take()
		}
		if !c.Quiescent() {
			t.Fatal("not quiescent")
		}
		snap := c.Snapshot()
		r := New(Config{Shard: c.Shard(), Self: &messages.Ref{Address: "s", Id: "shard"}}, now, 1)
		if err := r.LoadSnapshot(snap, e.lsn); err != nil {
			t.Fatal(err)
		}
		if got := r.Snapshot(); !bytes.Equal(got, snap) {
			t.Fatalf("failFirst=%v: the loaded shard's snapshot differs from the one it loaded (%d bytes against %d)", failFirst, len(got), len(snap))
		}
		got := r.reply(7)
		if got.GetState() != messages.JobState_ACTIVE {
			t.Fatalf("failFirst=%v: the loaded job is %s, want ACTIVE", failFirst, got.GetState())
		}
		// The loaded shard finishes the run: the job gets its next due.
		e2 := &fakeEnv{lsn: e.lsn}
		r.Recovered(now, e.lsn, e2)
		r.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e2)
		attempt := int32(1)
		if failFirst {
			now = 1900 // past the ladder's 200 ms: the second attempt goes out
			r.Tick(now, e2)
			r.Durable(e2.lsn, nil, e2)
			e2.take()
			attempt = 2
		}
		r.Handle(now, wref, &messages.RunResult{RunId: d.RunId, Attempt: attempt, Epoch: 1, WorkerId: "w1", Outcome: messages.Outcome_SUCCEEDED, StartMs: now, EndMs: now}, e2)
		r.Durable(e2.lsn, nil, e2)
		if got := r.reply(7); got.GetState() != messages.JobState_ACTIVE || got.GetNextDueMs() != now+500 {
			t.Fatalf("failFirst=%v: after the run's finish the job is %s, next due %d; want ACTIVE, %d", failFirst, got.GetState(), got.GetNextDueMs(), now+500)
		}
	}
}

// TestSnapshotViewWhileTheFirstChunkGrows: a shard's compact jobs start in a small
// chunk that doubles as it fills (coldFirst), and a view taken before it grows
// encodes the jobs as they were, on another goroutine, while deletes free slots
// in it and creates fill them and grow the chunk past several doublings.
func TestSnapshotViewWhileTheFirstChunkGrows(t *testing.T) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, 1000, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	id := int64(0)
	create := func(n int) {
		for range n {
			id++
			c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 3_600_000)}, e)
		}
		c.Durable(e.lsn, nil, e)
	}
	create(coldFirst - 3)
	if c.cold.len() != coldFirst-3 || len(c.cold.chunks) != 1 || len(c.cold.chunks[0].slots) != coldFirst {
		t.Fatalf("setup: %d compact jobs in %d chunks of %d slots; want them in one first chunk of %d",
			c.cold.len(), len(c.cold.chunks), len(c.cold.chunks[0].slots), coldFirst)
	}
	want := c.Snapshot()
	v := c.SnapshotView()
	encoded := make(chan []byte)
	go func() { encoded <- v.Encode() }()
	for k := int64(1); k <= 9; k++ { // slots the view shares: copied before the write
		c.Handle(1000, client, &messages.DeleteJob{App: "app", Id: k * 3}, e)
	}
	c.Durable(e.lsn, nil, e)
	create(5 * coldFirst) // into the freed slots, then growing the chunk
	if got := len(c.cold.chunks[0].slots); got < 4*coldFirst {
		t.Fatalf("the first chunk has %d slots after %d creates: it did not grow", got, c.cold.len())
	}
	if got := <-encoded; !bytes.Equal(got, want) {
		t.Fatal("the view's encoding changed with the creates and deletes after it was taken")
	}
	// The state after loads back as it is.
	now := c.Snapshot()
	back := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, 1000, 1)
	if err := back.LoadSnapshot(now, e.lsn); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Snapshot(), now) || back.cold.len() != c.cold.len() {
		t.Fatalf("loaded back: %d compact jobs, want %d", back.cold.len(), c.cold.len())
	}
}
