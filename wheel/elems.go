package wheel

// blockBits sets a block of a bucket's array at 1<<blockBits elements (64 KiB).
// Tests lower it so that small buckets span several blocks.
var blockBits uint = 12

// elems is a bucket's array of elements, in blocks: the first grows (by about
// a quarter, as append does) up to a block's length, and nearly every bucket
// stays within it; each further block is allocated whole. So a bucket of
// millions grows without copying what it holds: as one array, copied into
// fresh pages each time it grew, a million timers due at one time made one Add
// stand still for 67–79 ms.
//
// The block being filled is tail, at position at0; the full blocks before it
// are (*full)[:at0>>blockBits]. full is nil until a bucket first outgrows a
// block. Past its length, full's array keeps one block given back by a
// truncation, for the next push that fills the tail, so that a bucket whose
// size hovers about a block's boundary does not allocate each time it crosses.
// The spare goes with the rest when the bucket empties (reset).
type elems struct {
	tail []elem
	full *[][]elem
	at0  int32 // the position of tail[0]: every look at an element needs it
}

// base is the position of tail[0].
func (s *elems) base() int { return int(s.at0) }

func (s *elems) len() int { return int(s.at0) + len(s.tail) }

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
	if n := len(s.tail); n < cap(s.tail) {
		s.tail = s.tail[:n+1]
		s.tail[n] = el
		return
	}
	s.grow(el)
}

// grow appends el to a tail without room: the first block grows, up to a
// block's length; a full tail goes to full and a new block (the spare, if
// there is one) becomes the tail.
//
//go:noinline
func (s *elems) grow(el elem) {
	n := len(s.tail)
	if n < 1<<blockBits {
		c := n + (n+3*256)/4 // about append's growth, at most a block
		if n < 256 {
			c = max(2*n, 8)
		}
		s.tail = append(make([]elem, 0, min(c, 1<<blockBits)), s.tail...)
		s.tail = append(s.tail, el)
		return
	}
	if s.full == nil {
		s.full = new([][]elem)
	}
	f := *s.full
	var next []elem
	if len(f) < cap(f) {
		next = f[:len(f)+1][len(f)] // the spare, or nil
	}
	*s.full = append(f, s.tail)
	s.at0 += 1 << blockBits
	if next == nil {
		next = make([]elem, 0, 1<<blockBits)
	}
	s.tail = append(next[:0], el)
}

// truncate keeps the first n <= len() elements.
func (s *elems) truncate(n int) {
	q := n - int(s.at0)
	if q < 0 {
		s.truncateFull(n)
		return
	}
	s.tail = s.tail[:q]
}

// truncateFull is truncate into the full blocks: the block of position n
// becomes the tail, the first block after it is kept as the spare, and the
// others are given back.
//
//go:noinline
func (s *elems) truncateFull(n int) {
	f := *s.full
	k := n >> blockBits
	spare := s.tail
	if k+1 < len(f) {
		spare = f[k+1]
	}
	s.tail = f[k][:n-k<<blockBits]
	f = f[:cap(f)]
	clear(f[k+1:])
	f[k] = spare[:0]
	*s.full = f[:k]
	s.at0 = int32(k << blockBits)
}

// capacity is how many elements the blocks hold without allocating (the spare
// not counted).
func (s *elems) capacity() int { return int(s.at0) + cap(s.tail) }

// reset empties the array, keeping its memory only if it holds at most keep
// elements.
func (s *elems) reset(keep int) {
	if s.capacity() > keep || s.full != nil {
		*s = elems{}
		return
	}
	s.tail = s.tail[:0]
}

// shrink gives back most of the block's room when it is the only one, larger
// than keep, and less than a quarter used.
func (s *elems) shrink(keep int) {
	if s.at0 == 0 && cap(s.tail) > keep && cap(s.tail) > 4*len(s.tail) {
		s.tail = append(make([]elem, 0, 2*len(s.tail)), s.tail...)
		s.full = nil // and the spare
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
