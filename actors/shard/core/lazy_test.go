package core

import (
	"slices"
	"testing"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// lazyEnv is a fakeEnv that is a LazyAppender: it records the deadline each
// append was given (0: Append, at once) and the SyncNow calls.
type lazyEnv struct {
	fakeEnv
	by    []int64
	syncs int
}

func (e *lazyEnv) Append(es []persistence.Entry) (uint64, error) {
	e.by = append(e.by, 0)
	return e.fakeEnv.Append(es)
}

func (e *lazyEnv) AppendBy(es []persistence.Entry, byMs int64) (uint64, error) {
	if byMs <= 0 {
		panic("AppendBy with no deadline")
	}
	e.by = append(e.by, byMs)
	return e.fakeEnv.Append(es)
}

func (e *lazyEnv) SyncNow() { e.syncs++ }

// lastBy is the deadline of the latest append, and forgets the others.
func (e *lazyEnv) lastBy(t *testing.T) int64 {
	t.Helper()
	if len(e.by) == 0 {
		t.Fatal("no append")
	}
	w := e.by[len(e.by)-1]
	e.by = nil
	return w
}

func newLazyCore(now, armMs, lazyMs int64) (*Core, *lazyEnv) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, ArmMs: armMs, LazySyncMs: lazyMs}, now, 1)
	e := &lazyEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	e.take()
	e.by = nil
	return c, e
}

func onceAt(id, atMs int64) *messages.Job {
	j := onceJob(id, 0)
	j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: atMs}
	return j
}

// createDurable creates j at now and makes it durable, forgetting what was sent
// and appended.
func createDurable(c *Core, e *lazyEnv, now int64, j *messages.Job) {
	c.Handle(now, client, &messages.CreateJob{Job: j}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	e.by = nil
}

// Only steps whose messages are all results' acknowledgements or fires armed ahead
// of their due may wait for their sync (Config.LazySyncMs), an ack LazySyncMs and
// an armed fire until its due less ArmMs-LazySyncMs; a create's reply and an
// unarmed dispatch go at once.
func TestLazySyncOnlyForAcksAndArmedFires(t *testing.T) {
	c, e := newLazyCore(1000, 5, 2)
	c.Handle(1000, client, &messages.CreateJob{Job: onceAt(7, 1050)}, e)
	if by := e.lastBy(t); by != 0 {
		t.Fatalf("a create's step may wait until %d for its sync", by)
	}
	c.Durable(e.lsn, nil, e)
	e.take()

	c.Tick(1045, e) // armed 5 ms ahead: may wait until 1050-(5-2)
	if by := e.lastBy(t); by != 1047 {
		t.Fatalf("an armed fire's step: by %d, want 1047", by)
	}
	c.Durable(e.lsn, nil, e)
	c.Tick(1050, e)
	d := dispatchesIn(e.take())
	if len(d) != 1 {
		t.Fatalf("at the due: %v", d)
	}
	c.Handle(1051, wref, &messages.RunResult{RunId: d[0].RunId, Attempt: d[0].Attempt, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED, Worker: wref}, e)
	if by := e.lastBy(t); by != 1053 {
		t.Fatalf("a result's step: by %d, want 1053", by)
	}
	if s := e.take(); len(s) != 0 {
		t.Fatalf("the ack went before its record was durable: %v", s)
	}
	c.Durable(e.lsn, nil, e)
	if s := e.take(); len(s) != 1 {
		t.Fatalf("after durable: %v, want the ack", s)
	} else if _, ok := s[0].m.(*messages.ResultAck); !ok {
		t.Fatalf("after durable: %v, want the ack", s)
	}

	for _, tc := range []struct {
		what              string
		id, at, due, tick int64
		wantBy            int64
	}{
		// Armed a little late (the tick came at 1096 for a due at 1100): the due
		// less the sync's budget comes before the ack's deadline would.
		{"a fire armed 4 ms ahead", 8, 1060, 1100, 1096, 1097},
		// Armed 2 ms before its due (created that late): no time to wait.
		{"a fire armed 2 ms before its due", 9, 2000, 2002, 2000, 0},
		// A fire at its due (not armed ahead: the shard ticked late) is urgent.
		{"an unarmed fire", 10, 3000, 3010, 3010, 0},
	} {
		createDurable(c, e, tc.at, onceAt(tc.id, tc.due))
		c.Tick(tc.tick, e)
		if by := e.lastBy(t); by != tc.wantBy {
			t.Fatalf("%s: may wait until %d, want %d", tc.what, by, tc.wantBy)
		}
		c.Durable(e.lsn, nil, e)
		c.Tick(tc.due, e)
		e.take()
	}
}

// A reply queued behind records that wait lazily, in a step with no records of its
// own, asks for a sync (SyncNow) instead of waiting out their deadline.
func TestLazySyncReplyBehindLazyRecords(t *testing.T) {
	c, e := newLazyCore(1000, 5, 2)
	createDurable(c, e, 1000, onceAt(7, 1050))
	c.Tick(1045, e) // lazy: the armed fire's record
	if by := e.lastBy(t); by == 0 {
		t.Fatal("the armed fire's step did not wait lazily")
	}
	c.Handle(1046, client, &messages.GetJob{App: "app", Id: 7}, e) // nothing to journal
	if e.syncs != 1 {
		t.Fatalf("a read behind a lazy record asked for %d syncs, want 1", e.syncs)
	}
	if len(e.by) != 0 {
		t.Fatalf("a read appended: %v", e.by)
	}
	if s := e.take(); len(s) != 0 {
		t.Fatalf("the reply went before the record ahead of it was durable: %v", s)
	}
	c.Durable(e.lsn, nil, e)
	if s := e.take(); len(s) != 1 {
		t.Fatalf("after durable: %v, want the reply", s)
	}
	c.Handle(1047, client, &messages.GetJob{App: "app", Id: 7}, e) // all durable: nothing to ask
	if e.syncs != 1 {
		t.Fatalf("a read with nothing unsynced asked for a sync (%d)", e.syncs)
	}
}

// A step that sends nothing syncs at once, and so does a shard with LazySyncMs 0.
// (A frozen shard's steps journal nothing but its handoff's records, which the
// server's journal sends through Append whatever it is asked: actors/server.)
func TestLazySyncOffAndQuietSteps(t *testing.T) {
	c, e := newLazyCore(1000, 5, 0)
	c.Handle(1000, client, &messages.CreateJob{Job: onceAt(7, 1050)}, e)
	c.Durable(e.lsn, nil, e)
	c.Tick(1045, e)
	if slices.ContainsFunc(e.by, func(w int64) bool { return w != 0 }) {
		t.Fatalf("LazySyncMs 0 waited: %v", e.by)
	}

	c = New(Config{Shard: route.Root("app"), ArmMs: 5, LazySyncMs: 2}, 1000, 1)
	e = &lazyEnv{}
	c.Open(e) // journals its opening, sends nothing
	if len(e.by) != 1 || e.by[0] != 0 {
		t.Fatalf("a step sending nothing: %v", e.by)
	}
}
