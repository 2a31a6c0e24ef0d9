// Package server is the server actor: one per node. It hosts the node's shard actors
// (children), owns the node's journal, reports load to the NameServer in every
// heartbeat, opens shards it is assigned, hands each shard the workers of its group,
// and forwards registry traffic from clients and workers to the NameServer.
package server

import (
	"errors"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/shard"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Name is the actor name of the server actor on every node.
const Name = "kjob-server"

// ShardName is the child name of a shard's actor, stable across restarts so a route
// to it stays valid when its node comes back.
func ShardName(s string) string { return "shard-" + s }

// Deps is what the server needs from its node.
type Deps struct {
	ServerID   string
	Journal    shard.Journal
	Log        *slog.Logger
	NameServer func() *actor.PID // current NameServer PID (nil when unknown)
	NewCore    func(s route.Shard, epoch int64) *shardcore.Core
	Metrics    shard.Sink        // where shards report their figures (nil = nowhere)
	Alerts     []shard.AlertHook // called for each new dead letter
	// CrashAt is a crash point (crash.go) for tests of real processes; empty takes
	// the environment's CrashEnv, unset in production.
	CrashAt string
	// HandedOn keeps the epochs shards were handed on at from here across restarts
	// (handed.go); nil keeps them since start only. New loads it.
	HandedOn HandedOnStore
	// Incarnation counts the starts of this server on its data (NextIncarnation);
	// heartbeats carry it. 0 = unknown.
	Incarnation int64
}

// Recovered is a shard found in the journal at start.
type Recovered struct {
	Core       *shardcore.Core
	DurableLSN uint64
}

// child is a shard actor of this server. Its core belongs to the shard's goroutine
// from the spawn on (HandoffSnapshot even bumps its epoch for a moment), so the
// server keeps its own copy of what it needs: a shard's identity and epoch on a
// server never change after the spawn (a move makes a new core elsewhere).
type child struct {
	pid    *actor.PID
	shell  *shard.Actor
	shard  route.Shard
	stream uint64
	epoch  int64
	frozen bool // at spawn (a recovered shard resuming its handoff)
}

// HeartbeatTick makes the server send its heartbeat (and, every PullEveryTicks,
// pull the route table).
type HeartbeatTick struct{}

// PullEveryTicks is how many heartbeats apart the server pulls the route table: a
// pull repairs a push it missed (the NameServer pushes a change once, and does not
// re-push a server it hears from again), which would leave its shards with a stale
// worker list for good (the simulator's QuirkNoPull).
const PullEveryTicks = 3

// Actor is the server actor.
type Actor struct {
	deps      Deps
	recovered []Recovered
	children  map[string]*child
	opening   map[string]*opening             // assigned here, SHARD_OPENED not durable yet
	unopened  map[string]bool                 // assigned here, SHARD_OPENED appended, and then its sync failed or its actor did not start
	handedOn  map[string]int64                // shard → highest epoch handed on from here since start (the target's)
	movingTo  map[string]*messages.Ref        // shard → the server it is being moved to (from MoveShard)
	handedTo  map[string]*messages.RouteEntry // shard → where it went (hearsay for a fresh NameServer)
	table     atomic.Pointer[messages.RouteTable]
	groups    map[string]string // shard → last worker set key sent
	mu        sync.Mutex
	crashAt   string // crash point of a test process (crash.go); "" in production
	ticks     int    // heartbeats sent, for PullEveryTicks
}

// opening is a shard assigned to this server whose SHARD_OPENED record is on its way
// to disk. Until it is durable the shard is not spawned, not in heartbeats and not
// confirmed to anyone: a crash before then must leave no one routing to it.
type opening struct {
	shard   route.Shard
	epoch   int64
	record  persistence.Record // the SHARD_OPENED record (LSN filled in by Append)
	waiters []*actor.PID       // who asked, to be answered ShardOpened
}

// openDurable is the journal's word that an opening shard's record is durable (or failed).
type openDurable struct {
	shard string
	err   error
}

// New makes the server actor with the shards recovered from the journal.
func New(d Deps, rec []Recovered) *Actor {
	if d.CrashAt == "" {
		d.CrashAt = os.Getenv(CrashEnv)
	}
	handedOn := map[string]int64{}
	if d.HandedOn != nil {
		m, err := d.HandedOn.Load()
		if err != nil {
			// The node loads it before (and fails to start on a bad file); here it
			// can only have gone bad since.
			d.Log.Error("load the shards handed on from here", "err", err)
		} else {
			handedOn = m
		}
	}
	return &Actor{deps: d, recovered: rec, children: map[string]*child{}, opening: map[string]*opening{}, unopened: map[string]bool{},
		handedOn: handedOn, movingTo: map[string]*messages.Ref{}, handedTo: map[string]*messages.RouteEntry{}, groups: map[string]string{}, crashAt: d.CrashAt}
}

// Table is the last route table pushed to this server.
func (a *Actor) Table() *messages.RouteTable { return a.table.Load() }

// Receive implements actor.Actor.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		for _, r := range a.recovered {
			a.spawn(ctx, r.Core, false, r.DurableLSN)
		}
		a.recovered = nil
	case *HeartbeatTick:
		if ns := a.deps.NameServer(); ns != nil {
			ctx.Send(ns, a.heartbeat(ctx))
			if a.ticks%PullEveryTicks == 0 {
				ctx.Request(ns, &messages.GetRoutes{WithWorkers: true}) // answered like a push (below)
			}
			a.ticks++
		}
	case *messages.Ping:
		ctx.Respond(&messages.Pong{ServerId: a.deps.ServerID, Address: ctx.ActorSystem().Address()})
	case *messages.AssignShard:
		a.assign(ctx, m)
	case *openDurable:
		a.opened(ctx, m)
	case *messages.MoveShard:
		if e := nscore.CheckMove(m); e != nil {
			a.refusedOrder(ctx, m, e) // no reply: the NameServer sends it again if it still should
			return
		}
		if self := ctx.Self(); !m.Split && m.Target.GetAddress() == self.Address && m.Target.GetId() == self.Id {
			// A move to here is a stale order (the NameServer took a restart of this
			// process for another server): the shard would hand itself to itself and
			// stay frozen, its import refused forever. The order lapses unanswered.
			a.deps.Log.Warn("move of a shard to the server it is on: ignored", "shard", m.Shard, "epoch", m.Epoch)
			return
		}
		if c := a.children[m.Shard]; c != nil && c.epoch == m.Epoch && m.Target != nil {
			a.deps.Log.Info("handing off shard", "shard", m.Shard, "epoch", m.Epoch, "target", m.Target.Address)
			ctx.Send(c.pid, &shard.BeginHandoff{Target: actor.NewPID(m.Target.Address, m.Target.Id), Split: m.Split})
			if !m.Split {
				a.movingTo[m.Shard] = m.Target
			}
		}
	case *messages.ImportShard:
		ctx.Respond(a.importShard(ctx, m))
	case *shard.HandedOff:
		if c := a.children[m.Shard]; c != nil {
			ctx.Stop(c.pid)
			delete(a.children, m.Shard)
			delete(a.groups, m.Shard)
			a.handedOn[m.Shard] = max(a.handedOn[m.Shard], c.epoch+1)
			// The stream goes only once the epoch handed on is saved: until then its
			// SHARD_HANDOFF/SHARD_CLOSED records are what tells a restart (recovery
			// saves it from them).
			if err := a.saveHandedOn(); err != nil {
				a.deps.Log.Error("save the shards handed on from here; the stream is kept", "shard", m.Shard, "err", err)
			} else if err := a.deps.Journal.DropStream(c.stream); err != nil {
				a.deps.Log.Warn("drop handed-off shard's stream", "shard", m.Shard, "err", err)
			}
			if to := a.movingTo[m.Shard]; to != nil {
				// Until the target reports it, a fresh NameServer learns from this
				// hearsay that the shard exists (and is not placed anew).
				a.handedTo[m.Shard] = &messages.RouteEntry{Shard: m.Shard, App: c.shard.App, Level: int32(c.shard.Level), Index: c.shard.Index,
					Owner: &messages.Ref{Address: to.Address, Id: ShardName(m.Shard)}, Epoch: c.epoch + 1}
				delete(a.movingTo, m.Shard)
			}
			a.crash(CrashSourceDropped)
		}
	case *messages.RouteTable:
		// Versions order the tables of one NameServer instance only: take a push from
		// the NameServer this node resolves now (a fresh one starts its own count),
		// and never an older table of the same instance.
		ns := a.deps.NameServer()
		if ns == nil || m.Nameserver.GetAddress() != ns.Address || m.Nameserver.GetId() != ns.Id {
			return
		}
		if cur := a.table.Load(); cur != nil && proto.Equal(cur.Nameserver, m.Nameserver) && cur.Version > m.Version {
			return
		}
		if e := nscore.CheckTable(m); e != nil {
			a.refusedOrder(ctx, m, e) // the last good table stays
			return
		}
		a.table.Store(m)
		a.pushWorkers(ctx)
	case *messages.GetRoutes, *messages.WorkerHeartbeat, *messages.WorkerLeft, *messages.LeaseNode,
		*messages.ClusterStatus, *messages.Subscribe:
		if e := nscore.Check(m.(proto.Message)); e != nil {
			a.refuse(ctx, m.(proto.Message), e)
			return
		}
		ns := a.deps.NameServer()
		if ns == nil {
			a.unavailable(ctx, m.(proto.Message))
			return
		}
		ctx.Forward(ns)
	}
}

// refuse answers a worker's or client's message that fails the NameServer's
// checks (nscore.Check) with the error, in the reply its sender waits for, without
// forwarding it: the NameServer would refuse it all the same, and its observers
// (metrics labelled by app) see only what it keeps. A goodbye or a subscription
// has no reply: it is dropped with a warning.
func (a *Actor) refuse(ctx actor.Context, m proto.Message, e *messages.Error) {
	a.logRefused(ctx, m, e, "a worker or client")
	if ctx.Sender() != nil {
		answer(ctx, m, e, &messages.Pong{ServerId: a.deps.ServerID, Address: ctx.ActorSystem().Address(), Error: e})
	}
}

// answer replies to m, a worker's or client's message for the NameServer, with e
// in the reply its sender waits for; a heartbeat gets pong.
func answer(ctx actor.Context, m proto.Message, e *messages.Error, pong *messages.Pong) {
	switch m.(type) {
	case *messages.GetRoutes:
		ctx.Respond(&messages.RouteTable{Error: e})
	case *messages.LeaseNode:
		ctx.Respond(&messages.LeaseNodeReply{Error: e})
	case *messages.ClusterStatus:
		ctx.Respond(&messages.ClusterStatusReply{Error: e})
	case *messages.WorkerHeartbeat:
		ctx.Respond(pong)
	}
}

// assign opens a shard the NameServer placed here. The SHARD_OPENED record is
// journaled first; only once it is durable is the shard spawned, reported in
// heartbeats and confirmed (opened), so no one is told of a shard a crash can lose.
func (a *Actor) assign(ctx actor.Context, m *messages.AssignShard) {
	if e := nscore.CheckAssign(m); e != nil {
		a.refusedOrder(ctx, m, e)
		if ctx.Sender() != nil {
			ctx.Respond(&messages.ShardOpened{ServerId: a.deps.ServerID, Error: e})
		}
		return
	}
	sh, _ := route.Parse(m.Shard) // checked
	if ns := a.deps.NameServer(); ns != nil && m.Nameserver != nil && (m.Nameserver.Address != ns.Address || m.Nameserver.Id != ns.Id) {
		// From a NameServer instance other than the one this node resolves now: an
		// old one's late order, whose app its successor may have placed elsewhere
		// (a second owner). The current one places it again if it still should.
		a.deps.Log.Warn("assignment from a name server that is not the current one: ignored", "shard", m.Shard,
			"from", m.Nameserver.Address+"/"+m.Nameserver.Id, "current", ns.Address+"/"+ns.Id)
		if ctx.Sender() != nil {
			ctx.Respond(&messages.ShardOpened{ServerId: a.deps.ServerID, Error: kerr.New(messages.Code_FAILED_PRECONDITION, "nameserver",
				"assignment of %s from %s/%s, not the current name server", m.Shard, m.Nameserver.Address, m.Nameserver.Id)})
		}
		return
	}
	if c := a.children[m.Shard]; c != nil {
		a.pushWorkers(ctx)
		if ctx.Sender() != nil {
			ctx.Respond(&messages.ShardOpened{ServerId: a.deps.ServerID, Shard: a.loadOf(c)})
		}
		return
	}
	if l := a.movedOn(m.Shard, m.Epoch); l != nil && a.opening[m.Shard] == nil {
		// A late or repeated assignment of a shard that has moved on from here since
		// (handed off, or split into its halves): opening it again would make a
		// second owner, an empty one at the old epoch next to the live one (or
		// overlapping the halves). Found by the simulator (seed 3967).
		a.deps.Log.Warn("assignment of a shard that has moved on since: ignored", "shard", m.Shard, "epoch", m.Epoch, "now_epoch", l.Epoch)
		if ctx.Sender() != nil {
			ctx.Respond(&messages.ShardOpened{ServerId: a.deps.ServerID, Error: kerr.New(messages.Code_FAILED_PRECONDITION, "epoch",
				"shard %s has moved on from epoch %d (now at epoch %d)", m.Shard, m.Epoch, l.Epoch)})
		}
		return
	}
	o := a.opening[m.Shard]
	if o == nil {
		payload, err := proto.Marshal(&messages.ShardMeta{Shard: m.Shard, Epoch: m.Epoch})
		if err != nil {
			panic("server: marshal ShardMeta: " + err.Error()) // generated types always marshal
		}
		o = &opening{shard: sh, epoch: m.Epoch, record: persistence.Record{Stream: sh.Stream(), Type: uint8(messages.RecordType_SHARD_OPENED), Payload: payload}}
		self, sys, name := ctx.Self(), ctx.ActorSystem(), m.Shard
		_, last, err := a.deps.Journal.Append([]persistence.Entry{{Stream: o.record.Stream, Type: o.record.Type, Payload: payload}},
			func(_ uint64, err error) { sys.Root.Send(self, &openDurable{shard: name, err: err}) })
		if err != nil {
			a.deps.Log.Warn("open shard: journal refused its record", "shard", m.Shard, "err", err)
			if ctx.Sender() != nil {
				ctx.Respond(&messages.ShardOpened{ServerId: a.deps.ServerID,
					Error: kerr.New(messages.Code_UNAVAILABLE, "", "open shard %s: %v", m.Shard, err)})
			}
			return
		}
		o.record.LSN = last
		a.opening[m.Shard] = o
	}
	if s := ctx.Sender(); s != nil {
		o.waiters = append(o.waiters, s)
	}
}

// opened spawns a shard whose SHARD_OPENED record became durable and confirms it:
// to whoever asked, or else straight to the NameServer (sooner than a heartbeat).
func (a *Actor) opened(ctx actor.Context, m *openDurable) {
	o := a.opening[m.shard]
	if o == nil {
		return
	}
	delete(a.opening, m.shard)
	// Claimed in heartbeats (Opening) until it opens, if it does not now: the record
	// may be on disk whatever the sync said, and a restart would recover the shard.
	a.unopened[m.shard] = true
	var reply *messages.ShardOpened
	if m.err != nil {
		a.deps.Log.Warn("open shard: journal failed", "shard", m.shard, "err", m.err)
		reply = &messages.ShardOpened{ServerId: a.deps.ServerID, Error: kerr.New(messages.Code_UNAVAILABLE, "", "open shard %s: %v", m.shard, m.err)}
	} else {
		core := a.deps.NewCore(o.shard, o.epoch)
		if err := core.Replay(o.record); err != nil { // sets the epoch from the record
			panic("server: replay the SHARD_OPENED record just written: " + err.Error())
		}
		if c := a.spawn(ctx, core, false, o.record.LSN); c != nil {
			a.pushWorkers(ctx)
			reply = &messages.ShardOpened{ServerId: a.deps.ServerID, Shard: a.loadOf(c)}
		} else {
			// Durable but not running: a restart recovers it; until then say nothing.
			m.err = errors.New("shard actor did not start")
			reply = &messages.ShardOpened{ServerId: a.deps.ServerID, Error: kerr.New(messages.Code_UNAVAILABLE, "", "open shard %s: its actor did not start", m.shard)}
		}
	}
	to := o.waiters
	if len(to) == 0 {
		if ns := a.deps.NameServer(); ns != nil && m.err == nil {
			to = append(to, ns)
		}
	}
	for _, w := range to {
		ctx.Send(w, reply)
	}
}

// importShard persists a shard handed to this node (one record holding all of it)
// before it answers, then activates it at the new epoch. A repeat is answered the
// same way without a second copy.
func (a *Actor) importShard(ctx actor.Context, m *messages.ImportShard) *messages.ImportShardReply {
	if e := nscore.CheckImport(m); e != nil {
		a.refusedOrder(ctx, m, e)
		return &messages.ImportShardReply{Error: e}
	}
	sh, _ := route.Parse(m.Shard) // checked
	a.crash(CrashTargetReceived)
	if c := a.children[m.Shard]; c != nil {
		if c.epoch >= m.Epoch {
			return &messages.ImportShardReply{Shard: a.loadOf(c)}
		}
		return &messages.ImportShardReply{Error: kerr.New(messages.Code_FAILED_PRECONDITION, "epoch",
			"shard %s is here at epoch %d, below the import's %d", m.Shard, c.epoch, m.Epoch)}
	}
	if a.opening[m.Shard] != nil {
		return &messages.ImportShardReply{Error: kerr.New(messages.Code_UNAVAILABLE, "",
			"shard %s is being opened here; try again", m.Shard)}
	}
	if l := a.movedOn(m.Shard, m.Epoch); l != nil {
		// A late repeat from a source that was down while this server held the shard
		// at m.Epoch and handed it on: importing it again would bring back a stale
		// second owner. The shard lives on (at a higher epoch, from this very copy),
		// so the source may close its own.
		a.deps.Log.Warn("import of a shard that has moved on since: answered without importing", "shard", m.Shard,
			"epoch", m.Epoch, "now_epoch", l.Epoch, "now_at", l.Pid.GetAddress())
		return &messages.ImportShardReply{Shard: l}
	}
	// Check and load it before it is persisted: recovery rebuilds the shard from the
	// record alone (its name and epoch included), so a record that would not load,
	// or would load as another shard or epoch, must never reach the journal.
	if name, epoch, err := shardcore.ShardNameOfSnapshot(m.Snapshot); err != nil || name != m.Shard || epoch != m.Epoch {
		return &messages.ImportShardReply{Error: kerr.Invalid("snapshot", "shard %s epoch %d: snapshot holds %q epoch %d (%v)", m.Shard, m.Epoch, name, epoch, err)}
	}
	core := a.deps.NewCore(sh, m.Epoch)
	if err := core.LoadSnapshot(m.Snapshot, 0); err != nil {
		return &messages.ImportShardReply{Error: kerr.Invalid("snapshot", "%v", err)}
	}
	// Its load goes into every heartbeat, which the NameServer refuses whole for a
	// figure out of range: taken, such a snapshot would leave this server unheard.
	if fw := core.FiresWindow(time.Now().UnixMilli()); fw < 0 || fw > nscore.MaxFiresWindow {
		return &messages.ImportShardReply{Error: kerr.Invalid("snapshot", "shard %s: %d fires in its window, the limit is 0 to %d",
			m.Shard, fw, int64(nscore.MaxFiresWindow))}
	}
	done := make(chan error, 1)
	_, last, err := a.deps.Journal.Append([]persistence.Entry{{Stream: sh.Stream(), Type: uint8(messages.RecordType_SHARD_IMPORTED), Payload: m.Snapshot}},
		func(_ uint64, err error) { done <- err })
	if err == nil {
		err = <-done
	}
	if err != nil {
		return &messages.ImportShardReply{Error: kerr.New(messages.Code_UNAVAILABLE, "", "persist imported shard %s: %v", m.Shard, err)}
	}
	a.crash(CrashTargetImported)
	// Recovered (on the shard's start) moves its journal position to last.
	c := a.spawn(ctx, core, false, last)
	if c == nil {
		// Persisted but not running: the source retries, and a restart recovers it.
		return &messages.ImportShardReply{Error: kerr.New(messages.Code_UNAVAILABLE, "", "imported shard %s: its actor did not start; try again", m.Shard)}
	}
	a.pushWorkers(ctx)
	l := a.loadOf(c)
	if ns := a.deps.NameServer(); ns != nil {
		ctx.Send(ns, &messages.ShardOpened{ServerId: a.deps.ServerID, Shard: l})
	}
	a.deps.Log.Info("imported shard", "shard", m.Shard, "epoch", m.Epoch)
	a.crash(CrashTargetActivated)
	return &messages.ImportShardReply{Shard: l}
}

// saveHandedOn writes handedOn to the store (if any).
func (a *Actor) saveHandedOn() error {
	if a.deps.HandedOn == nil {
		return nil
	}
	return a.deps.HandedOn.Save(a.handedOn)
}

// movedOn says whether shard has been held at epoch (or later) and moved on since,
// as far as this server knows: it handed it on itself (kept across restarts by
// Deps.HandedOn), or the route table has a later epoch. Epochs only grow by
// handoffs, each from the one owner of the epoch before, and the import of an epoch
// comes only from the owner of the one before: a later epoch means this import's
// epoch was created and handed on already, and this copy of it is stale. (The
// route table alone is soft state: a fresh NameServer may not have the route yet.)
func (a *Actor) movedOn(shard string, epoch int64) *messages.ShardLoad {
	if e, ok := a.handedOn[shard]; ok && e >= epoch {
		l := &messages.ShardLoad{Shard: shard, Epoch: e}
		if t := a.table.Load(); t != nil {
			for _, r := range t.Routes {
				if r.Shard == shard && r.Epoch > e {
					l.Epoch, l.Pid = r.Epoch, r.Owner
				}
			}
		}
		return l
	}
	if t := a.table.Load(); t != nil {
		for _, r := range t.Routes {
			if r.Shard == shard && r.Epoch > epoch {
				return &messages.ShardLoad{Shard: shard, Epoch: r.Epoch, Pid: r.Owner}
			}
		}
	}
	return nil
}

func (a *Actor) loadOf(c *child) *messages.ShardLoad {
	return &messages.ShardLoad{Shard: c.shard.String(), Epoch: c.epoch, Frozen: c.frozen, Pid: &messages.Ref{Address: c.pid.Address, Id: c.pid.Id}}
}

func (a *Actor) unavailable(ctx actor.Context, m proto.Message) {
	// An empty Pong: the worker tries another server soon.
	answer(ctx, m, kerr.New(messages.Code_UNAVAILABLE, "", "no name server reachable from %s yet", ctx.ActorSystem().Address()), &messages.Pong{})
}

// spawn starts a shard actor for core; nil when it could not (its name is still
// taken, e.g. by a copy that is stopping).
func (a *Actor) spawn(ctx actor.Context, core *shardcore.Core, open bool, lsn uint64) *child {
	shell := shard.NewActor(core, a.shardJournal(core.Frozen()), a.deps.Log)
	shell.SetAlertHooks(a.deps.Alerts)
	shell.SetSink(a.deps.Metrics)
	sh := core.Shard()
	c := &child{shell: shell, shard: sh, stream: core.Stream(), epoch: core.Epoch(), frozen: core.Frozen()} // read before the shard runs
	pid, err := ctx.SpawnNamed(a.hookProps(shell.Props(open, lsn)), ShardName(sh.String()))
	if err != nil {
		a.deps.Log.Error("spawn shard", "shard", sh.String(), "err", err)
		return nil
	}
	c.pid = pid
	a.children[sh.String()] = c
	delete(a.unopened, sh.String()) // here now, however it came: no longer only claimed
	return c
}

func (a *Actor) heartbeat(ctx actor.Context) *messages.ServerHeartbeat {
	hb := &messages.ServerHeartbeat{ServerId: a.deps.ServerID, Server: &messages.Ref{Address: ctx.ActorSystem().Address(), Id: ctx.Self().Id},
		SentMs: time.Now().UnixMilli(), Address: ctx.ActorSystem().Address(), Cpu: cpuLoad(), Mem: memLoad(), SuccessRate: 1,
		Incarnation: a.deps.Incarnation}
	names := make([]string, 0, len(a.children))
	for n := range a.children {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := a.children[n]
		l := c.shell.Load()
		if l == nil {
			// Spawned (so durable) but not started yet: report it all the same, or a
			// heartbeat would take back the ShardOpened the NameServer just had.
			l = a.loadOf(c)
		}
		hb.Shards = append(hb.Shards, l)
	}
	hb.Opening = a.openingClaims()
	hb.Known = knownRoutes(a.table.Load(), a.handedTo)
	if j, ok := a.deps.Journal.(interface{ Err() error }); ok {
		if err := j.Err(); err != nil {
			hb.JournalError = journalErrorText(err) // the NameServer places no shard here until a restart
		}
	}
	// Out of disk space: no new app nor import here until there is room again.
	hb.JournalNoRoom = a.deps.Journal.Room() != nil
	return hb
}

// openingClaims lists, sorted, the shards assigned here whose SHARD_OPENED record
// was appended but is not known durable: in flight, or failed. A NameServer that
// started after it sent the assignment knows of these only from here, and must
// not place their apps on another server at the same epoch meanwhile.
func (a *Actor) openingClaims() []string {
	var out []string
	for n := range a.opening {
		out = append(out, n)
	}
	for n := range a.unopened {
		if a.opening[n] == nil && a.children[n] == nil {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// pushWorkers gives every local shard the workers of its group: an app's workers are
// partitioned among its shards by a hash of the worker id; a shard whose group is
// empty falls back to all of the app's workers.
func (a *Actor) pushWorkers(ctx actor.Context) {
	t := a.table.Load()
	if t == nil {
		return
	}
	byApp := map[string][]*messages.WorkerInfo{}
	for _, aw := range t.Apps {
		byApp[aw.App] = aw.Workers
	}
	shardsOf := map[string][]route.Shard{}
	for _, r := range t.Routes {
		if s, err := route.Parse(r.Shard); err == nil {
			shardsOf[r.App] = append(shardsOf[r.App], s)
		}
	}
	for name, c := range a.children {
		sh := c.shard
		all := byApp[sh.App]
		group := route.Group(sh, shardsOf[sh.App], all)
		key := ""
		for _, w := range group {
			key += w.WorkerId + "@" + w.Ref.GetAddress() + "/" + w.Ref.GetId() + ";"
		}
		key += "|"
		for _, w := range all {
			key += w.WorkerId + ";"
		}
		if a.groups[name] == key {
			continue
		}
		a.groups[name] = key
		ctx.Send(c.pid, &shard.SetWorkers{Workers: group, All: all})
	}
}

// knownRoutes is the server's hearsay for the NameServer: the routes of its table
// and, for each shard it handed off, where it went (when newer than the table's;
// an entry the table has caught up with is dropped from handed). It is cut to
// nscore.MaxRoutes, the most the NameServer takes in a heartbeat (hearsay only
// helps a fresh NameServer: the shards' owners report them all the same).
func knownRoutes(t *messages.RouteTable, handed map[string]*messages.RouteEntry) []*messages.RouteEntry {
	out := make([]*messages.RouteEntry, 0, len(t.GetRoutes())+len(handed))
	seen := make(map[string]bool, len(t.GetRoutes()))
	for _, r := range t.GetRoutes() {
		if h := handed[r.Shard]; h != nil && h.Epoch > r.Epoch {
			out = append(out, h)
		} else {
			delete(handed, r.Shard) // the table has caught up: the hearsay is no longer needed
			out = append(out, r)
		}
		seen[r.Shard] = true
	}
	names := make([]string, 0, len(handed))
	for n := range handed {
		if !seen[n] {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, handed[n])
	}
	return out[:min(len(out), nscore.MaxRoutes)]
}
