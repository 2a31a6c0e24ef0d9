package server

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/kjob/kjob/actors/shard"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// ErrFrozenSnapshot is the refusal to snapshot a shard that is being handed off.
var ErrFrozenSnapshot = errors.New("server: a shard being handed off is not snapshotted (a snapshot cannot say it is frozen)")

// shardJournal is the node's journal as one shard actor sees it. It refuses to
// snapshot the shard once it is frozen for a handoff: the snapshot format holds no
// handoff, so recovery from such a snapshot would bring the old owner back active
// at the old epoch, next to the new owner (recovery skips the records the snapshot
// covers, the SHARD_HANDOFF among them). A frozen shard never thaws (it closes), so
// the flag only goes one way; its stream pins its segments until it is dropped.
//
// In tests of real processes it also carries the source's journal crash points.
type shardJournal struct {
	shard.Journal
	frozen atomic.Bool        // set from the shard's goroutine (Append), read from it (WriteSnapshot)
	crash  func(point string) // nil in production
}

// shardJournal makes the journal of a shard; frozen is its state at spawn.
func (a *Actor) shardJournal(frozen bool) *shardJournal {
	j := &shardJournal{Journal: a.deps.Journal}
	j.frozen.Store(frozen)
	if a.crashAt != "" {
		j.crash = a.crash
	}
	return j
}

func (j *shardJournal) Append(entries []persistence.Entry, cb func(uint64, error)) (uint64, uint64, error) {
	return j.AppendWithin(entries, 0, cb)
}

// AppendWithin is Append for records that may wait up to within for their sync; a
// handoff's records never wait (the core does not ask).
func (j *shardJournal) AppendWithin(entries []persistence.Entry, within time.Duration, cb func(uint64, error)) (uint64, uint64, error) {
	var handoff, closed bool
	for _, e := range entries {
		switch messages.RecordType(e.Type) {
		case messages.RecordType_SHARD_HANDOFF:
			handoff = true
		case messages.RecordType_SHARD_CLOSED:
			closed = true // only HandoffDone appends it: the target has confirmed
		}
	}
	if handoff || closed {
		j.frozen.Store(true) // the core froze when it emitted the record
		within = 0
	}
	if j.crash == nil || !(handoff || closed) {
		return j.Journal.AppendWithin(entries, within, cb)
	}
	if closed {
		j.crash(CrashSourceReplyReceived)
	}
	inner := cb
	cb = func(lsn uint64, err error) {
		if err == nil && handoff {
			j.crash(CrashSourceHandoffDurable) // before the shard hears it is durable
		}
		if err == nil && closed {
			j.crash(CrashSourceClosedDurable)
		}
		inner(lsn, err)
	}
	return j.Journal.Append(entries, cb)
}

func (j *shardJournal) WriteSnapshot(stream, lsn uint64, data []byte) error {
	if j.frozen.Load() {
		return ErrFrozenSnapshot
	}
	return j.Journal.WriteSnapshot(stream, lsn, data)
}
