package server

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// The checks of what the NameServer and other servers send a server: orders
// (AssignShard, MoveShard), imports (ImportShard) and route tables. Each is
// refused, with the field at fault, before anything of it is kept or acted upon
// (a journal record written, a shard spawned or frozen, a table stored): what a
// server keeps comes back to the NameServer in its heartbeats, which refuses a
// heartbeat holding anything it would not keep itself (nscore.Check), so a
// server taking what the NameServer would refuse would go unheard for good.

// checkAssign checks an assignment: the NameServer assigns only a new app's root
// shard, at epoch 1.
func checkAssign(m *messages.AssignShard) *messages.Error {
	sh, e := nscore.ValidShard("shard", m.Shard)
	if e != nil {
		return e
	}
	if sh.Level != 0 {
		return kerr.Invalid("shard", "%s is not an app's root shard (level 0): only a new app's root is assigned", m.Shard)
	}
	return nscore.ValidEpoch("epoch", m.Epoch)
}

// checkMove checks a move or split order: a target that is no actor would freeze
// the shard for good (its handoff is journaled, and retried after a restart).
func checkMove(m *messages.MoveShard) *messages.Error {
	if _, e := nscore.ValidShard("shard", m.Shard); e != nil {
		return e
	}
	if e := nscore.ValidEpoch("epoch", m.Epoch); e != nil {
		return e
	}
	return nscore.ValidRef("target", m.Target)
}

// checkImport checks an import's name and epoch (its snapshot is checked against
// them, loaded and checked again before it is persisted: importShard).
func checkImport(m *messages.ImportShard) *messages.Error {
	if _, e := nscore.ValidShard("shard", m.Shard); e != nil {
		return e
	}
	return nscore.ValidEpoch("epoch", m.Epoch)
}

// checkTable checks a route table pushed (or pulled) from the NameServer: its
// routes go back to the NameServer as hearsay, its workers to the shards.
func checkTable(t *messages.RouteTable) *messages.Error {
	for i, r := range t.Routes {
		if e := nscore.ValidRoute(r); e != nil {
			return nscore.Under(fmt.Sprintf("routes[%d]", i), e)
		}
	}
	// (The fields' names are made only for an error: a table may list 65,536 workers.)
	for i, a := range t.Apps {
		if a == nil {
			return kerr.Invalid(fmt.Sprintf("apps[%d]", i), "is required: an app and its workers")
		}
		if why := route.ValidApp(a.App); why != "" {
			return kerr.Invalid(fmt.Sprintf("apps[%d].app", i), "%s", why)
		}
		for k, w := range a.Workers {
			if w == nil {
				return kerr.Invalid(fmt.Sprintf("apps[%d].workers[%d]", i, k), "is required: the worker's id, app, reference and capacity")
			}
			if e := nscore.ValidWorker(w); e != nil {
				return kerr.Invalid(fmt.Sprintf("apps[%d].workers[%d]", i, k)+strings.TrimPrefix(e.Field, "worker"), "%s", e.Message)
			}
		}
	}
	return nil
}

// refusedOrder logs a message from the NameServer or another server that fails
// its check; the caller answers it, when it has a reply.
func (a *Actor) refusedOrder(ctx actor.Context, m proto.Message, e *messages.Error) {
	a.logRefused(ctx, m, e, "the name server or a server")
}

// logRefused logs a refused message: its type, its sender and the error, which
// names the field.
func (a *Actor) logRefused(ctx actor.Context, m proto.Message, e *messages.Error, senders string) {
	from := ""
	if s := ctx.Sender(); s != nil {
		from = s.Address + "/" + s.Id
	}
	a.deps.Log.Warn("refused a message from "+senders, "type", string(m.ProtoReflect().Descriptor().Name()),
		"from", from, "err", kerr.FromWire(e))
}

// journalErrorText is a journal error as a heartbeat carries it: valid UTF-8 (a
// path in it may not be) and at most nscore.MaxJournalErrorLen bytes, which the
// NameServer checks.
func journalErrorText(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(s) <= nscore.MaxJournalErrorLen {
		return s
	}
	const more = "..."
	cut := nscore.MaxJournalErrorLen - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
