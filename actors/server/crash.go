package server

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/messages"
)

// Crash points: a test of real processes names one in CrashEnv, and the server
// kills its own process (SIGKILL: no deferred call, no flush, no goodbye) when a
// handoff reaches that step. They bracket every record and every message of the
// protocol (actors/shard/handoff.go), on both sides:
//
//	source (old owner)                        target
//	SHARD_HANDOFF durable ......... [1]
//	ImportShard sent .............. [2] ───▶  received ................... [6]
//	                                          SHARD_IMPORTED durable ..... [7]
//	                                          activated, not answered .... [8]
//	reply received ................ [3] ◀───
//	SHARD_CLOSED durable .......... [4]
//	stream dropped ................ [5]
const (
	CrashSourceHandoffDurable = "source-handoff-durable" // [1] frozen on disk; nothing sent
	CrashSourceSnapshotSent   = "source-snapshot-sent"   // [2] ImportShard on its way (the reply is never read)
	CrashSourceReplyReceived  = "source-reply-received"  // [3] the target confirmed; SHARD_CLOSED not appended
	CrashSourceClosedDurable  = "source-closed-durable"  // [4] SHARD_CLOSED durable; the stream may not be dropped
	CrashSourceDropped        = "source-dropped"         // [5] the stream is dropped
	CrashTargetReceived       = "target-received"        // [6] ImportShard here; nothing persisted
	CrashTargetImported       = "target-imported"        // [7] SHARD_IMPORTED durable; not activated
	CrashTargetActivated      = "target-activated"       // [8] active at epoch+1; no reply sent
)

// CrashPoints lists every crash point, source side first.
func CrashPoints() []string {
	return []string{CrashSourceHandoffDurable, CrashSourceSnapshotSent, CrashSourceReplyReceived, CrashSourceClosedDurable,
		CrashSourceDropped, CrashTargetReceived, CrashTargetImported, CrashTargetActivated}
}

// CrashEnv is the environment variable naming the crash point of a test process.
// It is read once, when the server actor is made; unset (production) no hook is
// installed at all: the shards get the plain journal and props.
const CrashEnv = "KJOB_TEST_CRASH_AT"

// crashSentGrace is how long the source waits, with its shard actor blocked, after
// sending ImportShard and before dying, so the message is on the wire and the
// target works on it while the source is dead.
const crashSentGrace = 300 * time.Millisecond

// crash kills the process if point is the configured crash point.
func (a *Actor) crash(point string) {
	if a.crashAt == "" || a.crashAt != point {
		return
	}
	a.deps.Log.Error("crash point reached: killing the process", "point", point)
	fmt.Fprintf(os.Stderr, "kjob: crash point %s: SIGKILL\n", point)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute) // the signal is on its way; do nothing more meanwhile
}

// hookProps adds the ImportShard crash point to a shard's props (a sender
// middleware sees it go out); the journal steps are in shardJournal.
func (a *Actor) hookProps(p *actor.Props) *actor.Props {
	if a.crashAt != CrashSourceSnapshotSent {
		return p
	}
	return p.Configure(actor.WithSenderMiddleware(func(next actor.SenderFunc) actor.SenderFunc {
		return func(c actor.SenderContext, target *actor.PID, env *actor.MessageEnvelope) {
			next(c, target, env)
			if _, ok := env.Message.(*messages.ImportShard); ok {
				time.Sleep(crashSentGrace)
				a.crash(CrashSourceSnapshotSent)
			}
		}
	}))
}
