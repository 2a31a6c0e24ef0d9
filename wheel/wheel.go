package wheel

import (
	"cmp"
	"math/bits"
	"slices"
)

// Handle names one pending entry of a Wheel: the entry's slab index in the
// low 32 bits, the generation of that slab slot in the high 32 bits. The
// zero Handle is never valid (slab index 0 is never used).
type Handle uint64

// Geometry. Due times are mapped onto 64-bit keys (see key). Level 0 has 64
// slots of 1 ms. Level 1 has 4096 slots of 64 ms (12 key bits, a block of
// 4.4 minutes), so that a timer due within a minute or so is cascaded at
// most once before it fires, however the minute falls on the blocks, and
// each cascade moves only 64 ms worth of timers. The levels above have 64
// slots (6 bits). Ten levels cover all 64 key bits (the top one uses 4),
// so every int64 due time has a slot and the top levels are the overflow
// area: the horizon is unbounded.
const (
	numLevels = 10
	l1Slots   = 4096
	l2Base    = 64 + l1Slots              // bucket of level 2, slot 0
	numSlots  = l2Base + (numLevels-2)*64 // wheel buckets
	l1Pages   = l1Slots / 64              // level-1 buckets are allocated 64 at a time

	// Buckets 0..numSlots-1 are the wheel slots, level by level (levelBase).
	overdueBucket = numSlots     // due <= Now(): fires at the next Advance
	firingBucket  = numSlots + 1 // the overdue batch of the running Advance
	numBuckets    = numSlots + 2
	noBucket      = -1

	// lowKeyLevel is the highest level whose slots are placed by the low 32
	// key bits alone (its shift is at most 32): buckets keep those bits
	// beside each element so that a cascade from such a level, and the
	// minimum of such a bucket, need not read the entries.
	lowKeyLevel = 4

	// entry.loc: the kind of bucket the entry is in, and its position there.
	// A wheel entry's bucket is not stored: it follows from due and elapsed.
	kindShift   = 30
	posMask     = 1<<kindShift - 1
	kindWheel   = 0 << kindShift
	kindOverdue = 1 << kindShift
	kindFiring  = 2 << kindShift
	kindFree    = 3 << kindShift
	kindMask    = 3 << kindShift

	// maxEntries bounds pending entries so that a bucket position (at most
	// twice the live entries plus compactSlack) always fits in 30 bits.
	maxEntries = 1 << 29

	// A bucket is compacted when it holds more tombstones than live
	// elements, and at least compactSlack of them.
	compactSlack = 16

	// keepCap: a bucket emptied by firing or cascading keeps its array if
	// it is this small; larger ones go back to the allocator, so memory
	// follows the pending entries rather than their past peak.
	keepCap = 256

	// movedKeepCap: the same for Wheel.moved (4 bytes an element), given
	// back when level 0 empties if it grew larger than this (16 KiB).
	movedKeepCap = 4096

	// spentKeepCap: the same for Wheel.spent (4 bytes an element), given
	// back when it empties.
	spentKeepCap = 4096

	chunkBits = 10 // 1024 entries (16 KiB) per slab chunk
	chunkLen  = 1 << chunkBits
	chunkMask = chunkLen - 1

	signBit = 1 << 63
)

// levelShift is the position of level l's lowest key bit.
func levelShift(l uint) uint {
	switch l {
	case 0:
		return 0
	case 1:
		return 6
	}
	return 18 + (l-2)*6
}

// levelBits is the number of key bits (log2 of the slots) of level l.
func levelBits(l uint) uint {
	if l == 1 {
		return 12
	}
	return 6 // the top level only ever uses the low 4 of its 6 bits
}

// levelBase is the bucket index of level l's slot 0; it is a multiple of 64.
func levelBase(l uint) uint {
	switch l {
	case 0:
		return 0
	case 1:
		return 64
	}
	return l2Base + (l-2)*64
}

// levelOfBit is the level whose slot digit holds key bit p.
func levelOfBit(p uint) uint {
	switch {
	case p < 6:
		return 0
	case p < 18:
		return 1
	}
	return 2 + (p-18)/6
}

// levelOfBucket is the level of wheel bucket b.
func levelOfBucket(b int32) uint {
	switch {
	case b < 64:
		return 0
	case b < l2Base:
		return 1
	}
	return 2 + uint(b-l2Base)>>6
}

// entry is one slab slot. It holds no pointers, so the garbage collector
// never scans the slab; it is 16 bytes. Its payload is kept in its bucket
// element, where firing reads it.
type entry struct {
	due int64  // on the free list: index of the next free entry
	gen uint32 // bumped every time the entry is cancelled, or reused after firing
	loc uint32 // kind | position in its bucket
}

// elem is one element of a bucket: kx packs the low 32 bits of the entry's
// key (high half) and its slab index (low half), and payload is the entry's.
// An element whose index is 0 is a tombstone, left by an entry that was
// cancelled or moved.
type elem struct {
	kx      uint64
	payload uint64
}

// bucket is one list of entries in insertion order.
type bucket struct {
	els    elems
	head   int32 // next position to fire (only moves while firing)
	live   int32 // elements that are not tombstones
	minDue int64 // exact earliest due of the live elements, if minOK
	minOK  bool
}

func element(k uint64, i int32, payload uint64) elem {
	return elem{uint64(uint32(k))<<32 | uint64(uint32(i)), payload}
}

func elIndex(kx uint64) int32 { return int32(uint32(kx)) }

// elKey is the low 32 bits of the key kept in kx.
func elKey(kx uint64) uint32 { return uint32(kx >> 32) }

// Wheel is a passive hierarchical timing wheel. See the package
// documentation for its structure, cost and limits. A Wheel is not safe for
// concurrent use.
//
// Invariants, outside Advance (the tests check them all):
//   - an entry with due <= now is in the overdue bucket;
//   - any other entry is in the wheel slot at the level whose digit holds
//     the highest bit in which key(due) and elapsed differ, at the slot
//     given by that digit of key(due); so a level's entries all lie in
//     elapsed's slot of the level above, and the lowest occupied level, at
//     its lowest occupied slot, holds the earliest entries;
//   - in every bucket, live elements with equal due are in insertion order:
//     insertion appends, tombstones and compaction keep order, and a
//     cascade moves a bucket in order into lower levels, which are empty
//     then because the lowest occupied level is always the one processed;
//   - a bucket's array is empty exactly when it has no live element; the
//     occupied bit of a wheel bucket is set exactly then; levelMask bit l
//     is set exactly when level l has an occupied bucket;
//   - an entry's loc names its kind and position: its bucket's element
//     there holds its index and the low 32 bits of its key; except that
//     an entry of level 0 whose element is not there was moved to level 0
//     by the latest level-1 cascade and not touched since: its loc still
//     holds its position in the level-1 slot it came from, p, and its
//     element is at moved[p]. (Such an entry cannot be found at p by
//     accident: an entry's index is at one position of its bucket only.)
//     A level-1 cascade runs only when level 0 is empty, and moved is
//     written only by such a cascade (and dropped only when level 0 is
//     empty), so it stays valid for as long as level 0 holds entries
//     placed by that cascade. Compaction rewrites positions, so a
//     compacted bucket holds exact positions only; trimming the
//     tombstones off a bucket's end moves no live element;
//   - an entry fired from a level-0 slot is in spent until alloc reuses
//     it, unchanged since it fired (kind wheel, a key at or before
//     elapsed), and in no bucket; every slab entry is pending, free or
//     spent;
//   - moved is at most movedKeepCap long when level 0 is empty;
//   - minOK implies minDue is exact.
type Wheel struct {
	chunks []*[chunkLen]entry // slab; chunks never move once allocated
	size   int32              // slab high-water mark (index 0 unused)
	free   int32              // head of the free list, 0 if empty
	count  int                // pending entries

	now     int64  // Now(); during Advance, the time being advanced to
	elapsed uint64 // key the wheel slots are laid out relative to

	levelMask uint16
	advancing bool
	firing    int32 // bucket being fired during Advance, or noBucket

	occupied [numSlots / 64]uint64 // bit b%64 of word b/64: bucket b non-empty
	l1sum    uint64                // bit j: occupied[1+j] != 0 (level 1's words)

	// The buckets, by index: level 0, level 1 and the levels above (in
	// pages allocated when first used, so that a small wheel stays small:
	// a shard has three wheels, and a node may host thousands of shards),
	// then overdue and firing.
	low  [64]bucket
	l1   [l1Pages]*[64]bucket
	high [(numSlots - l2Base) / 64]*[64]bucket // levels 2 and up, a page a level
	tail [numBuckets - numSlots]bucket         // overdue and firing

	// moved maps the positions of the level-1 slot cascaded last onto the
	// positions its entries took in level 0, for the entries the cascade
	// left unaware of their move (see the invariants and cascade).
	moved []uint32

	// spent holds the slab indexes of entries fired from level-0 slots and
	// not reused yet. Firing does not touch an entry (see fireSlot): it stays as
	// it was, recognisably fired by its due time (see isSpent), until alloc
	// takes its index from here and bumps its generation.
	spent []int32
}

// bucket returns bucket b, allocating its page if needed.
func (w *Wheel) bucket(b int32) *bucket {
	switch {
	case b < 64:
		return &w.low[b]
	case b < l2Base:
		pg := w.l1[(b-64)>>6]
		if pg == nil {
			pg = new([64]bucket)
			w.l1[(b-64)>>6] = pg
		}
		return &pg[(b-64)&63]
	case b < numSlots:
		pg := w.high[(b-l2Base)>>6]
		if pg == nil {
			pg = new([64]bucket)
			w.high[(b-l2Base)>>6] = pg
		}
		return &pg[(b-l2Base)&63]
	}
	return &w.tail[b-numSlots]
}

// key maps a due time onto the unsigned key space, preserving order.
func key(ms int64) uint64 { return uint64(ms) ^ signBit }

// unkey is the inverse of key.
func unkey(k uint64) int64 { return int64(k ^ signBit) }

// New returns an empty wheel whose clock starts at nowMs.
func New(nowMs int64) *Wheel {
	return &Wheel{
		size:    1, // the slab's first chunk comes with the first entry
		now:     nowMs,
		elapsed: key(nowMs),
		firing:  noBucket,
	}
}

func (w *Wheel) at(i int32) *entry { return &w.chunks[i>>chunkBits][i&chunkMask] }

func handleOf(i int32, e *entry) Handle { return Handle(uint64(e.gen)<<32 | uint64(uint32(i))) }

// lookup returns the slab index and entry of the pending entry named by h,
// or nil if h is stale, forged or zero.
func (w *Wheel) lookup(h Handle) (int32, *entry) {
	idx := uint32(h)
	if idx == 0 || idx >= uint32(w.size) {
		return 0, nil
	}
	i := int32(idx)
	e := w.at(i)
	if e.gen != uint32(h>>32) {
		return 0, nil
	}
	switch e.loc & kindMask {
	case kindFree:
		return 0, nil
	case kindWheel:
		if w.isSpent(i, e) {
			return 0, nil
		}
	}
	return i, e
}

// isSpent reports whether entry i (e), whose kind is kindWheel, has been
// fired, from a level-0 slot, and waits in spent. A pending wheel entry
// has a key after elapsed, except in the level-0 slot being fired, whose
// key is elapsed: there an entry has fired exactly when it is before the
// slot's head (or the slot has been fired to its end). A fired one has a
// key at or before elapsed, which never goes back.
func (w *Wheel) isSpent(i int32, e *entry) bool {
	k := key(e.due)
	if k != w.elapsed {
		return k < w.elapsed
	}
	b := w.firing
	if b < 0 || b >= 64 { // not firing a level-0 slot: k's slot is done
		return true
	}
	bk := &w.low[b] // k's slot, as k is elapsed, the slot's start
	return bk.live == 0 || w.posOf(b, i, e) < int(bk.head)
}

func (w *Wheel) alloc() int32 {
	if w.count >= maxEntries {
		panic("wheel: too many pending entries")
	}
	if n := len(w.spent); n > 0 {
		i := w.spent[n-1]
		if w.spent = w.spent[:n-1]; n == 1 && cap(w.spent) > spentKeepCap {
			w.spent = nil
		}
		w.at(i).gen++ // its handle goes stale now
		return i
	}
	if i := w.free; i != 0 {
		w.free = int32(w.at(i).due)
		return i
	}
	i := w.size
	if int(i>>chunkBits) == len(w.chunks) {
		w.chunks = append(w.chunks, new([chunkLen]entry))
	}
	w.size++
	return i
}

func (w *Wheel) release(i int32, e *entry) {
	e.gen++
	e.loc = kindFree
	e.due = int64(w.free)
	w.free = i
	w.count--
}

// slotOf returns the wheel bucket for key k, given elapsed: the slot given
// by k's digit of the level whose digit holds the highest bit in which k
// and elapsed differ. It is small enough to inline.
func (w *Wheel) slotOf(k uint64) int32 {
	g := &bitSlots[(bits.Len64((k^w.elapsed)|1)-1)&63]
	return int32(g.base) + int32(k>>g.shift)&int32(g.mask)
}

// bitSlots[p] describes, for a key whose highest bit differing from
// elapsed is p, the level whose digit holds bit p: its first bucket, the
// shift of its digit and the digit's mask.
var bitSlots = func() (t [64]struct {
	base, mask uint16
	shift      uint8
}) {
	for p := range t {
		l := levelOfBit(uint(p))
		t[p].base = uint16(levelBase(l))
		t[p].mask = uint16(1<<levelBits(l) - 1)
		t[p].shift = uint8(levelShift(l))
	}
	return t
}()

// occupy marks wheel bucket b non-empty.
func (w *Wheel) occupy(b int32) {
	w.occupied[b>>6] |= 1 << (b & 63)
	l := levelOfBucket(b)
	if l == 1 {
		w.l1sum |= 1 << (b>>6 - 1)
	}
	w.levelMask |= 1 << l
}

// vacate marks wheel bucket b empty.
func (w *Wheel) vacate(b int32) {
	if w.occupied[b>>6] &^= 1 << (b & 63); w.occupied[b>>6] != 0 {
		return
	}
	l := levelOfBucket(b)
	if l == 1 {
		if w.l1sum &^= 1 << (b>>6 - 1); w.l1sum != 0 {
			return
		}
	}
	w.levelMask &^= 1 << l
}

// firstSlot returns the lowest occupied slot of occupied level l.
func (w *Wheel) firstSlot(l uint) uint {
	if l != 1 {
		return uint(bits.TrailingZeros64(w.occupied[levelBase(l)>>6]))
	}
	j := uint(bits.TrailingZeros64(w.l1sum))
	return j*64 + uint(bits.TrailingZeros64(w.occupied[1+j]))
}

// slotStart is the first key covered by slot of level l, given elapsed.
func (w *Wheel) slotStart(l, slot uint) uint64 {
	shift := levelShift(l)
	// For the top level shift+levelBits exceeds 63: the shift yields 0 and
	// the mask all ones, which is what we want.
	return w.elapsed&^(uint64(1)<<(shift+levelBits(l))-1) | uint64(slot)<<shift
}

// push appends entry i, with its payload, to bucket b, of the given kind.
func (w *Wheel) push(b int32, i int32, e *entry, kind uint32, payload uint64) {
	bk := w.bucket(b)
	if bk.live == 0 {
		bk.minDue, bk.minOK = e.due, true
		if b < numSlots {
			w.occupy(b)
		}
	} else if e.due < bk.minDue {
		bk.minDue = e.due // exact if minOK was, harmless if not
	}
	pos := bk.els.len()
	if pos > posMask {
		panic("wheel: internal error: bucket position overflow")
	}
	e.loc = kind | uint32(pos)
	bk.els.push(element(key(e.due), i, payload))
	bk.live++
}

// place puts a detached entry where its due time belongs.
func (w *Wheel) place(i int32, e *entry, payload uint64) {
	if e.due <= w.now {
		w.push(overdueBucket, i, e, kindOverdue, payload)
		return
	}
	w.push(w.slotOf(key(e.due)), i, e, kindWheel, payload)
}

// bucketOf returns the bucket entry e is in.
func (w *Wheel) bucketOf(e *entry) int32 {
	switch e.loc & kindMask {
	case kindWheel:
		return w.slotOf(key(e.due))
	case kindOverdue:
		return overdueBucket
	default:
		return firingBucket
	}
}

// posOf returns the position of entry i (e) in its bucket b: the one its
// loc names, unless that is a level-0 slot and its element is not there;
// then a level-1 cascade moved it, and moved has it (see Wheel.moved).
func (w *Wheel) posOf(b, i int32, e *entry) int {
	pos := int(e.loc & posMask)
	if b < 64 {
		pos = w.lowPos(b, i, pos)
	}
	return pos
}

func (w *Wheel) lowPos(b, i int32, pos int) int {
	if els := &w.low[b].els; pos >= els.len() || elIndex(els.at(pos).kx) != i {
		pos = int(w.moved[pos])
	}
	return pos
}

// emptied resets bucket b after its last live element left it.
func (w *Wheel) emptied(b int32) {
	bk := w.bucket(b)
	bk.els.reset(keepCap)
	bk.head, bk.live, bk.minOK = 0, 0, false
	if b < numSlots {
		w.vacate(b)
		if b < 64 && w.occupied[0] == 0 && cap(w.moved) > movedKeepCap {
			w.moved = nil // level 0 is empty: no entry needs it
		}
	}
}

// remove takes pending entry i (e) out of its bucket, leaving a tombstone
// unless it was the newest element, and compacts the bucket if its
// tombstones now outnumber its live elements. It returns the payload.
func (w *Wheel) remove(i int32, e *entry) (payload uint64) {
	b := w.bucketOf(e)
	pos := w.posOf(b, i, e)
	bk := w.bucket(b)
	payload = bk.els.at(pos).payload
	live := bk.live - 1
	if bk.live = live; live == 0 {
		w.emptied(b)
		return payload
	}
	if bk.minOK && e.due == bk.minDue {
		bk.minOK = false
	}
	els, head := &bk.els, int(bk.head)
	n := els.len()
	if pos == n-1 { // trimmed with the tombstones before it
		for n = pos; n > head && elIndex(els.at(n-1).kx) == 0; n-- {
		}
		els.truncate(n)
	} else {
		*els.at(pos) = elem{}
	}
	// Either way live fell by one: the tombstones left may outnumber it.
	if dead := n - head - int(live); dead > int(live) && dead >= compactSlack && b != w.firing {
		w.compact(b)
	}
	return payload
}

// compact drops the tombstones of bucket b (which is not being fired),
// keeping order, and shrinks its array if it is mostly empty. It stores
// every live entry's new, exact position, so none of them needs moved.
func (w *Wheel) compact(b int32) {
	els := &w.bucket(b).els
	j := 0
	for p := range els.len() {
		if el := *els.at(p); elIndex(el.kx) != 0 {
			e := w.at(elIndex(el.kx))
			e.loc = e.loc&kindMask | uint32(j)
			*els.at(j) = el
			j++
		}
	}
	els.truncate(j)
	els.shrink(keepCap)
}

// Add schedules payload at dueMs and returns its handle. A due time at or
// before Now() is accepted and fires at the next Advance. During Advance
// (from its fn), a due time at or before the time being advanced to also
// fires at the next Advance, never the running one.
func (w *Wheel) Add(dueMs int64, payload uint64) Handle {
	i := w.alloc()
	e := w.at(i)
	e.due = dueMs
	w.count++
	w.place(i, e, payload)
	return handleOf(i, e)
}

// Cancel removes the pending entry named by h. It returns false, and changes
// nothing, if h is stale (its entry fired or was cancelled), forged or zero.
func (w *Wheel) Cancel(h Handle) bool {
	i, e := w.lookup(h)
	if e == nil {
		return false
	}
	w.remove(i, e)
	w.release(i, e)
	return true
}

// Reschedule moves the pending entry named by h to dueMs, keeping its
// payload; h stays valid. For the order of equal due times it counts as a
// fresh insertion. The same rules as Add apply to a due time in the past.
// It returns false, and changes nothing, if h is stale.
func (w *Wheel) Reschedule(h Handle, dueMs int64) bool {
	i, e := w.lookup(h)
	if e == nil {
		return false
	}
	p := w.remove(i, e)
	e.due = dueMs
	w.place(i, e, p)
	return true
}

// Get returns the due time and payload of the pending entry named by h.
func (w *Wheel) Get(h Handle) (dueMs int64, payload uint64, ok bool) {
	if i, e := w.lookup(h); e != nil {
		return e.due, w.payloadOf(i, e), true
	}
	return 0, 0, false
}

// payloadOf returns the payload of pending entry i (e), from its element.
func (w *Wheel) payloadOf(i int32, e *entry) uint64 {
	b := w.bucketOf(e)
	return w.bucket(b).els.at(w.posOf(b, i, e)).payload
}

// Len returns the number of pending entries.
func (w *Wheel) Len() int { return w.count }

// Now returns the wheel's clock: the origin given to New or the latest time
// passed to Advance. While Advance runs, it is the time being advanced to.
func (w *Wheel) Now() int64 { return w.now }

// Each calls fn for every pending entry, in no particular order, until fn
// returns false. fn may Cancel or Reschedule entries; whether entries added
// by fn are visited is unspecified.
func (w *Wheel) Each(fn func(h Handle, dueMs int64, payload uint64) bool) {
	size := w.size
	for i := int32(1); i < size; i++ {
		e := w.at(i)
		switch e.loc & kindMask {
		case kindFree:
			continue
		case kindWheel:
			if w.isSpent(i, e) {
				continue
			}
		}
		if !fn(handleOf(i, e), e.due, w.payloadOf(i, e)) {
			return
		}
	}
}

// NextDue returns the exact earliest due time among pending entries, which
// may be at or before Now() (then the next Advance fires it). ok is false if
// the wheel is empty. It costs O(1), plus one scan of a single bucket when
// the cached minimum of that bucket left it since it was last computed.
func (w *Wheel) NextDue() (dueMs int64, ok bool) {
	if fb := w.bucket(firingBucket); fb.live > 0 { // sorted: first live is min
		for p := int(fb.head); p < fb.els.len(); p++ {
			if i := elIndex(fb.els.at(p).kx); i != 0 {
				dueMs, ok = w.at(i).due, true
				break
			}
		}
	}
	if w.bucket(overdueBucket).live > 0 {
		if d := w.bucketMin(overdueBucket, 0); !ok || d < dueMs {
			dueMs, ok = d, true
		}
	}
	if w.levelMask != 0 {
		l := uint(bits.TrailingZeros16(w.levelMask))
		slot := w.firstSlot(l)
		var d int64
		if l == 0 { // a level-0 slot holds a single due time
			d = unkey(w.slotStart(0, slot))
		} else {
			d = w.bucketMin(int32(levelBase(l)+slot), w.slotStart(l, slot))
		}
		if !ok || d < dueMs {
			dueMs, ok = d, true
		}
	}
	return dueMs, ok
}

// bucketMin returns the exact earliest due of non-empty bucket b. For a
// wheel bucket, start is its slotStart; up to lowKeyLevel the minimum
// comes from the keys kept in the bucket, without reading entries.
func (w *Wheel) bucketMin(b int32, start uint64) int64 {
	bk := w.bucket(b)
	if bk.minOK {
		return bk.minDue
	}
	var m int64
	if b < numSlots && levelOfBucket(b) <= lowKeyLevel {
		mask := uint32(1)<<levelShift(levelOfBucket(b)) - 1
		low := uint32(mask)
		for p := int(bk.head); p < bk.els.len(); p++ {
			if el := bk.els.at(p); elIndex(el.kx) != 0 {
				low = min(low, elKey(el.kx)&mask)
			}
		}
		m = unkey(start | uint64(low))
	} else {
		first := true
		for p := int(bk.head); p < bk.els.len(); p++ {
			if i := elIndex(bk.els.at(p).kx); i != 0 {
				if d := w.at(i).due; first || d < m {
					m, first = d, false
				}
			}
		}
	}
	bk.minDue, bk.minOK = m, true
	return m
}

// Advance moves the clock to nowMs and calls fn with the due time and
// payload of every entry that was pending when Advance was called and has
// due <= nowMs, in non-decreasing due order, ties in insertion order; each
// entry's handle is stale by the time fn is called. It returns the number
// of entries fired. A nowMs before Now() does nothing and returns 0.
//
// fn may call Add, Cancel, Reschedule, Get, NextDue, Len, Each and Now, but
// not Advance. An entry that fn cancels or reschedules before its turn does
// not fire (a rescheduled one fires at its new time). An entry that fn adds,
// or reschedules, to a due time <= nowMs fires at the next Advance, not this
// one: so Advance always terminates, even if fn re-arms a timer with a zero
// or negative delay. fn may be nil.
//
// If fn panics, the wheel stays consistent: its clock is left at the due
// time of the entry that panicked, and the entries that had not fired yet
// fire at the next Advance, still in order.
func (w *Wheel) Advance(nowMs int64, fn func(dueMs int64, payload uint64)) int {
	if nowMs < w.now {
		return 0
	}
	if w.advancing {
		panic("wheel: Advance called from inside Advance")
	}
	target := key(nowMs)
	if w.count == 0 {
		w.now, w.elapsed = nowMs, target
		return 0
	}
	w.advancing = true
	w.now = nowMs
	done := false
	defer func() {
		w.advancing = false
		if !done {
			w.afterPanic()
		}
	}()

	fired := 0
	// Overdue entries all have due <= the previous now, earlier than anything
	// in the slots: they go first, sorted.
	if w.bucket(overdueBucket).live > 0 {
		w.batchOverdue()
		fired += w.fireBatch(fn)
	}
	for w.levelMask != 0 {
		l := uint(bits.TrailingZeros16(w.levelMask))
		slot := w.firstSlot(l)
		start := w.slotStart(l, slot)
		if start > target {
			break
		}
		w.elapsed = start
		b := int32(levelBase(l) + slot)
		if l == 0 {
			fired += w.fireSlot(b, fn)
		} else {
			w.cascade(b, l)
		}
	}
	// Every slot starting at or before target has been emptied, so the
	// remaining entries keep their places relative to target.
	w.elapsed = target
	done = true
	return fired
}

// batchOverdue moves the overdue bucket, stably sorted by due, into the
// firing bucket. Entries added while the batch fires go to the (now empty)
// overdue bucket and wait for the next Advance.
func (w *Wheel) batchOverdue() {
	ov, fb := w.bucket(overdueBucket), w.bucket(firingBucket)
	els := &ov.els
	j, sorted, last := 0, true, int64(0)
	for p := range els.len() {
		el := *els.at(p)
		i := elIndex(el.kx)
		if i == 0 {
			continue
		}
		d := w.at(i).due
		if j > 0 && d < last {
			sorted = false
		}
		last = d
		*els.at(j) = el
		j++
	}
	els.truncate(j)
	if !sorted {
		byDue := func(a, b elem) int { return cmp.Compare(w.at(elIndex(a.kx)).due, w.at(elIndex(b.kx)).due) }
		if els.base() == 0 {
			slices.SortStableFunc(els.tail, byDue)
		} else { // sorted in one piece, then put back
			flat := els.appendTo(make([]elem, 0, j))
			slices.SortStableFunc(flat, byDue)
			for p, el := range flat {
				*els.at(p) = el
			}
		}
	}
	for pos := range j {
		w.at(elIndex(els.at(pos).kx)).loc = kindFiring | uint32(pos)
	}
	ov.els, fb.els = fb.els, ov.els
	ov.els.truncate(0)
	fb.head, fb.live, fb.minOK = 0, int32(j), false
	ov.head, ov.live, ov.minOK = 0, 0, false
}

// fireBatch fires the live elements of the firing bucket (the overdue batch)
// in order until none is left. fn may cancel or move elements of it but cannot
// add any: only batchOverdue fills it. Its entries were read to sort them,
// so each is released as it fires.
func (w *Wheel) fireBatch(fn func(dueMs int64, payload uint64)) int {
	const b = firingBucket
	w.firing = b
	bk := w.bucket(b)
	n := 0
	for int(bk.head) < bk.els.len() {
		el := *bk.els.at(int(bk.head))
		bk.head++
		i := elIndex(el.kx)
		if i == 0 {
			continue
		}
		e := w.at(i)
		if e.due > w.now {
			panic("wheel: internal error: entry would fire early")
		}
		if bk.live--; bk.live == 0 {
			w.emptied(b)
		}
		due := e.due
		w.release(i, e)
		n++
		if fn != nil {
			fn(due, el.payload)
		}
	}
	w.firing = noBucket
	return n
}

// fireSlot fires the live elements of level-0 slot b, whose due time is
// elapsed, in order until none is left; fn may cancel or move elements of b
// but cannot add any (only cascades and Add fill a level-0 slot, and Add
// puts a due time at or before the clock in the overdue bucket).
//
// It does not touch the entries, which lie at random places in the slab:
// an element has all that firing needs (the due time is the slot's, the
// payload is kept beside the index), and the entry is left as it was. It
// is recognisably fired (isSpent) and its index goes to spent, from where
// alloc reuses it, bumping its generation then, when the entry is written
// anyway. Reading or writing each fired entry here was a cache miss per
// timer, most of what firing cost.
func (w *Wheel) fireSlot(b int32, fn func(dueMs int64, payload uint64)) int {
	w.firing = b
	bk := &w.low[b]
	due := unkey(w.elapsed)
	n := 0
	for int(bk.head) < bk.els.len() {
		el := *bk.els.at(int(bk.head))
		bk.head++
		i := elIndex(el.kx)
		if i == 0 {
			continue
		}
		if elKey(el.kx) != uint32(w.elapsed) {
			panic("wheel: internal error: entry in the wrong level-0 slot")
		}
		if bk.live--; bk.live == 0 {
			w.emptied(b)
		}
		w.spent = append(w.spent, i)
		w.count--
		n++
		if fn != nil {
			fn(due, el.payload)
		}
	}
	w.firing = noBucket
	return n
}

// cascade re-inserts every entry of slot b (level l > 0) relative to
// elapsed, which is the slot's start: each lands on a lower level, in
// order. All lower levels are empty when it runs (the lowest occupied
// level is always the one processed), so the destinations start empty.
//
// Up to lowKeyLevel an element's key bits alone place it, and the entry is
// touched only to store its new position. Those stores, the only random
// memory accesses, get a tight loop of their own, after the elements are
// distributed, so that many of their cache misses are in flight at once.
// From level 1, the most frequent cascade, the entries are not touched at
// all: their new positions go to moved, by old position, and the entries
// keep their old ones (see the Wheel invariants). They are read once more,
// when they fire, or when they are cancelled or moved.
func (w *Wheel) cascade(b int32, l uint) {
	src := &w.bucket(b).els
	n := src.len()
	if l == 1 { // all to level 0, whose slot is the low six bits
		moved := w.moved
		if cap(moved) < n { // with room for the next slots, a little larger
			moved = make([]uint32, n, n+n/4)
		}
		moved = moved[:n]
		for p := range n {
			if el := *src.at(p); elIndex(el.kx) != 0 {
				d := elKey(el.kx) & 63
				dk := &w.low[d]
				moved[p] = uint32(dk.els.len())
				dk.els.push(el)
				w.occupied[0] |= 1 << d
			}
		}
		w.moved = moved
		for word := w.occupied[0]; word != 0; word &= word - 1 {
			dk := &w.low[bits.TrailingZeros64(word)]
			dk.live = int32(dk.els.len()) // a level-0 slot holds one due time: no minimum to keep
		}
		if w.occupied[0] != 0 { // it is: an occupied slot has live elements
			w.levelMask |= 1
		}
		w.emptied(b)
		return
	}
	if l > lowKeyLevel {
		for p := range n {
			if el := *src.at(p); elIndex(el.kx) != 0 {
				i := elIndex(el.kx)
				e := w.at(i)
				w.push(w.slotOf(key(e.due)), i, e, kindWheel, el.payload)
			}
		}
		w.emptied(b)
		return
	}
	// Every key in the slot agrees with elapsed above levelShift(l), and
	// elapsed's bits below it are zero.
	mask := uint32(1)<<levelShift(l) - 1
	for p := range n {
		if el := *src.at(p); elIndex(el.kx) != 0 {
			d := lowSlot(elKey(el.kx) & mask)
			dk := w.bucket(d)
			dk.els.push(el)
			w.occupied[d>>6] |= 1 << (d & 63)
		}
	}
	// The destinations are exactly the occupied slots below level l.
	for wi, word := range w.occupied[:levelBase(l)>>6] {
		for ; word != 0; word &= word - 1 {
			d := int32(wi*64 + bits.TrailingZeros64(word))
			dk := w.bucket(d)
			for p := range dk.els.len() {
				w.at(elIndex(dk.els.at(p).kx)).loc = kindWheel | uint32(p)
			}
			dk.live = int32(dk.els.len())
			if d >= 64 { // a level-0 slot holds one due time: no minimum to keep
				low := mask
				for p := range dk.els.len() {
					low = min(low, elKey(dk.els.at(p).kx)&mask)
				}
				dk.minDue, dk.minOK = unkey(w.elapsed|uint64(low)), true
			}
			w.occupy(d) // sets the summary and level bits too
		}
	}
	w.emptied(b)
}

// lowSlot returns the wheel bucket of a key that differs from elapsed only
// in its low 32 bits, low.
func lowSlot(low uint32) int32 {
	l := levelOfBit(uint(bits.Len32(low|1) - 1))
	return int32(levelBase(l) + uint(low>>levelShift(l))&(1<<levelBits(l)-1))
}

// afterPanic restores the invariants when fn panicked inside Advance: the
// clock stops at elapsed (the due time of the slot being fired, or the old
// clock while the overdue batch fired); the entries not fired yet go first
// into the overdue bucket, then the entries fn deferred that are due by the
// stopped clock; the later ones go back to the slots. The entries fired
// from the slot stay spent: their keys are at or before elapsed.
func (w *Wheel) afterPanic() {
	w.now = unkey(w.elapsed)
	var deferred, unfired []elem
	ov := &w.bucket(overdueBucket).els
	for p := range ov.len() {
		if el := *ov.at(p); elIndex(el.kx) != 0 {
			deferred = append(deferred, el)
		}
	}
	w.emptied(overdueBucket)
	if b := w.firing; b != noBucket {
		bk := w.bucket(b)
		for p := int(bk.head); p < bk.els.len(); p++ {
			if el := *bk.els.at(p); elIndex(el.kx) != 0 {
				unfired = append(unfired, el)
			}
		}
		if bk.live > 0 {
			w.emptied(b)
		}
		w.firing = noBucket
	}
	for _, el := range unfired {
		i := elIndex(el.kx)
		w.push(overdueBucket, i, w.at(i), kindOverdue, el.payload)
	}
	for _, el := range deferred {
		i := elIndex(el.kx)
		w.place(i, w.at(i), el.payload)
	}
}
