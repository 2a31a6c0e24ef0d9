package shard

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/messages"
)

// Handoff, the shell side: the core journals the decision and freezes (BeginHandoff),
// then — once everything it ever acknowledged is durable — the shell sends the whole
// shard at epoch+1 to the target server, which persists it before it answers. Only
// then does this copy close (HandoffDone) and the server drop it. A failure or a
// crash at any step retries the import (the target answers a repeat idempotently),
// so a handoff once begun always completes and the shard has one active owner.

// BeginHandoff asks the shard to hand itself to Target (a server actor).
type BeginHandoff struct{ Target *actor.PID }

// HandedOff tells the parent server that the shard's copy here is closed.
type HandedOff struct{ Shard string }

type retryHandoff struct{}

// HandoffRetry is how long the shell waits before retrying a failed import.
const HandoffRetry = time.Second

// An import request's timeout grows with the snapshot (the target checks, loads and
// persists all of it before it answers), from handoffTimeoutMin to handoffTimeoutMax.
// A timeout is cheap to be wrong about: the retry is answered idempotently. Being
// long is not: a target that died with the request leaves the shard frozen (no
// owner serving it) until the timeout ends.
const (
	handoffTimeoutMin     = 2 * time.Second
	handoffTimeoutMax     = 60 * time.Second
	handoffBytesPerSecond = 4 << 20
)

func handoffTimeout(snapshotBytes int) time.Duration {
	d := handoffTimeoutMin + time.Duration(snapshotBytes)*time.Second/handoffBytesPerSecond
	return min(d, handoffTimeoutMax)
}

func (a *Actor) tryHandoff() {
	target := a.core.Handoff()
	if target == nil || a.handoffBusy || !a.core.Quiescent() || a.core.Failed() != nil {
		return
	}
	a.handoffBusy = true
	ctx := a.ctx
	snap := a.core.HandoffSnapshot()
	name := a.core.Shard().String()
	f := ctx.RequestFuture(actor.NewPID(target.Address, target.Id),
		&messages.ImportShard{Shard: name, Epoch: a.core.Epoch() + 1, Snapshot: snap}, handoffTimeout(len(snap)))
	ctx.ReenterAfter(f, func(res interface{}, err error) {
		a.ctx = ctx
		defer func() { a.ctx = nil }()
		a.handoffBusy = false
		if err == nil {
			if r, ok := res.(*messages.ImportShardReply); ok {
				err = kerr.FromWire(r.Error)
			} else {
				err = errUnexpected
			}
		}
		if err != nil {
			a.log.Warn("shard handoff: import failed; retrying", "shard", name, "target", target.Address, "err", err)
			self, sys := ctx.Self(), ctx.ActorSystem()
			time.AfterFunc(HandoffRetry, func() { sys.Root.Send(self, &retryHandoff{}) })
			return
		}
		a.core.HandoffDone(a)
		a.log.Info("shard handed off", "shard", name, "target", target.Address, "epoch", a.core.Epoch()+1)
		ctx.Send(ctx.Parent(), &HandedOff{Shard: name})
	})
}

type unexpectedReply struct{}

func (unexpectedReply) Error() string { return "shard handoff: unexpected reply" }

var errUnexpected error = unexpectedReply{}
