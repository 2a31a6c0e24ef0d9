package shard

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// TestLadderLevelHoldsAndReleases: a ladder level hands a held run back to its shard
// (the parent) once the run's delay is over, in due order, not before; a run
// released first (its job deleted, its shard handing off) never comes back, and
// one held again moves to its new due.
func TestLadderLevelHoldsAndReleases(t *testing.T) {
	sys := actor.NewActorSystem()
	type due struct {
		id string
		at time.Time
	}
	got := make(chan due, 16)
	var level *actor.PID
	parent := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *actor.Started:
			level = ctx.Spawn(actor.PropsFromProducer(func() actor.Actor { return newLevel(0) }))
		case *RetryDue:
			got <- due{m.RunID, time.Now()}
		case *hold, *unhold:
			ctx.Send(level, m)
		}
	}))
	defer sys.Root.Stop(parent)
	t0 := time.Now()
	at := func(ms int) int64 { return t0.Add(time.Duration(ms) * time.Millisecond).UnixMilli() }
	sys.Root.Send(parent, &hold{runID: "late", dueMs: at(300)})
	sys.Root.Send(parent, &hold{runID: "released", dueMs: at(100)})
	sys.Root.Send(parent, &hold{runID: "first", dueMs: at(150)})
	sys.Root.Send(parent, &hold{runID: "moved", dueMs: at(120)})
	sys.Root.Send(parent, &unhold{runID: "released"})
	sys.Root.Send(parent, &hold{runID: "moved", dueMs: at(200)}) // held again: a new due
	sys.Root.Send(parent, &unhold{runID: "never held"})
	want := []struct {
		id string
		ms int
	}{{"first", 150}, {"moved", 200}, {"late", 300}}
	for _, w := range want {
		select {
		case d := <-got:
			if d.id != w.id {
				t.Fatalf("run %s came back, want %s (a released run never does; the rest in due order)", d.id, w.id)
			}
			if d.at.Before(time.UnixMilli(at(w.ms))) {
				t.Fatalf("run %s came back %v before its due", d.id, time.UnixMilli(at(w.ms)).Sub(d.at))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("run %s never came back", w.id)
		}
	}
	select {
	case d := <-got:
		t.Fatalf("run %s came back once more", d.id)
	case <-time.After(200 * time.Millisecond):
	}
}
