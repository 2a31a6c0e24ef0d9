package wheel

// blockBits sets a block of a bucket's array at 1<<blockBits elements (64 KiB).
// Tests lower it so that small buckets span several blocks.
var blockBits uint = 12

// elems is a bucket's array of elements, in blocks: the first grows by append
// up to a block's length (nearly every bucket stays within it), each further
// one is allocated whole. So a bucket of millions grows without copying what it
// holds: as one array, copied into fresh pages each time it grew, a million
// timers due at one time made one Add stand still for 67–79 ms.
//
// The block being filled is tail; the full ones before it are in full, so a
// push, and a look at the newest elements, cost what they did on one array.
type elems struct {
	tail []elem
	full *[][]elem // nil while the first block has room
	at0  int32     // the position of tail[0]: len(*full) blocks
}

// base is the position of tail[0].
func (s *elems) base() int { return int(s.at0) }

func (s *elems) len() int { return s.base() + len(s.tail) }

// at is the element at position p < len().
func (s *elems) at(p int) *elem {
	if q := p - int(s.at0); q >= 0 {
		return &s.tail[q]
	}
	return s.atFull(p)
}

//go:noinline
func (s *elems) atFull(p int) *elem {
	return &(*s.full)[p>>blockBits][p&(1<<blockBits-1)]
}

// push appends el.
func (s *elems) push(el elem) {
	if len(s.tail) < 1<<blockBits {
		s.tail = append(s.tail, el)
		return
	}
	s.spill(el)
}

// spill moves the full tail to full and appends el to a new block.
//
//go:noinline
func (s *elems) spill(el elem) {
	if s.full == nil {
		s.full = new([][]elem)
	}
	*s.full = append(*s.full, s.tail)
	s.at0 += 1 << blockBits
	s.tail = append(make([]elem, 0, 1<<blockBits), el)
}

// truncate keeps the first n <= len() elements, giving back the blocks past them.
func (s *elems) truncate(n int) {
	q := n - int(s.at0)
	if q < 0 {
		s.truncateFull(n)
		return
	}
	s.tail = s.tail[:q]
}

// truncateFull is truncate into the full blocks.
//
//go:noinline
func (s *elems) truncateFull(n int) {
	f := *s.full
	k := n >> blockBits // the block of position n becomes the tail
	if n > 0 && n&(1<<blockBits-1) == 0 {
		k-- // n ends a block: keep it, full, as the tail
	}
	s.tail = f[k][:n-k<<blockBits]
	clear(f[k:])
	if k == 0 {
		s.full = nil
	} else {
		*s.full = f[:k]
	}
	s.at0 = int32(k << blockBits)
}

// capacity is how many elements the blocks hold without allocating.
func (s *elems) capacity() int { return s.base() + cap(s.tail) }

// reset empties the array, keeping its memory only if it holds at most keep
// elements.
func (s *elems) reset(keep int) {
	if s.capacity() > keep {
		*s = elems{}
		return
	}
	s.truncate(0)
}

// shrink gives back most of the block's room when it is the only one, larger
// than keep, and less than a quarter used.
func (s *elems) shrink(keep int) {
	if s.full == nil && cap(s.tail) > keep && cap(s.tail) > 4*len(s.tail) {
		s.tail = append(make([]elem, 0, 2*len(s.tail)), s.tail...)
	}
}

// appendTo appends the elements to dst, in order.
func (s *elems) appendTo(dst []elem) []elem {
	if s.full != nil {
		for _, b := range *s.full {
			dst = append(dst, b...)
		}
	}
	return append(dst, s.tail...)
}
