package core

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// Limits on what workers and clients send to the NameServer (through any server).
// What the NameServer keeps of a worker goes into every route table it pushes to
// every server, so each field is bounded: a worker entry stays under 1.3 KiB, and
// MaxWorkers of them under cluster.MaxMessageBytes (a push past it would be dropped
// on the wire, and with it every route change, for as long as the entry lived).
const (
	MaxWorkerIDLen    = 128    // bytes of a worker id
	MaxWorkerCapacity = 10_000 // handler pool slots a worker may report (0 = the worker's default)
	MaxRefLen         = 512    // bytes of a reference's address, and of its actor id
	MaxHolderLen      = 256    // bytes of a node lease's holder
	MaxWorkers        = 1 << 16
	MaxSubscribers    = 1 << 14 // clients subscribed to route pushes at once
)

// Check says what is wrong with a message a worker or client sends to the
// NameServer, nil when nothing is: the error names the field and, where there is
// one, the limit. The NameServer checks every such message before it keeps or acts
// on anything of it, and a server checks it before forwarding it (so the error
// comes back even when the NameServer is on another node, and the NameServer's
// observers see only what it would keep). A message of another type passes.
func Check(m proto.Message) *messages.Error {
	switch m := m.(type) {
	case *messages.WorkerHeartbeat:
		if m.Worker == nil {
			return kerr.Invalid("worker", "is required: the worker's id, app, reference and capacity")
		}
		return ValidWorker(m.Worker)
	case *messages.WorkerLeft:
		if e := validText("worker_id", m.WorkerId, MaxWorkerIDLen); e != nil {
			return e
		}
		if why := route.ValidApp(m.App); why != "" {
			return kerr.Invalid("app", "%s", why)
		}
	case *messages.GetRoutes:
		if m.App == "" && m.Ensure {
			return kerr.Invalid("app", "must not be empty to place an app")
		}
		if m.App != "" { // "" = every app
			if why := route.ValidApp(m.App); why != "" {
				return kerr.Invalid("app", "%s", why)
			}
		}
	case *messages.Subscribe:
		return validRef("subscriber", m.Subscriber)
	case *messages.LeaseNode:
		if e := validText("holder", m.Holder, MaxHolderLen); e != nil {
			return e
		}
		if m.Node < -1 || m.Node >= MaxNodes {
			return kerr.Invalid("node", "must be -1 (a new one) or 0 to %d, got %d", MaxNodes-1, m.Node)
		}
	}
	return nil
}

// ValidWorker checks a worker's registration; the error names the field
// ("worker.worker_id", ...) and the limit.
func ValidWorker(w *messages.WorkerInfo) *messages.Error {
	if e := validText("worker.worker_id", w.WorkerId, MaxWorkerIDLen); e != nil {
		return e
	}
	if why := route.ValidApp(w.App); why != "" {
		return kerr.Invalid("worker.app", "%s", why)
	}
	if e := validRef("worker.ref", w.Ref); e != nil {
		return e
	}
	// 0 is the worker's default (the shard assumes 64); the busy count is only
	// reported, but it travels in every push like the rest.
	if w.Capacity < 0 || w.Capacity > MaxWorkerCapacity {
		return kerr.Invalid("worker.capacity", "must be 0 (the default) to %d, got %d", MaxWorkerCapacity, w.Capacity)
	}
	if w.Busy < 0 || w.Busy > MaxWorkerCapacity {
		return kerr.Invalid("worker.busy", "must be 0 to %d, got %d", MaxWorkerCapacity, w.Busy)
	}
	return nil
}

// validRef checks a reference to an actor the NameServer will send to: a nil or
// empty one would take a shard's dispatches (or a subscriber's pushes) nowhere.
func validRef(field string, r *messages.Ref) *messages.Error {
	if r == nil {
		return kerr.Invalid(field, "is required: the actor's address and id")
	}
	if e := validText(field+".address", r.Address, MaxRefLen); e != nil {
		return e
	}
	return validText(field+".id", r.Id, MaxRefLen)
}

// validText checks a name (see textFault) and names field in its error.
func validText(field, s string, limit int) *messages.Error {
	if why := textFault(s, limit); why != "" {
		return kerr.Invalid(field, "%s", why)
	}
	return nil
}

// ValidWorkerID says what makes id unfit for a worker id, or "" (as route.ValidApp
// does for an app).
func ValidWorkerID(id string) string { return textFault(id, MaxWorkerIDLen) }

// textFault says what makes s unfit for a name of at most limit bytes, or "": empty,
// too long, not UTF-8 (protobuf does not marshal anything else, and proto.actor
// drops a message that does not marshal: a route push holding it would reach no
// server) or a control character.
func textFault(s string, limit int) string {
	if s == "" {
		return fmt.Sprintf("must not be empty (the limit is %d bytes)", limit)
	}
	if len(s) > limit {
		return fmt.Sprintf("is %d bytes, the limit is %d", len(s), limit)
	}
	return route.TextFault(s)
}

// errWorkersFull is the refusal of a new worker past MaxWorkers.
func errWorkersFull(n, limit int) *messages.Error {
	return kerr.New(messages.Code_RESOURCE_EXHAUSTED, "worker.worker_id",
		"the name server holds %d workers, the limit is %d; this one is not registered", n, limit)
}

// errSubscribersFull is the refusal of a new subscriber past MaxSubscribers.
func errSubscribersFull(n, limit int) *messages.Error {
	return kerr.New(messages.Code_RESOURCE_EXHAUSTED, "subscriber",
		"the name server has %d subscribers, the limit is %d", n, limit)
}
