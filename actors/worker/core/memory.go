package core

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// The memory of finished runs.
//
// A worker remembers its last RememberRuns finished runs, to answer a dispatch of
// one of them (a shard that did not get the result, or a new owner after a handoff)
// with the result instead of running it again. As messages (a map entry, an entry,
// the run id, a slimmed dispatch and the result: about 600 bytes a run, 39 MB at
// 65,536 in BenchmarkRemembered/gc) they were the largest heap of pointers in the
// fire scenario's single process, marked by the garbage collector on every cycle,
// and the collector's mark phases are what delayed the deliveries there.
//
// So a finished run is a fixed-size record without pointers, in a ring of
// RememberRuns slots filled in the order runs finish (the oldest is forgotten when
// a new one needs its slot):
//
//	record    seq        finish sequence number: slot = seq % RememberRuns
//	          keyHash    hash of run id and attempt, its key in index
//	          runHash    hash of run id, its key in Core.waitingRun
//	          attempt    with the run id (in the result) the run's key
//	          chunk/off/n  the result's protobuf encoding in the arena
//	          owner      index in owners: shard, epoch and reply-to to answer at
//	          sentMs, resends, waiting, sameRun   the result's acknowledgement (core.go)
//
// index (integers only, which the collector does not scan: index.go) finds a
// record by keyHash; every hit is checked against the full run id and attempt, so a
// collision is a longer probe, never another run's answer. The results are encoded
// into byte chunks appended in finish order; a chunk goes when its last record is
// forgotten. The few distinct places to answer (a shard's name, epoch and reply-to,
// shared by all the runs it dispatched) are kept once each, counted, in owners.
//
// A Resend or a resend tick decodes the result: a copy, allocated only then.

const (
	arenaChunkMin = 4 << 10 // the first chunk; each next one doubles
	arenaChunkMax = 64 << 10
)

// record is a finished run (see above). Its slot+1 is what links records: 0 is none.
type record struct {
	seq     uint64
	keyHash uint64
	runHash uint64
	sentMs  int64
	attempt int32
	chunk   uint32 // chunk sequence number (see memory.chunks)
	off     uint32
	n       uint32
	owner   uint32
	sameRun uint32 // slot+1 of the next waiting result with the same runHash
	resends int32
	waiting bool // in Core.waitingRun: finished, not acknowledged, not forgotten, not given up
}

type chunk struct {
	seq uint32
	buf []byte // appended to while it is the last chunk
}

// owner is where and at which epoch to answer: the newest owner that asked for a
// run. refs counts the records answering there; at 0 the owner is freed.
type owner struct {
	shard string
	epoch int64
	to    *messages.Ref
	refs  int
}

type ownerKey struct {
	shard, address, id string
	epoch              int64
	ref                bool // a reply-to at all
}

type memory struct {
	hash    func(string) uint64 // of a run id: a seeded maphash, or a weak one in tests
	records []record            // the ring: grows to RememberRuns, then wraps
	nextSeq uint64              // the sequence number of the next finished run
	index   index               // keyHash → slot

	chunks    []chunk // oldest first
	chunkSeq  uint32  // the sequence number of the next chunk
	chunkNext int     // the size of the next chunk
	spare     []byte  // the last full-size chunk freed, reused by the next

	owners     []owner
	ownerIndex map[ownerKey]uint32
	freeOwners []uint32
}

func (m *memory) init(hash func(string) uint64) {
	m.hash = hash
	m.ownerIndex = make(map[ownerKey]uint32)
	m.chunkNext = arenaChunkMin
}

// keyHashOf mixes a run id's hash with the attempt (splitmix64's finalizer).
func keyHashOf(runHash uint64, attempt int32) uint64 {
	h := runHash + uint64(uint32(attempt))*0x9e3779b97f4a7c15
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	return h ^ h>>31
}

// find returns the slot of run/attempt when it is remembered.
func (m *memory) find(runID string, attempt int32) (uint32, bool) {
	h := keyHashOf(m.hash(runID), attempt)
	return m.index.lookup(h, func(s uint32) bool {
		r := &m.records[s]
		return r.keyHash == h && r.attempt == attempt && m.isRun(s, runID)
	})
}

// slotOf is the slot of the record with sequence number seq, when it is still
// remembered.
func (m *memory) slotOf(seq uint64) (uint32, bool) {
	s := seq % RememberRuns
	if s >= uint64(len(m.records)) || m.records[s].seq != seq {
		return 0, false
	}
	return uint32(s), true
}

// remember records the result r of the run dispatched by d (the newest owner that
// asked) in the next slot, forgetting the run there, and returns the slot. The new
// record is not waiting.
func (c *Core) remember(r *messages.RunResult, d *messages.Dispatch) uint32 {
	m := &c.memory
	seq := m.nextSeq
	m.nextSeq++
	s := uint32(seq % RememberRuns)
	if int(s) < len(m.records) {
		c.forget(s)
	} else {
		if len(m.records) == cap(m.records) { // double, not append's quarter: fewer copies of a large slice
			m.records = slices.Grow(m.records, min(max(len(m.records), 1024), RememberRuns-len(m.records)))
		}
		m.records = append(m.records, record{})
	}
	runHash := m.hash(r.RunId)
	rec := record{seq: seq, keyHash: keyHashOf(runHash, r.Attempt), runHash: runHash, attempt: r.Attempt,
		owner: m.ownerOf(d)}
	rec.chunk, rec.off, rec.n = m.store(r)
	m.index.insert(rec.keyHash, s)
	m.records[s] = rec
	return s
}

// forget drops the oldest record, in slot s, to reuse the slot: it is no longer
// found, nor resent.
func (c *Core) forget(s uint32) {
	m := &c.memory
	r := &m.records[s]
	if r.waiting {
		c.unwait(s)
	}
	m.index.remove(r.keyHash, s)
	m.release(r.owner)
	*r = record{}
	// The chunks older than the next oldest record's hold no record any more (the
	// ring is full: every other slot holds one). The last chunk, which the record
	// about to be written may use, is never older.
	oldest := m.records[(s+1)%uint32(len(m.records))].chunk
	for int32(oldest-m.chunks[0].seq) > 0 {
		if b := m.chunks[0].buf; cap(b) == arenaChunkMax {
			m.spare = b[:0]
		}
		m.chunks[0] = chunk{}
		m.chunks = m.chunks[1:]
	}
}

// store appends r's encoding to the arena.
func (m *memory) store(r *messages.RunResult) (chunkSeq, off, n uint32) {
	size, fast := resultSize(r)
	if !fast {
		size = proto.Size(r)
	}
	if len(m.chunks) == 0 || cap(m.chunks[len(m.chunks)-1].buf)-len(m.chunks[len(m.chunks)-1].buf) < size {
		var buf []byte
		if size <= arenaChunkMax && m.chunkNext == arenaChunkMax && m.spare != nil {
			buf, m.spare = m.spare, nil
		} else {
			buf = make([]byte, 0, max(m.chunkNext, size))
			m.chunkNext = min(2*m.chunkNext, arenaChunkMax)
		}
		m.chunks = append(m.chunks, chunk{seq: m.chunkSeq, buf: buf})
		m.chunkSeq++
	}
	ch := &m.chunks[len(m.chunks)-1]
	start := len(ch.buf)
	if fast {
		ch.buf = appendResult(ch.buf, r)
		if len(ch.buf)-start != size {
			panic("worker core: a result's encoding is not the size computed for it")
		}
		return ch.seq, uint32(start), uint32(size)
	}
	opts := proto.MarshalOptions{UseCachedSize: true} // the size just computed
	b, err := opts.MarshalAppend(ch.buf, r)
	if err != nil {
		// Only a string that is not UTF-8 (a handler's error text) fails, and
		// the shard could not decode it either: the result is sent, and
		// remembered, with such bytes replaced.
		validUTF8(r)
		size = proto.Size(r)
		if cap(ch.buf)-start < size {
			// The replacement made it longer than the room left: a chunk of its
			// own, after the others.
			m.chunks = append(m.chunks, chunk{seq: m.chunkSeq, buf: make([]byte, 0, size)})
			m.chunkSeq++
			ch = &m.chunks[len(m.chunks)-1]
			start = 0
		}
		if b, err = opts.MarshalAppend(ch.buf, r); err != nil {
			panic(fmt.Sprintf("worker core: result %s does not encode: %v", r.RunId, err))
		}
	}
	if len(b)-start != size || cap(b) != cap(ch.buf) {
		panic("worker core: a result's encoding outgrew its chunk")
	}
	ch.buf = b
	return ch.seq, uint32(start), uint32(size)
}

// validUTF8 replaces what is not UTF-8 in r's strings.
func validUTF8(r *messages.RunResult) {
	for _, s := range []*string{&r.RunId, &r.Shard, &r.Error, &r.WorkerId} {
		*s = strings.ToValidUTF8(*s, "\uFFFD")
	}
	if w := r.Worker; w != nil {
		r.Worker = &messages.Ref{Address: strings.ToValidUTF8(w.Address, "\uFFFD"), Id: strings.ToValidUTF8(w.Id, "\uFFFD")}
	}
}

// encoding is the result of the record in slot s, encoded.
func (m *memory) encoding(s uint32) []byte {
	r := &m.records[s]
	ch := m.chunks[r.chunk-m.chunks[0].seq].buf
	return ch[r.off : r.off+r.n : r.off+r.n]
}

// result decodes the result of the record in slot s: a new message.
func (m *memory) result(s uint32) *messages.RunResult {
	r := new(messages.RunResult)
	if err := proto.Unmarshal(m.encoding(s), r); err != nil {
		panic(fmt.Sprintf("worker core: a remembered result does not decode: %v", err))
	}
	return r
}

// runIDOf is the run id in a result's encoding (field 1), without a copy.
func runIDOf(b []byte) []byte {
	var id []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			panic("worker core: a remembered result does not decode")
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				panic("worker core: a remembered result does not decode")
			}
			id, b = v, b[n:] // the last one counts, as for a decoder
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			panic("worker core: a remembered result does not decode")
		}
		b = b[n:]
	}
	return id
}

// isRun says whether the record in slot s is of run id runID.
func (m *memory) isRun(s uint32, runID string) bool {
	return string(runIDOf(m.encoding(s))) == runID
}

// sameRunID says whether the records in slots a and b are of one run id.
func (m *memory) sameRunID(a, b uint32) bool {
	return m.records[a].runHash == m.records[b].runHash && bytes.Equal(runIDOf(m.encoding(a)), runIDOf(m.encoding(b)))
}

// answerAt makes d's owner the one the run in slot s answers.
func (m *memory) answerAt(s uint32, d *messages.Dispatch) {
	o := m.ownerOf(d)
	m.release(m.records[s].owner)
	m.records[s].owner = o
}

// ownerOf returns (and counts one more reference to) d's shard, epoch and reply-to.
func (m *memory) ownerOf(d *messages.Dispatch) uint32 {
	k := ownerKey{shard: d.Shard, epoch: d.Epoch}
	if d.ReplyTo != nil {
		k.address, k.id, k.ref = d.ReplyTo.Address, d.ReplyTo.Id, true
	}
	i, ok := m.ownerIndex[k]
	if !ok {
		o := owner{shard: d.Shard, epoch: d.Epoch}
		if k.ref {
			o.to = &messages.Ref{Address: k.address, Id: k.id}
		}
		if n := len(m.freeOwners); n > 0 {
			i = m.freeOwners[n-1]
			m.freeOwners = m.freeOwners[:n-1]
			m.owners[i] = o
		} else {
			i = uint32(len(m.owners))
			m.owners = append(m.owners, o)
		}
		m.ownerIndex[k] = i
	}
	m.owners[i].refs++
	return i
}

// release drops a reference to owner i.
func (m *memory) release(i uint32) {
	o := &m.owners[i]
	if o.refs--; o.refs > 0 {
		return
	}
	k := ownerKey{shard: o.shard, epoch: o.epoch}
	if o.to != nil {
		k.address, k.id, k.ref = o.to.Address, o.to.Id, true
	}
	delete(m.ownerIndex, k)
	*o = owner{}
	m.freeOwners = append(m.freeOwners, i)
}
