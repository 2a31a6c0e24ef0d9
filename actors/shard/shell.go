package shard

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/dispatch"
	"github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Journal is the part of persistence.Journal the shell uses. Append copies the
// entries' payloads before it returns (the core reuses their memory: core.Env).
type Journal interface {
	Append(entries []persistence.Entry, cb func(lastLSN uint64, err error)) (uint64, uint64, error)
	// AppendWithin is Append for records that may wait up to within for their sync
	// (persistence.Journal.AppendWithin).
	AppendWithin(entries []persistence.Entry, within time.Duration, cb func(lastLSN uint64, err error)) (uint64, uint64, error)
	// SyncNow asks for a sync of everything appended so far, without waiting
	// (persistence.Journal.SyncNow).
	SyncNow()
	WriteSnapshot(stream, lsn uint64, data []byte) error
	DropStream(stream uint64) error
	// Room says why the journal should take no new work now (persistence.Journal.Room).
	Room() error
}

// Local (never remote) messages of the shell.
type (
	// durable says the journal's flusher made more of this shard's appends durable
	// (or failed); what it reached is in Actor.dur.
	durable struct{}
	tick    struct{ at int64 }
	// snapDone is the snapshot goroutine's word that the snapshot at lsn is written
	// (or failed).
	snapDone struct {
		lsn uint64
		err error
	}
	// SetWorkers hands the shard the live workers of its group (Workers) and of its
	// app (All; nil = the group).
	SetWorkers struct{ Workers, All []*messages.WorkerInfo }
	// Stats asks for a ShardLoad (reply *messages.ShardLoad).
	Stats struct{}
	// TakeSnapshot asks the shard to snapshot itself when quiescent.
	TakeSnapshot struct{}
)

// Snapshot cadence. A shard snapshots once it has appended SnapshotEveryRecords
// records since its last snapshot, or SnapshotRecordsPerJob records per job it holds
// if that is more: taking a snapshot costs in proportion to the jobs (freezing them
// stalls the actor about 0.01 µs a full job or run and 0.02 µs a packed one; encoding
// and writing them takes about 1 µs a job off it), so a fixed cadence would make a
// large shard spend ever more of its time snapshotting. Recovery replays at most that many records after the snapshot
// (SnapshotDeferFactor times as many when the shard was busy throughout).
const (
	SnapshotEveryRecords  = 200_000
	SnapshotRecordsPerJob = 2
	// SnapshotInlineJobs: a shard holding fewer jobs encodes and writes its snapshot
	// on its own goroutine (a few milliseconds at most), so that it is written when
	// TakeSnapshot has been handled; a larger one hands that to a goroutine.
	SnapshotInlineJobs = 4096
	// SnapshotQuietMs and SnapshotDeferFactor: a due snapshot waits while the shard is
	// busy — a job of it is due within SnapshotQuietMs, or runs are held for want of
	// worker credit — so that a burst of fires is not stalled by the freeze and slowed
	// by the encoding's CPU and garbage (a collection mid-burst); it waits at most until
	// SnapshotDeferFactor times the cadence has been appended, so under a load that
	// never pauses recovery still replays a bounded number of records.
	SnapshotQuietMs     = 1000
	SnapshotDeferFactor = 2
	// SnapshotAskDeferrals: compaction's request to snapshot (TakeSnapshot, every
	// 30 s while the shard's records hold the journal's oldest segment) waits while
	// the shard is busy too, for at most this many requests in a row; the next is
	// taken busy or not, so a shard that is never quiet still lets the journal go.
	SnapshotAskDeferrals = 3
)

// snapshotDue reports whether the shard should snapshot now: enough has been appended
// since the last snapshot, and the shard is not busy or has deferred it long enough.
func (a *Actor) snapshotDue(now int64) bool {
	every := max(SnapshotEveryRecords, SnapshotRecordsPerJob*uint64(a.core.Jobs()))
	since := a.core.AppliedLSN() - a.lastSnap
	if since < every {
		return false // the common case: no look at the wheel
	}
	return snapshotNow(since, every, a.busy(now))
}

// snapshotNow is the cadence: since records appended since the last snapshot, every
// the records between snapshots, busy whether the shard has fires at hand.
func snapshotNow(since, every uint64, busy bool) bool {
	return since >= every && (!busy || since >= SnapshotDeferFactor*every)
}

// busy reports whether the shard has fires at hand: a job due within SnapshotQuietMs
// of now, runs armed and waiting for their due, or runs held until a worker has room.
func (a *Actor) busy(now int64) bool {
	if a.core.Held() > 0 {
		return true
	}
	if due, ok := a.core.NextDue(); ok && due <= now+SnapshotQuietMs {
		return true
	}
	return a.core.HasArmed()
}

// Actor is the proto.actor shell around Core.
type Actor struct {
	core          *core.Core
	journal       Journal
	log           *slog.Logger
	ctx           actor.Context
	timer         interface{ Stop() bool } // the next tick's alarm (alarm.go)
	wakeAt        int64
	lastSnap      uint64 // LSN of the last snapshot written
	snapBusy      bool   // a snapshot is being encoded and written by its goroutine
	askDeferred   int    // compaction's requests deferred in a row while busy
	system        *actor.ActorSystem
	loadAt        int64
	loadv         atomic.Pointer[messages.ShardLoad]
	levels        map[int]*actor.PID // retry ladder children (ladder.go)
	dead          *actor.PID         // dead-letter child
	alerts        []AlertHook
	handoffBusy   bool     // an import request is in flight (handoff.go)
	handoffWait   bool     // an import failed; the next waits for retryHandoff
	obs           observer // metrics and debug logs (metrics.go)
	dur           durableMark
	durFailLogged bool
	out           outbox // dispatches and acks of this step, by worker (batch.go)
}

// durableMark coalesces the journal's durability callbacks into at most one durable
// message in the shard's mailbox: every append registers a callback, and at tens of
// thousands of appends a second one message per callback doubled the mailbox traffic
// and made the shard step once per callback. The flusher (one goroutine, callbacks in
// LSN order) raises lsn, then queues a message unless one is already queued; the actor
// clears queued before it reads lsn, so an advance it missed queues a new message.
type durableMark struct {
	lsn    atomic.Uint64
	err    atomic.Pointer[error]
	queued atomic.Bool
}

// Load is the shard's last published load figures (safe from any goroutine).
func (a *Actor) Load() *messages.ShardLoad { return a.loadv.Load() }

// NewActor wraps a recovered (or new) core. Recovered must be called by the actor on
// Started, so pending runs go out from the actor's own goroutine.
func NewActor(c *core.Core, j Journal, log *slog.Logger) *Actor {
	return &Actor{core: c, journal: j, log: log, lastSnap: c.AppliedLSN()}
}

// Props returns the props of the shell; recovered says whether to run Recovered.
func (a *Actor) Props(open bool, durableLSN uint64) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &startup{a: a, open: open, lsn: durableLSN} },
		actor.WithDispatcher(dispatch.Shared), actor.WithMailbox(dispatch.Mailbox))
}

type startup struct {
	a    *Actor
	open bool
	lsn  uint64
}

func (s *startup) Receive(ctx actor.Context) {
	a := s.a
	if _, ok := ctx.Message().(*actor.Started); ok {
		a.system = ctx.ActorSystem()
		self := ctx.Self()
		a.core.SetSelf(&messages.Ref{Address: self.Address, Id: self.Id})
		a.ctx = ctx
		a.obs.started(a)
		if s.open {
			a.core.Open(a)
		} else {
			a.core.Recovered(nowMs(), s.lsn, a)
		}
		a.arm()
		a.tryHandoff()
		a.loadv.Store(a.load(nowMs()))
		a.obs.publish(a)
		a.ctx = nil
		return
	}
	a.Receive(ctx)
}

func nowMs() int64 { return time.Now().UnixMilli() }

// Receive turns actor messages into core inputs.
func (a *Actor) Receive(ctx actor.Context) {
	a.ctx = ctx
	defer func() {
		a.out.flush(ctx)
		a.ctx = nil
	}()
	now := nowMs()
	switch m := ctx.Message().(type) {
	case *actor.Stopping:
		if a.timer != nil {
			a.timer.Stop()
		}
		a.obs.stopped()
		return
	case *actor.Started, *actor.Stopped, *actor.Restarting:
		return
	case *durable:
		a.dur.queued.Store(false)
		var err error
		if p := a.dur.err.Load(); p != nil {
			err = *p
		}
		a.core.Durable(a.dur.lsn.Load(), err, a)
		if err != nil && a.core.Failed() != nil && !a.durFailLogged {
			a.durFailLogged = true
			a.log.Error("journal failed; shard stopped serving", "shard", a.core.Shard().String(), "err", err)
		}
	case *tick:
		a.wakeAt = 0
		a.core.Tick(now, a)
	case *SetWorkers:
		all := m.All
		if all == nil {
			all = m.Workers
		}
		a.core.SetWorkersOf(now, m.Workers, all, a)
	case *RetryDue:
		a.core.RetryDue(now, m.RunID, a)
	case *BeginHandoff:
		if m.Split {
			a.core.BeginSplit(&messages.Ref{Address: m.Target.Address, Id: m.Target.Id}, a)
		} else {
			a.core.BeginHandoff(&messages.Ref{Address: m.Target.Address, Id: m.Target.Id}, a)
		}
	case *retryHandoff:
		a.handoffWait = false
	case *Stats:
		ctx.Respond(a.load(now))
		return
	case *TakeSnapshot:
		if a.busy(now) && a.askDeferred < SnapshotAskDeferrals {
			a.askDeferred++
			return
		}
		a.askDeferred = 0
		a.snapshot(true)
		return
	case *snapDone:
		a.snapBusy = false
		a.snapshotDone(m.lsn, m.err)
		return
	case proto.Message:
		var from *messages.Ref
		if s := ctx.Sender(); s != nil {
			from = &messages.Ref{Address: s.Address, Id: s.Id}
		}
		a.core.Handle(now, from, m, a)
	default:
		return
	}
	if now-a.loadAt >= 200 {
		a.loadAt = now
		a.loadv.Store(a.load(now))
	}
	if a.snapshotDue(now) {
		a.snapshot(false)
	}
	a.obs.publish(a)
	a.arm()
	a.tryHandoff()
}

func (a *Actor) load(now int64) *messages.ShardLoad {
	self := a.core.Self()
	return &messages.ShardLoad{Shard: a.core.Shard().String(), Epoch: a.core.Epoch(), Pending: int64(a.core.Pending()),
		FiresWindow: a.core.FiresWindow(now), FiresTotal: a.core.FiresTotal(), Pid: self, Frozen: a.core.Frozen()}
}

// snapshot writes the shard's state at its applied LSN when everything applied is
// durable (so the snapshot reflects exactly the records up to that LSN, all of them
// on disk). Only the freezing of the state (core.SnapshotView: a copy of the full
// jobs' and runs' references, a walk over the packed jobs' index) runs on the actor's
// goroutine; encoding, writing and fsyncing the file — most of a
// second for a few hundred thousand jobs — run on a goroutine of their own, so the
// shard keeps firing meanwhile (below SnapshotInlineJobs they run here). One snapshot
// at a time: the next is due only after this one is written.
//
// asked is compaction's request (TakeSnapshot): the shard's records pin the oldest
// segment. Then a snapshot at the LSN of the last one is taken too, which the
// journal keeps as a second copy: it releases records only up to a stream's older
// retained snapshot, and a shard gone quiet after its last snapshot would
// otherwise hold every segment from its last records on.
func (a *Actor) snapshot(asked bool) {
	if a.snapBusy || !a.core.Snapshottable() {
		return
	}
	lsn := a.core.AppliedLSN()
	if lsn == a.lastSnap && !asked {
		return
	}
	// What this step decided to send goes before the freeze, which stalls the actor
	// (2–4 ms at 200,000 periodic jobs; it was 15–20 ms at 100,000 jobs when it copied
	// them): held in the outbox until the step's end, the dispatches of the tick that
	// let a burst's snapshot start went that much late.
	a.out.flush(a.ctx)
	view := a.core.SnapshotView()
	j, stream := a.journal, a.core.Stream()
	if a.core.Jobs() < SnapshotInlineJobs {
		a.snapshotDone(lsn, j.WriteSnapshot(stream, lsn, view.Encode()))
		return
	}
	a.snapBusy = true
	self, sys := a.ctx.Self(), a.system
	go func() {
		err := j.WriteSnapshot(stream, lsn, view.Encode())
		sys.Root.Send(self, &snapDone{lsn: lsn, err: err})
	}()
}

func (a *Actor) snapshotDone(lsn uint64, err error) {
	if err != nil {
		a.log.Warn("snapshot failed", "shard", a.core.Shard().String(), "err", err)
	} else if lsn > a.lastSnap {
		a.lastSnap = lsn
	}
}

// arm keeps exactly one runtime timer, set to the core's next wake-up.
func (a *Actor) arm() {
	at, ok := a.core.NextWake()
	if !ok || (a.wakeAt != 0 && a.wakeAt <= at) {
		return
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	a.wakeAt = at
	self, sys := a.ctx.Self(), a.system
	d := time.Until(time.UnixMilli(at))
	a.timer = AfterFunc(d, func() { sys.Root.Send(self, &tick{at: at}) })
}

var _ core.Roomy = (*Actor)(nil)

// JournalRoom implements core.Roomy.
func (a *Actor) JournalRoom() error { return a.journal.Room() }

// Append implements Env: the journal calls back from its flusher when durable.
func (a *Actor) Append(entries []persistence.Entry) (uint64, error) {
	_, last, err := a.journal.Append(entries, a.durableCallback())
	return last, err
}

var _ core.LazyAppender = (*Actor)(nil)

// AppendBy implements core.LazyAppender.
func (a *Actor) AppendBy(entries []persistence.Entry, byMs int64) (uint64, error) {
	within := time.Until(time.UnixMilli(byMs))
	if within <= 0 {
		return a.Append(entries)
	}
	_, last, err := a.journal.AppendWithin(entries, within, a.durableCallback())
	return last, err
}

// SyncNow implements core.LazyAppender.
func (a *Actor) SyncNow() { a.journal.SyncNow() }

// durableCallback is the journal's callback for an append: it records what became
// durable (or the failure) and wakes the shard once for any number of them.
func (a *Actor) durableCallback() func(lsn uint64, err error) {
	self, sys := a.ctx.Self(), a.system
	return func(lsn uint64, err error) {
		if err != nil {
			a.dur.err.CompareAndSwap(nil, &err)
		} else if lsn > a.dur.lsn.Load() { // only the flusher stores: no lost update
			a.dur.lsn.Store(lsn)
		}
		if a.dur.queued.CompareAndSwap(false, true) {
			sys.Root.Send(self, &durable{})
		}
	}
}

var _ core.Recorder = (*Actor)(nil)

// Recorded implements core.Recorder.
func (a *Actor) Recorded(types []messages.RecordType, ms []proto.Message) {
	a.obs.recorded(a, types, ms)
}

// Send implements Env.
func (a *Actor) Send(to *messages.Ref, m proto.Message) {
	a.obs.sent(a, to, m)
	switch m.(type) {
	case *messages.Dispatch, *messages.ResultAck:
		a.out.add(to, m) // sent when this message is handled, with the rest for that worker
	default:
		a.ctx.Send(actor.NewPID(to.Address, to.Id), m)
	}
}
