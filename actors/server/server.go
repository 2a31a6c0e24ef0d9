// Package server is the server actor: one per node. It hosts the node's shard actors
// (children), owns the node's journal, reports load to the NameServer in every
// heartbeat, opens shards it is assigned, hands each shard the workers of its group,
// and forwards registry traffic from clients and workers to the NameServer.
package server

import (
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
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
}

// Recovered is a shard found in the journal at start.
type Recovered struct {
	Core       *shardcore.Core
	DurableLSN uint64
}

type child struct {
	pid   *actor.PID
	shell *shard.Actor
	core  *shardcore.Core
}

// HeartbeatTick makes the server send its heartbeat.
type HeartbeatTick struct{}

// Actor is the server actor.
type Actor struct {
	deps      Deps
	recovered []Recovered
	children  map[string]*child
	table     atomic.Pointer[messages.RouteTable]
	groups    map[string]string // shard → last worker set key sent
	mu        sync.Mutex
}

// New makes the server actor with the shards recovered from the journal.
func New(d Deps, rec []Recovered) *Actor {
	return &Actor{deps: d, recovered: rec, children: map[string]*child{}, groups: map[string]string{}}
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
		}
	case *messages.Ping:
		ctx.Respond(&messages.Pong{ServerId: a.deps.ServerID, Address: ctx.ActorSystem().Address()})
	case *messages.AssignShard:
		sh, err := route.Parse(m.Shard)
		if err != nil {
			ctx.Respond(&messages.ShardOpened{ServerId: a.deps.ServerID, Error: kerr.Invalid("shard", "%v", err)})
			return
		}
		c := a.children[m.Shard]
		if c == nil {
			c = a.spawn(ctx, a.deps.NewCore(sh, m.Epoch), true, 0)
		}
		a.pushWorkers(ctx)
		l := &messages.ShardLoad{Shard: m.Shard, Epoch: c.core.Epoch(), Pid: &messages.Ref{Address: c.pid.Address, Id: c.pid.Id}}
		if ctx.Sender() != nil {
			ctx.Respond(&messages.ShardOpened{ServerId: a.deps.ServerID, Shard: l})
		}
	case *messages.MoveShard:
		if c := a.children[m.Shard]; c != nil && c.core.Epoch() == m.Epoch && m.Target != nil {
			a.deps.Log.Info("handing off shard", "shard", m.Shard, "epoch", m.Epoch, "target", m.Target.Address)
			ctx.Send(c.pid, &shard.BeginHandoff{Target: actor.NewPID(m.Target.Address, m.Target.Id)})
		}
	case *messages.ImportShard:
		ctx.Respond(a.importShard(ctx, m))
	case *shard.HandedOff:
		if c := a.children[m.Shard]; c != nil {
			ctx.Stop(c.pid)
			delete(a.children, m.Shard)
			delete(a.groups, m.Shard)
			if err := a.deps.Journal.DropStream(c.core.Stream()); err != nil {
				a.deps.Log.Warn("drop handed-off shard's stream", "shard", m.Shard, "err", err)
			}
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
		a.table.Store(m)
		a.pushWorkers(ctx)
	case *messages.GetRoutes, *messages.WorkerHeartbeat, *messages.WorkerLeft, *messages.LeaseNode,
		*messages.ClusterStatus, *messages.Subscribe:
		ns := a.deps.NameServer()
		if ns == nil {
			a.unavailable(ctx, m.(proto.Message))
			return
		}
		ctx.Forward(ns)
	}
}

// importShard persists a shard handed to this node (one record holding all of it)
// before it answers, then activates it at the new epoch. A repeat is answered the
// same way without a second copy.
func (a *Actor) importShard(ctx actor.Context, m *messages.ImportShard) *messages.ImportShardReply {
	sh, err := route.Parse(m.Shard)
	if err != nil {
		return &messages.ImportShardReply{Error: kerr.Invalid("shard", "%v", err)}
	}
	if c := a.children[m.Shard]; c != nil {
		if c.core.Epoch() >= m.Epoch {
			return &messages.ImportShardReply{Shard: a.loadOf(c)}
		}
		return &messages.ImportShardReply{Error: kerr.New(messages.Code_FAILED_PRECONDITION, "epoch",
			"shard %s is here at epoch %d, below the import's %d", m.Shard, c.core.Epoch(), m.Epoch)}
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
	core := a.deps.NewCore(sh, m.Epoch)
	if err := core.LoadSnapshot(m.Snapshot, last); err != nil {
		return &messages.ImportShardReply{Error: kerr.Invalid("snapshot", "%v", err)}
	}
	c := a.spawn(ctx, core, false, last)
	a.pushWorkers(ctx)
	l := a.loadOf(c)
	if ns := a.deps.NameServer(); ns != nil {
		ctx.Send(ns, &messages.ShardOpened{ServerId: a.deps.ServerID, Shard: l})
	}
	a.deps.Log.Info("imported shard", "shard", m.Shard, "epoch", m.Epoch)
	return &messages.ImportShardReply{Shard: l}
}

func (a *Actor) loadOf(c *child) *messages.ShardLoad {
	return &messages.ShardLoad{Shard: c.core.Shard().String(), Epoch: c.core.Epoch(), Pid: &messages.Ref{Address: c.pid.Address, Id: c.pid.Id}}
}

func (a *Actor) unavailable(ctx actor.Context, m proto.Message) {
	e := kerr.New(messages.Code_UNAVAILABLE, "", "no name server reachable from %s yet", ctx.ActorSystem().Address())
	switch m.(type) {
	case *messages.GetRoutes:
		ctx.Respond(&messages.RouteTable{Error: e})
	case *messages.LeaseNode:
		ctx.Respond(&messages.LeaseNodeReply{Error: e})
	case *messages.ClusterStatus:
		ctx.Respond(&messages.ClusterStatusReply{Error: e})
	case *messages.WorkerHeartbeat:
		ctx.Respond(&messages.Pong{})
	}
}

func (a *Actor) spawn(ctx actor.Context, core *shardcore.Core, open bool, lsn uint64) *child {
	shell := shard.NewActor(core, a.deps.Journal, a.deps.Log)
	shell.SetAlertHooks(a.deps.Alerts)
	shell.SetSink(a.deps.Metrics)
	name := core.Shard().String()
	pid, err := ctx.SpawnNamed(shell.Props(open, lsn), ShardName(name))
	if err != nil {
		a.deps.Log.Error("spawn shard", "shard", name, "err", err)
		return &child{pid: pid, shell: shell, core: core}
	}
	c := &child{pid: pid, shell: shell, core: core}
	a.children[name] = c
	return c
}

func (a *Actor) heartbeat(ctx actor.Context) *messages.ServerHeartbeat {
	hb := &messages.ServerHeartbeat{ServerId: a.deps.ServerID, Server: &messages.Ref{Address: ctx.ActorSystem().Address(), Id: ctx.Self().Id},
		SentMs: time.Now().UnixMilli(), Address: ctx.ActorSystem().Address(), Cpu: cpuLoad(), Mem: memLoad(), SuccessRate: 1}
	names := make([]string, 0, len(a.children))
	for n := range a.children {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if l := a.children[n].shell.Load(); l != nil {
			hb.Shards = append(hb.Shards, l)
		}
	}
	if t := a.table.Load(); t != nil {
		hb.Known = t.Routes
	}
	return hb
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
		sh := c.core.Shard()
		all := byApp[sh.App]
		group := route.Group(sh, shardsOf[sh.App], all)
		key := ""
		for _, w := range group {
			key += w.WorkerId + "@" + w.Ref.GetAddress() + "/" + w.Ref.GetId() + ";"
		}
		if a.groups[name] == key {
			continue
		}
		a.groups[name] = key
		ctx.Send(c.pid, &shard.SetWorkers{Workers: group})
	}
}
