package core

import (
	"fmt"
	"slices"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/wheel"
)

// Packed jobs.
//
// A one-shot that ran is DONE and stays readable, with its run history, for
// DoneRetentionMs (an hour by default). At thousands of fires a second that is most
// of a busy shard's jobs, and as full records they were most of the heap the garbage
// collector marks: a job, its message, schedule and params, its history slice, the
// run record and its strings, about 650 bytes in six objects a job. The mark phases
// grew with them (300–600 ms at 200,000 fired jobs on 2 cores), and fires were late
// while they ran.
//
// So a DONE one-shot with nothing going on (no run in flight or waiting for a retry,
// no due, no compiled schedule) is packed: its message and history are marshalled
// (as a ShardSnapshot holding that one job and its history, so nothing is lost) into
// byte chunks that hold no pointers, found through a map that holds none either. The
// collector never looks inside them. Like a compact job it is a representation, not
// a state: readers decode it (peek, history, snapshots), and anything that may change
// the job unpacks it back into a full one first (Core.job). TestCompactMatchesFull
// runs every command through a shard that packs and one that keeps full jobs
// (Config.FullJobs) and requires the same replies, dispatches and snapshot bytes.
//
// A job is packed at the end of the step whose RUN_FINISHED made it eligible (not in
// the apply itself: a failed attempt's RETRY_SCHEDULED follows its RUN_FINISHED), in
// recovery once the queue of candidates is long, and when recovery ends.

const (
	packedChunkMin = 4 << 10 // the first chunk of a shard; each next one doubles
	packedChunkMax = 1 << 20

	packedPrefaultMin = 64 << 10 // chunks this large are prefaulted (prefault.go): the store has 60 KiB already
)

// packBatch is how many candidates recovery queues before it packs them (a
// variable for the tests).
var packBatch = 4096

// packedRef is where a packed job's encoding is, and its expiry handle.
type packedRef struct {
	chunk   uint32
	off     uint32
	n       uint32
	handler uint16 // index in coldStore.handlers, when named (ListJobs filters by it)
	named   bool
	expiry  wheel.Handle
}

type packedChunk struct {
	buf  []byte // appended to until full; nil once every job in it left
	live int32
}

type packedStore struct {
	idx    map[int64]packedRef // no pointers: the collector does not scan it
	chunks []packedChunk
	holes  []uint32 // chunks freed, for reuse
	cur    int32    // the chunk appended to, or -1
	next   int      // the size of the next chunk
}

func (s *packedStore) len() int { return len(s.idx) }

func (s *packedStore) put(id int64, blob []byte, ref packedRef) {
	if s.idx == nil {
		s.idx, s.cur, s.next = map[int64]packedRef{}, -1, packedChunkMin
	}
	if s.cur < 0 || len(s.chunks[s.cur].buf)+len(blob) > cap(s.chunks[s.cur].buf) {
		size := max(s.next, len(blob))
		s.next = min(2*s.next, packedChunkMax)
		ch := packedChunk{buf: make([]byte, 0, size)}
		if size >= packedPrefaultMin {
			prefault(unsafe.Pointer(unsafe.SliceData(ch.buf)), uintptr(size))
		}
		if n := len(s.holes); n > 0 {
			s.cur = int32(s.holes[n-1])
			s.holes = s.holes[:n-1]
			s.chunks[s.cur] = ch
		} else {
			s.cur = int32(len(s.chunks))
			s.chunks = append(s.chunks, ch)
		}
	}
	ch := &s.chunks[s.cur]
	ref.chunk, ref.off, ref.n = uint32(s.cur), uint32(len(ch.buf)), uint32(len(blob))
	s.idx[id] = ref
	ch.buf = append(ch.buf, blob...)
	ch.live++
}

// get is job id's encoding (shared: not to be changed) and reference.
func (s *packedStore) get(id int64) ([]byte, packedRef, bool) {
	r, ok := s.idx[id]
	if !ok {
		return nil, r, false
	}
	return s.chunks[r.chunk].buf[r.off : r.off+r.n : r.off+r.n], r, true
}

// remove forgets job id; its chunk goes once no job is left in it, even the one
// appended to (a snapshot view that still reads it keeps its bytes alive).
func (s *packedStore) remove(id int64) {
	r, ok := s.idx[id]
	if !ok {
		return
	}
	delete(s.idx, id)
	ch := &s.chunks[r.chunk]
	if ch.live--; ch.live == 0 {
		s.release(r.chunk)
		if int32(r.chunk) == s.cur {
			s.cur = -1 // the next put starts a chunk
		}
	}
}

func (s *packedStore) release(i uint32) {
	s.chunks[i] = packedChunk{}
	s.holes = append(s.holes, i)
}

// each calls fn with every packed job's id, encoding and reference, in no
// particular order.
func (s *packedStore) each(fn func(id int64, blob []byte, r packedRef)) {
	for id, r := range s.idx {
		fn(id, s.chunks[r.chunk].buf[r.off:r.off+r.n:r.off+r.n], r)
	}
}

// packOf appends to buf the encoding of a job and its history: a ShardSnapshot
// holding just them, written field by field into the one reused buffer (a marshal
// of a wrapper message cost a few allocations more per fired job).
func packOf(buf []byte, j *job) []byte {
	buf = appendMessage(buf, snapshotJobsField, j.j)
	for _, h := range j.history {
		buf = appendMessage(buf, snapshotHistoryField, h)
	}
	return buf
}

// appendMessage appends m as field num of a message: its tag, its length, its
// bytes (appendFastOr's). The length is written after the bytes, in the one byte
// kept for it when it fits (below 128), else moved up to make room.
func appendMessage(buf []byte, num protowire.Number, m proto.Message) []byte {
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	at := len(buf)
	buf = appendFastOr(append(buf, 0), m)
	n := len(buf) - at - 1
	if n < 0x80 {
		buf[at] = byte(n)
		return buf
	}
	var l [10]byte // (a varint of 64 bits)
	lb := protowire.AppendVarint(l[:0], uint64(n))
	return slices.Replace(buf, at, at+1, lb...)
}

// unpack decodes a packed job's message and history.
func unpack(blob []byte) (*messages.Job, []*messages.RunRecord) {
	s := &messages.ShardSnapshot{}
	if err := proto.Unmarshal(blob, s); err != nil || len(s.Jobs) != 1 {
		panic(fmt.Sprintf("shard: packed job does not decode: %v (%d jobs)", err, len(s.Jobs)))
	}
	return s.Jobs[0], s.History
}

// ---------------------------------------------------------------- the core's side

// queuePack makes job id a candidate for packing at the end of the step (or of a
// batch of replayed records).
func (c *Core) queuePack(id int64) {
	if c.cfg.FullJobs {
		return
	}
	c.packq = append(c.packq, id)
	if !c.live && len(c.packq) >= packBatch {
		c.packDue()
	}
}

// packDue packs the candidates that qualify.
func (c *Core) packDue() {
	for _, id := range c.packq {
		if j := c.jobs[id]; j != nil && c.packable(j) {
			hi, _, named := c.cold.handler(j.j.Handler)
			c.packBuf = packOf(c.packBuf[:0], j)
			c.packed.put(id, c.packBuf, packedRef{handler: hi, named: named, expiry: j.expiry})
			c.dropFull(id)
		}
	}
	c.packq = c.packq[:0]
}

// packable: a DONE one-shot with nothing going on.
func (c *Core) packable(j *job) bool {
	return j.j.State == messages.JobState_DONE && j.j.Schedule.GetKind() == messages.ScheduleKind_ONCE &&
		j.running == 0 && j.handle == 0 && j.sched == nil && c.runsOf[j.j.Id] == 0
}

// unpackJob turns packed job id back into a full one (nil when it is not packed).
func (c *Core) unpackJob(id int64) *job {
	if c.packed.len() == 0 {
		return nil
	}
	blob, r, ok := c.packed.get(id)
	if !ok {
		return nil
	}
	jm, hist := unpack(blob)
	c.packed.remove(id)
	j := &job{j: jm, history: hist, expiry: r.expiry}
	c.putFull(id, j)
	return j
}

// peekPacked is packed job id decoded (a fresh message), for a reader.
func (c *Core) peekPacked(id int64) (*messages.Job, []*messages.RunRecord, bool) {
	if c.packed.len() == 0 {
		return nil, nil, false
	}
	blob, _, ok := c.packed.get(id)
	if !ok {
		return nil, nil, false
	}
	jm, hist := unpack(blob)
	return jm, hist, true
}

// dropPacked removes packed job id and its expiry, if it is one.
func (c *Core) dropPacked(id int64) {
	if c.packed.len() == 0 {
		return
	}
	if _, r, ok := c.packed.get(id); ok {
		if r.expiry != 0 {
			c.expire.Cancel(r.expiry)
		}
		c.packed.remove(id)
	}
}

// PackedJobs is the number of jobs kept packed.
func (c *Core) PackedJobs() int { return c.packed.len() }

// packedView is a snapshot view's share of the packed jobs: their encodings, which
// never change (an unpack or a delete only drops the reference).
type packedView struct{ blobs [][]byte }

func (c *Core) packedViewOf(in func(int64) bool) packedView {
	var v packedView
	if c.packed.len() == 0 {
		return v
	}
	v.blobs = spareOr(&c.spares.blobs, c.packed.len())
	c.packed.each(func(id int64, blob []byte, _ packedRef) {
		if in(id) {
			v.blobs = append(v.blobs, blob)
		}
	})
	return v
}

// addTo decodes the view's packed jobs into jobs and history (Encode, off the
// shard's goroutine).
func (v *packedView) addTo(jobs *[]jobView) {
	*jobs = slices.Grow(*jobs, len(v.blobs))
	for _, blob := range v.blobs {
		jm, h := unpack(blob)
		*jobs = append(*jobs, jobView{j: jm, hist: h})
	}
}
