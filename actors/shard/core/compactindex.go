package core

// coldIndex finds a compact job's slot by its id. A Go map from int64 to uint32
// costs about 26 bytes an entry (16-byte slots at 7/8 load at most, and it never
// shrinks); this table costs about 7: one uint32 a cell, open addressing with
// linear probing at a load between 3/8 and 3/4, the key kept only in the slot the
// cell names. Each cell also holds 7 bits of the id's hash, so a probe that passes
// another id rarely reads that id's slot. The table is 256 parts by the hash's
// top byte, each growing (and shrinking) on its own, so a resize rehashes 1/256 of
// the jobs: a fraction of a millisecond at a million, not a stall of the shard.
// Deletion shifts the cells behind back (no tombstones), so probes stay short
// however many jobs come and go.
const (
	idxParts   = 256
	idxRefBits = 25 // a cell: tag<<25 | ref+1
	idxRefMask = 1<<idxRefBits - 1
	// coldMaxChunks bounds the chunks so that every ref+1 fits idxRefBits: 33.5
	// million compact jobs per shard (a job beyond them is kept full).
	coldMaxChunks = (1<<idxRefBits - 1) / coldChunk
)

type coldIndex struct {
	parts    [idxParts]idxPart
	n        int
	reserved bool // reserve sized the parts: fit shrinks what is unused
}

type idxPart struct {
	cells []uint32
	n     int
}

func idxHash(id int64) uint64 { // murmur3's finalizer: snowflake ids differ in few bits
	x := uint64(id)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func idxTag(h uint64) uint32 { return uint32(h>>49) & 0x7f }

// find is the cell index of id in its part, or -1; idOf names the job a ref holds.
func (x *coldIndex) find(id int64, idOf func(uint32) int64) (*idxPart, int, uint32) {
	h := idxHash(id)
	p := &x.parts[h>>56]
	if len(p.cells) == 0 {
		return p, -1, 0
	}
	mask := uint64(len(p.cells) - 1)
	tag := idxTag(h)
	for i := h & mask; ; i = (i + 1) & mask {
		c := p.cells[i]
		if c == 0 {
			return p, -1, 0
		}
		if c>>idxRefBits == tag {
			if ref := c&idxRefMask - 1; idOf(ref) == id {
				return p, int(i), ref
			}
		}
	}
}

// warm reads the cell each of ids hashes to and returns their sum, which means
// nothing: it is for a batch of ids about to be looked up one by one, between
// other work. Each lookup's first cell is a cache miss in a large table (and often
// a TLB miss), and one at a time they cost a create about a quarter of a
// microsecond; read back to back here, the misses overlap (the CPU keeps several
// independent loads in flight), and the lookups find their cells cached.
func (x *coldIndex) warm(n int, id func(int) int64) uint32 {
	var sum uint32
	for i := range n {
		h := idxHash(id(i))
		p := &x.parts[h>>56]
		if len(p.cells) > 0 {
			sum += p.cells[h&uint64(len(p.cells)-1)]
		}
	}
	return sum
}

func (x *coldIndex) get(id int64, idOf func(uint32) int64) (uint32, bool) {
	_, i, ref := x.find(id, idOf)
	return ref, i >= 0
}

// insert adds id (which the index does not hold) at ref; idOf must already know it.
func (x *coldIndex) insert(id int64, ref uint32, idOf func(uint32) int64) {
	h := idxHash(id)
	p := &x.parts[h>>56]
	if (p.n+1)*4 > len(p.cells)*3 {
		p.resize(max(16, 2*len(p.cells)), idOf)
	}
	p.place(h, idxTag(h)<<idxRefBits|(ref+1))
	p.n++
	x.n++
}

func (p *idxPart) place(h uint64, cell uint32) {
	mask := uint64(len(p.cells) - 1)
	i := h & mask
	for p.cells[i] != 0 {
		i = (i + 1) & mask
	}
	p.cells[i] = cell
}

func (p *idxPart) resize(n int, idOf func(uint32) int64) {
	old := p.cells
	p.cells = make([]uint32, n)
	for _, c := range old {
		if c != 0 {
			p.place(idxHash(idOf(c&idxRefMask-1)), c)
		}
	}
}

// remove drops id, if held.
func (x *coldIndex) remove(id int64, idOf func(uint32) int64) bool {
	p, i, _ := x.find(id, idOf)
	if i < 0 {
		return false
	}
	mask := len(p.cells) - 1
	// Backward-shift deletion: a cell after the hole moves into it unless its home
	// lies cyclically in (hole, cell].
	for j := (i + 1) & mask; p.cells[j] != 0; j = (j + 1) & mask {
		c := p.cells[j]
		home := int(idxHash(idOf(c&idxRefMask-1))) & mask
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			p.cells[i] = c
			i = j
		}
	}
	p.cells[i] = 0
	p.n--
	x.n--
	if len(p.cells) > 16 && p.n*8 < len(p.cells) {
		p.resize(len(p.cells)/2, idOf)
	}
	return true
}

// reserve sizes the parts for n ids in all (at most what refs can name), spread as
// the hash spreads them, so that inserting them resizes few of the parts, if any;
// it never shrinks one. fit gives back what was not used.
func (x *coldIndex) reserve(n int, idOf func(uint32) int64) {
	per := min(n, coldMaxChunks*coldChunk) / idxParts
	per += per/8 + 16 // about the spread of the parts' counts: a part past it grows as usual
	size := idxSizeFor(per)
	for i := range x.parts {
		if p := &x.parts[i]; len(p.cells) < size {
			p.resize(size, idOf)
		}
	}
	x.reserved = true
}

// fit shrinks every part that reserve left larger than its ids need to the size
// insert would have grown it to.
func (x *coldIndex) fit(idOf func(uint32) int64) {
	if !x.reserved {
		return
	}
	x.reserved = false
	for i := range x.parts {
		p := &x.parts[i]
		if p.n == 0 {
			p.cells = nil
		} else if size := idxSizeFor(p.n); len(p.cells) > size {
			p.resize(size, idOf)
		}
	}
}

// idxSizeFor is the size of a part insert grows to for n ids: the least power of
// two, at least 16, that holds them at a load of at most 3/4.
func idxSizeFor(n int) int {
	size := 16
	for n*4 > size*3 {
		size *= 2
	}
	return size
}
