package wheel

import (
	"cmp"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The reference model: a set of pending entries, each with a due time and an
// insertion sequence number; Advance(now) fires the entries that were
// pending at the call with due <= now, sorted by (due, seq). The harness
// drives the Wheel and the model with the same operations, from a source of
// choices (rapid, or a fuzzer's bytes), and requires identical results.

type source interface {
	intn(n int) int // in [0, n)
	u64() uint64
	exhausted() bool
	fatalf(format string, args ...any)
}

type rapidSource struct{ t *rapid.T }

func (s rapidSource) intn(n int) int                    { return rapid.IntRange(0, n-1).Draw(s.t, "n") }
func (s rapidSource) u64() uint64                       { return rapid.Uint64().Draw(s.t, "u") }
func (s rapidSource) exhausted() bool                   { return false }
func (s rapidSource) fatalf(format string, args ...any) { s.t.Fatalf(format, args...) }

// byteSource decodes choices from a fuzzer's input; past its end every
// choice is 0 and the run stops at the next operation boundary.
type byteSource struct {
	t    *testing.T
	data []byte
}

func (s *byteSource) intn(n int) int {
	if len(s.data) == 0 {
		return 0
	}
	var v int
	if n <= 256 {
		v = int(s.data[0])
		s.data = s.data[1:]
	} else {
		var b [4]byte
		s.data = s.data[copy(b[:], s.data):]
		v = int(binary.LittleEndian.Uint32(b[:]) & math.MaxInt32)
	}
	return v % n
}

func (s *byteSource) u64() uint64 {
	var b [8]byte
	s.data = s.data[copy(b[:], s.data):]
	return binary.LittleEndian.Uint64(b[:])
}

func (s *byteSource) exhausted() bool                   { return len(s.data) == 0 }
func (s *byteSource) fatalf(format string, args ...any) { s.t.Fatalf(format, args...) }

type modelEntry struct {
	due     int64
	payload uint64
	seq     uint64
}

type firing struct {
	h Handle
	modelEntry
}

type harness struct {
	src     source
	w       *Wheel
	now     int64
	seq     uint64
	pending map[Handle]modelEntry
	issued  []Handle // every handle ever returned, live or stale
	dues    []int64  // recently used due times, to make many equal ones
	payload uint64
	fired   int
}

const msPerYear = 365 * 24 * 3600 * 1000

func satAdd(a, b int64) int64 {
	s := a + b
	if b > 0 && s < a {
		return math.MaxInt64
	}
	if b < 0 && s > a {
		return math.MinInt64
	}
	return s
}

func newHarness(src source) *harness {
	var origin int64
	switch src.intn(12) {
	case 0:
		origin = 0
	case 1:
		origin = int64(src.u64())
	case 2:
		origin = -int64(src.intn(1 << 20))
	case 3:
		origin = math.MaxInt64 - int64(src.intn(1000))
	case 4:
		origin = math.MinInt64 + int64(src.intn(1000))
	default:
		origin = 1_700_000_000_000 + int64(src.intn(1<<30)) // a realistic Unix ms
	}
	return &harness{src: src, w: New(origin), now: origin, pending: map[Handle]modelEntry{}}
}

func (hs *harness) pickDue() int64 {
	s := hs.src
	var d int64
	switch s.intn(12) {
	case 0:
		d = hs.now // 0 ms delay
	case 1:
		d = satAdd(hs.now, int64(s.intn(5))-2)
	case 2:
		d = satAdd(hs.now, 1+int64(s.intn(100)))
	case 3, 9:
		d = satAdd(hs.now, int64(s.intn(300_000)))
	case 10:
		d = satAdd(hs.now, int64(s.intn(20_000_000))) // hours: levels 2 and 3
	case 4:
		d = satAdd(hs.now, -1-int64(s.intn(1_000_000))) // negative delay
	case 5:
		d = satAdd(hs.now, int64(1+s.intn(30))*msPerYear+int64(s.intn(1000))) // years
	case 6:
		d = []int64{math.MinInt64, math.MinInt64 + 1, -1, 0, 1, math.MaxInt64 - 1, math.MaxInt64}[s.intn(7)]
	case 7:
		d = int64(s.u64())
	default:
		if len(hs.dues) > 0 { // many equal due times
			return hs.dues[s.intn(len(hs.dues))]
		}
		d = satAdd(hs.now, int64(s.intn(64)))
	}
	if len(hs.dues) < 8 {
		hs.dues = append(hs.dues, d)
	} else {
		hs.dues[s.intn(8)] = d
	}
	return d
}

func (hs *harness) pickHandle() Handle {
	s := hs.src
	n := len(hs.issued)
	if n == 0 || s.intn(8) == 0 {
		switch s.intn(3) {
		case 0:
			return 0
		case 1:
			return Handle(s.u64())
		default:
			return Handle(uint64(s.intn(4))<<32 | uint64(s.intn(64)))
		}
	}
	var h Handle
	if s.intn(2) == 0 {
		h = hs.issued[n-1-s.intn(min(n, 16))] // recent: likely live
	} else {
		h = hs.issued[s.intn(n)]
	}
	if s.intn(16) == 0 {
		h += 1 << 32 // right index, wrong generation
	}
	return h
}

func (hs *harness) add() {
	due := hs.pickDue()
	hs.payload++
	h := hs.w.Add(due, hs.payload)
	if h == 0 {
		hs.src.fatalf("Add returned the zero handle")
	}
	if _, dup := hs.pending[h]; dup {
		hs.src.fatalf("Add returned live handle %x again", h)
	}
	hs.seq++
	hs.pending[h] = modelEntry{due: due, payload: hs.payload, seq: hs.seq}
	hs.issued = append(hs.issued, h)
}

func (hs *harness) cancel() {
	h := hs.pickHandle()
	_, want := hs.pending[h]
	if got := hs.w.Cancel(h); got != want {
		hs.src.fatalf("Cancel(%x) = %v, want %v", h, got, want)
	}
	delete(hs.pending, h)
}

func (hs *harness) reschedule() {
	h := hs.pickHandle()
	due := hs.pickDue()
	e, want := hs.pending[h]
	if got := hs.w.Reschedule(h, due); got != want {
		hs.src.fatalf("Reschedule(%x, %d) = %v, want %v", h, due, got, want)
	}
	if want {
		hs.seq++
		e.due, e.seq = due, hs.seq
		hs.pending[h] = e
	}
}

func (hs *harness) get() {
	h := hs.pickHandle()
	e, want := hs.pending[h]
	due, payload, ok := hs.w.Get(h)
	if ok != want || (ok && (due != e.due || payload != e.payload)) {
		hs.src.fatalf("Get(%x) = %d, %d, %v; want %d, %d, %v", h, due, payload, ok, e.due, e.payload, want)
	}
}

func (hs *harness) pickAdvance() int64 {
	s := hs.src
	switch s.intn(10) {
	case 0:
		return satAdd(hs.now, int64(s.intn(3)))
	case 1, 2:
		return satAdd(hs.now, int64(s.intn(200)))
	case 3:
		return satAdd(hs.now, int64(s.intn(300_000))) // across level-1 slots
	case 4:
		return satAdd(hs.now, int64(s.intn(10_000_000)))
	case 5:
		return satAdd(hs.now, -1-int64(s.intn(10))) // backwards: no-op
	case 6:
		if d, ok := hs.modelNextDue(); ok {
			return max(d, hs.now)
		}
		return hs.now
	case 7:
		if len(hs.dues) > 0 {
			return max(hs.dues[s.intn(len(hs.dues))], hs.now)
		}
		return satAdd(hs.now, int64(s.intn(64)))
	case 8:
		return satAdd(hs.now, int64(1+s.intn(3))*msPerYear)
	default:
		if s.intn(50) == 0 {
			return math.MaxInt64 // the end of time: everything fires
		}
		return hs.pickDue()
	}
}

func (hs *harness) advance() { hs.advanceTo(hs.pickAdvance()) }

// advanceTo advances both the wheel and the model and requires the same fire
// sequence, and Advance's result to match the number of callbacks.
func (hs *harness) advanceTo(to int64) {
	if to < hs.now {
		n := hs.w.Advance(to, func(due int64, payload uint64) {
			hs.src.fatalf("Advance(%d) before now %d fired payload %d", to, hs.now, payload)
		})
		if n != 0 {
			hs.src.fatalf("Advance back in time returned %d", n)
		}
		return
	}
	hs.now = to
	var batch []firing
	for h, e := range hs.pending {
		if e.due <= to {
			batch = append(batch, firing{h, e})
		}
	}
	slices.SortFunc(batch, func(a, b firing) int {
		return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.seq, b.seq))
	})
	pos, calls := 0, 0
	skipDead := func() {
		for pos < len(batch) {
			if e, ok := hs.pending[batch[pos].h]; ok && e.seq == batch[pos].seq {
				return
			}
			pos++
		}
	}
	got := hs.w.Advance(to, func(due int64, payload uint64) {
		calls++
		skipDead()
		if pos == len(batch) {
			hs.src.fatalf("Advance(%d) fired unexpected payload %d due %d", to, payload, due)
		}
		want := batch[pos]
		pos++
		// Payloads are unique: the payload names the entry that fired.
		if due != want.due || payload != want.payload {
			hs.src.fatalf("Advance(%d) fired due %d payload %d, want %x due %d payload %d",
				to, due, payload, want.h, want.due, want.payload)
		}
		h := want.h
		if due > to {
			hs.src.fatalf("fired early: due %d > now %d", due, to)
		}
		delete(hs.pending, h)
		if _, _, ok := hs.w.Get(h); ok {
			hs.src.fatalf("handle %x still valid inside fn", h)
		}
		if hs.w.Now() != to {
			hs.src.fatalf("Now() = %d inside Advance(%d)", hs.w.Now(), to)
		}
		switch hs.src.intn(8) { // the callback changes the wheel
		case 0:
			hs.add()
		case 1:
			hs.cancel()
		case 2:
			hs.reschedule()
		case 3:
			hs.get()
		}
		hs.checkObservable()
	})
	skipDead()
	if pos != len(batch) {
		hs.src.fatalf("Advance(%d) did not fire %x due %d", to, batch[pos].h, batch[pos].due)
	}
	if got != calls {
		hs.src.fatalf("Advance(%d) returned %d, fn was called %d times", to, got, calls)
	}
	hs.fired += calls
}

func (hs *harness) modelNextDue() (int64, bool) {
	var d int64
	ok := false
	for _, e := range hs.pending {
		if !ok || e.due < d {
			d, ok = e.due, true
		}
	}
	return d, ok
}

// checkObservable compares what any caller can see, also inside Advance.
func (hs *harness) checkObservable() {
	if got, want := hs.w.Len(), len(hs.pending); got != want {
		hs.src.fatalf("Len() = %d, want %d", got, want)
	}
	gd, gok := hs.w.NextDue()
	wd, wok := hs.modelNextDue()
	if gd != wd || gok != wok {
		hs.src.fatalf("NextDue() = %d, %v; want %d, %v", gd, gok, wd, wok)
	}
}

func (hs *harness) checkAll() {
	hs.checkObservable()
	if hs.w.Now() != hs.now {
		hs.src.fatalf("Now() = %d, want %d", hs.w.Now(), hs.now)
	}
	if err := hs.w.check(); err != nil {
		hs.src.fatalf("invariant: %v", err)
	}
	n := 0
	hs.w.Each(func(h Handle, due int64, payload uint64) bool {
		e, ok := hs.pending[h]
		if !ok || e.due != due || e.payload != payload {
			hs.src.fatalf("Each yielded %x due %d payload %d, model has %+v %v", h, due, payload, e, ok)
		}
		n++
		return true
	})
	if n != len(hs.pending) {
		hs.src.fatalf("Each yielded %d entries, want %d", n, len(hs.pending))
	}
}

// step performs one operation and then checks everything observable.
func (hs *harness) step() {
	switch hs.src.intn(12) {
	case 0, 1, 2, 3:
		hs.add()
	case 4, 5:
		hs.cancel()
	case 6, 7:
		hs.reschedule()
	case 8, 9, 10:
		hs.advance()
	default:
		hs.get()
	}
	hs.checkAll()
}

// TestPropertyAgainstModel runs rapid's default 100 random operation
// sequences; go test -run Property -rapid.checks=10000 runs more.
func TestPropertyAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		hs := newHarness(rapidSource{t})
		steps := rapid.IntRange(100, 600).Draw(t, "steps")
		for range steps {
			hs.step()
		}
		// Drain: everything left must fire, in order, by the end of time.
		hs.drain()
	})
}

// drain advances to the end of time and checks that everything fires.
func (hs *harness) drain() {
	hs.src = drainSource{hs.src}
	hs.advanceTo(math.MaxInt64)
	hs.checkAll()
	if hs.w.Len() != 0 {
		hs.src.fatalf("%d entries left after Advance(MaxInt64)", hs.w.Len())
	}
}

// drainSource makes the callbacks of the final drain do nothing.
type drainSource struct{ source }

func (drainSource) intn(int) int { return 7 }

// FuzzWheel decodes its input as an operation sequence: after a byte that
// picks the clock's origin, each operation is a byte choosing it (see step)
// followed by the bytes its own choices consume (pickDue, pickHandle,
// pickAdvance, and the callback's operations); past the end every choice
// is 0. The seeds are short hand-made sequences and pseudo-random ones.
func FuzzWheel(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 0, 8, 0})
	f.Add([]byte{1, 0, 0, 0, 4, 1, 0, 5, 3, 0, 4, 0, 0, 8, 4, 8, 4})
	f.Add([]byte{3, 9, 9, 9, 9, 9, 9, 9, 9, 8, 1, 10, 3, 8, 0, 6, 1, 9, 8, 5, 0})
	rng := rand.New(rand.NewPCG(1, 2))
	for range 24 {
		b := make([]byte, 64+rng.IntN(1024))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{t: t, data: data}
		hs := newHarness(src)
		for steps := 0; !src.exhausted() && steps < 2000; steps++ {
			hs.step()
		}
		hs.drain()
	})
}
