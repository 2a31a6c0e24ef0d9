package core

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

func newArmedCore(now, armMs int64) (*Core, *fakeEnv) {
	c, e := newArmedCoreNoWorker(now, armMs)
	c.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	e.take()
	return c, e
}

// newArmedCoreNoWorker is an open shard that knows no worker yet.
func newArmedCoreNoWorker(now, armMs int64) (*Core, *fakeEnv) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, ArmMs: armMs}, now, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	return c, e
}

// armOnceAt1050 creates one-shot job 7 at 1000, due at 1050, and arms it at 1045
// (durable, everything sent taken); it returns the job as created.
func armOnceAt1050(c *Core, e *fakeEnv) *messages.Job {
	j := onceJob(7, 0)
	j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 1050}
	c.Handle(1000, client, &messages.CreateJob{Job: j}, e)
	c.Durable(e.lsn, nil, e)
	c.Tick(1045, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	return j
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

// HasArmed reports a run that is armed and waits for its due, while the due wheel
// is empty: a shell that took the shard for idle (a snapshot's cadence) would stall
// the send.
func TestHasArmedWhileARunWaitsForItsDue(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	if c.HasArmed() {
		t.Fatal("armed runs on an empty shard")
	}
	armOnceAt1050(c, e)
	if _, ok := c.NextDue(); ok {
		t.Fatal("the armed job is still in the due wheel")
	}
	if !c.HasArmed() {
		t.Fatal("the run armed for 1050 is not reported")
	}
	c.Tick(1050, e)
	if d := dispatchesIn(e.take()); len(d) != 1 {
		t.Fatalf("at the due: %v", d)
	}
	if c.HasArmed() {
		t.Fatal("armed runs after the run went")
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

// An update that comes between the arming and the due follows the fire. A one-shot
// whose time it keeps (or moves earlier) has had its one fire: it is not fired again
// (the review of the armed fires found it fired twice, 7:1050 and 7:1050.2).
func TestUpdateDuringArmingDoesNotFireAgain(t *testing.T) {
	for _, atMs := range []int64{1050, 1020} {
		c, e := newArmedCore(1000, 5)
		j := armOnceAt1050(c, e)
		u := proto.Clone(j).(*messages.Job)
		u.Params, u.Schedule.AtMs = []byte("new"), atMs
		c.Handle(1047, client, &messages.UpdateJob{Job: u, RequestId: 21}, e)
		c.Tick(1050, e)
		c.Durable(e.lsn, nil, e)
		s := e.take()
		if d := dispatchesIn(s); len(d) != 1 || d[0].RunId != "7:1050" {
			t.Fatalf("at %d: at the due %v, want the one fire 7:1050", atMs, d)
		}
		if len(s) != 2 || s[1].m.(*messages.JobReply).Error != nil {
			t.Fatalf("at %d: the update's reply: %v", atMs, s)
		}
		for _, now := range []int64{1051, 1060, 2000} {
			c.Tick(now, e)
			c.Durable(e.lsn, nil, e)
			if d := dispatchesIn(e.take()); len(d) != 0 {
				t.Fatalf("at %d: fired again at %d: %v", atMs, now, d)
			}
		}
		c.Handle(2000, client, &messages.GetJob{App: "app", Id: 7}, e)
		got := e.take()[0].m.(*messages.JobReply).Job
		if string(got.Params) != "new" || got.Schedule.AtMs != atMs {
			t.Fatalf("at %d: the update was not applied: %v", atMs, got)
		}
	}
}

// An update that moves a one-shot later reschedules it: the armed fire went (the
// command came less than ArmMs before it) and the new time fires too.
func TestUpdateDuringArmingToLaterFiresAtTheNewTime(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	j := armOnceAt1050(c, e)
	u := proto.Clone(j).(*messages.Job)
	u.Schedule.AtMs = 1500
	c.Handle(1047, client, &messages.UpdateJob{Job: u, RequestId: 21}, e)
	c.Tick(1050, e)
	c.Durable(e.lsn, nil, e)
	if d := dispatchesIn(e.take()); len(d) != 1 || d[0].DueMs != 1050 {
		t.Fatalf("at the due: %v", d)
	}
	c.Tick(1495, e)
	c.Tick(1500, e)
	c.Durable(e.lsn, nil, e)
	if d := dispatchesIn(e.take()); len(d) != 1 || d[0].DueMs != 1500 {
		t.Fatalf("at the new time: %v", d)
	}
}

// A periodic job updated during an arming moves on past the due that fired: the
// cron instant is not fired twice (the command is handled in the due's millisecond).
func TestCronUpdateDuringArmingMovesPastTheFiredDue(t *testing.T) {
	c, e := newArmedCore(1500, 5)
	j := onceJob(7, 0)
	j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "* * * * * *", Tz: "UTC"}
	c.Handle(1500, client, &messages.CreateJob{Job: j}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Tick(1995, e)
	c.Durable(e.lsn, nil, e)
	u := proto.Clone(j).(*messages.Job)
	u.Params = []byte("new")
	c.Handle(1997, client, &messages.UpdateJob{Job: u, RequestId: 21}, e)
	c.Tick(2000, e)
	c.Durable(e.lsn, nil, e)
	if d := dispatchesIn(e.take()); len(d) != 1 || d[0].DueMs != 2000 {
		t.Fatalf("at the due: %v", d)
	}
	var dues []int64
	for now := int64(2001); now <= 3000; now++ {
		c.Tick(now, e)
		c.Durable(e.lsn, nil, e)
		for _, d := range dispatchesIn(e.take()) {
			dues = append(dues, d.DueMs)
		}
	}
	if len(dues) != 1 || dues[0] != 3000 {
		t.Fatalf("after the update the job fired at %v, want only 3000", dues)
	}
}

// A handoff that begins while commands are parked answers them (NOT_OWNER) at once;
// a journal failure answers them UNAVAILABLE.
func TestStoppingAnswersParkedCommands(t *testing.T) {
	for _, how := range []string{"handoff", "split", "journal"} {
		c, e := newArmedCore(1000, 5)
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
		c.Tick(1045, e)
		c.Durable(e.lsn, nil, e)
		e.take()
		c.Handle(1046, client, &messages.DeleteJob{App: "app", Id: 7, RequestId: 11}, e)
		if len(c.parked) != 1 {
			t.Fatalf("%s: %d parked, want the delete", how, len(c.parked))
		}
		want := messages.Code_NOT_OWNER
		switch how {
		case "handoff":
			c.BeginHandoff(&messages.Ref{Address: "t", Id: "server"}, e)
		case "split":
			c.BeginSplit(&messages.Ref{Address: "s", Id: "server"}, e)
		case "journal":
			c.Durable(0, errSync, e)
			want = messages.Code_UNAVAILABLE
		}
		c.Durable(e.lsn, nil, e)
		var got []sentMsg
		for _, m := range e.take() {
			if m.to == client {
				got = append(got, m)
			}
		}
		if len(got) != 1 || got[0].m.(*messages.JobReply).Error.GetCode() != want {
			t.Fatalf("%s: the parked delete got %v, want %v", how, got, want)
		}
		if len(c.parked) != 0 {
			t.Fatalf("%s: %d still parked", how, len(c.parked))
		}
	}
}

// A run dispatched while armed by something other than its fire (here a worker that
// joins after the arming found none) carries its due as its dispatch time, and its
// deadline counts from there.
func TestArmedRunDispatchedLaterCarriesItsDue(t *testing.T) {
	c, e := newArmedCoreNoWorker(1000, 5)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Tick(1045, e) // no worker: the run waits for one
	c.Durable(e.lsn, nil, e)
	e.take()
	c.SetWorkers(1046, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	c.Durable(e.lsn, nil, e)
	if d := dispatchesIn(e.take()); len(d) != 0 {
		t.Fatalf("sent before its due: %v", d)
	}
	c.Tick(1050, e)
	c.Durable(e.lsn, nil, e)
	d := dispatchesIn(e.take())
	if len(d) != 1 || d[0].DispatchedMs != 1050 {
		t.Fatalf("at the due: %v, want one dispatch stamped 1050", d)
	}
}

// A stopped shard asks for no wake-up: its Tick does nothing, so a wake-up at its
// wheels' next due would come back at once, over and over (the shell's timer).
func TestStoppedShardNeedsNoTick(t *testing.T) {
	for _, how := range []string{"handoff", "journal"} {
		c, e := newCore(1000)
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(8, 0)}, e)
		c.Durable(e.lsn, nil, e)
		c.Tick(1000, e) // job 8 runs: a deadline timer too
		c.Durable(e.lsn, nil, e)
		if _, ok := c.NextWake(); !ok {
			t.Fatalf("%s: a serving shard with a pending job needs a tick", how)
		}
		if how == "handoff" {
			c.BeginHandoff(&messages.Ref{Address: "t", Id: "server"}, e)
		} else {
			c.Durable(0, errSync, e)
		}
		if at, ok := c.NextWake(); ok {
			t.Fatalf("%s: a stopped shard asks for a tick at %d", how, at)
		}
	}
}

// A run armed with no worker to send it to (none yet, or none with credit) has no
// dispatch in the outbox, and is armed all the same: a command for its job waits
// for the due (the review found a one-shot updated then fired twice, and a pause
// acknowledged before a due that then fired).
func TestCommandWaitsForAnArmedRunWithoutWorker(t *testing.T) {
	for _, cmd := range []string{"update", "pause"} {
		c, e := newArmedCoreNoWorker(1000, 5)
		j := onceJob(7, 0)
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 1050}
		c.Handle(1000, client, &messages.CreateJob{Job: j}, e)
		c.Tick(1045, e) // armed; no worker
		c.Durable(e.lsn, nil, e)
		e.take()
		switch cmd {
		case "update":
			u := proto.Clone(j).(*messages.Job)
			u.Params = []byte("new")
			c.Handle(1047, client, &messages.UpdateJob{Job: u, RequestId: 21}, e)
		case "pause":
			c.Handle(1047, client, &messages.PauseJob{App: "app", Id: 7, RequestId: 21}, e)
		}
		c.Durable(e.lsn, nil, e)
		if s := e.take(); len(s) != 0 || len(c.parked) != 1 {
			t.Fatalf("%s: answered before the armed run's due: %v (parked %d)", cmd, s, len(c.parked))
		}
		if at, ok := c.NextWake(); !ok || at > 1050 {
			t.Fatalf("%s: next wake %d %v, want by the due 1050", cmd, at, ok)
		}
		c.SetWorkers(1048, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
		var sent []sentMsg
		for now := int64(1048); now <= 2000; now++ {
			c.Tick(now, e)
			c.Durable(e.lsn, nil, e)
			sent = append(sent, e.take()...)
		}
		d := dispatchesIn(sent)
		if len(d) != 1 || d[0].RunId != "7:1050" {
			t.Fatalf("%s: dispatches %v, want the one fire 7:1050", cmd, d)
		}
		if len(sent) != 2 || sent[1].to != client {
			t.Fatalf("%s: %v, want the dispatch, then the reply", cmd, sent)
		}
	}
}

// A parked update to a one-shot with a delay counts the delay from when it came:
// with delay 0 it is due before the armed fire, which is its one fire, however late
// the shard's tick at the due is.
func TestParkedDelayCountsFromArrival(t *testing.T) {
	for _, tickAt := range []int64{1050, 1051, 1060} {
		c, e := newArmedCore(1000, 5)
		j := armOnceAt1050(c, e)
		u := proto.Clone(j).(*messages.Job)
		u.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 0}
		c.Handle(1047, client, &messages.UpdateJob{Job: u, RequestId: 21}, e)
		var n int
		for _, now := range []int64{tickAt, 1100, 2000} {
			c.Tick(now, e)
			c.Durable(e.lsn, nil, e)
			n += len(dispatchesIn(e.take()))
		}
		if n != 1 {
			t.Fatalf("tick at %d: %d dispatches, want the one fire", tickAt, n)
		}
	}
}

// A command for a job whose period is no longer than ArmMs is answered: such a job
// always had a run armed ahead of the clock, and the command waited for ever (the
// third review). Ticks follow NextWake, as the shell's timer does; nothing may be
// dispatched for the job after the delete's reply, and the shard must not spin.
func TestCommandForAFastPeriodicJobIsAnswered(t *testing.T) {
	for every := int64(1); every <= 7; every++ {
		for _, cmd := range []string{"delete", "pause", "update"} {
			c, e := newArmedCoreNoWorker(1000, 5)
			c.SetWorkers(1000, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 100_000}}, e)
			j := onceJob(7, 0)
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: every}
			c.Handle(1000, client, &messages.CreateJob{Job: j}, e)
			c.Durable(e.lsn, nil, e)
			e.take()
			now, sameMs, sentCmd := int64(1000), 0, false
			var replyAt int64
			var after []int64 // dues dispatched after the reply
			for now < 1500 {
				at, ok := c.NextWake()
				if !ok {
					if !sentCmd {
						t.Fatalf("every %d, %s: no wake-up at %d", every, cmd, now)
					}
					break // nothing left to do (deleted)
				}
				if at > now {
					now, sameMs = at, 0
				} else if sameMs++; sameMs > 50 {
					t.Fatalf("every %d, %s: the shard spins at %d (wake-up %d)", every, cmd, now, at)
				}
				if !sentCmd && now >= 1100 {
					sentCmd = true
					var m proto.Message
					switch cmd {
					case "delete":
						m = &messages.DeleteJob{App: "app", Id: 7, RequestId: 21}
					case "pause":
						m = &messages.PauseJob{App: "app", Id: 7, RequestId: 21}
					case "update":
						u := proto.Clone(j).(*messages.Job)
						u.Params = []byte("new")
						m = &messages.UpdateJob{Job: u, RequestId: 21}
					}
					c.Handle(now, client, m, e)
				}
				c.Tick(now, e)
				c.Durable(e.lsn, nil, e)
				for _, s := range e.take() {
					switch x := s.m.(type) {
					case *messages.JobReply:
						if x.Error != nil {
							t.Fatalf("every %d, %s: %v", every, cmd, x.Error)
						}
						replyAt = now
					case *messages.Dispatch:
						if replyAt != 0 {
							after = append(after, x.DueMs)
						}
						if cmd == "update" && replyAt != 0 && string(x.Params) != "new" {
							t.Fatalf("every %d: run due %d went with the old params after the update's reply", every, x.DueMs)
						}
					}
				}
			}
			if replyAt == 0 || replyAt > 1100+5+every+1 {
				t.Fatalf("every %d, %s: the command sent at 1100 was answered at %d", every, cmd, replyAt)
			}
			if cmd != "update" && len(after) > 0 {
				t.Fatalf("every %d, %s: dispatched %v after the reply", every, cmd, after)
			}
			if cmd == "update" && len(after) == 0 {
				t.Fatalf("every %d: the job stopped firing after the update", every)
			}
		}
	}
}

// A command parked behind an armed run that then goes another way than its due
// wakes the shard at once: here a shard recovered (no worker yet) with a run the
// previous owner armed and sent, whose result comes back before the due on this
// shard's clock.
func TestParkedCommandReadyWakesTheShard(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Tick(1045, e)
	c.Durable(e.lsn, nil, e)

	r := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, ArmMs: 5}, 1046, 1)
	for _, rec := range e.log {
		if err := r.Replay(rec); err != nil {
			t.Fatal(err)
		}
	}
	e2 := &fakeEnv{lsn: e.lsn}
	r.Recovered(1046, e.lsn, e2) // no worker: no dispatch in the outbox
	r.Handle(1046, client, &messages.DeleteJob{App: "app", Id: 7, RequestId: 21}, e2)
	if len(r.parked) != 1 {
		t.Fatalf("%d parked, want the delete behind the armed run", len(r.parked))
	}
	r.Handle(1047, wref, &messages.RunResult{RunId: "7:1050", JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED, WorkerId: "w1", Worker: wref}, e2)
	r.Durable(e2.lsn, nil, e2)
	e2.take()
	if at, ok := r.NextWake(); !ok || at > 1047 {
		t.Fatalf("next wake %d %v, want now (1047): the delete can be answered", at, ok)
	}
	r.Tick(1047, e2)
	r.Durable(e2.lsn, nil, e2)
	if s := e2.take(); len(s) != 1 || s[0].m.(*messages.JobReply).Error != nil {
		t.Fatalf("the delete got %v", s)
	}
}

// After the clock steps back, a dispatch that was due is not held again: a delete
// handled meanwhile must not have its reply overtake it (the fourth review).
func TestClockStepBackDoesNotReArm(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Handle(1100, client, &messages.TriggerJob{App: "app", Id: 0}, e) // (not found: a reply, nothing else)
	c.Handle(1100, client, &messages.CreateJob{Job: onceJob(7, 0)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Tick(1100, e) // fires 7 at 1100; its dispatch waits for the journal
	c.Handle(1100, client, &messages.DeleteJob{App: "app", Id: 7, RequestId: 21}, e)
	c.Handle(1050, client, &messages.GetJob{App: "app", Id: 8}, e) // the clock stepped back 50 ms
	c.Durable(e.lsn, nil, e)
	s := e.take()
	var order []string
	for _, m := range s {
		switch x := m.m.(type) {
		case *messages.Dispatch:
			order = append(order, "dispatch "+x.RunId)
		case *messages.JobReply:
			order = append(order, "reply")
		}
	}
	if len(order) == 0 || order[0] != "dispatch 7:1100" {
		t.Fatalf("sent %v: the fire's dispatch must go first", order)
	}
}

// After the clock steps back behind the due wheel's own clock, an entry due before
// that clock fires only once the clock is there again: the shard must not ask for
// a tick over and over meanwhile (the fourth review: 50,500 ticks).
func TestClockStepBackDoesNotSpin(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	c.Tick(2000, e)
	j := onceJob(7, 0)
	j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 1500}
	c.Handle(1000, client, &messages.CreateJob{Job: j}, e) // the clock stepped back a second
	c.Durable(e.lsn, nil, e)
	at, ok := c.NextWake()
	if !ok || at < 2000-5 {
		t.Fatalf("next wake %d %v: before the wheel's clock (2005) less ArmMs, a tick does nothing", at, ok)
	}
	c.Tick(at, e)
	c.Durable(e.lsn, nil, e)
	if d := dispatchesIn(e.take()); len(d) != 1 || d[0].RunId != "7:1500" {
		t.Fatalf("at %d: %v, want the overdue fire", at, d)
	}
}

// Held dispatches leave by due, ties in the order they were held.
func TestHeldDispatchesByDueThenArrival(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	for round := range 50 {
		var h heldDispatches
		type want struct{ due, n int64 }
		var all []want
		pushes := 1 + rng.IntN(3000)
		for n := range pushes {
			due := int64(rng.IntN(40))
			h.push(outMsg{m: &messages.Dispatch{DueMs: due, Attempt: int32(n)}})
			all = append(all, want{due, int64(n)})
		}
		slices.SortStableFunc(all, func(a, b want) int { return cmp.Compare(a.due, b.due) })
		for i, w := range all {
			d := h.pop().m.(*messages.Dispatch)
			if d.DueMs != w.due || int64(d.Attempt) != w.n {
				t.Fatalf("round %d, pop %d: due %d (push %d), want due %d (push %d)", round, i, d.DueMs, d.Attempt, w.due, w.n)
			}
		}
		if len(h.q) != 0 {
			t.Fatalf("round %d: %d left", round, len(h.q))
		}
	}
}

// A run's result that comes while its dispatch is still held (a worker that had it
// from the shard's previous owner) leaves the job no armed run but that dispatch: a
// delete must still wait for the dispatch to go, and answer after it.
func TestDeleteWaitsForAHeldDispatchAfterItsResult(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	armOnceAt1050(c, e)
	c.Handle(1047, wref, &messages.RunResult{RunId: "7:1050", JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED, WorkerId: "w1", Worker: wref}, e)
	c.Durable(e.lsn, nil, e)
	sent := e.take()
	c.Handle(1048, client, &messages.DeleteJob{App: "app", Id: 7, RequestId: 22}, e)
	c.Durable(e.lsn, nil, e)
	sent = append(sent, e.take()...)
	for now := int64(1049); now <= 1100; now++ {
		c.Tick(now, e)
		c.Durable(e.lsn, nil, e)
		sent = append(sent, e.take()...)
	}
	di, ri := -1, -1
	for i, m := range sent {
		if d, ok := m.m.(*messages.Dispatch); ok && d.RunId == "7:1050" {
			di = i
		}
		if m.to == client && ri < 0 {
			ri = i
		}
	}
	if di < 0 || ri < 0 || ri < di {
		t.Fatalf("dispatch at %d, the delete's reply at %d in %v: the reply must follow the dispatch", di, ri, sent)
	}
}

// A shard whose journal failed never sends the dispatches it held for their dues.
func TestFailedShardSendsNoHeldDispatch(t *testing.T) {
	c, e := newArmedCore(1000, 5)
	armOnceAt1050(c, e)
	c.Durable(e.lsn, errors.New("EIO"), e)
	e.take()
	c.Tick(1060, e)
	c.Handle(1060, wref, &messages.RunResult{RunId: "9:1", JobId: 9, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED, WorkerId: "w1", Worker: wref}, e)
	if d := dispatchesIn(e.take()); len(d) != 0 {
		t.Fatalf("a failed shard sent %v", d)
	}
}
