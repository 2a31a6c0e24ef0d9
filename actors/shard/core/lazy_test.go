package core

import (
	"slices"
	"testing"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// lazyEnv is a fakeEnv that is a LazyAppender: it records how long each append
// was allowed to wait for its sync (0: Append).
type lazyEnv struct {
	fakeEnv
	within []int64
}

func (e *lazyEnv) Append(es []persistence.Entry) (uint64, error) {
	e.within = append(e.within, 0)
	return e.fakeEnv.Append(es)
}

func (e *lazyEnv) AppendWithin(es []persistence.Entry, withinMs int64) (uint64, error) {
	if withinMs <= 0 {
		panic("AppendWithin with nothing to wait")
	}
	e.within = append(e.within, withinMs)
	return e.fakeEnv.Append(es)
}

// lastWithin is the wait of the latest append, and forgets the others.
func (e *lazyEnv) lastWithin(t *testing.T) int64 {
	t.Helper()
	if len(e.within) == 0 {
		t.Fatal("no append")
	}
	w := e.within[len(e.within)-1]
	e.within = nil
	return w
}

func newLazyCore(now, armMs, lazyMs int64) (*Core, *lazyEnv) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, ArmMs: armMs, LazySyncMs: lazyMs}, now, 1)
	e := &lazyEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	e.take()
	e.within = nil
	return c, e
}

// Only steps whose messages are all results' acknowledgements or fires armed ahead
// of their due may wait for their sync (Config.LazySyncMs); a create's reply, an
// unarmed dispatch, a step that sends nothing, and a frozen shard's steps go at once.
func TestLazySyncOnlyForAcksAndArmedFires(t *testing.T) {
	c, e := newLazyCore(1000, 5, 2)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	if w := e.lastWithin(t); w != 0 {
		t.Fatalf("a create's step waited %d ms for its sync", w)
	}
	c.Durable(e.lsn, nil, e)
	e.take()

	c.Tick(1045, e) // armed 5 ms ahead: may wait until 1050-(5-2)
	if w := e.lastWithin(t); w != 2 {
		t.Fatalf("an armed fire's step: within %d, want 2", w)
	}
	c.Durable(e.lsn, nil, e)
	c.Tick(1050, e)
	d := dispatchesIn(e.take())
	if len(d) != 1 {
		t.Fatalf("at the due: %v", d)
	}
	c.Handle(1051, wref, &messages.RunResult{RunId: d[0].RunId, Attempt: d[0].Attempt, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED, Worker: wref}, e)
	if w := e.lastWithin(t); w != 2 {
		t.Fatalf("a result's step: within %d, want 2", w)
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

	// Armed later than ArmMs-LazySyncMs before its due (a job created 2 ms before
	// it): no time to wait.
	c.Handle(2000, client, &messages.CreateJob{Job: onceJob(8, 2)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	e.within = nil
	c.Tick(2000, e)
	if w := e.lastWithin(t); w != 0 {
		t.Fatalf("a fire armed 2 ms before its due waited %d ms", w)
	}
	c.Durable(e.lsn, nil, e)
	c.Tick(2002, e)
	e.take()

	// A fire at its due (not armed) is urgent.
	c.Handle(3000, client, &messages.CreateJob{Job: onceJob(9, 0)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	e.within = nil
	c.Tick(3000, e)
	if w := e.lastWithin(t); w != 0 {
		t.Fatalf("an unarmed fire waited %d ms", w)
	}
}

// A step that sends nothing syncs at once, and so does a shard with LazySyncMs 0
// or an Env that is not a LazyAppender.
func TestLazySyncOffAndQuietSteps(t *testing.T) {
	c, e := newLazyCore(1000, 5, 0)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Durable(e.lsn, nil, e)
	c.Tick(1045, e)
	if slices.ContainsFunc(e.within, func(w int64) bool { return w != 0 }) {
		t.Fatalf("LazySyncMs 0 waited: %v", e.within)
	}

	c = New(Config{Shard: route.Root("app"), ArmMs: 5, LazySyncMs: 2}, 1000, 1)
	e = &lazyEnv{}
	c.Open(e) // journals its opening, sends nothing
	if len(e.within) != 1 || e.within[0] != 0 {
		t.Fatalf("a step sending nothing: %v", e.within)
	}
}
