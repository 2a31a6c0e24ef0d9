package core

import (
	"testing"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

func retentionCore(now, retention int64) (*Core, *fakeEnv) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, DoneRetentionMs: retention}, now, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	return c, e
}

// A one-shot job that ran stays readable for the retention, then is deleted by a
// journaled record (so a restart agrees); one whose retry is pending stays.
func TestDoneJobsExpire(t *testing.T) {
	c, e := retentionCore(1000, 5000)
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(7, 10), RequestId: 1})
	reply(t, c, e, 1000, &messages.CreateJob{Job: &messages.Job{Id: 8, App: "app", Handler: "h",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 10},
		Policy:   &messages.Policy{Attempts: 2, LadderMs: []int64{60_000}}}, RequestId: 2})
	c.Tick(1010, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Handle(1020, wref, &messages.RunResult{RunId: "7:1010", JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED}, e)
	c.Handle(1020, wref, &messages.RunResult{RunId: "8:1010", JobId: 8, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_FAILED}, e)
	c.Durable(e.lsn, nil, e)
	if r := reply(t, c, e, 5000, &messages.GetJob{App: "app", Id: 7}); r.Job.GetState() != messages.JobState_DONE {
		t.Fatalf("before the retention: %v, want DONE", r)
	}
	if at, ok := c.NextWake(); !ok || at > 6020 {
		t.Fatalf("next wake %d %v, want by 6020 (the expiry)", at, ok)
	}
	c.Tick(6020, e)
	c.Durable(e.lsn, nil, e)
	if r := reply(t, c, e, 6020, &messages.GetJob{App: "app", Id: 7}); r.Error.GetCode() != messages.Code_NOT_FOUND {
		t.Fatalf("after the retention: %v, want NOT_FOUND", r)
	}
	if c.jobs[8] == nil {
		t.Fatal("job 8 expired with its retry still waiting")
	}
	// A replay of the journal agrees.
	c2 := New(Config{Shard: c.Shard(), DoneRetentionMs: 5000}, 7000, 1)
	for _, rec := range e.log {
		if err := c2.Replay(rec); err != nil {
			t.Fatal(err)
		}
	}
	if c2.Jobs() != 1 || c2.jobs[8] == nil {
		t.Fatalf("replayed: %d jobs, want only job 8", c2.Jobs())
	}
}

// A one-shot's expiry is armed when it fires and then follows its finish: armExpiry
// leaves the earlier one in the wheel, and when that comes the job is looked at again
// and kept until its exact time — never deleted early — and a replay agrees.
func TestDoneJobExpiryFollowsItsFinish(t *testing.T) {
	c, e := retentionCore(1000, 5000)
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(7, 10), RequestId: 1})
	c.Tick(1010, e) // fires: DONE, armed for 1010+5000
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Handle(1030, wref, &messages.RunResult{RunId: "7:1010", JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED, EndMs: 1030}, e)
	c.Durable(e.lsn, nil, e)
	if at, ok := c.NextWake(); !ok || at > 6030 {
		t.Fatalf("next wake %d %v, want by 6030", at, ok)
	}
	c.Tick(6020, e) // the fire's expiry has come, the finish's not yet
	c.Durable(e.lsn, nil, e)
	if r := reply(t, c, e, 6020, &messages.GetJob{App: "app", Id: 7}); r.Job.GetState() != messages.JobState_DONE {
		t.Fatalf("10 ms before its retention after the finish: %v, want DONE", r)
	}
	if at, ok := c.NextWake(); !ok || at != 6030 {
		t.Fatalf("next wake %d %v, want 6030 (the finish's expiry)", at, ok)
	}
	c.Tick(6030, e)
	c.Durable(e.lsn, nil, e)
	if r := reply(t, c, e, 6030, &messages.GetJob{App: "app", Id: 7}); r.Error.GetCode() != messages.Code_NOT_FOUND {
		t.Fatalf("at its retention after the finish: %v, want NOT_FOUND", r)
	}
	c2 := New(Config{Shard: c.Shard(), DoneRetentionMs: 5000}, 7000, 1)
	for _, rec := range e.log {
		if err := c2.Replay(rec); err != nil {
			t.Fatal(err)
		}
	}
	if c2.Jobs() != 0 {
		t.Fatalf("replayed: %d jobs, want none", c2.Jobs())
	}
}
