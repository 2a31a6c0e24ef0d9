package core

import (
	"bytes"
	"testing"

	"github.com/kjob/kjob/messages"
)

// runAll fires every job due by nowMs and reports every dispatch as succeeded.
// (The worker's credit holds runs back until results come.)
func runAll(c *Core, e *fakeEnv, nowMs int64) {
	c.Tick(nowMs, e)
	c.Durable(e.lsn, nil, e)
	for sent := e.take(); len(sent) > 0; sent = e.take() {
		for _, s := range sent {
			if d, ok := s.m.(*messages.Dispatch); ok {
				c.Handle(nowMs, wref, &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Attempt: d.Attempt, Epoch: d.Epoch,
					Outcome: messages.Outcome_SUCCEEDED, StartMs: nowMs, EndMs: nowMs, WorkerId: "w1", Worker: wref}, e)
			}
		}
		c.Durable(e.lsn, nil, e)
	}
}

// A one-shot that ran is kept packed; it reads the same (get, history, list), and a
// snapshot view of packed jobs stays as it was taken while they are unpacked (an
// update), deleted and expire.
func TestPackedJobs(t *testing.T) {
	c, e := newCore(1000)
	const n = 3 * packedChunkMin / 64 // several chunks
	for id := int64(1); id <= n; id++ {
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 10+id%50)}, e)
	}
	c.Durable(e.lsn, nil, e)
	e.take()
	runAll(c, e, 1100)
	if c.PackedJobs() != n || c.Jobs() != n {
		t.Fatalf("%d of %d jobs packed, want all %d", c.PackedJobs(), c.Jobs(), n)
	}
	if len(c.packed.chunks) < 2 {
		t.Fatalf("%d chunks: the test wants several", len(c.packed.chunks))
	}
	jm := c.peek(7)
	if jm.GetState() != messages.JobState_DONE || jm.Runs != 1 {
		t.Fatalf("packed job 7 reads %v", jm)
	}
	if h := c.history(&messages.GetRuns{App: "app", Id: 7}).(*messages.RunsReply); len(h.Runs) != 1 || h.Runs[0].Outcome != messages.Outcome_SUCCEEDED {
		t.Fatalf("packed job 7's history: %v", h)
	}
	l := c.list(&messages.ListJobs{App: "app", State: messages.JobState_DONE, Handler: "h", Limit: 1000}).(*messages.ListJobsReply)
	if len(l.Jobs) != n {
		t.Fatalf("listed %d DONE jobs of handler h, want %d", len(l.Jobs), n)
	}
	if l := c.list(&messages.ListJobs{App: "app", Handler: "other", Limit: 1000}).(*messages.ListJobsReply); len(l.Jobs) != 0 {
		t.Fatalf("listed %d jobs of handler other", len(l.Jobs))
	}

	want := c.Snapshot()
	v := c.SnapshotView()
	for id := int64(1); id <= n/2; id += 2 {
		c.Handle(1200, client, &messages.DeleteJob{App: "app", Id: id}, e)
	}
	upd := onceJob(2, 5000)
	c.Handle(1200, client, &messages.UpdateJob{Job: upd}, e) // unpacked, ACTIVE again, history kept
	c.Durable(e.lsn, nil, e)
	e.take()
	if j := c.jobs[2]; j == nil || len(j.history) != 1 || j.j.State != messages.JobState_ACTIVE {
		t.Fatalf("updated job 2: %+v", j)
	}
	c.Tick(1100+c.cfg.DoneRetentionMs+1, e) // the rest expire
	c.Durable(e.lsn, nil, e)
	if c.PackedJobs() != 0 || c.Jobs() != 1 {
		t.Fatalf("after expiry: %d jobs, %d packed; want only job 2", c.Jobs(), c.PackedJobs())
	}
	for _, ch := range c.packed.chunks {
		if ch.buf != nil || ch.live != 0 {
			t.Fatalf("an empty chunk is kept: %d live, %d bytes", ch.live, len(ch.buf))
		}
	}
	if got := v.Encode(); !bytes.Equal(got, want) {
		t.Fatal("the view of packed jobs changed after it was taken")
	}
}
