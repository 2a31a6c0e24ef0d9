package core

import "slices"

// reqIndex maps the request window's ids to what they did, kept sorted by id in
// chunks of up to reqChunkCap.
//
// Request ids are snowflake ids: a millisecond timestamp in the high bits, so the
// ids a shard sees rise with time, whichever client took them. A new id (most
// commands) then sorts after every id in the window and the oldest id sorts first:
// a create's lookup and insert touch the last chunk and its eviction the first,
// and the window's memory between them stays cold. A hash map of the same 100,000
// ids (what the window was) took three cache misses a create, about 0.6 µs of the
// shard's 2.5 µs in a million-create profile. An id out of that order (a client
// whose clock is behind, a retry) costs a binary search over the chunks' last ids
// and one chunk's.
type reqIndex struct {
	chunks []*reqChunk
	last   []int64 // last[i] is the greatest id in chunks[i]: searched without touching the chunks
	n      int
}

// reqChunkCap: a chunk's ids, binary searched, fit in 16 cache lines; inserting
// into the middle of one moves at most 3 KiB.
const reqChunkCap = 128

// reqChunk holds ids[lo:n] (sorted) and what each did; the oldest ids leave
// from the front by moving lo. Every chunk but the last holds at least
// reqChunkMin ids (rebalance).
type reqChunk struct {
	lo, n int
	ids   [reqChunkCap]int64
	vals  [reqChunkCap]seenReq
}

func (x *reqIndex) len() int { return x.n }

// chunkFor is the index of the first chunk whose greatest id is at least id, or
// len(x.chunks) when id is above them all.
func (x *reqIndex) chunkFor(id int64) int {
	if k := len(x.last); k == 0 || id > x.last[k-1] {
		return k
	}
	c, _ := slices.BinarySearch(x.last, id)
	return c
}

func (x *reqIndex) get(id int64) (seenReq, bool) {
	c := x.chunkFor(id)
	if c == len(x.chunks) {
		return seenReq{}, false
	}
	ch := x.chunks[c]
	i, ok := slices.BinarySearch(ch.ids[ch.lo:ch.n], id)
	if !ok {
		return seenReq{}, false
	}
	return ch.vals[ch.lo+i], true
}

// put enters id, which the index does not hold.
func (x *reqIndex) put(id int64, v seenReq) {
	x.n++
	c := x.chunkFor(id)
	if c == len(x.chunks) { // above every id: the common case
		if c > 0 {
			ch := x.chunks[c-1]
			if ch.n == reqChunkCap && ch.lo > 0 { // a window smaller than a chunk: no new one
				ch.closeUp()
			}
			if ch.n < reqChunkCap {
				ch.ids[ch.n], ch.vals[ch.n] = id, v
				ch.n++
				x.last[c-1] = id
				return
			}
		}
		ch := &reqChunk{n: 1}
		ch.ids[0], ch.vals[0] = id, v
		x.chunks = append(x.chunks, ch)
		x.last = append(x.last, id)
		return
	}
	ch := x.chunks[c]
	if ch.n == reqChunkCap {
		if ch.lo > 0 { // room at the front
			ch.closeUp()
		} else { // split: the upper half goes to a new chunk after it
			half := reqChunkCap / 2
			up := &reqChunk{n: reqChunkCap - half}
			copy(up.ids[:], ch.ids[half:])
			copy(up.vals[:], ch.vals[half:])
			ch.n = half
			x.chunks = slices.Insert(x.chunks, c+1, up)
			x.last = slices.Insert(x.last, c+1, x.last[c])
			x.last[c] = ch.ids[half-1]
			if id > x.last[c] {
				c, ch = c+1, up
			}
		}
	}
	i, _ := slices.BinarySearch(ch.ids[ch.lo:ch.n], id)
	i += ch.lo
	copy(ch.ids[i+1:ch.n+1], ch.ids[i:ch.n])
	copy(ch.vals[i+1:ch.n+1], ch.vals[i:ch.n])
	ch.ids[i], ch.vals[i] = id, v
	ch.n++ // below the chunk's greatest id (chunkFor, or the split): last[c] stands
}

// closeUp moves the chunk's ids to its front.
func (ch *reqChunk) closeUp() {
	copy(ch.ids[:], ch.ids[ch.lo:ch.n])
	copy(ch.vals[:], ch.vals[ch.lo:ch.n])
	ch.n -= ch.lo
	ch.lo = 0
}

// del removes id, which the index holds.
func (x *reqIndex) del(id int64) {
	c, i := 0, 0
	if ch := x.chunks[0]; ch.ids[ch.lo] == id { // the least id: the common case
		i = ch.lo
	} else {
		c = x.chunkFor(id)
		ch = x.chunks[c]
		var ok bool
		if i, ok = slices.BinarySearch(ch.ids[ch.lo:ch.n], id); !ok {
			panic("core: the request window's index lost an id")
		}
		i += ch.lo
	}
	ch := x.chunks[c]
	x.n--
	if i == ch.lo { // the oldest: the common case
		ch.lo++
	} else {
		copy(ch.ids[i:], ch.ids[i+1:ch.n])
		copy(ch.vals[i:], ch.vals[i+1:ch.n])
		ch.n--
	}
	if ch.lo == ch.n { // the last chunk, which appends had not filled; any other is rebalanced first
		x.chunks = slices.Delete(x.chunks, c, c+1)
		x.last = slices.Delete(x.last, c, c+1)
		return
	}
	x.last[c] = ch.ids[ch.n-1]
	if ch.n-ch.lo < reqChunkMin && len(x.chunks) > 1 {
		x.rebalance(c)
	}
}

// reqChunkMin is the fewest ids a chunk holds, but the last (which appends fill):
// so the index holds at most n/reqChunkMin+1 chunks whatever ids come and go. Without it,
// ids chosen to leave one id in each chunk (a client picks its request ids) kept
// 100,000 ids in 48,413 chunks, 143 MiB.
const reqChunkMin = reqChunkCap / 4

// rebalance restores reqChunkMin after chunk c fell below it: c and a neighbour
// (which holds at least reqChunkMin) become one chunk if their ids fit in one, else
// share them evenly (at least half a chunk each). Front to back, a draining chunk
// takes half of the next one's ids every reqChunkCap/2 - reqChunkMin evictions or so.
func (x *reqIndex) rebalance(c int) {
	a := min(c, len(x.chunks)-2) // the pair a, a+1
	l, r := x.chunks[a], x.chunks[a+1]
	var ids [2 * reqChunkCap]int64
	var vals [2 * reqChunkCap]seenReq
	k := copy(ids[:], l.ids[l.lo:l.n])
	copy(vals[:], l.vals[l.lo:l.n])
	copy(vals[k:], r.vals[r.lo:r.n])
	k += copy(ids[k:], r.ids[r.lo:r.n])
	if k <= reqChunkCap {
		copy(l.ids[:], ids[:k])
		copy(l.vals[:], vals[:k])
		l.lo, l.n = 0, k
		x.last[a] = x.last[a+1]
		x.chunks = slices.Delete(x.chunks, a+1, a+2)
		x.last = slices.Delete(x.last, a+1, a+2)
		return
	}
	h := k / 2
	copy(l.ids[:], ids[:h])
	copy(l.vals[:], vals[:h])
	l.lo, l.n = 0, h
	copy(r.ids[:], ids[h:k])
	copy(r.vals[:], vals[h:k])
	r.lo, r.n = 0, k-h
	x.last[a] = ids[h-1]
}
