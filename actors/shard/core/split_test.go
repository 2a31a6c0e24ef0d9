package core

import (
	"testing"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// A split hands each half exactly its own jobs, runs and dead letters, at epoch+1,
// and the parent refuses commands from the moment it is journaled.
func TestSplitPartitionsTheShard(t *testing.T) {
	c, e := newCore(1000)
	const n = 200
	for id := int64(1); id <= n; id++ {
		delay := int64(3_600_000)
		if id%10 == 0 {
			delay = 10 // due soon: in flight at the split
		}
		reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(id, delay), RequestId: 1000 + id})
	}
	c.Tick(1010, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	if c.InFlight() != n/10 {
		t.Fatalf("in flight %d, want %d", c.InFlight(), n/10)
	}
	self := &messages.Ref{Address: "s", Id: "kjob-server"}
	c.BeginSplit(self, e)
	if !c.Splitting() || !c.Frozen() {
		t.Fatal("not splitting / frozen after BeginSplit")
	}
	if r := reply(t, c, e, 1020, &messages.GetJob{App: "app", Id: 1}); r.Error.GetCode() != messages.Code_NOT_OWNER {
		t.Fatalf("a splitting shard answered %v, want NOT_OWNER", r)
	}
	c.Durable(e.lsn, nil, e)
	imports := c.HandoffImports()
	if len(imports) != 2 {
		t.Fatalf("%d imports, want 2", len(imports))
	}
	lo, hi := route.Root("app").Children()
	jobs, runs := 0, 0
	for i, im := range imports {
		want := []route.Shard{lo, hi}[i]
		if im.Shard != want.String() || im.Epoch != 2 {
			t.Fatalf("import %d: %s@%d, want %s@2", i, im.Shard, im.Epoch, want)
		}
		child := New(Config{Shard: want}, 1020, im.Epoch)
		if err := child.LoadSnapshot(im.Snapshot, 0); err != nil {
			t.Fatal(err)
		}
		for id := int64(1); id <= n; id++ {
			has := child.has(id)
			if has != want.ContainsJob(id) {
				t.Fatalf("%s: job %d present=%v, its hash says %v", want, id, has, want.ContainsJob(id))
			}
		}
		for _, r := range child.runs {
			if !want.ContainsJob(r.st.JobId) {
				t.Fatalf("%s holds run %s of another half's job", want, r.st.RunId)
			}
		}
		if name, ep, _ := ShardNameOfSnapshot(im.Snapshot); name != want.String() || ep != 2 {
			t.Fatalf("snapshot names %s@%d", name, ep)
		}
		jobs += child.Jobs()
		runs += child.InFlight()
		if child.Jobs() == 0 || child.Jobs() == n {
			t.Fatalf("%s got %d of %d jobs: not a split", want, child.Jobs(), n)
		}
	}
	if jobs != n || runs != n/10 {
		t.Fatalf("halves hold %d jobs and %d runs, want %d and %d", jobs, runs, n, n/10)
	}
	c.HandoffDone(e)
	if !c.Closed() {
		t.Fatal("parent not closed after HandoffDone")
	}
}

// The split decision survives a restart: a journal that ends after SHARD_HANDOFF
// (split) recovers frozen and splitting, so the shell rolls the split forward.
func TestSplitRecoversSplitting(t *testing.T) {
	c, e := newCore(1000)
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(1, 60_000), RequestId: 1})
	c.BeginSplit(&messages.Ref{Address: "s", Id: "kjob-server"}, e)
	c.Durable(e.lsn, nil, e)
	c2 := New(Config{Shard: c.Shard()}, 2000, 1)
	for _, rec := range e.log {
		if err := c2.Replay(rec); err != nil {
			t.Fatal(err)
		}
	}
	c2.Recovered(2000, e.lsn, &fakeEnv{lsn: e.lsn})
	if !c2.Splitting() || !c2.Frozen() || len(c2.HandoffImports()) != 2 {
		t.Fatalf("after restart: splitting=%v frozen=%v", c2.Splitting(), c2.Frozen())
	}
}

// A run in flight at a split or move is sent again by the new owner to the worker
// that has it, even outside the new shard's group: that worker dedupes it by run id,
// where another worker would run it a second time.
func TestRedispatchSticksToTheWorker(t *testing.T) {
	c, e := newCore(1000)
	w2 := &messages.WorkerInfo{WorkerId: "w2", App: "app", Ref: &messages.Ref{Address: "w", Id: "w2"}, Capacity: 4}
	w1 := &messages.WorkerInfo{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}
	c.SetWorkers(1000, []*messages.WorkerInfo{w2}, e)
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(7, 10), RequestId: 1})
	c.Tick(1010, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.BeginHandoff(&messages.Ref{Address: "t", Id: "kjob-server"}, e)
	c.Durable(e.lsn, nil, e)
	im := c.HandoffImports()[0]
	n := New(Config{Shard: c.Shard(), Self: &messages.Ref{Address: "t", Id: "shard"}}, 1020, im.Epoch)
	if err := n.LoadSnapshot(im.Snapshot, 0); err != nil {
		t.Fatal(err)
	}
	e2 := &fakeEnv{}
	n.SetWorkersOf(1020, []*messages.WorkerInfo{w1}, []*messages.WorkerInfo{w1, w2}, e2)
	n.Recovered(1020, 0, e2)
	var to []string
	for _, s := range e2.take() {
		if _, ok := s.m.(*messages.Dispatch); ok {
			to = append(to, s.to.Id)
		}
	}
	if len(to) != 1 || to[0] != "w2" {
		t.Fatalf("re-dispatch went to %v, want the worker that has the run (w2)", to)
	}
}
