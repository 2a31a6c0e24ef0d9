package sim

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
)

// recDropped is the journal's own drop-stream record (persistence.Journal.DropStream):
// recovery forgets every earlier record of its stream. The shard core never sees it;
// its payload (the epoch dropped, 8 bytes little endian) is for the trace only.
const recDropped uint8 = 242

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
