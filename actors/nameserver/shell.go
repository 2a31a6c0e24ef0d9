package nameserver

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/dispatch"
	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/messages"
)

// Kind is the cluster kind of the NameServer; Identity its one fixed identity.
const (
	Kind     = "kjob-nameserver"
	Identity = "main"
)

type tick struct{}

// Actor is the proto.actor shell around Core.
type Actor struct {
	core   *core.Core
	ctx    actor.Context
	ticker *time.Ticker
	done   chan struct{}
}

// Props returns the NameServer actor's props; members are the addresses of every
// configured server (see core.SetMembers), nil when unknown; split sets the split
// thresholds (zero values: the defaults).
func Props(s core.Strategy, members []string, split core.SplitPolicy) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		c := core.New(time.Now().UnixMilli(), s)
		c.SetMembers(members)
		c.SetSplit(split)
		return &Actor{core: c}
	}, actor.WithMailbox(dispatch.Mailbox)) // addressed by name from every node: see dispatch.Mailbox
}

// Receive implements actor.Actor.
func (a *Actor) Receive(ctx actor.Context) {
	a.ctx = ctx
	defer func() { a.ctx = nil }()
	now := time.Now().UnixMilli()
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.core.SetSelf(&messages.Ref{Address: ctx.Self().Address, Id: ctx.Self().Id})
		a.ticker = time.NewTicker(core.HeartbeatMs * time.Millisecond / 2)
		a.done = make(chan struct{})
		self, sys, t, done := ctx.Self(), ctx.ActorSystem(), a.ticker, a.done
		go func() {
			for {
				select {
				case <-t.C:
					sys.Root.Send(self, &tick{})
				case <-done:
					return
				}
			}
		}()
	case *actor.Stopping:
		a.ticker.Stop()
		close(a.done)
	case *tick:
		a.core.Tick(now, a)
	case *messages.ServerHeartbeat:
		// No reply: a refused heartbeat is dropped with a warning (the server goes
		// on as one not heard from).
		if err := a.core.ServerHeartbeat(now, m, a); err != nil {
			refused(ctx, m, err)
		}
	case *messages.WorkerHeartbeat:
		err := a.core.WorkerHeartbeat(now, m, a)
		if ctx.Sender() != nil {
			// Registered, or refused with the field at fault: either way a worker that
			// asks knows it need not try again soon (a server without a NameServer yet
			// answers an empty Pong instead).
			ctx.Respond(&messages.Pong{ServerId: "nameserver", Address: ctx.ActorSystem().Address(), Error: err})
		}
	case *messages.WorkerLeft:
		// A goodbye has no reply: one refused is dropped (the server it came through
		// logged it).
		_ = a.core.WorkerLeft(now, m, a)
	case *messages.ShardOpened:
		if m.Error == nil {
			if err := a.core.ShardOpened(now, m.ServerId, m.Shard, a); err != nil {
				refused(ctx, m, err)
			}
		}
	case *messages.GetRoutes:
		var from *messages.Ref
		if m.App == "" && ctx.Sender() != nil && !m.WithWorkers {
			from = nil // pulls are answered; subscriptions use Subscribe
		}
		ctx.Respond(a.core.GetRoutes(now, m, from, a))
	case *messages.Subscribe:
		// No reply either: a refused subscription is dropped (the server logged it).
		_ = a.core.Subscribe(now, m, a)
	case *messages.LeaseNode:
		ctx.Respond(a.core.Lease(now, m))
	case *messages.ClusterStatus:
		r := a.core.Status(now)
		r.Nameserver = ctx.Self().Address
		ctx.Respond(r)
	}
}

// refused logs a server's message the core refused (a message without a reply):
// its type, its sender and the error, which names the field.
func refused(ctx actor.Context, m proto.Message, err *messages.Error) {
	from := ""
	if s := ctx.Sender(); s != nil {
		from = s.Address + "/" + s.Id
	}
	id := ""
	if s, ok := m.(interface{ GetServerId() string }); ok {
		id = s.GetServerId()
		if len(id) > core.MaxServerIDLen {
			id = id[:core.MaxServerIDLen] + "..."
		}
	}
	ctx.Logger().Warn("name server: refused a message from a server", "type", string(m.ProtoReflect().Descriptor().Name()),
		"server_id", id, "from", from, "err", kerr.FromWire(err))
}

// Send implements Env.
func (a *Actor) Send(to *messages.Ref, m any) {
	if to == nil {
		return
	}
	a.ctx.Send(actor.NewPID(to.Address, to.Id), m.(proto.Message))
}
