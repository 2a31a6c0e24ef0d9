package shard

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Journal is the part of persistence.Journal the shell uses.
type Journal interface {
	Append(entries []persistence.Entry, cb func(lastLSN uint64, err error)) (uint64, uint64, error)
	WriteSnapshot(stream, lsn uint64, data []byte) error
	DropStream(stream uint64) error
}

// Local (never remote) messages of the shell.
type (
	durable struct {
		lsn uint64
		err error
	}
	tick struct{ at int64 }
	// SetWorkers hands the shard the live workers of its group.
	SetWorkers struct{ Workers []*messages.WorkerInfo }
	// Stats asks for a ShardLoad (reply *messages.ShardLoad).
	Stats struct{}
	// TakeSnapshot asks the shard to snapshot itself when quiescent.
	TakeSnapshot struct{}
)

// SnapshotEveryRecords is how many records a shard appends between snapshots.
const SnapshotEveryRecords = 200_000

// Actor is the proto.actor shell around Core.
type Actor struct {
	core        *core.Core
	journal     Journal
	log         *slog.Logger
	ctx         actor.Context
	timer       *time.Timer
	wakeAt      int64
	lastSnap    uint64
	system      *actor.ActorSystem
	loadAt      int64
	loadv       atomic.Pointer[messages.ShardLoad]
	levels      map[int]*actor.PID // retry ladder children (ladder.go)
	dead        *actor.PID         // dead-letter child
	alerts      []AlertHook
	handoffBusy bool     // an import request is in flight (handoff.go)
	obs         observer // metrics and debug logs (metrics.go)
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
	return actor.PropsFromProducer(func() actor.Actor { return &startup{a: a, open: open, lsn: durableLSN} })
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
	defer func() { a.ctx = nil }()
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
		a.core.Durable(m.lsn, m.err, a)
		if m.err != nil {
			a.log.Error("journal failed; shard stopped serving", "shard", a.core.Shard().String(), "err", m.err)
		}
	case *tick:
		a.wakeAt = 0
		a.core.Tick(now, a)
	case *SetWorkers:
		a.core.SetWorkers(now, m.Workers, a)
	case *RetryDue:
		a.core.RetryDue(now, m.RunID, a)
	case *BeginHandoff:
		if m.Split {
			a.core.BeginSplit(&messages.Ref{Address: m.Target.Address, Id: m.Target.Id}, a)
		} else {
			a.core.BeginHandoff(&messages.Ref{Address: m.Target.Address, Id: m.Target.Id}, a)
		}
	case *retryHandoff:
	case *Stats:
		ctx.Respond(a.load(now))
		return
	case *TakeSnapshot:
		a.snapshot()
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
	if a.core.AppliedLSN()-a.lastSnap >= SnapshotEveryRecords {
		a.snapshot()
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

func (a *Actor) snapshot() {
	if !a.core.Quiescent() || a.core.Failed() != nil {
		return
	}
	lsn := a.core.AppliedLSN()
	if lsn == a.lastSnap {
		return
	}
	if err := a.journal.WriteSnapshot(a.core.Stream(), lsn, a.core.Snapshot()); err != nil {
		a.log.Warn("snapshot failed", "shard", a.core.Shard().String(), "err", err)
		return
	}
	a.lastSnap = lsn
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
	a.timer = time.AfterFunc(d, func() { sys.Root.Send(self, &tick{at: at}) })
}

// Append implements Env: the journal calls back from its flusher when durable.
func (a *Actor) Append(entries []persistence.Entry) (uint64, error) {
	self, sys := a.ctx.Self(), a.system
	_, last, err := a.journal.Append(entries, func(lsn uint64, err error) {
		sys.Root.Send(self, &durable{lsn: lsn, err: err})
	})
	if err == nil {
		a.obs.appended(a, entries)
	}
	return last, err
}

// Send implements Env.
func (a *Actor) Send(to *messages.Ref, m proto.Message) {
	a.obs.sent(a, to, m)
	a.ctx.Send(actor.NewPID(to.Address, to.Id), m)
}
