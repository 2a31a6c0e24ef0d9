package shard

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// snapJournal is a journal that is durable at once and notes, at every snapshot,
// whether the shard still held messages of the step in its outbox.
type snapJournal struct {
	a *Actor

	mu    sync.Mutex
	lsn   uint64
	snaps int // snapshots written
	held  int // of them, taken with the step's sends still in the outbox
}

func (j *snapJournal) Append(es []persistence.Entry, cb func(uint64, error)) (uint64, uint64, error) {
	j.mu.Lock()
	first := j.lsn + 1
	j.lsn += uint64(len(es))
	last := j.lsn
	j.mu.Unlock()
	cb(last, nil)
	return first, last, nil
}

func (j *snapJournal) SyncNow() {}

func (j *snapJournal) AppendWithin(es []persistence.Entry, _ time.Duration, cb func(uint64, error)) (uint64, uint64, error) {
	return j.Append(es, cb)
}

// WriteSnapshot runs on the shard's goroutine (a shard under SnapshotInlineJobs
// writes inline), so it may look at the outbox.
func (j *snapJournal) WriteSnapshot(uint64, uint64, []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.snaps++
	if len(j.a.out.dests) > 0 {
		j.held++
	}
	return nil
}

func (j *snapJournal) DropStream(uint64) error { return nil }
func (j *snapJournal) Room() error             { return nil }

// snapShard is a shard of app "app" on a snapJournal, to spawn; everyStep makes it
// snapshot at every quiescent step (as if it never caught up with its cadence).
func snapShard(cfg core.Config, everyStep bool) (*Actor, *snapJournal) {
	cfg.Shard = route.Root("app")
	j := &snapJournal{}
	a := NewActor(core.New(cfg, time.Now().UnixMilli(), 1), j, slog.New(slog.NewTextHandler(io.Discard, nil)))
	j.a = a
	if everyStep {
		a.lastSnap = 1 << 63
	}
	return a, j
}

// stepDone sends m (if any) to the shard, then a Stats, whose reply says m's step is done.
func stepDone(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, m any) *messages.ShardLoad {
	t.Helper()
	if m != nil {
		sys.Root.Send(pid, m)
	}
	r, err := sys.Root.RequestFuture(pid, &Stats{}, 5*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	return r.(*messages.ShardLoad)
}

// snapsTaken is how many snapshots the shard has written.
func (j *snapJournal) snapsTaken() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.snaps
}

// A snapshot's freeze stalls the shard (about 0.15 µs a job); the dispatches of the
// step that starts it go first, not after it. The shard here snapshots at every
// quiescent step, so also at the one that releases the fire.
func TestDispatchesLeaveBeforeTheSnapshotFreeze(t *testing.T) {
	sys := actor.NewActorSystem()
	got := make(chan *messages.Dispatch, 16)
	wpid := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *messages.Dispatch:
			got <- m
		case *messages.Dispatches:
			for _, d := range m.Dispatches {
				got <- d
			}
		}
	}))
	defer sys.Root.Stop(wpid)

	for _, armMs := range []int64{0, 5} {
		a, j := snapShard(core.Config{ArmMs: armMs}, true)
		pid := sys.Root.Spawn(a.Props(true, 0))
		wref := &messages.Ref{Address: wpid.Address, Id: wpid.Id}
		sys.Root.Send(pid, &SetWorkers{Workers: []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 8}}})
		job := &messages.Job{Id: 1, App: "app", Handler: "h",
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 30}}
		r, err := sys.Root.RequestFuture(pid, &messages.CreateJob{Job: job}, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("arm %d: create: %v", armMs, err)
		}
		if rep, ok := r.(*messages.JobReply); !ok || rep.Error != nil {
			t.Fatalf("arm %d: create reply %v", armMs, r)
		}
		select {
		case d := <-got:
			if d.JobId != 1 {
				t.Fatalf("arm %d: dispatch of job %d", armMs, d.JobId)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("arm %d: no dispatch", armMs)
		}
		// The snapshot of the step that sent the dispatch is written before the
		// dispatch arrives: wait for the shard to finish that step.
		if _, err := sys.Root.RequestFuture(pid, &Stats{}, 5*time.Second).Result(); err != nil {
			t.Fatalf("arm %d: stats: %v", armMs, err)
		}
		j.mu.Lock()
		snaps, held := j.snaps, j.held
		j.mu.Unlock()
		if snaps == 0 {
			t.Fatalf("arm %d: no snapshot taken: the test proves nothing", armMs)
		}
		if held > 0 {
			t.Errorf("arm %d: %d of %d snapshots froze the shard with the step's dispatches still held", armMs, held, snaps)
		}
		sys.Root.Stop(pid)
	}
}

// A frozen shard (handing off) takes no snapshot, asked or due: a snapshot holds no
// handoff, so recovered from one taken after SHARD_HANDOFF the old owner was
// active at its old epoch beside the target (sim seed 862, stale-owner-active).
func TestNoSnapshotWhileFrozen(t *testing.T) {
	sys := actor.NewActorSystem()
	a, j := snapShard(core.Config{}, true)
	pid := sys.Root.Spawn(a.Props(true, 0))
	defer sys.Root.Stop(pid)
	step := func(m any) *messages.ShardLoad { return stepDone(t, sys, pid, m) }
	job := &messages.Job{Id: 1, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 60_000}}
	if _, err := sys.Root.RequestFuture(pid, &messages.CreateJob{Job: job}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	step(&TakeSnapshot{})
	before := j.snapsTaken()
	if before == 0 {
		t.Fatal("no snapshot of the shard before its handoff: the test proves nothing")
	}
	// A target that is not there: the import fails and the shard stays frozen.
	step(&BeginHandoff{Target: actor.NewPID(sys.Address(), "nobody")})
	step(&TakeSnapshot{})
	if l := step(&TakeSnapshot{}); !l.Frozen {
		t.Fatal("the shard is not frozen after BeginHandoff")
	}
	if after := j.snapsTaken(); after != before {
		t.Fatalf("%d snapshots taken while the shard was frozen", after-before)
	}
}

// TestCompactionAskWaitsWhileBusy: compaction's request to snapshot waits while the
// shard has fires at hand (the freeze would stall them), for SnapshotAskDeferrals
// requests in a row; the next is taken, busy or not. A shard with nothing due soon
// takes the first (TestNoSnapshotWhileFrozen).
func TestCompactionAskWaitsWhileBusy(t *testing.T) {
	sys := actor.NewActorSystem()
	a, j := snapShard(core.Config{}, false)
	pid := sys.Root.Spawn(a.Props(true, 0))
	defer sys.Root.Stop(pid)
	snaps := func(m any) int { stepDone(t, sys, pid, m); return j.snapsTaken() }
	// Due every 200 ms, and no worker: always a fire at hand.
	job := &messages.Job{Id: 1, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 200}}
	if _, err := sys.Root.RequestFuture(pid, &messages.CreateJob{Job: job}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	for i := range SnapshotAskDeferrals {
		if n := snaps(&TakeSnapshot{}); n != 0 {
			t.Fatalf("request %d: %d snapshots of a shard with a fire at hand", i+1, n)
		}
	}
	if n := snaps(&TakeSnapshot{}); n != 1 {
		t.Fatalf("%d snapshots after %d deferred requests, want the next one taken", n, SnapshotAskDeferrals)
	}
	for i := range SnapshotAskDeferrals {
		if n := snaps(&TakeSnapshot{}); n != 1 {
			t.Fatalf("request %d after the snapshot: %d snapshots, want the count of deferrals started again", i+1, n)
		}
	}
}
