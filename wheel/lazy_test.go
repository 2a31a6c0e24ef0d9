package wheel

import "testing"

// A fresh wheel holds no slab chunk and no page above level 0; an entry an hour
// out takes one page of level 2 (and one slab chunk), nothing of level 1; after
// it fires the wheel is consistent and the slab is reused, not grown.
func TestPagesAllocatedOnUse(t *testing.T) {
	w := New(0)
	pages := func() (n int) {
		for _, pg := range w.high {
			if pg != nil {
				n++
			}
		}
		return
	}
	if len(w.chunks) != 0 || pages() != 0 {
		t.Fatalf("fresh: %d chunks, %d high pages", len(w.chunks), pages())
	}
	if _, _, ok := w.Get(Handle(1)); ok || w.Cancel(Handle(1)) || w.Cancel(Handle(1<<32|1)) {
		t.Fatal("a forged handle on an empty wheel")
	}
	w.Each(func(Handle, int64, uint64) bool { t.Fatal("Each on an empty wheel"); return false })
	if _, ok := w.NextDue(); ok {
		t.Fatal("NextDue on an empty wheel")
	}
	h := w.Add(3_600_000, 7)
	if len(w.chunks) != 1 || pages() != 1 {
		t.Fatalf("one entry an hour out: %d chunks, %d high pages", len(w.chunks), pages())
	}
	for _, pg := range w.l1 {
		if pg != nil {
			t.Fatal("a level-1 page for a level-2 entry")
		}
	}
	if d, p, ok := w.Get(h); !ok || d != 3_600_000 || p != 7 {
		t.Fatal("Get")
	}
	// far-future and overdue entries too
	w.Add(1<<62, 8)
	w.Add(-5, 9)
	var fired []uint64
	w.Advance(3_600_000, func(_ int64, p uint64) { fired = append(fired, p) })
	if len(fired) != 2 || fired[0] != 9 || fired[1] != 7 {
		t.Fatalf("fired %v", fired)
	}
	mustCheck(t, w)
	for i := range 3000 {
		w.Add(int64(3_600_001+i), uint64(i))
	}
	if len(w.chunks) != 3 || w.size != 3002 {
		t.Fatalf("%d chunks, size %d", len(w.chunks), w.size)
	}
	mustCheck(t, w)
}

// check must not allocate the pages it looks at.
func TestCheckAllocatesNoPage(t *testing.T) {
	w := New(0)
	w.Add(5, 1)
	mustCheck(t, w)
	for j, pg := range w.high {
		if pg != nil {
			t.Fatalf("page %d of levels 2+ allocated by check", j)
		}
	}
}
