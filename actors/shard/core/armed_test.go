package core

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

func newArmedCore(now, armMs int64) (*Core, *fakeEnv) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, ArmMs: armMs}, now, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	e.take()
	return c, e
}

func dispatchesIn(s []sentMsg) []*messages.Dispatch {
	var out []*messages.Dispatch
	for _, m := range s {
		if d, ok := m.m.(*messages.Dispatch); ok {
			out = append(out, d)
		}
	}
	return out
}

// An armed fire is journaled ArmMs ahead and sent at its due, not before, and only
// once durable.
func TestArmedFireJournaledAheadSentAtDue(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	if at, ok := c.NextWake(); !ok || at != 1045 {
		t.Fatalf("next wake %d %v, want 1045 (due 1050 - ArmMs 5)", at, ok)
	}
	n := len(e.log)
	c.Tick(1045, e)
	if len(e.log) != n+1 || messages.RecordType(e.log[n].Type) != messages.RecordType_RUN_DISPATCHED {
		t.Fatalf("the fire was not journaled at its arming: %d records", len(e.log)-n)
	}
	st := decodeRunState(t, e.log[n])
	if st.DueMs != 1050 || st.DispatchedMs != 1050 {
		t.Fatalf("armed run journaled with due %d, dispatched %d; want both 1050", st.DueMs, st.DispatchedMs)
	}
	c.Durable(e.lsn, nil, e)
	if d := dispatchesIn(e.take()); len(d) != 0 {
		t.Fatalf("an armed dispatch went 5 ms early: %v", d)
	}
	if at, ok := c.NextWake(); !ok || at != 1050 {
		t.Fatalf("next wake %d %v, want the armed due 1050", at, ok)
	}
	c.Tick(1049, e)
	if d := dispatchesIn(e.take()); len(d) != 0 {
		t.Fatalf("dispatched 1 ms early: %v", d)
	}
	c.Tick(1050, e)
	d := dispatchesIn(e.take())
	if len(d) != 1 || d[0].RunId != "7:1050" || d[0].DispatchedMs != 1050 {
		t.Fatalf("at the due: %v", d)
	}
	c.Tick(2000, e)
	if d := dispatchesIn(e.take()); len(d) != 0 {
		t.Fatalf("dispatched twice: %v", d)
	}
}

// An armed dispatch whose record is not yet durable at the due waits for it.
func TestArmedFireStillWaitsForDurability(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Tick(1046, e)
	c.Tick(1050, e)
	if d := dispatchesIn(e.take()); len(d) != 0 {
		t.Fatalf("sent before its record was durable: %v", d)
	}
	c.Durable(e.lsn, nil, e)
	if d := dispatchesIn(e.take()); len(d) != 1 {
		t.Fatalf("not sent once durable at its due: %v", d)
	}
}

// A delete that comes between the arming and the due is applied after the fire:
// its reply never precedes the dispatch, and nothing fires after it.
func TestDeleteDuringArmingWaitsForTheFire(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(8, 500)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Tick(1045, e)
	c.Durable(e.lsn, nil, e)
	c.Handle(1047, client, &messages.DeleteJob{App: "app", Id: 7, RequestId: 11}, e)
	c.Handle(1047, client, &messages.PauseJob{App: "app", Id: 7, RequestId: 12}, e)
	c.Handle(1047, client, &messages.DeleteJob{App: "app", Id: 8, RequestId: 13}, e) // no armed run: at once
	c.Durable(e.lsn, nil, e)
	s := e.take()
	if len(s) != 1 || s[0].to != client {
		t.Fatalf("before the due: %v (want only job 8's delete reply)", s)
	}
	if len(c.parked) != 2 {
		t.Fatalf("%d commands parked, want 2", len(c.parked))
	}
	c.Tick(1050, e)
	c.Durable(e.lsn, nil, e)
	s = e.take()
	if len(s) != 3 {
		t.Fatalf("at the due: %d messages %v, want the dispatch then two replies", len(s), s)
	}
	if d, ok := s[0].m.(*messages.Dispatch); !ok || d.JobId != 7 {
		t.Fatalf("first at the due: %v, want job 7's dispatch", s[0].m)
	}
	for _, m := range s[1:] {
		if m.to != client {
			t.Fatalf("after the dispatch: %v", m)
		}
	}
	if r := s[2].m.(*messages.JobReply); r.Error.GetCode() != messages.Code_NOT_FOUND {
		t.Fatalf("pause after the delete: %v, want NOT_FOUND", r)
	}
	if len(c.parked) != 0 {
		t.Fatalf("%d commands still parked", len(c.parked))
	}
}

// A run journaled armed and recovered before its due goes at its due.
func TestRecoveredArmedRunWaitsForItsDue(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Tick(1045, e)
	c.Durable(e.lsn, nil, e)
	log := e.log

	r := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, ArmMs: 5}, 1046, 1)
	for _, rec := range log {
		if err := r.Replay(rec); err != nil {
			t.Fatal(err)
		}
	}
	e2 := &fakeEnv{lsn: e.lsn}
	r.SetWorkers(1046, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e2)
	r.Recovered(1046, e.lsn, e2)
	r.Durable(e2.lsn, nil, e2)
	if d := dispatchesIn(e2.take()); len(d) != 0 {
		t.Fatalf("a recovered armed run went before its due: %v", d)
	}
	r.Tick(1050, e2)
	r.Durable(e2.lsn, nil, e2)
	if d := dispatchesIn(e2.take()); len(d) != 1 || d[0].RunId != "7:1050" {
		t.Fatalf("at its due: %v", d)
	}
}

func decodeRunState(t *testing.T, r persistence.Record) *messages.RunState {
	t.Helper()
	st := &messages.RunState{}
	if err := proto.Unmarshal(r.Payload, st); err != nil {
		t.Fatalf("record %d: %v", r.LSN, err)
	}
	return st
}

// A shard frozen for a handoff never sends its armed dispatches (the new owner has
// the run) and answers the commands parked behind them with its refusal.
func TestFrozenShardKeepsArmedDispatches(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Tick(1045, e)
	c.Durable(e.lsn, nil, e)
	c.Handle(1046, client, &messages.DeleteJob{App: "app", Id: 7, RequestId: 11}, e)
	if len(c.parked) != 1 {
		t.Fatalf("%d parked, want the delete", len(c.parked))
	}
	c.Freeze(&messages.Error{Code: messages.Code_NOT_OWNER, Message: "moved"})
	c.Tick(1050, e)
	c.Durable(e.lsn, nil, e)
	s := e.take()
	if d := dispatchesIn(s); len(d) != 0 {
		t.Fatalf("a frozen shard sent its armed dispatch: %v", d)
	}
	if len(s) != 1 || s[0].m.(*messages.JobReply).Error.GetCode() != messages.Code_NOT_OWNER {
		t.Fatalf("the parked delete got %v, want NOT_OWNER", s)
	}
	if at, ok := c.NextWake(); ok && at <= 1050 {
		t.Fatalf("a frozen shard asks to wake at %d for a dispatch that never goes", at)
	}
}
