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
	b = appendVarintField(b, 1, uint64(j.Id))
	b = appendStringField(b, 2, j.App)
	b = appendStringField(b, 3, j.Handler)
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
	b = appendVarintField(b, 7, uint64(int64(j.State)))
	b = appendVarintField(b, 8, uint64(j.Version))
	b = appendVarintField(b, 9, uint64(j.CreatedMs))
	b = appendVarintField(b, 10, uint64(j.UpdatedMs))
	b = appendVarintField(b, 11, uint64(j.NextDueMs))
	b = appendVarintField(b, 12, uint64(j.Runs))
	b = appendVarintField(b, 13, uint64(j.LastDueMs))
	b = appendVarintField(b, 14, uint64(j.LastFinishMs))
	b = appendVarintField(b, 15, uint64(j.RequestId))
	return b, true
}

func appendSchedule(b []byte, s *messages.Schedule) []byte {
	b = appendVarintField(b, 1, uint64(int64(s.Kind)))
	b = appendVarintField(b, 2, uint64(s.AtMs))
	b = appendVarintField(b, 3, uint64(s.DelayMs))
	b = appendStringField(b, 4, s.Cron)
	b = appendStringField(b, 5, s.Tz)
	b = appendVarintField(b, 6, uint64(s.EveryMs))
	b = appendVarintField(b, 7, uint64(s.StartMs))
	b = appendVarintField(b, 8, uint64(s.NotBeforeMs))
	b = appendVarintField(b, 9, uint64(s.NotAfterMs))
	return appendVarintField(b, 10, uint64(s.MaxRuns))
}

// scheduleSize is the length of appendSchedule's bytes for s.
func scheduleSize(s *messages.Schedule) int {
	return varintFieldSize(uint64(int64(s.Kind))) + varintFieldSize(uint64(s.AtMs)) + varintFieldSize(uint64(s.DelayMs)) +
		stringFieldSize(s.Cron) + stringFieldSize(s.Tz) + varintFieldSize(uint64(s.EveryMs)) +
		varintFieldSize(uint64(s.StartMs)) + varintFieldSize(uint64(s.NotBeforeMs)) +
		varintFieldSize(uint64(s.NotAfterMs)) + varintFieldSize(uint64(s.MaxRuns))
}

// appendVarintField appends field num (below 16: a one-byte tag) as a varint,
// unless v is zero, as proto3 does.
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, byte(num)<<3|byte(protowire.VarintType)), v)
}

func appendStringField(b []byte, num protowire.Number, v string) []byte {
	if v == "" {
		return b
	}
	return protowire.AppendString(append(b, byte(num)<<3|byte(protowire.BytesType)), v)
}

func varintFieldSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func stringFieldSize(v string) int {
	if v == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(v))
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
	b = appendStringField(b, 1, r.RunId)
	b = appendVarintField(b, 2, uint64(r.JobId))
	b = appendVarintField(b, 3, uint64(r.DueMs))
	b = appendVarintField(b, 4, uint64(r.DispatchedMs))
	b = appendVarintField(b, 5, uint64(r.StartMs))
	b = appendVarintField(b, 6, uint64(r.EndMs))
	b = appendVarintField(b, 7, uint64(int64(r.Attempt)))
	b = appendStringField(b, 8, r.WorkerId)
	b = appendVarintField(b, 9, uint64(int64(r.Outcome)))
	b = appendStringField(b, 10, r.Error)
	b = appendStringField(b, 11, r.TraceId)
	if r.SetsNext {
		b = appendVarintField(b, 12, 1)
	}
	return appendVarintField(b, 13, uint64(r.JobNextDueMs)), true
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
