package sim

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
)

// The server's own records in the shared journal, next to the shards' records.
// They carry the handoff protocol (see handoff.go); the shard core never sees them.
const (
	// recSnapshot is a shard's state as a handoff target persisted it, before it
	// activated: payload = target epoch (8 bytes, little endian) + core snapshot.
	recSnapshot uint8 = 240
	// recIntent says the shard is being handed off: payload = target address. It
	// is written with the shard's SHARD_CLOSED record, so a source that restarts
	// mid-handoff knows where to resume.
	recIntent uint8 = 241
	// recDropped says the shard left this server (the target confirmed): recovery
	// forgets its stream, as persistence.Journal.DropStream would.
	recDropped uint8 = 242
)

func encodeSnapshotRecord(epoch int64, data []byte) []byte {
	b := make([]byte, 8, 8+len(data))
	binary.LittleEndian.PutUint64(b, uint64(epoch))
	return append(b, data...)
}

func decodeSnapshotRecord(p []byte) (int64, []byte, error) {
	if len(p) < 8 {
		return 0, nil, fmt.Errorf("snapshot record of %d bytes", len(p))
	}
	return int64(binary.LittleEndian.Uint64(p)), p[8:], nil
}

// decodePayload decodes a shard record's payload by its type, with the core's own
// mapping (RecordType → message).
func decodePayload(t uint8, b []byte) (proto.Message, error) {
	return shardcore.Decode(messages.RecordType(t), b)
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("sim: marshal %T: %v", m, err))
	}
	return b
}

// recordBrief is a one-line description of a shard record for the trace.
func recordBrief(t messages.RecordType, m proto.Message) string {
	switch x := m.(type) {
	case *messages.Job:
		return fmt.Sprintf("%s{%d v%d %s next=%d runs=%d}", t, x.Id, x.Version, x.State, x.NextDueMs, x.Runs)
	case *messages.RunState:
		return fmt.Sprintf("%s{%s#%d level=%d deadline=%d fire=%v next=%d}", t, x.RunId, x.Attempt, x.Level, x.DeadlineMs, x.Fire, x.JobNextDueMs)
	case *messages.RunRecord:
		return fmt.Sprintf("%s{%s#%d %s sets_next=%v next=%d}", t, x.RunId, x.Attempt, x.Outcome, x.SetsNext, x.JobNextDueMs)
	case *messages.DeadLetter:
		return fmt.Sprintf("%s{%s after %d attempts}", t, x.RunId, x.Attempts)
	case *messages.JobRef:
		return fmt.Sprintf("%s{%d %s}", t, x.Id, x.RunId)
	case *messages.ShardMeta:
		return fmt.Sprintf("%s{%s@%d}", t, x.Shard, x.Epoch)
	}
	return t.String()
}
