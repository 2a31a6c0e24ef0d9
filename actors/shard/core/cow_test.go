package core

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// A REFUSED result changes the run's state in place (result: r.st.WorkerId = ""),
// so it makes the state the run's own first (ownSt): a view taken before it shares
// that state, and encoded the run as it was after the view (and, on another
// goroutine, raced with the core). Found by a review; it predates the jobs' views.
func TestRefusedResultLeavesTheViewsRun(t *testing.T) {
	c, e := dispatchedJob7()
	if !c.Quiescent() || c.InFlight() != 1 {
		t.Fatalf("setup: quiescent %v, %d in flight", c.Quiescent(), c.InFlight())
	}
	want := c.Snapshot()
	v := c.SnapshotView()
	c.Handle(1001, wref, &messages.RunResult{RunId: "7:1000", JobId: 7, Attempt: 1, Epoch: c.Epoch(),
		Outcome: messages.Outcome_REFUSED, WorkerId: "w1"}, e)
	if got := v.Encode(); !bytes.Equal(got, want) {
		a, b := &messages.ShardSnapshot{}, &messages.ShardSnapshot{}
		_ = proto.Unmarshal(got, a)
		_ = proto.Unmarshal(want, b)
		t.Fatalf("a run changed in the view after it was taken:\n got %v\nwant %v", a.Runs, b.Runs)
	}
}

// The same on another goroutine, as the shell encodes: run with -race.
func TestRefusedResultWhileAViewEncodes(t *testing.T) {
	c, e := dispatchedJob7()
	v := c.SnapshotView()
	done := make(chan []byte)
	go func() { done <- v.Encode() }()
	c.Handle(1001, wref, &messages.RunResult{RunId: "7:1000", JobId: 7, Attempt: 1, Epoch: c.Epoch(),
		Outcome: messages.Outcome_REFUSED, WorkerId: "w1"}, e)
	<-done
}

// ownJob copies a job with jobCopy, which keeps its unknown fields (a record of a
// newer version): without them a job changed after a view lost them, and so did its
// later JOB_PUTs (a pause clones the job).
func TestOwnJobKeepsUnknownFields(t *testing.T) {
	for _, view := range []bool{false, true} {
		jm := &messages.Job{Id: 7, App: "app", Handler: "h", State: messages.JobState_ACTIVE, Version: 1, CreatedMs: 1000, UpdatedMs: 1000,
			NextDueMs: 1010, Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 10}}
		b, _ := proto.Marshal(jm)
		b = protowire.AppendTag(b, 999, protowire.VarintType)
		b = protowire.AppendVarint(b, 5)
		c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, 1000, 1)
		e := &fakeEnv{}
		if err := c.Replay(persistence.Record{LSN: 1, Type: uint8(messages.RecordType_JOB_PUT), Payload: b}); err != nil {
			t.Fatal(err)
		}
		e.lsn = 1
		c.Recovered(1000, 1, e)
		c.SetWorkers(1000, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
		if view {
			_ = c.SnapshotView()
		}
		c.Tick(1010, e) // a fire changes the job in place (ownJob after a view)
		c.Durable(e.lsn, nil, e)
		c.Handle(1011, client, &messages.PauseJob{App: "app", Id: 7}, e)
		c.Durable(e.lsn, nil, e)
		last := e.log[len(e.log)-1]
		got := &messages.Job{}
		if err := proto.Unmarshal(last.Payload, got); err != nil {
			t.Fatal(err)
		}
		if messages.RecordType(last.Type) != messages.RecordType_JOB_PUT || got.State != messages.JobState_PAUSED {
			t.Fatalf("setup: last record %v %v", messages.RecordType(last.Type), got)
		}
		if len(got.ProtoReflect().GetUnknown()) == 0 {
			t.Fatalf("view taken %v: the pause's JOB_PUT lost the job's unknown field", view)
		}
	}
}
