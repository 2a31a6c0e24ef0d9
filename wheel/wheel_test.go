package wheel

import (
	"cmp"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"unsafe"
)

type fired struct {
	due     int64
	payload uint64
}

// collect advances w to now and returns what fired.
func collect(t *testing.T, w *Wheel, now int64) []fired {
	t.Helper()
	var out []fired
	n := w.Advance(now, func(due int64, payload uint64) {
		if due > now {
			t.Fatalf("fired early: due %d > now %d", due, now)
		}
		out = append(out, fired{due, payload})
	})
	if n != len(out) {
		t.Fatalf("Advance returned %d, fired %d", n, len(out))
	}
	mustCheck(t, w)
	return out
}

func mustCheck(t *testing.T, w *Wheel) {
	t.Helper()
	if err := w.check(); err != nil {
		t.Fatal(err)
	}
}

func payloads(fs []fired) []uint64 {
	out := make([]uint64, len(fs))
	for i, f := range fs {
		out[i] = f.payload
	}
	return out
}

func wantPayloads(t *testing.T, got []fired, want ...uint64) {
	t.Helper()
	if g := payloads(got); !slices.Equal(g, want) {
		t.Fatalf("fired payloads %v, want %v", g, want)
	}
}

func TestEntryIsPointerFree(t *testing.T) {
	if s := unsafe.Sizeof(entry{}); s != 16 {
		t.Errorf("entry is %d bytes, want 16", s)
	}
	typ := reflect.TypeFor[entry]()
	for i := range typ.NumField() {
		switch typ.Field(i).Type.Kind() {
		case reflect.Int32, reflect.Int64, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		default:
			t.Errorf("entry.%s is a %v: the slab must stay pointer-free", typ.Field(i).Name, typ.Field(i).Type)
		}
	}
}

func TestInvalidHandles(t *testing.T) {
	w := New(0)
	h := w.Add(10, 1)
	for _, bad := range []Handle{0, 1 << 32, Handle(uint32(h) + 1), h + 1<<32, h - 1<<32, math.MaxUint64} {
		if w.Cancel(bad) {
			t.Errorf("Cancel(%x) = true", bad)
		}
		if w.Reschedule(bad, 5) {
			t.Errorf("Reschedule(%x) = true", bad)
		}
		if _, _, ok := w.Get(bad); ok {
			t.Errorf("Get(%x) ok", bad)
		}
	}
	if due, p, ok := w.Get(h); !ok || due != 10 || p != 1 {
		t.Fatalf("Get(h) = %d, %d, %v", due, p, ok)
	}
	mustCheck(t, w)
}

func TestStaleHandlesNeverTouchOtherEntries(t *testing.T) {
	w := New(0)
	a := w.Add(5, 1)
	if !w.Cancel(a) || w.Cancel(a) {
		t.Fatal("cancel twice: want true then false")
	}
	b := w.Add(5, 2) // reuses a's slab slot
	if uint32(b) != uint32(a) || b == a {
		t.Fatalf("expected slot reuse with a new generation: a=%x b=%x", a, b)
	}
	if w.Cancel(a) || w.Reschedule(a, 1) {
		t.Fatal("stale handle acted on the entry that reused its slot")
	}
	wantPayloads(t, collect(t, w, 5), 2)
	if w.Cancel(b) || w.Reschedule(b, 9) {
		t.Fatal("handle of a fired entry is not stale")
	}
	if w.Len() != 0 {
		t.Fatalf("Len = %d", w.Len())
	}
}

func TestOrderTiesAndReschedule(t *testing.T) {
	w := New(1000)
	// Equal due times fire in insertion order, whatever level they were
	// inserted at: 1 far away (high level), later ones nearer.
	a := w.Add(5000, 1)
	collect(t, w, 4000) // a is now at a low level
	w.Add(5000, 2)
	w.Add(4999, 3)
	w.Add(5000, 4)
	c := w.Add(5000, 5)
	if !w.Reschedule(a, 5000) { // counts as a fresh insertion
		t.Fatal("Reschedule failed")
	}
	if !w.Reschedule(c, 5000) {
		t.Fatal("Reschedule failed")
	}
	if due, p, ok := w.Get(a); !ok || due != 5000 || p != 1 {
		t.Fatalf("Get after Reschedule = %d, %d, %v", due, p, ok)
	}
	wantPayloads(t, collect(t, w, 4999), 3)
	wantPayloads(t, collect(t, w, 1<<40), 2, 4, 1, 5)
}

func TestTiesAcrossCascades(t *testing.T) {
	w := New(0)
	due := int64(3*msPerYear + 12345)
	var want []uint64
	// Insert the same due time from many clock positions, so entries reach
	// its slot from different levels.
	for i := range uint64(40) {
		w.Add(due, i)
		want = append(want, i)
		collect(t, w, w.Now()+(due-w.Now())/3)
	}
	got := collect(t, w, due)
	wantPayloads(t, got, want...)
}

func TestPastAndZeroDelay(t *testing.T) {
	w := New(100)
	w.Add(100, 1) // 0 ms delay
	w.Add(50, 2)  // negative delay
	w.Add(math.MinInt64, 3)
	w.Add(101, 4)
	if d, ok := w.NextDue(); !ok || d != math.MinInt64 {
		t.Fatalf("NextDue = %d, %v", d, ok)
	}
	// Advance to the same time fires what is due, oldest due first.
	wantPayloads(t, collect(t, w, 100), 3, 2, 1)
	wantPayloads(t, collect(t, w, 100))
	wantPayloads(t, collect(t, w, 101), 4)
}

func TestAdvanceBackwardsIsNoop(t *testing.T) {
	w := New(1000)
	w.Add(999, 1)
	if n := w.Advance(999, func(int64, uint64) { t.Fatal("fired") }); n != 0 {
		t.Fatalf("Advance back = %d", n)
	}
	if w.Now() != 1000 || w.Len() != 1 {
		t.Fatalf("Now %d Len %d", w.Now(), w.Len())
	}
	wantPayloads(t, collect(t, w, 1000), 1)
}

func TestAddInsideAdvanceFiresNextAdvance(t *testing.T) {
	w := New(0)
	w.Add(10, 1)
	w.Add(20, 2)
	var got []uint64
	rearms := 0
	n := w.Advance(30, func(due int64, p uint64) {
		got = append(got, p)
		if p == 1 {
			w.Add(15, 10)  // due <= 30, before the pending 20: still deferred
			w.Add(30, 11)  // due == now: deferred
			w.Add(31, 12)  // future: normal
			w.Add(-99, 13) // far past: deferred
		}
		if p >= 100 || p == 2 { // a zero-delay re-arm must not loop
			rearms++
			w.Add(w.Now(), p+100)
		}
	})
	if n != 2 || !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("Advance fired %v (n=%d)", got, n)
	}
	mustCheck(t, w)
	wantPayloads(t, collect(t, w, 30), 13, 10, 11, 102)
	wantPayloads(t, collect(t, w, 31), 12)
	if rearms != 1 {
		t.Fatalf("rearms = %d", rearms)
	}
}

func TestCancelAndRescheduleInsideAdvance(t *testing.T) {
	w := New(0)
	w.Add(5, 1)
	b := w.Add(5, 2)
	c := w.Add(7, 3)
	d := w.Add(8, 4)
	w.Add(-1, 5) // overdue batch
	e := w.Add(-1, 6)
	var got []uint64
	w.Advance(10, func(due int64, p uint64) {
		got = append(got, p)
		switch p {
		case 5:
			w.Cancel(e) // not yet fired, in the overdue batch
		case 1:
			w.Cancel(b)          // same slot, not yet fired
			w.Reschedule(c, 100) // later slot, moves out
			w.Reschedule(d, 9)   // stays within this Advance's range: deferred
			if d, ok := w.NextDue(); !ok || d != 9 {
				t.Errorf("NextDue inside Advance = %d, %v", d, ok)
			}
		}
	})
	if !slices.Equal(got, []uint64{5, 1}) {
		t.Fatalf("fired %v", got)
	}
	mustCheck(t, w)
	wantPayloads(t, collect(t, w, 99), 4)
	wantPayloads(t, collect(t, w, 100), 3)
}

func TestNextDueExact(t *testing.T) {
	w := New(0)
	if _, ok := w.NextDue(); ok {
		t.Fatal("NextDue on empty wheel")
	}
	for _, far := range []int64{100, 5_000, 3 * 3_600_000, 20 * 86_400_000, 7*msPerYear + 123} {
		t.Run("", func(t *testing.T) { testNextDueExact(t, New(0), far) })
	}
}

// testNextDueExact checks NextDue as the earliest of a few entries around
// far is cancelled, and then while advancing to each in turn.
func testNextDueExact(t *testing.T, w *Wheel, far int64) {
	h1 := w.Add(far, 1)
	w.Add(far+1, 2)
	h3 := w.Add(far-far/8, 3)
	w.Add(far+5000, 4)
	for _, c := range []struct {
		cancel Handle
		want   int64
	}{{0, far - far/8}, {h3, far}, {h1, far + 1}} {
		if c.cancel != 0 && !w.Cancel(c.cancel) {
			t.Fatal("cancel failed")
		}
		if d, ok := w.NextDue(); !ok || d != c.want {
			t.Fatalf("NextDue = %d, %v; want %d", d, ok, c.want)
		}
		mustCheck(t, w)
	}
	// Advancing exactly to NextDue fires exactly what is due then.
	for w.Len() > 0 {
		d, _ := w.NextDue()
		if got := collect(t, w, d-1); len(got) != 0 {
			t.Fatalf("fired %v before NextDue %d", got, d)
		}
		if got := collect(t, w, d); len(got) != 1 || got[0].due != d {
			t.Fatalf("at NextDue %d fired %v", d, got)
		}
	}
}

func TestTombstonesAndCompaction(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	w := New(0)
	type item struct {
		h   Handle
		due int64
		seq int
		p   uint64
	}
	var items []item
	// Thousands of entries in a few slots of levels 1 and 2, so that
	// cancelling most of them in random order leaves tombstones and forces
	// compactions, and rescheduling moves entries within and between slots.
	for i := range 3000 {
		due := int64(300_000 + rng.IntN(4)*70_000 + rng.IntN(50))
		items = append(items, item{w.Add(due, uint64(i)), due, i, uint64(i)})
	}
	seq := len(items)
	rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
	for k := range items {
		switch {
		case k%3 != 0:
			if !w.Cancel(items[k].h) {
				t.Fatal("Cancel failed")
			}
			items[k].h = 0
		case k%9 == 0:
			items[k].due += int64(rng.IntN(100)) - 50
			seq++
			items[k].seq = seq
			if !w.Reschedule(items[k].h, items[k].due) {
				t.Fatal("Reschedule failed")
			}
		}
		if k%97 == 0 {
			mustCheck(t, w)
		}
	}
	mustCheck(t, w)
	var want []item
	for _, it := range items {
		if it.h != 0 {
			want = append(want, it)
		}
	}
	slices.SortFunc(want, func(a, b item) int { return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.seq, b.seq)) })
	got := collect(t, w, 1_000_000)
	if len(got) != len(want) {
		t.Fatalf("fired %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].payload != want[i].p || got[i].due != want[i].due {
			t.Fatalf("fire %d: payload %d due %d, want %d due %d", i, got[i].payload, got[i].due, want[i].p, want[i].due)
		}
	}
}

// TestCancelNewestCompacts cancels the newest element of a bucket whose
// tombstones equal its live elements: trimming it leaves them outnumbered,
// so the bucket must be compacted then too.
func TestCancelNewestCompacts(t *testing.T) {
	w := New(0)
	var hs []Handle
	for i := range 2*compactSlack + 1 {
		hs = append(hs, w.Add(1000, uint64(i)))
	}
	for _, h := range hs[:compactSlack] {
		w.Cancel(h)
		mustCheck(t, w)
	}
	for k := len(hs) - 1; k >= len(hs)-3; k-- { // the newest, one by one
		w.Cancel(hs[k])
		mustCheck(t, w)
	}
	wantPayloads(t, collect(t, w, 1000), 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29)
}

func TestLevelOnePagesAllocatedOnUse(t *testing.T) {
	w := New(0)
	for i := range 1000 {
		w.Add(int64(i%60), uint64(i)) // level 0 only
	}
	for j, pg := range w.l1 {
		if pg != nil {
			t.Fatalf("level-1 page %d allocated for level-0 entries", j)
		}
	}
	w.Add(10_000, 1)
	n := 0
	for _, pg := range w.l1 {
		if pg != nil {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d level-1 pages for one level-1 entry", n)
	}
	mustCheck(t, w)
}

func TestExtremes(t *testing.T) {
	w := New(math.MinInt64)
	w.Add(math.MaxInt64, 1)
	w.Add(math.MaxInt64-1, 2)
	w.Add(0, 3)
	w.Add(-1, 4)
	w.Add(math.MinInt64, 5)
	w.Add(math.MinInt64+1, 6)
	wantPayloads(t, collect(t, w, math.MinInt64), 5)
	wantPayloads(t, collect(t, w, -1), 6, 4)
	wantPayloads(t, collect(t, w, math.MaxInt64-2), 3)
	if d, ok := w.NextDue(); !ok || d != math.MaxInt64-1 {
		t.Fatalf("NextDue = %d, %v", d, ok)
	}
	wantPayloads(t, collect(t, w, math.MaxInt64), 2, 1)

	w = New(math.MaxInt64) // the end of time: everything is overdue
	w.Add(math.MaxInt64, 1)
	w.Add(0, 2)
	wantPayloads(t, collect(t, w, math.MaxInt64), 2, 1)
}

func TestIdleAdvanceOverYears(t *testing.T) {
	w := New(0)
	w.Add(30*msPerYear, 1)
	for i := int64(1); i < 30; i++ {
		if got := collect(t, w, i*msPerYear); len(got) != 0 {
			t.Fatalf("fired early at year %d", i)
		}
	}
	wantPayloads(t, collect(t, w, 30*msPerYear), 1)
}

func TestEachStopsAndSeesAll(t *testing.T) {
	w := New(0)
	want := map[Handle]uint64{}
	for i := range uint64(100) {
		want[w.Add(int64(i*37%50)-10, i)] = i
	}
	n := 0
	w.Each(func(h Handle, due int64, p uint64) bool {
		if want[h] != p {
			t.Fatalf("Each: %x payload %d, want %d", h, p, want[h])
		}
		n++
		return true
	})
	if n != 100 {
		t.Fatalf("Each visited %d", n)
	}
	n = 0
	w.Each(func(Handle, int64, uint64) bool { n++; return n < 3 })
	if n != 3 {
		t.Fatalf("Each did not stop: %d", n)
	}
}

func TestNilFn(t *testing.T) {
	w := New(0)
	w.Add(1, 1)
	w.Add(-1, 2)
	if n := w.Advance(1, nil); n != 2 || w.Len() != 0 {
		t.Fatalf("Advance(nil) = %d, Len %d", n, w.Len())
	}
}

func TestNestedAdvancePanics(t *testing.T) {
	w := New(0)
	w.Add(1, 1)
	defer func() {
		if recover() == nil {
			t.Fatal("nested Advance did not panic")
		}
		mustCheck(t, w)
	}()
	w.Advance(1, func(int64, uint64) { w.Advance(2, nil) })
}

func TestPanicInFnKeepsWheelConsistent(t *testing.T) {
	for _, panicAt := range []uint64{2, 12} { // in the overdue batch, in a slot
		w := New(0)
		w.Add(-5, 1)
		w.Add(-3, 2)
		w.Add(-1, 3)
		w.Add(10, 11)
		w.Add(10, 12)
		w.Add(10, 13)
		w.Add(20, 21)
		var got []uint64
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("panic did not propagate")
				}
			}()
			w.Advance(50, func(due int64, p uint64) {
				got = append(got, p)
				if p == panicAt {
					w.Add(40, 41) // deferred to a time after where the clock stops
					w.Add(0, 42)  // deferred, due before the clock stops
					panic("boom")
				}
			})
		}()
		mustCheck(t, w)
		if w.Now() > 50 || w.Now() < 0 {
			t.Fatalf("Now = %d after panic", w.Now())
		}
		for _, f := range collect(t, w, 50) {
			got = append(got, f.payload)
		}
		var want []uint64
		if panicAt == 2 {
			want = []uint64{1, 2, 3, 42, 11, 12, 13, 21, 41}
		} else {
			want = []uint64{1, 2, 3, 11, 12, 42, 13, 21, 41}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("panic at %d: fired %v, want %v", panicAt, got, want)
		}
	}
}

func TestSteadyStateDoesNotAllocate(t *testing.T) {
	w := New(0)
	for i := range 10_000 {
		w.Add(int64(i*7919%100_000), uint64(i))
	}
	now := int64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		h := w.Add(now+5000, 1)
		w.Reschedule(h, now+7000)
		w.Cancel(h)
		now++
		w.Advance(now, func(int64, uint64) {})
		w.NextDue()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per op", allocs)
	}
}

// TestLargeRandomOrder drives enough entries to fill high-level slots with
// thousands of entries and checks the whole fire sequence against a sort.
func TestLargeRandomOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	w := New(1_700_000_000_000)
	type want struct {
		due     int64
		seq     int
		payload uint64
	}
	live := map[Handle]want{}
	handleOf := map[uint64]Handle{} // by payload
	var handles []Handle
	seq := 0
	scales := []int64{1, 64, 4096, 60_000, 3_600_000, msPerYear}
	randDue := func() int64 {
		s := scales[rng.IntN(len(scales))]
		return w.Now() + rng.Int64N(3*s) - s/4
	}
	for step := range 200 {
		for range 1000 {
			seq++
			due := randDue()
			if rng.IntN(4) == 0 { // many equal due times
				due = w.Now() + int64(rng.IntN(3))*1000
			}
			h := w.Add(due, uint64(seq))
			live[h] = want{due, seq, uint64(seq)}
			handleOf[uint64(seq)] = h
			handles = append(handles, h)
		}
		for range 300 {
			h := handles[rng.IntN(len(handles))]
			if rng.IntN(2) == 0 {
				_, ok := live[h]
				if w.Cancel(h) != ok {
					t.Fatal("Cancel disagrees with model")
				}
				delete(live, h)
			} else if e, ok := live[h]; ok {
				seq++
				e.due, e.seq = randDue(), seq
				w.Reschedule(h, e.due)
				live[h] = e
			}
		}
		now := w.Now() + rng.Int64N(scales[step%len(scales)])
		var exp []want
		for _, e := range live {
			if e.due <= now {
				exp = append(exp, e)
			}
		}
		slices.SortFunc(exp, func(a, b want) int { return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.seq, b.seq)) })
		got := collect(t, w, now)
		if len(got) != len(exp) {
			t.Fatalf("step %d: fired %d, want %d", step, len(got), len(exp))
		}
		for i := range got {
			if got[i].payload != exp[i].payload || got[i].due != exp[i].due {
				t.Fatalf("step %d: fire %d is payload %d due %d, want %d due %d",
					step, i, got[i].payload, got[i].due, exp[i].payload, exp[i].due)
			}
			h := handleOf[got[i].payload]
			if _, _, ok := w.Get(h); ok {
				t.Fatalf("step %d: handle %x still valid after it fired", step, h)
			}
			delete(live, h)
		}
		if w.Len() != len(live) {
			t.Fatalf("Len %d, want %d", w.Len(), len(live))
		}
		d, ok := w.NextDue()
		md, mok := int64(0), false
		for _, e := range live {
			if !mok || e.due < md {
				md, mok = e.due, true
			}
		}
		if d != md || ok != mok {
			t.Fatalf("NextDue %d %v, want %d %v", d, ok, md, mok)
		}
	}
}

// TestCancelAndRescheduleMovedEntries cascades thousands of entries from
// level-1 slots into level 0, where they keep their level-1 positions (see
// Wheel.moved), and cancels, reschedules, looks up and adds entries in
// random order, also from inside Advance, advancing 1 ms at a time and
// checking the invariants after every operation and the fire order against
// a sort. A wrong position from moved tombstones the wrong element.
func TestCancelAndRescheduleMovedEntries(t *testing.T) {
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for seed := range seeds {
		testMovedEntries(t, seed)
	}
}

func testMovedEntries(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	const start = 64 * 64 // a level-1 slot of 64 ms, at 4096
	w := New(0)
	type item struct {
		due     int64
		seq     int // insertion order: Reschedule counts as an insertion
		payload uint64
	}
	live := map[Handle]item{}
	handleOf := map[uint64]Handle{} // by payload
	var handles []Handle
	seq := 0
	add := func(due int64) {
		seq++
		h := w.Add(due, uint64(seq))
		live[h] = item{due, seq, uint64(seq)}
		handleOf[uint64(seq)] = h
		handles = append(handles, h)
	}
	movedOps := 0 // entries found through moved picked for an operation
	pick := func() (Handle, item, bool) {
		for range 8 {
			h := handles[rng.IntN(len(handles))]
			if it, ok := live[h]; ok {
				i := int32(uint32(h))
				e := w.at(i)
				if b := w.slotOf(key(e.due)); e.loc&kindMask == kindWheel && b < 64 {
					if els, pos := &w.low[b].els, int(e.loc&posMask); pos >= els.len() || elIndex(els.at(pos).kx) != i {
						movedOps++
					}
				}
				return h, it, true
			}
		}
		return 0, item{}, false
	}
	// Three level-1 slots from start, in random order; a few cancelled and
	// rescheduled already, to leave tombstones there.
	for range 3000 {
		add(start + rng.Int64N(3*64))
	}
	for range 300 {
		h, _, _ := pick()
		if rng.IntN(2) == 0 {
			w.Cancel(h)
			delete(live, h)
		} else if it, ok := live[h]; ok {
			seq++
			it.due, it.seq = start+rng.Int64N(3*64), seq
			w.Reschedule(h, it.due)
			live[h] = it
		}
	}
	mustCheck(t, w)

	var got []fired
	taken := map[uint64]bool{} // payloads fn cancelled or moved to later
	var fn func(due int64, p uint64)
	advance := func(now int64) {
		var exp []item
		for _, it := range live {
			if it.due <= now {
				exp = append(exp, it)
			}
		}
		got = got[:0]
		clear(taken)
		if n := w.Advance(now, fn); n != len(got) {
			t.Fatalf("seed %d: Advance(%d) returned %d, fired %d", seed, now, n, len(got))
		}
		mustCheck(t, w)
		// fn cancels, or moves past now, only entries due after the one
		// firing: what fires is what was due at the call, less those.
		slices.SortFunc(exp, func(a, b item) int { return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.seq, b.seq)) })
		var want []item
		for _, it := range exp {
			if !taken[it.payload] {
				want = append(want, it)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("seed %d: Advance(%d) fired %d, want %d", seed, now, len(got), len(want))
		}
		for k := range got {
			if got[k].payload != want[k].payload || got[k].due != want[k].due {
				t.Fatalf("seed %d: Advance(%d) fire %d is %d due %d, want %d due %d",
					seed, now, k, got[k].payload, got[k].due, want[k].payload, want[k].due)
			}
		}
	}
	fn = func(due int64, p uint64) {
		h := handleOf[p]
		it, ok := live[h]
		if !ok || it.due != due || it.payload != p {
			t.Fatalf("seed %d: fired %x due %d payload %d, model has %+v %v", seed, h, due, p, it, ok)
		}
		if _, _, ok := w.Get(h); ok {
			t.Fatalf("seed %d: handle %x still valid inside fn", seed, h)
		}
		delete(live, h)
		got = append(got, fired{due, p})
		if rng.IntN(4) == 0 { // cancel or move a later entry, maybe of this slot
			if h2, it2, ok := pick(); ok && it2.due > due {
				taken[it2.payload] = true
				if rng.IntN(2) == 0 {
					w.Cancel(h2)
					delete(live, h2)
				} else {
					seq++
					it2.due, it2.seq = w.Now()+1+rng.Int64N(64), seq
					w.Reschedule(h2, it2.due)
					live[h2] = it2
				}
			}
		}
	}
	advance(start - 1)
	advance(start) // the cascade
	moved := 0
	for b := range w.low {
		for pos := range w.low[b].els.len() {
			if i := elIndex(w.low[b].els.at(pos).kx); i != 0 && int(w.at(i).loc&posMask) != pos {
				moved++
			}
		}
	}
	if moved < 500 {
		t.Fatalf("seed %d: only %d entries in level 0 found through moved", seed, moved)
	}

	now := int64(start)
	for now < start+4*64 {
		switch r := rng.IntN(64); {
		case r < 16:
			if h, _, ok := pick(); ok {
				if !w.Cancel(h) {
					t.Fatalf("seed %d: Cancel(%x) failed", seed, h)
				}
				delete(live, h)
			}
		case r < 48:
			if h, it, ok := pick(); ok {
				seq++
				switch rng.IntN(4) {
				case 0: // into level 0, or overdue
					it.due = now - 1 + rng.Int64N(64)
				case 1: // further away
					it.due = now + rng.Int64N(100_000)
				default: // same due: to the end of its slot
				}
				it.seq = seq
				if !w.Reschedule(h, it.due) {
					t.Fatalf("seed %d: Reschedule(%x) failed", seed, h)
				}
				live[h] = it
			}
		case r < 56:
			add(now + rng.Int64N(64))
		case r < 63:
			if h, it, ok := pick(); ok {
				if due, p, ok := w.Get(h); !ok || due != it.due || p != it.payload {
					t.Fatalf("seed %d: Get(%x) = %d %d %v, want %+v", seed, h, due, p, ok, it)
				}
			}
		default:
			now++
			advance(now)
		}
		mustCheck(t, w)
		if d, ok := w.NextDue(); ok && len(live) > 0 {
			md := int64(math.MaxInt64)
			for _, it := range live {
				md = min(md, it.due)
			}
			if d != md {
				t.Fatalf("seed %d: NextDue %d, want %d", seed, d, md)
			}
		}
	}
	for len(live) > 0 { // the stragglers
		now += 1000
		advance(now)
	}
	if w.Len() != 0 {
		t.Fatalf("seed %d: Len %d after all fired", seed, w.Len())
	}
	if movedOps < 1000 {
		t.Fatalf("seed %d: only %d operations on entries found through moved", seed, movedOps)
	}
	t.Logf("seed %d: %d operations on entries found through moved", seed, movedOps)
}

// TestFiredEntryReused checks that an entry fired from a level-0 slot, left
// untouched by firing, is recognised as fired, and that the Add that reuses
// its slab slot makes the old handle stale for good.
func TestFiredEntryReused(t *testing.T) {
	w := New(0)
	a := w.Add(5, 1)
	b := w.Add(5, 2)
	wantPayloads(t, collect(t, w, 5), 1, 2)
	for _, h := range []Handle{a, b} {
		if _, _, ok := w.Get(h); ok {
			t.Fatalf("Get(%x) of a fired entry succeeded", h)
		}
		if w.Cancel(h) || w.Reschedule(h, 100) {
			t.Fatalf("a fired entry's handle %x still works", h)
		}
	}
	c := w.Add(7, 3) // reuses a fired slot
	if uint32(c) != uint32(a) && uint32(c) != uint32(b) {
		t.Fatalf("Add took slab index %d, not a fired one (%d, %d)", uint32(c), uint32(a), uint32(b))
	}
	if c == a || c == b {
		t.Fatalf("reused entry kept its old handle %x", c)
	}
	mustCheck(t, w)
	if w.Cancel(a) || w.Cancel(b) {
		t.Fatal("a stale handle cancelled the entry that reused its slot")
	}
	if due, p, ok := w.Get(c); !ok || due != 7 || p != 3 {
		t.Fatalf("Get(new) = %d %d %v", due, p, ok)
	}
	n := 0
	w.Each(func(h Handle, due int64, p uint64) bool {
		if h != c || due != 7 || p != 3 {
			t.Fatalf("Each visited %x %d %d", h, due, p)
		}
		n++
		return true
	})
	if n != 1 {
		t.Fatalf("Each visited %d entries, want 1 (fired ones are not pending)", n)
	}
	wantPayloads(t, collect(t, w, 7), 3)
}

// TestSmallBlocks runs the model and the tests that grow, compact, cascade and
// fire large buckets with blocks of four elements, so that their buckets span
// many blocks (invariants check the blocks).
func TestSmallBlocks(t *testing.T) {
	defer func(b uint) { blockBits = b }(blockBits)
	blockBits = 2
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"PropertyAgainstModel", TestPropertyAgainstModel},
		{"TombstonesAndCompaction", TestTombstonesAndCompaction},
		{"CancelNewestCompacts", TestCancelNewestCompacts},
		{"LargeRandomOrder", TestLargeRandomOrder},
		{"CancelAndRescheduleMovedEntries", TestCancelAndRescheduleMovedEntries},
		{"PanicInFnKeepsWheelConsistent", TestPanicInFnKeepsWheelConsistent},
		{"TiesAcrossCascades", TestTiesAcrossCascades},
		{"CancelAndRescheduleInsideAdvance", TestCancelAndRescheduleInsideAdvance},
		{"PastAndZeroDelay", TestPastAndZeroDelay},
		{"NextDueExact", TestNextDueExact},
	} {
		t.Run(tc.name, tc.f)
	}
}

// elems against a plain slice: pushes, stores, truncations, shrinks and resets
// in random order, with blocks of four and of the default size.
func TestElemsMatchSlice(t *testing.T) {
	defer func(b uint) { blockBits = b }(blockBits)
	for _, bb := range []uint{2, 12} {
		blockBits = bb
		rng := rand.New(rand.NewPCG(uint64(bb), 7))
		var s elems
		var model []elem
		maxLen := 0
		for step := range 300_000 {
			switch r := rng.IntN(100_000); {
			case r < 70_000:
				el := elem{kx: uint64(step), payload: rng.Uint64()}
				s.push(el)
				model = append(model, el)
			case r < 85_000 && len(model) > 0:
				p := rng.IntN(len(model))
				el := elem{kx: rng.Uint64(), payload: uint64(step)}
				*s.at(p) = el
				model[p] = el
			case r < 86_000:
				s.shrink(keepCap) // gives room back, never elements
			case r < 99_999 && len(model) > 0:
				n := len(model) - rng.IntN(min(len(model), 3)+1)
				if rng.IntN(5000) == 0 {
					n = rng.IntN(len(model) + 1)
				}
				s.truncate(n)
				model = model[:n]
			case r >= 99_999:
				s.reset(keepCap)
				model = model[:0]
			}
			maxLen = max(maxLen, len(model))
			if s.len() != len(model) {
				t.Fatalf("blockBits %d, step %d: len %d, want %d", bb, step, s.len(), len(model))
			}
			if err := s.check(); err != nil {
				t.Fatalf("blockBits %d, step %d: %v", bb, step, err)
			}
			if step%1000 == 0 || len(model) < 50 {
				for p, want := range model {
					if got := *s.at(p); got != want {
						t.Fatalf("blockBits %d, step %d: element %d is %v, want %v", bb, step, p, got, want)
					}
				}
			}
		}
		if maxLen < 4<<bb {
			t.Errorf("blockBits %d: the array grew to only %d elements", bb, maxLen)
		}
		if s.reset(0); s.capacity() != 0 {
			t.Errorf("blockBits %d: reset(0) keeps room for %d", bb, s.capacity())
		}
	}
}

// A slot whose size goes back and forth across a block's boundary, and an
// overdue batch out of order in one block, allocate nothing once warm.
func TestBlocksDoNotChurn(t *testing.T) {
	w := New(0)
	const due = 3_600_000
	for i := range 1<<blockBits - 1 {
		w.Add(due, uint64(i))
	}
	allocs := testing.AllocsPerRun(200, func() {
		a := w.Add(due, 1)
		b := w.Add(due, 2) // the first element of the next block
		w.Cancel(b)
		w.Cancel(a) // back into the first block
	})
	if allocs != 0 {
		t.Errorf("crossing a block's boundary: %v allocations each way", allocs)
	}
	mustCheck(t, w)

	now := int64(0)
	allocs = testing.AllocsPerRun(200, func() {
		w.Add(now-1, 1)
		w.Add(now-5, 2) // out of order: the batch is sorted
		w.Add(now-3, 3)
		now++
		w.Advance(now, func(int64, uint64) {})
	})
	if allocs != 0 {
		t.Errorf("an overdue batch out of order: %v allocations", allocs)
	}
	mustCheck(t, w)
}

// A slot of several full blocks, mostly cancelled, compacts back into its first
// block and gives the rest back; then it fires in order.
func TestBlocksCompactAndShrink(t *testing.T) {
	w := New(0)
	const due = 3_600_000
	n := 3<<blockBits + 100
	hs := make([]Handle, n)
	for i := range n {
		hs[i] = w.Add(due+int64(i%7), uint64(i))
	}
	b := w.slotOf(key(due))
	if got := w.bucket(b).els.base(); got < 3<<blockBits {
		t.Fatalf("slot of %d in blocks: the tail at %d", n, got)
	}
	var kept []uint64
	for i, h := range hs {
		if i%20 != 0 {
			w.Cancel(h)
		} else {
			kept = append(kept, uint64(i))
		}
	}
	mustCheck(t, w)
	bk := w.bucket(b)
	if bk.els.base() != 0 || bk.els.full != nil || bk.els.capacity() > 4*len(kept) {
		t.Errorf("after compaction: %d elements, the tail at %d, room for %d, full %v", bk.els.len(), bk.els.base(), bk.els.capacity(), bk.els.full != nil)
	}
	var fired []uint64
	w.Advance(due+10, func(_ int64, p uint64) { fired = append(fired, p) })
	slices.SortStableFunc(kept, func(a, b uint64) int { return cmp.Compare(a%7, b%7) })
	if !slices.Equal(fired, kept) {
		t.Errorf("fired %d, want %d in due order", len(fired), len(kept))
	}
	mustCheck(t, w)
}
