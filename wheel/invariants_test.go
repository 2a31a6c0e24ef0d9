package wheel

import "fmt"

// check verifies every structural invariant of w outside Advance and
// returns the first violation found.
func (w *Wheel) check() error {
	if w.advancing || w.firing != noBucket {
		return fmt.Errorf("advancing=%v firing=%d outside Advance", w.advancing, w.firing)
	}
	if w.elapsed != key(w.now) {
		return fmt.Errorf("elapsed %d != key(now %d)", w.elapsed, w.now)
	}
	total := 0
	var levelsSeen uint16
	movedFrom := make([]int32, len(w.moved)) // entry found through moved[p], or 0
	for b := int32(0); b < numBuckets; b++ {
		if b >= 64 && b < l2Base && w.l1[(b-64)>>6] == nil {
			if w.occupied[b>>6] != 0 {
				return fmt.Errorf("level-1 word %d occupied without a page", b>>6)
			}
			b += 63 // the whole page is empty
			continue
		}
		if b >= l2Base && b < numSlots && w.high[(b-l2Base)>>6] == nil {
			if w.occupied[b>>6] != 0 {
				return fmt.Errorf("level-%d word %d occupied without a page", levelOfBucket(b), b>>6)
			}
			b += 63
			continue
		}
		bk := w.bucket(b)
		if bk.head != 0 {
			return fmt.Errorf("bucket %d: head %d outside Advance", b, bk.head)
		}
		live := 0
		var minDue int64
		for pos := range bk.els.len() {
			el := *bk.els.at(pos)
			i := elIndex(el.kx)
			if i == 0 {
				continue
			}
			if i <= 0 || i >= w.size {
				return fmt.Errorf("bucket %d: bad index %d", b, i)
			}
			e := w.at(i)
			if elKey(el.kx) != uint32(key(e.due)) {
				return fmt.Errorf("bucket %d: element %d keeps key bits %x, entry due %d", b, pos, elKey(el.kx), e.due)
			}
			if el.payload != w.payloadOf(i, e) {
				return fmt.Errorf("bucket %d: element %d's payload not found through its entry", b, pos)
			}
			if p := int(e.loc & posMask); p != pos {
				// Only an entry moved to level 0 by the latest level-1
				// cascade may be elsewhere, at moved[p]; and as posOf looks
				// for the entry at p first, its element must not be there.
				if b >= 64 || p >= len(w.moved) || int(w.moved[p]) != pos {
					return fmt.Errorf("bucket %d: entry %d at %d says position %d (moved %d)", b, i, pos, p, len(w.moved))
				}
				if p < bk.els.len() && elIndex(bk.els.at(p).kx) == i {
					return fmt.Errorf("bucket %d: entry %d at %d and %d", b, i, pos, p)
				}
				if j := movedFrom[p]; j != 0 {
					return fmt.Errorf("entries %d and %d both moved from level-1 position %d", j, i, p)
				}
				movedFrom[p] = i
			}
			if wb := w.bucketOf(e); wb != b {
				return fmt.Errorf("bucket %d: entry %d at %d, bucketOf says %d", b, i, pos, wb)
			}
			if wpos := w.posOf(b, i, e); wpos != pos {
				return fmt.Errorf("bucket %d: entry %d at %d, posOf says %d", b, i, pos, wpos)
			}
			switch kind := e.loc & kindMask; {
			case b == firingBucket:
				return fmt.Errorf("firing bucket not empty outside Advance")
			case b == overdueBucket:
				if kind != kindOverdue || e.due > w.now {
					return fmt.Errorf("overdue entry %d: kind %x due %d now %d", i, kind, e.due, w.now)
				}
			default:
				if kind != kindWheel || key(e.due) <= w.elapsed {
					return fmt.Errorf("slot %d: entry %d kind %x due %d now %d", b, i, kind, e.due, w.now)
				}
				if want := w.slotOf(key(e.due)); want != b {
					return fmt.Errorf("entry %d due %d in slot %d, want %d", i, e.due, b, want)
				}
			}
			if live == 0 || e.due < minDue {
				minDue = e.due
			}
			live++
		}
		if live != int(bk.live) {
			return fmt.Errorf("bucket %d: %d live elements, count says %d", b, live, bk.live)
		}
		if (live == 0) != (bk.els.len() == 0) {
			return fmt.Errorf("bucket %d: %d live in an array of %d", b, live, bk.els.len())
		}
		if err := bk.els.check(); err != nil {
			return fmt.Errorf("bucket %d: %w", b, err)
		}
		if dead := bk.els.len() - live; dead > live && dead >= compactSlack {
			return fmt.Errorf("bucket %d: %d tombstones for %d live: not compacted", b, dead, live)
		}
		if live > 0 && bk.minOK && bk.minDue != minDue {
			return fmt.Errorf("bucket %d: cached min %d, actual %d", b, bk.minDue, minDue)
		}
		if b < numSlots {
			if occ := w.occupied[b>>6]&(1<<(b&63)) != 0; occ != (live > 0) {
				return fmt.Errorf("slot %d: occupied bit %v with %d live", b, occ, live)
			}
			if live > 0 {
				levelsSeen |= 1 << levelOfBucket(b)
			}
		}
		total += live
	}
	for j := range l1Pages {
		if (w.l1sum&(1<<j) != 0) != (w.occupied[1+j] != 0) {
			return fmt.Errorf("l1sum %x disagrees with level-1 word %d", w.l1sum, j)
		}
	}
	if w.occupied[0] == 0 && cap(w.moved) > movedKeepCap {
		return fmt.Errorf("level 0 empty, moved keeps %d positions", cap(w.moved))
	}
	if levelsSeen != w.levelMask {
		return fmt.Errorf("levelMask %b, occupied levels %b", w.levelMask, levelsSeen)
	}
	if total != w.count {
		return fmt.Errorf("buckets hold %d entries, count is %d", total, w.count)
	}
	free := 0
	for i := w.free; i != 0; i = int32(w.at(i).due) {
		if i < 0 || i >= w.size || w.at(i).loc != kindFree {
			return fmt.Errorf("free list: bad entry %d", i)
		}
		if free++; free > int(w.size) {
			return fmt.Errorf("free list cycle")
		}
	}
	// A spent entry is a wheel entry that fired: its key is not after
	// elapsed, so no handle of it is valid, and it is in no bucket.
	seen := make(map[int32]bool, len(w.spent))
	for _, i := range w.spent {
		if i <= 0 || i >= w.size || seen[i] {
			return fmt.Errorf("spent: bad or repeated entry %d", i)
		}
		seen[i] = true
		e := w.at(i)
		if e.loc&kindMask != kindWheel || key(e.due) > w.elapsed || !w.isSpent(i, e) {
			return fmt.Errorf("spent entry %d: kind %x due %d, now %d", i, e.loc&kindMask, e.due, w.now)
		}
		if _, le := w.lookup(handleOf(i, e)); le != nil {
			return fmt.Errorf("spent entry %d: its handle is valid", i)
		}
	}
	if free+len(w.spent)+total != int(w.size)-1 {
		return fmt.Errorf("free %d + spent %d + pending %d != slab entries %d", free, len(w.spent), total, w.size-1)
	}
	return nil
}

// check verifies the blocks: every one before the tail full, the tail a whole
// block when there are any, at0 where the tail starts, and at most one block (the
// spare) kept past the full ones.
func (s *elems) check() error {
	if len(s.tail) > 1<<blockBits || cap(s.tail) > 1<<blockBits {
		return fmt.Errorf("a tail of %d (room for %d) in blocks of %d", len(s.tail), cap(s.tail), 1<<blockBits)
	}
	if s.full == nil {
		if s.at0 != 0 {
			return fmt.Errorf("no full blocks, the tail at %d", s.at0)
		}
		return nil
	}
	f := *s.full
	if s.base() != len(f)<<blockBits {
		return fmt.Errorf("%d full blocks, the tail at %d", len(f), s.at0)
	}
	for k, b := range f {
		if len(b) != 1<<blockBits {
			return fmt.Errorf("block %d of %d full ones holds %d elements (a block: %d)", k, len(f), len(b), 1<<blockBits)
		}
	}
	if len(f) > 0 && cap(s.tail) != 1<<blockBits {
		return fmt.Errorf("%d full blocks and a tail of room for %d", len(f), cap(s.tail))
	}
	for k, b := range f[len(f):cap(f)] {
		if b != nil && (k > 0 || cap(b) != 1<<blockBits) {
			return fmt.Errorf("a block of room for %d kept %d past the %d full ones", cap(b), k, len(f))
		}
	}
	return nil
}
