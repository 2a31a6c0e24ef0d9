package core

// index finds a remembered run's slot by its key hash (keyHashOf). Every dispatch of
// a new run looks it up and misses, so a miss must be cheap: a Go map churned by an
// insert and a delete per finished run filled up with deleted entries, and a miss
// cost about 1.2 µs there (most of the worker core's time in the fire scenario). So
// it is open addressing with linear probing over at most 2 × RememberRuns entries
// (never more than half full): a miss ends at the first empty entry, usually in the
// first cache line, and a delete shifts the entries after it back (Knuth's
// algorithm R), leaving no deleted entries behind.
//
// An entry is the key hash with its low indexSlotBits replaced by slot+1 (0: empty).
// Its high bits place it (home) and screen the records: a record is read only when
// they match, and the caller then compares its full key.
type index struct {
	e []uint64
	n int
}

const (
	indexSlotBits = 17 // slot+1 ≤ RememberRuns
	indexSlotMask = 1<<indexSlotBits - 1
	indexMin      = 1024
	indexMax      = 2 * RememberRuns
)

// RememberRuns slots must fit in an entry's slot bits.
const _ = uint(indexSlotMask - RememberRuns)

func (x *index) home(h uint64) int { return int(h>>32) & (len(x.e) - 1) }

// lookup calls match with the slot of every entry whose key hash may be h, in
// probing order, until match returns true; it returns that slot.
func (x *index) lookup(h uint64, match func(slot uint32) bool) (uint32, bool) {
	if len(x.e) == 0 {
		return 0, false
	}
	mask := len(x.e) - 1
	for i := x.home(h); ; i = (i + 1) & mask {
		v := x.e[i]
		if v == 0 {
			return 0, false
		}
		if v&^indexSlotMask == h&^indexSlotMask && match(uint32(v&indexSlotMask)-1) {
			return uint32(v&indexSlotMask) - 1, true
		}
	}
}

// insert adds slot s under key hash h.
func (x *index) insert(h uint64, s uint32) {
	if 2*(x.n+1) > len(x.e) {
		x.grow()
	}
	mask := len(x.e) - 1
	i := x.home(h)
	for x.e[i] != 0 {
		i = (i + 1) & mask
	}
	x.e[i] = h&^indexSlotMask | uint64(s+1)
	x.n++
}

// remove takes slot s, inserted under key hash h, out.
func (x *index) remove(h uint64, s uint32) {
	mask := len(x.e) - 1
	want := h&^indexSlotMask | uint64(s+1)
	i := x.home(h)
	for x.e[i] != want {
		if x.e[i] == 0 {
			panic("worker core: a remembered run is not in the index")
		}
		i = (i + 1) & mask
	}
	// Shift back every entry after i, up to the next empty one, that may not be
	// found past an empty entry at i: its home is not cyclically within (i, j].
	for j := i; ; {
		j = (j + 1) & mask
		v := x.e[j]
		if v == 0 {
			break
		}
		k := int(v>>32) & mask
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			x.e[i] = v
			i = j
		}
	}
	x.e[i] = 0
	x.n--
}

func (x *index) grow() {
	n := max(indexMin, 2*len(x.e))
	if n > indexMax {
		panic("worker core: the index outgrew RememberRuns")
	}
	old := x.e
	x.e, x.n = make([]uint64, n), 0
	for _, v := range old {
		if v != 0 {
			x.insert(v, uint32(v&indexSlotMask)-1)
		}
	}
}
