package messages

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The packed form of a CreateJobs (CreateJobs.packed), version 1:
//
//	byte    1 (the version)
//	byte    flags: 1 = lean_replies
//	varint  the number of creates, then for each:
//	varint  CreateJob.request_id
//	byte    present: 1 = job, 2 = a new app follows, 4 = a new handler follows,
//	        8 = schedule, 16 = policy
//	  (with a job:)
//	string  app, when it differs from the create before (the first create's from "")
//	string  handler, likewise
//	varint  id; bytes params; varints state, version, created_ms, updated_ms,
//	        next_due_ms, runs, last_due_ms, last_finish_ms, request_id
//	  (with a schedule:) varints kind, at_ms, delay_ms, every_ms, start_ms,
//	        not_before_ms, not_after_ms, max_runs; strings cron, tz
//	  (with a policy:) bytes: the Policy in protobuf
//
// Strings and bytes are a varint length and the bytes; an int64 is the varint of
// its two's complement (as protobuf writes int64). PackCreateJobs packs only
// messages whose every field it knows (packedFieldsKnown), with no unknown fields
// kept from a newer sender and valid UTF-8 in every string (what protobuf demands
// of a string field), so a packed batch unpacks to a CreateJobs equal to the one
// packed (proto.Equal); any other goes plain. Unpacking refuses what protobuf
// would: invalid UTF-8 in a string never reaches the shard (whose journal record
// would not marshal).
const packedVersion = 1

const (
	packedHasJob = 1 << iota
	packedNewApp
	packedNewHandler
	packedHasSchedule
	packedHasPolicy
)

// ErrPacked is the error of a packed batch that does not unpack.
var ErrPacked = errors.New("messages: packed create batch")

// packedFieldsKnown reports whether CreateJobs, CreateJob, Job and Schedule have
// exactly the fields the packed form carries: a field added to the .proto since
// turns packing off (batches go plain) instead of being dropped on the way.
var packedFieldsKnown = sync.OnceValue(func() bool {
	n := func(m proto.Message) int { return m.ProtoReflect().Descriptor().Fields().Len() }
	return n(&CreateJobs{}) == 3 && n(&CreateJob{}) == 2 && n(&Job{}) == 15 && n(&Schedule{}) == 10
})

// PackCreateJobs returns m in the packed form (a CreateJobs with only packed set),
// or nil when m cannot be packed (a field the packed form does not know, unknown
// fields m carries, a string that is not UTF-8, or m packed already): send m plain.
func PackCreateJobs(m *CreateJobs) *CreateJobs {
	if !packedFieldsKnown() || len(m.unknownFields) > 0 || len(m.Packed) > 0 {
		return nil
	}
	size := 3 + protowire.SizeVarint(uint64(len(m.Jobs)))
	for _, c := range m.Jobs {
		if c == nil {
			size += 2
			continue
		}
		j := c.Job
		if len(c.unknownFields) > 0 || (j != nil && len(j.unknownFields) > 0) || (j != nil && j.Schedule != nil && len(j.Schedule.unknownFields) > 0) {
			return nil
		}
		if j != nil && (!utf8.ValidString(j.App) || !utf8.ValidString(j.Handler) ||
			!utf8.ValidString(j.GetSchedule().GetCron()) || !utf8.ValidString(j.GetSchedule().GetTz())) {
			return nil // plain, which protobuf refuses to marshal, as before
		}
		// A guess that fits a one-shot's create (small ints are one byte); append
		// grows the buffer for the rest.
		size += 64 + len(j.GetParams()) + len(j.GetSchedule().GetCron()) + len(j.GetSchedule().GetTz())
	}
	b := make([]byte, 0, size)
	b = append(b, packedVersion)
	if m.LeanReplies {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = protowire.AppendVarint(b, uint64(len(m.Jobs)))
	var app, handler string
	for _, c := range m.Jobs {
		if c == nil {
			b = append(b, 0, 0) // a nil create: request id 0, nothing present (unpacks to an empty CreateJob)
			continue
		}
		b = protowire.AppendVarint(b, uint64(c.RequestId))
		j := c.Job
		if j == nil {
			b = append(b, 0)
			continue
		}
		has := byte(packedHasJob)
		if j.App != app {
			has |= packedNewApp
		}
		if j.Handler != handler {
			has |= packedNewHandler
		}
		if j.Schedule != nil {
			has |= packedHasSchedule
		}
		if j.Policy != nil {
			has |= packedHasPolicy
		}
		b = append(b, has)
		if has&packedNewApp != 0 {
			app = j.App
			b = protowire.AppendString(b, app)
		}
		if has&packedNewHandler != 0 {
			handler = j.Handler
			b = protowire.AppendString(b, handler)
		}
		b = protowire.AppendVarint(b, uint64(j.Id))
		b = protowire.AppendBytes(b, j.Params)
		for _, v := range [...]int64{int64(j.State), j.Version, j.CreatedMs, j.UpdatedMs, j.NextDueMs, j.Runs, j.LastDueMs, j.LastFinishMs, j.RequestId} {
			b = protowire.AppendVarint(b, uint64(v))
		}
		if s := j.Schedule; s != nil {
			for _, v := range [...]int64{int64(s.Kind), s.AtMs, s.DelayMs, s.EveryMs, s.StartMs, s.NotBeforeMs, s.NotAfterMs, s.MaxRuns} {
				b = protowire.AppendVarint(b, uint64(v))
			}
			b = protowire.AppendString(b, s.Cron)
			b = protowire.AppendString(b, s.Tz)
		}
		if j.Policy != nil {
			p, err := proto.Marshal(j.Policy)
			if err != nil {
				return nil
			}
			b = protowire.AppendBytes(b, p)
		}
	}
	return &CreateJobs{Packed: b}
}

// Unpacked returns the CreateJobs m stands for: m itself when it is not packed,
// else the batch in m.packed, or an error wrapping ErrPacked that says where the
// data is off. The creates' CreateJob structs share an array, and their Job structs
// a few (a batch is read, applied and dropped); the app and handler strings are
// shared by the creates that repeat them; params, schedules and policies are each
// their own, as a shard may keep them.
func (m *CreateJobs) Unpacked() (*CreateJobs, error) {
	if len(m.Packed) == 0 {
		return m, nil
	}
	if len(m.Jobs) > 0 || m.LeanReplies {
		return nil, fmt.Errorf("%w: packed beside %d plain creates", ErrPacked, len(m.Jobs))
	}
	d := &packedReader{b: m.Packed}
	if len(d.b) < 2 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than its header", ErrPacked, len(d.b))
	}
	if d.b[0] != packedVersion {
		return nil, fmt.Errorf("%w: version %d, not %d", ErrPacked, d.b[0], packedVersion)
	}
	if d.b[1]&^1 != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrPacked, d.b[1])
	}
	out := &CreateJobs{LeanReplies: d.b[1] == 1}
	d.b = d.b[2:]
	n := d.varint("creates")
	if d.err == nil && n > uint64(len(d.b))/2 { // each create takes two bytes at least
		return nil, fmt.Errorf("%w: %d creates in %d bytes", ErrPacked, n, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	cs := make([]CreateJob, n)
	out.Jobs = make([]*CreateJob, n)
	var js []Job // Jobs in blocks as they come: a create without one takes two bytes, a Job 192
	var app, handler string
	for i := range cs {
		c := &cs[i]
		out.Jobs[i] = c
		c.RequestId = int64(d.varint("request_id"))
		has := d.byte("present")
		if d.err != nil {
			return nil, fmt.Errorf("create %d: %w", i, d.err)
		}
		if has&^(packedHasJob|packedNewApp|packedNewHandler|packedHasSchedule|packedHasPolicy) != 0 || (has&packedHasJob == 0 && has != 0) {
			return nil, fmt.Errorf("%w: create %d: present %#x", ErrPacked, i, has)
		}
		if has&packedHasJob == 0 {
			continue
		}
		if len(js) == cap(js) {
			js = make([]Job, 0, min(64, int(n)-i))
		}
		js = js[:len(js)+1]
		j := &js[len(js)-1]
		c.Job = j
		if has&packedNewApp != 0 {
			app = d.string("app")
		}
		if has&packedNewHandler != 0 {
			handler = d.string("handler")
		}
		j.App, j.Handler = app, handler
		j.Id = int64(d.varint("id"))
		if pb := d.bytes("params"); len(pb) > 0 {
			j.Params = append([]byte(nil), pb...)
		}
		j.State = JobState(d.varint("state"))
		for _, f := range [...]*int64{&j.Version, &j.CreatedMs, &j.UpdatedMs, &j.NextDueMs, &j.Runs, &j.LastDueMs, &j.LastFinishMs, &j.RequestId} {
			*f = int64(d.varint("job fields"))
		}
		if has&packedHasSchedule != 0 {
			s := &Schedule{Kind: ScheduleKind(d.varint("schedule kind"))}
			for _, f := range [...]*int64{&s.AtMs, &s.DelayMs, &s.EveryMs, &s.StartMs, &s.NotBeforeMs, &s.NotAfterMs, &s.MaxRuns} {
				*f = int64(d.varint("schedule fields"))
			}
			s.Cron = d.string("cron")
			s.Tz = d.string("tz")
			j.Schedule = s
		}
		if has&packedHasPolicy != 0 {
			pb := d.bytes("policy")
			if d.err == nil {
				j.Policy = &Policy{}
				if err := proto.Unmarshal(pb, j.Policy); err != nil {
					d.err = fmt.Errorf("%w: policy: %v", ErrPacked, err)
				}
			}
		}
		if d.err != nil {
			return nil, fmt.Errorf("create %d: %w", i, d.err)
		}
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last create", ErrPacked, len(d.b))
	}
	return out, nil
}

// packedReader reads the packed form; its first error sticks, and every read after
// it returns zero.
type packedReader struct {
	b   []byte
	err error
}

func (r *packedReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s cut short or malformed", ErrPacked, what)
	}
	r.b = nil
}

func (r *packedReader) byte(what string) byte {
	if r.err != nil || len(r.b) == 0 {
		r.fail(what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *packedReader) varint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := protowire.ConsumeVarint(r.b)
	if n < 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *packedReader) bytes(what string) []byte {
	if r.err != nil {
		return nil
	}
	v, n := protowire.ConsumeBytes(r.b)
	if n < 0 {
		r.fail(what)
		return nil
	}
	r.b = r.b[n:]
	return v
}

// string reads a string, which must be UTF-8 (as protobuf demands of its strings).
func (r *packedReader) string(what string) string {
	b := r.bytes(what)
	if r.err == nil && !utf8.Valid(b) {
		r.err = fmt.Errorf("%w: %s is not valid UTF-8", ErrPacked, what)
		r.b = nil
		return ""
	}
	return string(b)
}
