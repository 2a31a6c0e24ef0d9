package core

import (
	"sync"
	"unsafe"

	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/wheel"
)

// Compact jobs.
//
// Most of a busy shard's jobs are one-shots that wait: created, not yet due, never
// run, with the app's default policy and a few bytes of params ("remind about order
// 42 in 15 minutes"). A full job (a *messages.Job, its *messages.Schedule, its
// params, the job struct and its map entry: six heap objects, 550 bytes and more
// with the fragmentation they leave) is seven times what such a job needs. So a job
// that is exactly that — a one-shot, ACTIVE, with a due time, no run, no policy of
// its own, params of at most coldParams bytes, no field this file does not know —
// is kept as one coldJob: 72 bytes in a chunk of coldChunk slots that holds no
// pointers (the garbage collector never scans it), found through an index of
// about 7 bytes a job that holds none either (compactindex.go).
//
// A compact job is a representation, not a state: every reader sees the job it
// stands for (coldMessage rebuilds it field for field, TestCompactRoundTrip keeps
// it complete), and everything that changes a job first turns it back into a full
// one (Core.job): a fire, a run or result, an update, pause, trigger. Only creating
// a job (apply of a JOB_PUT for a job the shard holds no full record of) makes one,
// and only deleting it or making it full removes one. So a compact job has no run
// history, no run in flight, no expiry and no compiled schedule, by construction.
//
// The chunks are copy-on-write for snapshots: a SnapshotView takes the chunk
// pointers (not the jobs) and marks them shared; the core copies a shared chunk
// before its next write to it, so the view's encoder reads jobs nobody changes, and
// taking a view costs a few hundred pointer copies instead of a walk over every job.

const (
	coldParams = 28   // params bytes kept inline (the slot is then 72 bytes)
	coldChunk  = 4096 // slots per chunk (288 KiB)
	// coldFirst is the slots a store's first chunk starts with: it doubles as it
	// fills, up to coldChunk, so that a shard with a few jobs (a small app; a node
	// may host thousands of shards) holds a few KiB, not 288. Later chunks are
	// made whole (and prefaulted).
	coldFirst = 32

	coldDelay = 1 << 0 // the schedule is a delay (next - created); else at_ms (= next)
)

// coldJob is one compact job (see above). Its schedule is implied: at_ms = next, or
// with coldDelay delay_ms = next - created (a one-shot's first due is exactly that).
// A free slot has id 0 and, in next, the chunk-relative index+1 of the next free
// slot of its chunk.
type coldJob struct {
	id      int64
	created int64 // created_ms
	next    int64 // next_due_ms (> 0)
	handle  wheel.Handle
	upd     uint32 // updated_ms - created_ms
	version uint32
	handler uint16 // index in coldStore.handlers
	flags   uint8
	nparams uint8
	params  [coldParams]byte
}

type coldChunkT struct {
	slots  []coldJob // len = cap: coldChunk, or less for a first chunk still growing
	live   int32
	free   int32 // index+1 of the first free slot below high; 0 = none
	high   int32 // slots ever used (those above are free and zero)
	shared bool  // a snapshot view may be reading slots: copy before writing
}

type coldStore struct {
	idx    coldIndex // job id → ref: chunk<<12 | slot (compactindex.go)
	chunks []coldChunkT
	avail  []int32 // chunks that may have a free slot (checked when used)
	holes  []int32 // indices of dropped (empty) chunks, for reuse

	handlers  []string // handler names by index (only ever appended)
	handlerIx map[string]uint16
}

// coldFieldsKnown reports whether messages.Job and messages.Schedule have exactly
// the fields coldMessage rebuilds: a field added to the .proto since turns compact
// jobs off (every job is kept full) instead of being silently dropped.
var coldFieldsKnown = sync.OnceValue(func() bool {
	job := (&messages.Job{}).ProtoReflect().Descriptor().Fields()
	sch := (&messages.Schedule{}).ProtoReflect().Descriptor().Fields()
	return job.Len() == 15 && sch.Len() == 10 && len(jobExtra()) == 0
})

func (s *coldStore) len() int { return s.idx.n }

// idOf is the id of the job at ref (the index keeps no keys of its own).
func (s *coldStore) idOf(ref uint32) int64 { return s.at(ref).id }

func (s *coldStore) at(ref uint32) *coldJob {
	return &s.chunks[ref>>12].slots[ref&(coldChunk-1)]
}

// mut is at for a write: a chunk a snapshot view shares is copied first.
func (s *coldStore) mut(ref uint32) *coldJob {
	ch := &s.chunks[ref>>12]
	if ch.shared {
		cp := make([]coldJob, len(ch.slots))
		prefault(unsafe.Pointer(unsafe.SliceData(cp)), uintptr(len(cp))*unsafe.Sizeof(cp[0]))
		copy(cp, ch.slots)
		ch.slots, ch.shared = cp, false
	}
	return &ch.slots[ref&(coldChunk-1)]
}

func (s *coldStore) get(id int64) (*coldJob, bool) {
	ref, ok := s.idx.get(id, s.idOf)
	if !ok {
		return nil, false
	}
	return s.at(ref), true
}

// put stores cj (whose id the store does not hold), unless the store is full.
func (s *coldStore) put(cj coldJob) bool {
	ci := s.chunkWithRoom()
	if ci < 0 {
		return false
	}
	ch := &s.chunks[ci]
	var slot int32
	if ch.free != 0 {
		slot = ch.free - 1
		ch.free = int32(ch.slots[slot].next)
	} else {
		slot = ch.high
		if int(slot) == len(ch.slots) {
			// A first chunk still growing: double it. A view sharing the old
			// slots keeps them, as after a copy on write.
			grown := make([]coldJob, min(2*len(ch.slots), coldChunk))
			copy(grown, ch.slots)
			ch.slots, ch.shared = grown, false
		}
		ch.high++
	}
	ch.live++
	ref := uint32(ci)<<12 | uint32(slot)
	*s.mut(ref) = cj
	s.idx.insert(cj.id, ref, s.idOf)
	return true
}

func (s *coldStore) chunkWithRoom() int32 {
	for len(s.avail) > 0 {
		ci := s.avail[len(s.avail)-1]
		if ch := &s.chunks[ci]; ch.slots != nil && (ch.free != 0 || ch.high < coldChunk) {
			return ci
		}
		s.avail = s.avail[:len(s.avail)-1]
	}
	var ci int32
	if n := len(s.holes); n > 0 {
		ci = s.holes[n-1]
		s.holes = s.holes[:n-1]
	} else {
		if len(s.chunks) >= coldMaxChunks {
			return -1
		}
		ci = int32(len(s.chunks))
		s.chunks = append(s.chunks, coldChunkT{})
	}
	var slots []coldJob
	if len(s.chunks) > 1 { // a store past its first chunk (prefault.go)
		slots = make([]coldJob, coldChunk)
		prefault(unsafe.Pointer(unsafe.SliceData(slots)), uintptr(len(slots))*unsafe.Sizeof(slots[0]))
	} else {
		slots = make([]coldJob, coldFirst)
	}
	s.chunks[ci] = coldChunkT{slots: slots}
	s.avail = append(s.avail, ci)
	return ci
}

// take removes job id and returns what it was.
func (s *coldStore) take(id int64) (coldJob, bool) {
	ref, ok := s.idx.get(id, s.idOf)
	if !ok {
		return coldJob{}, false
	}
	cj := *s.at(ref)
	s.idx.remove(id, s.idOf) // before the slot is cleared: it reads the ids of others
	ci, slot := int32(ref>>12), int32(ref&(coldChunk-1))
	ch := &s.chunks[ci]
	wasFull := ch.free == 0 && ch.high == coldChunk
	ch.live--
	if ch.live == 0 { // an empty chunk is given back
		s.chunks[ci] = coldChunkT{}
		s.holes = append(s.holes, ci)
		if s.idx.n == 0 { // the store is empty: it starts again small (coldFirst)
			s.chunks, s.avail, s.holes = nil, nil, nil
		}
	} else {
		*s.mut(ref) = coldJob{next: int64(ch.free)}
		ch.free = slot + 1
		if wasFull {
			s.avail = append(s.avail, ci)
		}
	}
	return cj, true
}

// handler is the index of handler name h, adding it when there is room.
func (s *coldStore) handler(h string) (uint16, string, bool) {
	if i, ok := s.handlerIx[h]; ok {
		return i, s.handlers[i], true
	}
	if len(s.handlers) >= maxInterned {
		return 0, h, false
	}
	if s.handlerIx == nil {
		s.handlerIx = make(map[string]uint16)
	}
	i := uint16(len(s.handlers))
	s.handlers = append(s.handlers, h)
	s.handlerIx[h] = i
	return i, h, true
}

// handlerBytes is handler's index, as handler.
func (s *coldStore) handlerBytes(h []byte) (uint16, bool) {
	if i, ok := s.handlerIx[string(h)]; ok {
		return i, true
	}
	i, _, ok := s.handler(string(h))
	return i, ok
}

// coldOf is jm as a compact job, when it is one (see the top of this file); jm's
// handler must be in the handler table already (hi is its index).
func coldOf(jm *messages.Job, app string, hi uint16) (coldJob, bool) {
	if jm.Schedule == nil || jm.Policy != nil || jm.App != app || !coldFieldsKnown() ||
		len(jm.ProtoReflect().GetUnknown()) > 0 || len(jm.Schedule.ProtoReflect().GetUnknown()) > 0 {
		return coldJob{}, false
	}
	f := flatOf(jm)
	return f.compact(jm.Params, hi)
}

// coldMessage fills dst (and sched, which dst then points to) with the job cj
// stands for. Params are copied unless share, when they point into cj (a view's
// slots, which nobody changes).
func coldMessage(dst *messages.Job, sched *messages.Schedule, cj *coldJob, app string, handlers []string, share bool) {
	*sched = messages.Schedule{Kind: messages.ScheduleKind_ONCE}
	if cj.flags&coldDelay != 0 {
		sched.DelayMs = cj.next - cj.created
	} else {
		sched.AtMs = cj.next
	}
	*dst = messages.Job{Id: cj.id, App: app, Handler: handlers[cj.handler], Schedule: sched,
		State: messages.JobState_ACTIVE, Version: int64(cj.version), CreatedMs: cj.created,
		UpdatedMs: cj.created + int64(cj.upd), NextDueMs: cj.next}
	if cj.nparams > 0 {
		if share {
			dst.Params = cj.params[:cj.nparams:cj.nparams]
		} else {
			dst.Params = append([]byte(nil), cj.params[:cj.nparams]...)
		}
	}
}

// coldView is the compact jobs as a snapshot view holds them: the chunks shared
// copy-on-write with the core, and the handler names up to then.
type coldView struct {
	chunks   [][]coldJob
	handlers []string
	n        int
}

// view shares the chunks with a snapshot view (see the top of this file).
func (s *coldStore) view() coldView {
	v := coldView{handlers: s.handlers[:len(s.handlers):len(s.handlers)], n: s.idx.n}
	for i := range s.chunks {
		if ch := &s.chunks[i]; ch.slots != nil {
			ch.shared = true
			v.chunks = append(v.chunks, ch.slots)
		}
	}
	return v
}

// each calls fn with every compact job (in slot order).
func (s *coldStore) each(fn func(cj *coldJob)) {
	for i := range s.chunks {
		if ch := s.chunks[i].slots; ch != nil {
			for k := range s.chunks[i].high {
				if cj := &ch[k]; cj.id != 0 {
					fn(cj)
				}
			}
		}
	}
}

// each calls fn with every job of the view (in slot order).
func (v *coldView) each(fn func(cj *coldJob)) {
	for _, ch := range v.chunks {
		for i := range ch {
			if cj := &ch[i]; cj.id != 0 {
				fn(cj)
			}
		}
	}
}

// ---------------------------------------------------------------- the core's side

// job is job id's full record, turning a compact job into a full one first: use it
// wherever the job may change. Readers that change nothing use peek.
func (c *Core) job(id int64) *job {
	if j := c.jobs[id]; j != nil {
		return j
	}
	if j := c.unpackJob(id); j != nil {
		return j
	}
	if c.cold.len() == 0 {
		return nil
	}
	cj, ok := c.cold.take(id)
	if !ok {
		return nil
	}
	// One allocation for the job, its message, schedule and params (four objects
	// for the garbage collector to mark, for as long as the job is kept, were one
	// each): a fired one-shot stays DoneRetentionMs.
	b := &fullJob{}
	coldMessage(&b.m, &b.s, &cj, c.cfg.Shard.App, c.cold.handlers, true)
	b.m.Params = nil
	if cj.nparams > 0 {
		b.p = cj.params
		b.m.Params = b.p[:cj.nparams:cj.nparams]
	}
	b.j = job{j: &b.m, handle: cj.handle}
	c.putFull(id, &b.j)
	return &b.j
}

// fullJob is a compact job made full, in one block. A later JOB_PUT replaces j.j
// (and so the message and its schedule) as for any job; the block lives on while
// j does.
type fullJob struct {
	j job
	m messages.Job
	s messages.Schedule
	p [coldParams]byte
}

// peek is job id as it is now, for a reader: the stored full job (not to be
// changed, nor to leave the shard: jobCopy it), or a compact one rebuilt.
func (c *Core) peek(id int64) *messages.Job {
	if j := c.jobs[id]; j != nil {
		return j.j
	}
	if jm, _, ok := c.peekPacked(id); ok {
		return jm
	}
	cj, ok := c.cold.get(id)
	if !ok {
		return nil
	}
	jm, sched := &messages.Job{}, &messages.Schedule{}
	coldMessage(jm, sched, cj, c.cfg.Shard.App, c.cold.handlers, false)
	return jm
}

// has reports whether the shard holds job id.
func (c *Core) has(id int64) bool {
	if c.jobs[id] != nil {
		return true
	}
	if _, ok := c.packed.idx[id]; ok {
		return true
	}
	_, ok := c.cold.idx.get(id, c.cold.idOf)
	return ok
}

// jobCount is the number of jobs, full, packed and compact.
func (c *Core) jobCount() int { return len(c.jobs) + c.packed.len() + c.cold.len() }

// Compact is the number of jobs kept compact.
func (c *Core) Compact() int { return c.cold.len() }

// putCold stores new job jm compactly when it qualifies, and arms its due.
func (c *Core) putCold(jm *messages.Job) bool {
	if c.cfg.FullJobs {
		return false
	}
	hi, _, ok := c.cold.handler(jm.Handler)
	if !ok {
		return false
	}
	cj, ok := coldOf(jm, c.cfg.Shard.App, hi)
	if !ok {
		return false
	}
	cj.handle = c.due.Add(cj.next, uint64(cj.id))
	if !c.cold.put(cj) {
		c.due.Cancel(cj.handle)
		return false
	}
	return true
}

// dropCold removes compact job id and its due, if it is one.
func (c *Core) dropCold(id int64) {
	if c.cold.len() == 0 {
		return
	}
	if cj, ok := c.cold.take(id); ok {
		c.due.Cancel(cj.handle)
	}
}

// Reserve sizes the shard's tables for about n jobs more than it holds, before a
// recovery replays them (a hint: the records to replay bound them), so that the
// index of compact jobs does not grow part by part, each step rereading every id
// of the part from its slot; Recovered gives back what the replay did not use.
func (c *Core) Reserve(n int) {
	if c.cfg.FullJobs || n <= 0 {
		return
	}
	c.cold.idx.reserve(c.cold.len()+n, c.cold.idOf)
}
