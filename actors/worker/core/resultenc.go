package core

import (
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kjob/kjob/messages"
)

// A finished run's result is encoded into the memory's arena once (store), on the
// worker actor's goroutine, for every run; proto.Size and proto.Marshal took about
// 1.3 µs of it. resultSize and appendResult write the same bytes without
// protobuf's reflection (TestAppendResultMatchesProto, FuzzAppendResult), for every
// result but one with unknown fields, a string that is not UTF-8, or a .proto with
// fields they do not know: those go to proto.Marshal as before.

// resultFieldsKnown reports whether messages.RunResult and messages.Ref have
// exactly the fields appendResult writes.
var resultFieldsKnown = sync.OnceValue(func() bool {
	return (&messages.RunResult{}).ProtoReflect().Descriptor().Fields().Len() == 13 &&
		(&messages.Ref{}).ProtoReflect().Descriptor().Fields().Len() == 2
})

// resultSize is the length of r's encoding, false when appendResult does not
// take r (leave it to proto.Marshal).
func resultSize(r *messages.RunResult) (int, bool) {
	if !resultFieldsKnown() || len(r.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(r.RunId) ||
		!utf8.ValidString(r.Shard) || !utf8.ValidString(r.Error) || !utf8.ValidString(r.WorkerId) {
		return 0, false
	}
	n := messages.StringFieldSize(r.RunId) + messages.VarintFieldSize(uint64(r.JobId)) +
		messages.StringFieldSize(r.Shard) + messages.VarintFieldSize(uint64(r.Epoch)) +
		messages.VarintFieldSize(uint64(int64(r.Attempt))) + messages.VarintFieldSize(uint64(r.DueMs)) +
		messages.VarintFieldSize(uint64(int64(r.Outcome))) + messages.StringFieldSize(r.Error) +
		messages.VarintFieldSize(uint64(r.StartMs)) + messages.VarintFieldSize(uint64(r.EndMs)) +
		messages.StringFieldSize(r.WorkerId)
	if w := r.Worker; w != nil {
		if len(w.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(w.Address) || !utf8.ValidString(w.Id) {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(refSize(w))
	}
	if r.Duplicate {
		n += 2
	}
	return n, true
}

func refSize(w *messages.Ref) int {
	return messages.StringFieldSize(w.Address) + messages.StringFieldSize(w.Id)
}

// appendResult appends r's encoding to b; resultSize must have taken r.
func appendResult(b []byte, r *messages.RunResult) []byte {
	b = messages.AppendStringField(b, 1, r.RunId)
	b = messages.AppendVarintField(b, 2, uint64(r.JobId))
	b = messages.AppendStringField(b, 3, r.Shard)
	b = messages.AppendVarintField(b, 4, uint64(r.Epoch))
	b = messages.AppendVarintField(b, 5, uint64(int64(r.Attempt)))
	b = messages.AppendVarintField(b, 6, uint64(r.DueMs))
	b = messages.AppendVarintField(b, 7, uint64(int64(r.Outcome)))
	b = messages.AppendStringField(b, 8, r.Error)
	b = messages.AppendVarintField(b, 9, uint64(r.StartMs))
	b = messages.AppendVarintField(b, 10, uint64(r.EndMs))
	b = messages.AppendStringField(b, 11, r.WorkerId)
	if w := r.Worker; w != nil {
		b = protowire.AppendVarint(protowire.AppendTag(b, 12, protowire.BytesType), uint64(refSize(w)))
		b = messages.AppendStringField(b, 1, w.Address)
		b = messages.AppendStringField(b, 2, w.Id)
	}
	if r.Duplicate {
		b = messages.AppendVarintField(b, 13, 1)
	}
	return b
}
