package shard

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
)

// Handoff, the shell side: the core journals the decision and freezes (BeginHandoff),
// then — once everything it ever acknowledged is durable — the shell sends the whole
// shard at epoch+1 to the target server, which persists it before it answers. Only
// then does this copy close (HandoffDone) and the server drop it. A failure or a
// crash at any step retries the import (the target answers a repeat idempotently),
// so a handoff once begun always completes and the shard has one active owner.

// BeginHandoff asks the shard to hand itself to Target (a server actor), or with
// Split to split itself into its two halves on Target (its own server).
type BeginHandoff struct {
	Target *actor.PID
	Split  bool
}

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
	if target == nil || a.handoffBusy || a.handoffWait || !a.core.Quiescent() || a.core.Failed() != nil {
		return
	}
	a.handoffBusy = true
	a.importNext(a.ctx, target, a.core.HandoffImports(), 0)
}

// importNext sends imports[i] to target, then the next; after the last is confirmed
// the copy here closes. A move has one import, a split two (its halves, to its own
// server). Any failure retries the whole handoff later: an import already done is
// answered idempotently.
func (a *Actor) importNext(ctx actor.Context, target *messages.Ref, imports []*messages.ImportShard, i int) {
	name := a.core.Shard().String()
	if i == len(imports) {
		a.handoffBusy = false
		a.core.HandoffDone(a)
		if len(imports) > 1 {
			a.log.Info("shard split", "shard", name, "into", imports[0].Shard+", "+imports[1].Shard, "epoch", imports[0].Epoch)
		} else {
			a.log.Info("shard handed off", "shard", name, "target", target.Address, "epoch", a.core.Epoch()+1)
		}
		ctx.Send(ctx.Parent(), &HandedOff{Shard: name})
		return
	}
	im := imports[i]
	f := ctx.RequestFuture(actor.NewPID(target.Address, target.Id), im, handoffTimeout(len(im.Snapshot)))
	ctx.ReenterAfter(f, func(res interface{}, err error) {
		a.ctx = ctx
		defer func() { a.ctx = nil }()
		if err == nil {
			if r, ok := res.(*messages.ImportShardReply); ok {
				err = kerr.FromWire(core.ImportConfirmed(im, r))
			} else {
				err = errUnexpected
			}
		}
		if err != nil {
			// Wait out HandoffRetry before the next attempt: every message this
			// frozen shard receives (callers retrying, worker results) would start
			// another one at once.
			a.handoffBusy, a.handoffWait = false, true
			a.log.Warn("shard handoff: import failed; retrying", "shard", name, "import", im.Shard, "target", target.Address, "err", err)
			self, sys := ctx.Self(), ctx.ActorSystem()
			time.AfterFunc(HandoffRetry, func() { sys.Root.Send(self, &retryHandoff{}) })
			return
		}
		a.importNext(ctx, target, imports, i+1)
	})
}

type unexpectedReply struct{}

func (unexpectedReply) Error() string { return "shard handoff: unexpected reply" }

var errUnexpected error = unexpectedReply{}
