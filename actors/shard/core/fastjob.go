package core

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// flatJob is a JOB_PUT payload parsed without protobuf's reflection and without
// allocating: its scalars, and its strings and params as ranges of the payload.
// Recovery decodes one such record per job created; proto.Unmarshal cost about
// 0.8 µs each, as much as applying them, and building the message (five objects)
// still about 0.4 µs, most of it garbage once the job is kept compact.
type flatJob struct {
	id, version, created, updated, next, runs, lastDue, lastFinish, reqID int64
	state                                                                 int32
	app, handler, params                                                  span
	hasParams, hasSched                                                   bool
	sched                                                                 flatSchedule
}

type flatSchedule struct {
	kind                                                 int32
	at, delay, every, start, notBefore, notAfter, maxRun int64
	cron, tz                                             span
}

// span is a range of the payload a flatJob was parsed from.
type span struct{ off, n uint32 }

func (s span) of(b []byte) []byte { return b[s.off : s.off+s.n : s.off+s.n] }

// parseJob parses a JOB_PUT payload into f, for a job with no policy of its own and
// only the fields it knows. ok false means: use proto.Unmarshal (a policy, a field
// number or wire type it does not know, a repeated sub-message, invalid UTF-8, a
// malformed encoding; proto.Unmarshal then decodes it or says what is wrong).
// TestDecodeJobFastMatchesProto and FuzzDecodeJobFast keep it equal to proto.Unmarshal.
func parseJob(b []byte, f *flatJob) bool {
	if !coldFieldsKnown() || len(b) > 1<<31 {
		return false
	}
	*f = flatJob{}
	at := 0
	for at < len(b) {
		num, typ, n := protowire.ConsumeTag(b[at:])
		if n < 0 {
			return false
		}
		at += n
		switch {
		case typ == protowire.VarintType && (num == 1 || (num >= 7 && num <= 15)):
			v, n := protowire.ConsumeVarint(b[at:])
			if n < 0 {
				return false
			}
			at += n
			switch num {
			case 1:
				f.id = int64(v)
			case 7:
				f.state = int32(v)
			case 8:
				f.version = int64(v)
			case 9:
				f.created = int64(v)
			case 10:
				f.updated = int64(v)
			case 11:
				f.next = int64(v)
			case 12:
				f.runs = int64(v)
			case 13:
				f.lastDue = int64(v)
			case 14:
				f.lastFinish = int64(v)
			case 15:
				f.reqID = int64(v)
			}
		case typ == protowire.BytesType && num >= 2 && num <= 5:
			v, n := protowire.ConsumeBytes(b[at:])
			if n < 0 {
				return false
			}
			s := span{uint32(at + n - len(v)), uint32(len(v))}
			at += n
			switch num {
			case 2, 3:
				if !utf8.Valid(v) {
					return false
				}
				if num == 2 {
					f.app = s
				} else {
					f.handler = s
				}
			case 4:
				f.params, f.hasParams = s, true
			case 5:
				if f.hasSched { // a second occurrence merges into the first
					return false
				}
				if !parseSchedule(b, s, &f.sched) {
					return false
				}
				f.hasSched = true
			}
		default:
			return false
		}
	}
	return true
}

// parseSchedule parses the schedule at s of b into f.
func parseSchedule(b []byte, s span, f *flatSchedule) bool {
	at, end := int(s.off), int(s.off+s.n)
	for at < end {
		num, typ, n := protowire.ConsumeTag(b[at:end])
		if n < 0 {
			return false
		}
		at += n
		switch {
		case typ == protowire.VarintType && (num <= 3 || num >= 6) && num >= 1 && num <= 10:
			v, n := protowire.ConsumeVarint(b[at:end])
			if n < 0 {
				return false
			}
			at += n
			switch num {
			case 1:
				f.kind = int32(v)
			case 2:
				f.at = int64(v)
			case 3:
				f.delay = int64(v)
			case 6:
				f.every = int64(v)
			case 7:
				f.start = int64(v)
			case 8:
				f.notBefore = int64(v)
			case 9:
				f.notAfter = int64(v)
			case 10:
				f.maxRun = int64(v)
			}
		case typ == protowire.BytesType && (num == 4 || num == 5):
			v, n := protowire.ConsumeBytes(b[at:end])
			if n < 0 || !utf8.Valid(v) {
				return false
			}
			sp := span{uint32(at + n - len(v)), uint32(len(v))}
			at += n
			if num == 4 {
				f.cron = sp
			} else {
				f.tz = sp
			}
		default:
			return false
		}
	}
	return true
}

// message is the job f holds (b is the payload it was parsed from).
func (f *flatJob) message(b []byte) *messages.Job {
	j := &messages.Job{Id: f.id, State: messages.JobState(f.state), Version: f.version, CreatedMs: f.created,
		UpdatedMs: f.updated, NextDueMs: f.next, Runs: f.runs, LastDueMs: f.lastDue, LastFinishMs: f.lastFinish,
		RequestId: f.reqID, App: string(f.app.of(b)), Handler: string(f.handler.of(b))}
	if f.hasParams {
		j.Params = append([]byte{}, f.params.of(b)...)
	}
	if f.hasSched {
		s := &f.sched
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind(s.kind), AtMs: s.at, DelayMs: s.delay,
			Cron: string(s.cron.of(b)), Tz: string(s.tz.of(b)), EveryMs: s.every, StartMs: s.start,
			NotBeforeMs: s.notBefore, NotAfterMs: s.notAfter, MaxRuns: s.maxRun}
	}
	return j
}

// decodeJobFast is a JOB_PUT payload as a message, decoded through parseJob; ok
// false as there.
func decodeJobFast(b []byte) (*messages.Job, bool) {
	var f flatJob
	if !parseJob(b, &f) {
		return nil, false
	}
	return f.message(b), true
}

// flatOf is what parseJob leaves for jm (which has no policy and no unknown field),
// as far as compact needs it: the lengths of its strings, not where they are.
func flatOf(jm *messages.Job) flatJob {
	f := flatJob{id: jm.Id, version: jm.Version, created: jm.CreatedMs, updated: jm.UpdatedMs, next: jm.NextDueMs,
		runs: jm.Runs, lastDue: jm.LastDueMs, lastFinish: jm.LastFinishMs, reqID: jm.RequestId, state: int32(jm.State),
		app: span{n: uint32(len(jm.App))}, handler: span{n: uint32(len(jm.Handler))}, params: span{n: uint32(len(jm.Params))},
		hasParams: jm.Params != nil}
	if s := jm.Schedule; s != nil {
		f.hasSched = true
		f.sched = flatSchedule{kind: int32(s.Kind), at: s.AtMs, delay: s.DelayMs, every: s.EveryMs, start: s.StartMs,
			notBefore: s.NotBeforeMs, notAfter: s.NotAfterMs, maxRun: s.MaxRuns,
			cron: span{n: uint32(len(s.Cron))}, tz: span{n: uint32(len(s.Tz))}}
	}
	return f
}

// compact is the compact form of the job f holds (see the top of compact.go), if
// it has one: all of it but its handler (hi) and its app, which the caller checks
// (it must be the shard's), with params its params.
func (f *flatJob) compact(params []byte, hi uint16) (coldJob, bool) {
	s := &f.sched
	if !f.hasSched || s.kind != int32(messages.ScheduleKind_ONCE) ||
		f.state != int32(messages.JobState_ACTIVE) || f.next <= 0 || f.runs != 0 || f.lastDue != 0 ||
		f.lastFinish != 0 || len(params) > coldParams ||
		f.version <= 0 || f.version > 1<<32-1 || f.updated < f.created || f.updated-f.created > 1<<32-1 ||
		s.cron.n != 0 || s.tz.n != 0 || s.every != 0 || s.start != 0 || s.notBefore != 0 || s.notAfter != 0 ||
		s.maxRun != 0 || (s.at != 0 && (s.delay != 0 || f.next != s.at)) ||
		(s.at == 0 && (s.delay < 0 || f.next != f.created+s.delay)) || !coldFieldsKnown() {
		return coldJob{}, false
	}
	cj := coldJob{id: f.id, created: f.created, next: f.next,
		upd: uint32(f.updated - f.created), version: uint32(f.version), handler: hi, nparams: uint8(len(params))}
	if s.at == 0 {
		cj.flags = coldDelay
	}
	copy(cj.params[:], params)
	return cj, true
}

// Decoded is a journal record's payload decoded by DecodeRecord, for
// ReplayDecoded. A JOB_PUT of a job that can be kept compact is left as that
// compact job (no message, nothing allocated); any other record is its message.
type Decoded struct {
	m   proto.Message
	err error

	put          bool    // a compact JOB_PUT: the fields below hold it, m is nil
	cold         coldJob // the job, but its handler
	reqID        int64
	app, handler span // of the record's payload
}

// DecodeRecord decodes a journal record's payload b (of type t) for ReplayDecoded.
func DecodeRecord(t messages.RecordType, b []byte) Decoded {
	var d Decoded
	if t == messages.RecordType_JOB_PUT {
		var f flatJob
		if parseJob(b, &f) {
			if cj, ok := f.compact(f.params.of(b), 0); ok {
				return Decoded{put: true, cold: cj, reqID: f.reqID, app: f.app, handler: f.handler}
			}
			d.m = f.message(b)
			return d
		}
	}
	d.m, d.err = decode(t, b)
	return d
}

// message is the JOB_PUT d holds as a message (b is its payload).
func (d *Decoded) message(b []byte) *messages.Job {
	jm, sched := &messages.Job{}, &messages.Schedule{}
	h := string(d.handler.of(b))
	coldMessage(jm, sched, &d.cold, string(d.app.of(b)), []string{h}, false)
	jm.RequestId = d.reqID
	return jm
}

// applyCompactPut is apply of the compact JOB_PUT d (b its payload): the same
// change, without a message when the job is kept compact, as it is when the shard
// holds no full or packed version of it (nearly every create of a recovery).
func (c *Core) applyCompactPut(d *Decoded, b []byte) {
	id := d.cold.id
	if _, packed := c.packed.idx[id]; packed || c.cfg.FullJobs || c.jobs[id] != nil || string(d.app.of(b)) != c.cfg.Shard.App {
		c.applyPut(d.message(b))
		return
	}
	hi, ok := c.cold.handlerBytes(d.handler.of(b))
	if !ok {
		c.applyPut(d.message(b))
		return
	}
	// From here as applyPut, with putCold's checks passed already.
	c.reqs.add(d.reqID, id, d.cold.created+int64(d.cold.upd))
	c.dropCold(id) // a version replayed over a compact one
	cj := d.cold
	cj.handler = hi
	cj.handle = c.due.Add(cj.next, uint64(id))
	if !c.cold.put(cj) { // the store is full: the job is kept full
		c.due.Cancel(cj.handle)
		jm := d.message(b)
		jm.RequestId, jm.App, jm.Handler = 0, c.cfg.Shard.App, c.cold.handlers[hi]
		j := &job{}
		c.putFull(id, j)
		c.setJob(j, jm)
		return
	}
	c.compiled = compiledFor{}
}
