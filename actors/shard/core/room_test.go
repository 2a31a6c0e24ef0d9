package core

import (
	"errors"
	"testing"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// roomyEnv is a fakeEnv whose journal may be out of disk space (Roomy).
type roomyEnv struct {
	fakeEnv
	full bool
}

func (e *roomyEnv) JournalRoom() error {
	if e.full {
		return errors.New("disk full")
	}
	return nil
}

// TestNoRoomRefusesOnlyNewWork: while the journal has no room, a create, an update,
// a trigger and a batch's creates are refused with RESOURCE_EXHAUSTED on field
// "journal" and journal nothing; a retry of a create or an update that was taken
// before is answered as taken (a client must never hear "refused" of a job that
// exists); reads, pauses, resumes, deletes and fires go on; once there is room a
// refused create's retry, under its request id, is taken once.
func TestNoRoomRefusesOnlyNewWork(t *testing.T) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, 1000, 1)
	e := &roomyEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(1000, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	taken := &messages.CreateJob{Job: onceJob(7, 50), RequestId: 1}
	if r := reply(t, c, e, 1000, taken); r.Error != nil {
		t.Fatal(r.Error)
	}
	other := &messages.CreateJob{Job: onceJob(8, 3_600_000), RequestId: 2}
	if r := reply(t, c, e, 1000, other); r.Error != nil {
		t.Fatal(r.Error)
	}
	up := &messages.UpdateJob{Job: onceJob(8, 1_800_000), RequestId: 3}
	if r := reply(t, c, e, 1001, up); r.Error != nil || r.Job.Version != 2 {
		t.Fatalf("update: %v", r)
	}

	e.full = true
	refused := func(what string, r *messages.JobReply) {
		t.Helper()
		if r.Error.GetCode() != messages.Code_RESOURCE_EXHAUSTED || r.Error.GetField() != "journal" {
			t.Fatalf("%s with no room: %v, want RESOURCE_EXHAUSTED on field journal", what, r)
		}
	}
	lsn := e.lsn
	fresh := &messages.CreateJob{Job: onceJob(9, 50), RequestId: 4}
	refused("a new create", reply(t, c, e, 1010, fresh))
	refused("an update", reply(t, c, e, 1010, &messages.UpdateJob{Job: onceJob(8, 900_000), RequestId: 5}))
	refused("a trigger", reply(t, c, e, 1010, &messages.TriggerJob{App: "app", Id: 8, RequestId: 6}))
	c.Handle(1010, client, &messages.CreateJobs{Jobs: []*messages.CreateJob{{Job: onceJob(10, 50), RequestId: 7}, taken}}, e)
	c.Durable(e.lsn, nil, e)
	for _, s := range e.take() {
		if b, ok := s.m.(*messages.CreateJobsReply); ok {
			refused("a batch's new create", b.Replies[0])
			if b.Replies[1].Error != nil {
				t.Fatalf("a batch's retried create with no room: %v, want it answered as taken", b.Replies[1])
			}
		}
	}
	if e.lsn != lsn {
		t.Fatalf("refused commands journaled %d records", e.lsn-lsn)
	}
	// Retries of what was taken are answered as taken.
	if r := reply(t, c, e, 1020, taken); r.Error != nil || r.Job.GetId() != 7 {
		t.Fatalf("a retried create with no room: %v, want it answered as taken", r)
	}
	if r := reply(t, c, e, 1020, &messages.CreateJob{Job: onceJob(7, 50)}); r.Error != nil || r.Job.GetId() != 7 {
		t.Fatalf("the same create without its request id, with no room: %v, want it answered as taken", r)
	}
	if r := reply(t, c, e, 1020, up); r.Error != nil || r.Job.Version != 2 {
		t.Fatalf("a retried update with no room: %v, want version 2 as taken", r)
	}
	// What was accepted goes on: reads, pauses, resumes, deletes, the due fire.
	if r := reply(t, c, e, 1020, &messages.GetJob{App: "app", Id: 8}); r.Error != nil {
		t.Fatal(r.Error)
	}
	if r := reply(t, c, e, 1020, &messages.PauseJob{App: "app", Id: 8, RequestId: 8}); r.Error != nil {
		t.Fatal(r.Error)
	}
	if r := reply(t, c, e, 1020, &messages.ResumeJob{App: "app", Id: 8, RequestId: 9}); r.Error != nil {
		t.Fatal(r.Error)
	}
	if r := reply(t, c, e, 1020, &messages.DeleteJob{App: "app", Id: 8, RequestId: 10}); r.Error != nil {
		t.Fatal(r.Error)
	}
	c.Tick(1050, e)
	c.Durable(e.lsn, nil, e)
	fired := false
	for _, s := range e.take() {
		if d, ok := s.m.(*messages.Dispatch); ok && d.JobId == 7 {
			fired = true
		}
	}
	if !fired {
		t.Fatal("job 7, taken before, did not fire with no room")
	}

	// Room again: the refused create's retry is taken, once.
	e.full = false
	if r := reply(t, c, e, 1100, fresh); r.Error != nil || r.Job.GetId() != 9 || r.Job.Version != 1 {
		t.Fatalf("the refused create's retry once there is room: %v", r)
	}
	if r := reply(t, c, e, 1100, fresh); r.Error != nil || r.Job.Version != 1 {
		t.Fatalf("its second retry: %v", r)
	}
}
