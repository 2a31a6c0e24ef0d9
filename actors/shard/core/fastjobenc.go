package core

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// appendJobFast appends j's JOB_PUT payload to b without protobuf's reflection: the
// bytes proto.Marshal writes for it (fields in number order, zero values left out),
// which TestAppendJobFastMatchesProto and FuzzAppendJobFast hold it to. Every create
// journals one; proto.Marshal cost about 0.4 µs of the shard's 1.6 µs a create
// (BenchmarkCreate's x-marshal). A policy is marshalled by protobuf in place.
//
// ok false, with b as it was, leaves j to proto.Marshal: a .proto with fields this
// does not know (coldFieldsKnown), unknown fields in the job or its schedule, or a
// string that is not UTF-8 (which proto.Marshal refuses, saying which).
func appendJobFast(b []byte, j *messages.Job) ([]byte, bool) {
	s := j.Schedule
	if !coldFieldsKnown() || len(j.ProtoReflect().GetUnknown()) > 0 ||
		!utf8.ValidString(j.App) || !utf8.ValidString(j.Handler) {
		return b, false
	}
	if s != nil && (len(s.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(s.Cron) || !utf8.ValidString(s.Tz)) {
		return b, false
	}
	if p := j.Policy; p != nil && !utf8.ValidString(p.RouteKey) {
		return b, false
	}
	b = messages.AppendVarintField(b, 1, uint64(j.Id))
	b = messages.AppendStringField(b, 2, j.App)
	b = messages.AppendStringField(b, 3, j.Handler)
	if len(j.Params) > 0 {
		b = protowire.AppendBytes(protowire.AppendTag(b, 4, protowire.BytesType), j.Params)
	}
	if s != nil {
		b = protowire.AppendVarint(protowire.AppendTag(b, 5, protowire.BytesType), uint64(scheduleSize(s)))
		b = appendSchedule(b, s)
	}
	if p := j.Policy; p != nil {
		b = protowire.AppendVarint(protowire.AppendTag(b, 6, protowire.BytesType), uint64(proto.Size(p)))
		var err error
		if b, err = (proto.MarshalOptions{}).MarshalAppend(b, p); err != nil {
			panic("shard: marshal a job's policy: " + err.Error()) // generated types always marshal
		}
	}
	b = messages.AppendVarintField(b, 7, uint64(int64(j.State)))
	b = messages.AppendVarintField(b, 8, uint64(j.Version))
	b = messages.AppendVarintField(b, 9, uint64(j.CreatedMs))
	b = messages.AppendVarintField(b, 10, uint64(j.UpdatedMs))
	b = messages.AppendVarintField(b, 11, uint64(j.NextDueMs))
	b = messages.AppendVarintField(b, 12, uint64(j.Runs))
	b = messages.AppendVarintField(b, 13, uint64(j.LastDueMs))
	b = messages.AppendVarintField(b, 14, uint64(j.LastFinishMs))
	b = messages.AppendVarintField(b, 15, uint64(j.RequestId))
	return b, true
}

func appendSchedule(b []byte, s *messages.Schedule) []byte {
	b = messages.AppendVarintField(b, 1, uint64(int64(s.Kind)))
	b = messages.AppendVarintField(b, 2, uint64(s.AtMs))
	b = messages.AppendVarintField(b, 3, uint64(s.DelayMs))
	b = messages.AppendStringField(b, 4, s.Cron)
	b = messages.AppendStringField(b, 5, s.Tz)
	b = messages.AppendVarintField(b, 6, uint64(s.EveryMs))
	b = messages.AppendVarintField(b, 7, uint64(s.StartMs))
	b = messages.AppendVarintField(b, 8, uint64(s.NotBeforeMs))
	b = messages.AppendVarintField(b, 9, uint64(s.NotAfterMs))
	return messages.AppendVarintField(b, 10, uint64(s.MaxRuns))
}

// scheduleSize is the length of appendSchedule's bytes for s.
func scheduleSize(s *messages.Schedule) int {
	return messages.VarintFieldSize(uint64(int64(s.Kind))) + messages.VarintFieldSize(uint64(s.AtMs)) + messages.VarintFieldSize(uint64(s.DelayMs)) +
		messages.StringFieldSize(s.Cron) + messages.StringFieldSize(s.Tz) + messages.VarintFieldSize(uint64(s.EveryMs)) +
		messages.VarintFieldSize(uint64(s.StartMs)) + messages.VarintFieldSize(uint64(s.NotBeforeMs)) +
		messages.VarintFieldSize(uint64(s.NotAfterMs)) + messages.VarintFieldSize(uint64(s.MaxRuns))
}

// runRecordFieldsKnown reports whether messages.RunRecord has exactly the fields
// appendRunRecordFast writes.
var runRecordFieldsKnown = sync.OnceValue(func() bool {
	return (&messages.RunRecord{}).ProtoReflect().Descriptor().Fields().Len() == 13
})

// appendRunRecordFast appends r's marshalled bytes to b without protobuf's
// reflection, as appendJobFast does a job's: a run's finish journals one and a
// packed one-shot keeps its history in them, and proto.Size with proto.Marshal
// cost about 0.7 µs each, on the shard's goroutine, at every fire. ok false, with
// b as it was, leaves r to proto.Marshal (unknown fields, a string that is not
// UTF-8, a .proto with fields this does not know). TestAppendRunRecordFastMatchesProto
// and FuzzAppendRunRecordFast hold it to proto.Marshal's bytes.
func appendRunRecordFast(b []byte, r *messages.RunRecord) ([]byte, bool) {
	if !runRecordFieldsKnown() || len(r.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(r.RunId) ||
		!utf8.ValidString(r.WorkerId) || !utf8.ValidString(r.Error) || !utf8.ValidString(r.TraceId) {
		return b, false
	}
	b = messages.AppendStringField(b, 1, r.RunId)
	b = messages.AppendVarintField(b, 2, uint64(r.JobId))
	b = messages.AppendVarintField(b, 3, uint64(r.DueMs))
	b = messages.AppendVarintField(b, 4, uint64(r.DispatchedMs))
	b = messages.AppendVarintField(b, 5, uint64(r.StartMs))
	b = messages.AppendVarintField(b, 6, uint64(r.EndMs))
	b = messages.AppendVarintField(b, 7, uint64(int64(r.Attempt)))
	b = messages.AppendStringField(b, 8, r.WorkerId)
	b = messages.AppendVarintField(b, 9, uint64(int64(r.Outcome)))
	b = messages.AppendStringField(b, 10, r.Error)
	b = messages.AppendStringField(b, 11, r.TraceId)
	if r.SetsNext {
		b = messages.AppendVarintField(b, 12, 1)
	}
	return messages.AppendVarintField(b, 13, uint64(r.JobNextDueMs)), true
}

// appendFastOr appends m's marshalled bytes: a job or a run record without
// reflection when it can (appendJobFast, appendRunRecordFast), else proto.Marshal's.
func appendFastOr(b []byte, m proto.Message) []byte {
	ok := false
	switch v := m.(type) {
	case *messages.Job:
		b, ok = appendJobFast(b, v)
	case *messages.RunRecord:
		b, ok = appendRunRecordFast(b, v)
	}
	if ok {
		return b
	}
	b, err := (proto.MarshalOptions{}).MarshalAppend(b, m)
	if err != nil {
		panic(fmt.Sprintf("shard: marshal %T: %v", m, err)) // generated types always marshal
	}
	return b
}
