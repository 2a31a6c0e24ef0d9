package core

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// reply handles m at now, makes the journal durable and returns the one reply.
func reply(t *testing.T, c *Core, env testEnv, now int64, m proto.Message) *messages.JobReply {
	t.Helper()
	e := env.fake()
	c.Handle(now, client, m, env)
	c.Durable(e.lsn, nil, env)
	for _, s := range e.take() {
		if r, ok := s.m.(*messages.JobReply); ok && s.to == client {
			return r
		}
		e.sent = append(e.sent, s) // keep dispatches for the caller
	}
	t.Fatalf("no reply to %T", m)
	return nil
}

func TestRetriedUpdateAppliedOnce(t *testing.T) {
	c, e := newCore(1000)
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(7, 60_000), RequestId: 1})
	up := &messages.UpdateJob{Job: onceJob(7, 30_000), RequestId: 2}
	r1 := reply(t, c, e, 1100, up)
	r2 := reply(t, c, e, 1500, up) // the retry of a call whose reply was lost
	if r1.Error != nil || r2.Error != nil || r1.Job.Version != 2 || r2.Job.Version != 2 {
		t.Fatalf("retried update: %v / %v, want version 2 both times", r1, r2)
	}
	if r2.Job.NextDueMs != r1.Job.NextDueMs {
		t.Fatalf("the retry re-armed the job: due %d, then %d", r1.Job.NextDueMs, r2.Job.NextDueMs)
	}
	// A fresh call with the same definition is a new update.
	if r := reply(t, c, e, 1600, &messages.UpdateJob{Job: onceJob(7, 30_000), RequestId: 3}); r.Job.Version != 3 {
		t.Fatalf("a new request was taken for a retry: version %d", r.Job.Version)
	}
}

func TestRetriedTriggerStartsOneRun(t *testing.T) {
	c, e := newCore(1000)
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(7, 3_600_000), RequestId: 1})
	tr := &messages.TriggerJob{App: "app", Id: 7, RequestId: 9}
	reply(t, c, e, 1100, tr)
	reply(t, c, e, 1101, tr)
	if n := c.InFlight(); n != 1 {
		t.Fatalf("a retried trigger started %d runs, want 1", n)
	}
}

func TestLateCreateAfterDeleteDoesNotResurrect(t *testing.T) {
	c, e := newCore(1000)
	cr := &messages.CreateJob{Job: onceJob(7, 60_000), RequestId: 1}
	reply(t, c, e, 1000, cr)
	del := &messages.DeleteJob{App: "app", Id: 7, RequestId: 2}
	if r := reply(t, c, e, 1100, del); r.Error != nil {
		t.Fatal(r.Error)
	}
	if r := reply(t, c, e, 1200, del); r.Error != nil { // a retried delete succeeds
		t.Fatalf("retried delete: %v", r.Error)
	}
	r := reply(t, c, e, 1300, cr) // the create, delivered late
	if r.Error.GetCode() != messages.Code_NOT_FOUND || c.Jobs() != 0 {
		t.Fatalf("late create: %v, %d jobs; want NOT_FOUND and none", r, c.Jobs())
	}
	// The window survives a restart: from the journal and from a snapshot.
	for _, fromSnap := range []bool{false, true} {
		c2 := New(Config{Shard: c.Shard()}, 2000, 1)
		if fromSnap {
			if err := c2.LoadSnapshot(c.Snapshot(), e.lsn); err != nil {
				t.Fatal(err)
			}
		} else {
			for _, rec := range e.log {
				if err := c2.Replay(rec); err != nil {
					t.Fatal(err)
				}
			}
		}
		e2 := &fakeEnv{lsn: e.lsn}
		c2.Recovered(2000, e.lsn, e2)
		if r := reply(t, c2, e2, 2000, cr); r.Error.GetCode() != messages.Code_NOT_FOUND || c2.Jobs() != 0 {
			t.Fatalf("late create after restart (snapshot %v): %v", fromSnap, r)
		}
		if c2.RequestWindow() != c.RequestWindow() {
			t.Fatalf("window after restart (snapshot %v): %d ids, want %d", fromSnap, c2.RequestWindow(), c.RequestWindow())
		}
	}
	// A user re-creating the id with a new request is not a duplicate.
	if r := reply(t, c, e, 1400, &messages.CreateJob{Job: onceJob(7, 60_000), RequestId: 3}); r.Error != nil || c.Jobs() != 1 {
		t.Fatalf("re-create with a new request: %v", r)
	}
}

func TestRequestWindowBounded(t *testing.T) {
	var w reqWindow
	for i := int64(1); i <= MaxRequestWindow+10; i++ {
		w.add(i, i, 0)
	}
	if w.len() != MaxRequestWindow {
		t.Fatalf("window holds %d, want the bound %d", w.len(), MaxRequestWindow)
	}
	if _, ok := w.has(1); ok {
		t.Fatal("the oldest id stayed past the bound")
	}
	w.add(MaxRequestWindow+100, 1, RequestWindowMs+1) // time passes: everything older goes
	if w.len() != 1 {
		t.Fatalf("after the window's time: %d ids, want 1", w.len())
	}
}

// TestRequestWindowMatchesModel checks the window against a plain model (first
// entry kept, the oldest let out past the size or the age) over adds and lookups
// mixed the ways the shard mixes them: a lookup that misses and then the add of its
// own id (which skips the add's lookup), several adds of one id (a purge's records),
// a miss followed by another id's add, and ids coming back after they left.
func TestRequestWindowMatchesModel(t *testing.T) {
	type entry struct{ jobID, atMs int64 }
	model := map[int64]entry{}
	var order []int64
	modelAdd := func(id, jobID, at int64) {
		if _, ok := model[id]; ok || id == 0 {
			return
		}
		model[id] = entry{jobID, at}
		order = append(order, id)
		for len(order) > 0 && (len(model) > MaxRequestWindow || model[order[0]].atMs < at-RequestWindowMs) {
			delete(model, order[0])
			order = order[1:]
		}
	}
	var w reqWindow
	rng := rand.New(rand.NewPCG(1, 2))
	at, next := int64(1_000), int64(1)
	for i := range 3 * MaxRequestWindow {
		at += int64(rng.IntN(3))
		if i == MaxRequestWindow/2 || i == 2*MaxRequestWindow {
			at += RequestWindowMs / 2 // the oldest half leaves by age later
		}
		var id int64
		switch r := rng.IntN(10); {
		case r < 6: // a new id
			id, next = next, next+1
		case r < 8: // a recent one, maybe still in the window
			id = max(1, next-1-int64(rng.IntN(50)))
		default: // an old one, likely out of it
			id = max(1, next-int64(rng.IntN(int(next))))
		}
		got, gotOK := w.has(id)
		want, wantOK := model[id]
		if gotOK != wantOK || (gotOK && (got.jobID != want.jobID || got.atMs != want.atMs)) {
			t.Fatalf("step %d: has(%d) = %v %v, model %v %v", i, id, got, gotOK, want, wantOK)
		}
		switch r := rng.IntN(10); {
		case r < 7: // the command's own record(s)
			for range 1 + rng.IntN(2) {
				w.add(id, int64(i), at)
				modelAdd(id, int64(i), at)
			}
		case r < 9: // another id's record before it (or none)
			other := max(1, next-int64(rng.IntN(10)))
			w.add(other, int64(i), at)
			modelAdd(other, int64(i), at)
			w.add(id, int64(i), at)
			modelAdd(id, int64(i), at)
		default: // the command was refused: nothing added
		}
		if w.seen.len() != len(model) {
			t.Fatalf("step %d: window holds %d, model %d", i, w.seen.len(), len(model))
		}
	}
	es := w.entries()
	if len(es) != len(order) || len(es) == 0 {
		t.Fatalf("%d entries, model %d", len(es), len(order))
	}
	for i, e := range es {
		if m := model[order[i]]; e.RequestId != order[i] || e.JobId != m.jobID || e.AtMs != m.atMs {
			t.Fatalf("entry %d: %v, model %d %v", i, e, order[i], m)
		}
	}
}

// TestRunIDKeepsDue: a trigger in the same millisecond as a due fire gets its own run
// id, and neither run's due moves (a moved due could be ahead of the clock).
func TestRunIDKeepsDue(t *testing.T) {
	c, e := newCore(1000)
	reply(t, c, e, 1000, &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 2000}}, RequestId: 1})
	e.take()
	c.Tick(2000, e) // the fire, due 2000
	c.Durable(e.lsn, nil, e)
	reply(t, c, e, 2000, &messages.TriggerJob{App: "app", Id: 7, RequestId: 2}) // a trigger in the same ms
	ids := map[string]bool{}
	for _, s := range e.take() {
		if d, ok := s.m.(*messages.Dispatch); ok {
			if d.DueMs != 2000 {
				t.Fatalf("run %s due %d, want 2000", d.RunId, d.DueMs)
			}
			ids[d.RunId] = true
		}
	}
	if len(ids) != 2 || c.InFlight() != 2 {
		t.Fatalf("dispatched runs %v, in flight %d; want two runs, both due 2000", ids, c.InFlight())
	}
}

// A window that logged its adds during recovery and entered them when the shard went
// live is the window the adds one by one leave: over more than 2×MaxRequestWindow
// adds, with ids repeated a few at a time (a purge's records share one) and times
// that step past RequestWindowMs.
func TestRequestWindowDeferredMatches(t *testing.T) {
	var exact reqWindow
	deferred := reqWindow{deferring: true}
	at := int64(1_000)
	for i := int64(1); i <= 2*MaxRequestWindow+50_000; i++ {
		id := i
		if i%7 == 0 {
			id = i - 1 // the previous add's id again
		}
		at += i % 3
		if i == MaxRequestWindow+10 {
			at += RequestWindowMs + 1 // everything before leaves by age
		}
		exact.add(id, i, at)
		deferred.add(id, i, at)
		if n := deferred.deferred.n; n != int(min(i, 2*MaxRequestWindow)) && (n < 2*MaxRequestWindow || n >= 2*MaxRequestWindow+2*deferBlock) {
			t.Fatalf("after %d adds the log holds %d", i, n)
		}
	}
	if n := deferred.deferred.n; deferred.seen.len() != 0 || n < 2*MaxRequestWindow || n >= 2*MaxRequestWindow+2*deferBlock {
		t.Fatalf("deferring: %d entered, %d logged", deferred.seen.len(), n)
	}
	held := 0
	for i, b := range deferred.deferred.blocks {
		if cap(b) != deferBlock || (i < len(deferred.deferred.blocks)-1 && len(b) != deferBlock) {
			t.Fatalf("block %d: %d of %d, want full blocks of %d but the last", i, len(b), cap(b), deferBlock)
		}
		held += len(b)
	}
	if last := deferred.deferred.blocks[len(deferred.deferred.blocks)-1]; held != deferred.deferred.n || last[len(last)-1].jobID != 2*MaxRequestWindow+50_000 {
		t.Fatalf("the log holds %d (counted %d), its newest is job %d", held, deferred.deferred.n, last[len(last)-1].jobID)
	}
	small := reqWindow{deferring: true}
	for i := int64(1); i <= 20; i++ {
		small.add(i, i, at)
	}
	if bs := small.deferred.blocks; len(bs) != 1 || len(bs[0]) != 20 || cap(bs[0]) > 64 {
		t.Fatalf("20 adds logged in %d blocks, the first %d of %d", len(bs), len(bs[0]), cap(bs[0]))
	}
	a, b := exact.entries(), deferred.entries()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("%d entries exact, %d deferred", len(a), len(b))
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			t.Fatalf("entry %d: exact %v, deferred %v", i, a[i], b[i])
		}
	}
	if _, ok := deferred.has(2*MaxRequestWindow + 50_000); !ok || deferred.deferring {
		t.Fatal("the settled window does not answer")
	}
}

// BenchmarkRequestWindowDeferred logs the request ids of a million-record replay
// (one per create) into a recovering shard's window: what the log's growth costs.
func BenchmarkRequestWindowDeferred(b *testing.B) {
	const adds = 1_000_000
	for range b.N {
		w := reqWindow{deferring: true}
		for i := int64(1); i <= adds; i++ {
			w.add(i, i, 1_000+i)
		}
		if w.deferred.n < 2*MaxRequestWindow {
			b.Fatalf("logged %d", w.deferred.n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/adds, "ns/add")
}

// BenchmarkRequestWindowLive is what a live create costs the window once it is full:
// a lookup that misses, then the add of the create's record, which lets the oldest out.
func BenchmarkRequestWindowLive(b *testing.B) {
	w := reqWindow{}
	id := int64(1)
	for ; id <= MaxRequestWindow; id++ {
		w.add(id, id, 1_000+id)
	}
	b.ResetTimer()
	for range b.N {
		if _, ok := w.has(id); ok {
			b.Fatalf("id %d seen", id)
		}
		w.add(id, id, 1_000+id)
		id++
	}
	b.StopTimer()
	if w.seen.len() != MaxRequestWindow {
		b.Fatalf("window holds %d", w.seen.len())
	}
}
