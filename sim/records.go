package sim

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

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

// decodePayload decodes a shard record's payload by its type (the core's own
// mapping, RecordType → message).
func decodePayload(t uint8, b []byte) (proto.Message, error) {
	var m proto.Message
	switch messages.RecordType(t) {
	case messages.RecordType_SHARD_OPENED, messages.RecordType_SHARD_CLOSED:
		m = &messages.ShardMeta{}
	case messages.RecordType_JOB_PUT:
		m = &messages.Job{}
	case messages.RecordType_JOB_DELETED, messages.RecordType_DEAD_LETTER_REMOVED:
		m = &messages.JobRef{}
	case messages.RecordType_RUN_DISPATCHED, messages.RecordType_RETRY_SCHEDULED:
		m = &messages.RunState{}
	case messages.RecordType_RUN_FINISHED:
		m = &messages.RunRecord{}
	case messages.RecordType_DEAD_LETTERED:
		m = &messages.DeadLetter{}
	default:
		return nil, fmt.Errorf("unknown record type %d", t)
	}
	return m, proto.Unmarshal(b, m)
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("sim: marshal %T: %v", m, err))
	}
	return b
}
