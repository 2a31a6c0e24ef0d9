package server

import (
	"strings"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/messages"
)

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
