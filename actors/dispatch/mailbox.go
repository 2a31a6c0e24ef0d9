package dispatch

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Mailbox is proto.actor's default (unbounded) mailbox, safe to post to while its
// actor is still being spawned.
//
// proto.actor's spawn registers a named actor's process, and only then gives its
// mailbox a dispatcher (RegisterHandlers), posts Started and calls Start. A message
// for that name arriving in between — from a remote node, which addresses kjob's
// shards, servers and workers by name — finds the process and posts to a mailbox
// with no dispatcher: the receiving node panics on a nil pointer in
// defaultMailbox.schedule (protoactor-go issue #198, closed without a fix; seen here
// when a node restarted after a SIGKILL while its peers and clients were already
// sending to the shard it was spawning again).
//
// This mailbox keeps what is posted before Start and hands it on in Start: system
// messages first (Started among them, as proto.actor itself would run them), then
// user messages in the order they came. After Start a post costs one atomic load
// more than the default mailbox's.
func Mailbox() actor.Mailbox {
	return &earlyMailbox{Mailbox: actor.Unbounded()()}
}

var _ actor.MailboxProducer = Mailbox

type earlyMailbox struct {
	actor.Mailbox
	started atomic.Bool
	mu      sync.Mutex
	sys     []any // posted before Start
	user    []any
}

func (m *earlyMailbox) PostUserMessage(msg any) {
	if m.started.Load() || !m.keep(msg, false) {
		m.Mailbox.PostUserMessage(msg)
	}
}

func (m *earlyMailbox) PostSystemMessage(msg any) {
	if m.started.Load() || !m.keep(msg, true) {
		m.Mailbox.PostSystemMessage(msg)
	}
}

// keep keeps msg for Start and reports true, or reports false when Start has run.
func (m *earlyMailbox) keep(msg any, system bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started.Load() {
		return false
	}
	if system {
		m.sys = append(m.sys, msg)
	} else {
		m.user = append(m.user, msg)
	}
	return true
}

// Start hands on what was kept, then lets posts through. Posts racing with it wait
// on the lock and go after what was kept.
func (m *earlyMailbox) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, msg := range m.sys {
		m.Mailbox.PostSystemMessage(msg)
	}
	for _, msg := range m.user {
		m.Mailbox.PostUserMessage(msg)
	}
	m.sys, m.user = nil, nil
	m.started.Store(true)
	m.Mailbox.Start()
}
