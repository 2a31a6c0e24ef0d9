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
