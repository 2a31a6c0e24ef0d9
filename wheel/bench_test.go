package wheel

import (
	"container/heap"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// All benchmarks run in one `go test -bench . ./wheel` so that the wheel and
// its baselines are compared on the same machine at the same moment:
//
//	go test -run '^$' -bench . -benchtime 1s -count 3 ./wheel
//
// The baselines are container/heap (a textbook pointer heap with index
// tracking) and the Go runtime's own timers (time.AfterFunc + Stop).

const outstandingTimers = 1_000_000

const hourMs = 3_600_000

// originMs is the simulated clock's start: a realistic Unix time in ms, not
// aligned to any slot, so that a simulated minute falls across slot
// boundaries the way a shard's would.
const originMs = 1_767_225_612_345

// randomDelays returns n delays uniform in [1, spanMs], from a fixed seed.
func randomDelays(n int, spanMs int64, seed uint64) []int64 {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	d := make([]int64, n)
	for i := range d {
		d[i] = 1 + rng.Int64N(spanMs)
	}
	return d
}

const opDelays = 1 << 16 // table of per-op delays, indexed with a mask

// BenchmarkAddCancel adds a timer due within the hour and cancels it again,
// with 1,000,000 others, due within the hour, outstanding.
func BenchmarkAddCancel(b *testing.B) {
	background := randomDelays(outstandingTimers, hourMs, 1)
	ops := randomDelays(opDelays, hourMs, 2)

	b.Run("wheel", func(b *testing.B) {
		w := New(originMs)
		for i, d := range background {
			w.Add(originMs+d, uint64(i))
		}
		i := 0
		for b.Loop() {
			h := w.Add(originMs+ops[i&(opDelays-1)], uint64(i))
			if !w.Cancel(h) {
				b.Fatal("Cancel failed")
			}
			i++
		}
		if w.Len() != outstandingTimers {
			b.Fatalf("Len = %d", w.Len())
		}
	})

	b.Run("heap", func(b *testing.B) {
		h := make(timerHeap, 0, outstandingTimers+1)
		for i, d := range background {
			heap.Push(&h, &heapItem{due: d, payload: uint64(i)})
		}
		i := 0
		for b.Loop() {
			it := &heapItem{due: ops[i&(opDelays-1)], payload: uint64(i)}
			heap.Push(&h, it)
			heap.Remove(&h, it.index)
			i++
		}
		if h.Len() != outstandingTimers {
			b.Fatalf("Len = %d", h.Len())
		}
	})

	b.Run("afterfunc", func(b *testing.B) {
		f := func() {}
		ts := make([]*time.Timer, outstandingTimers)
		for i, d := range background { // an hour out: nothing fires during the run
			ts[i] = time.AfterFunc(time.Hour+time.Duration(d)*time.Millisecond, f)
		}
		i := 0
		for b.Loop() {
			t := time.AfterFunc(time.Hour+time.Duration(ops[i&(opDelays-1)])*time.Millisecond, f)
			if !t.Stop() {
				b.Fatal("Stop failed")
			}
			i++
		}
		b.StopTimer()
		for _, t := range ts {
			t.Stop()
		}
	})
}

// BenchmarkAdvance fires 1,000,000 timers spread over one simulated minute,
// advancing 1 ms at a time and asking for NextDue after every step, the way
// a shard drives its wheel from one runtime timer. The timers are added in
// random order of due time, so they lie at random places in the slab.
// Building the wheel is not timed.
//
// Besides ns/timer (wall clock) it reports cpu-ns/timer, the CPU time of
// the benchmark's thread, which is what the wheel costs when the machine is
// shared and the thread is descheduled part of the time.
func BenchmarkAdvance(b *testing.B) {
	dues := randomDelays(outstandingTimers, 60_000, 3)
	var sum uint64
	fn := func(_ int64, payload uint64) { sum += payload }
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cpuNs int64
	cpuOK := true
	for range b.N {
		b.StopTimer()
		w := New(originMs)
		for i, d := range dues {
			w.Add(originMs+d, uint64(i))
		}
		b.StartTimer()
		c0, ok0 := threadCPUNs()
		fired := 0
		for now := int64(originMs + 1); now <= originMs+60_000; now++ {
			fired += w.Advance(now, fn)
			w.NextDue()
		}
		c1, ok1 := threadCPUNs()
		cpuNs += c1 - c0
		cpuOK = cpuOK && ok0 && ok1
		if fired != outstandingTimers || w.Len() != 0 {
			b.Fatalf("fired %d, %d left", fired, w.Len())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/outstandingTimers, "ns/timer")
	if cpuOK {
		b.ReportMetric(float64(cpuNs)/float64(b.N)/outstandingTimers, "cpu-ns/timer")
	}
}

// heapAllocBytes returns the live heap after a full collection.
func heapAllocBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMemory measures the heap held per outstanding timer: HeapAlloc
// after a GC with the timers outstanding, minus HeapAlloc before. The caller's
// own handle storage (a []Handle, a []*time.Timer) is allocated before the
// first reading, so it is not counted for either; afterfunc timers share one
// func, so no closure per timer is counted for them either.
func BenchmarkMemory(b *testing.B) {
	background := randomDelays(outstandingTimers, hourMs, 4)

	b.Run("wheel", func(b *testing.B) {
		handles := make([]Handle, outstandingTimers)
		var perTimer float64
		for range b.N {
			before := heapAllocBytes()
			w := New(originMs)
			for i, d := range background {
				handles[i] = w.Add(originMs+d, uint64(i))
			}
			after := heapAllocBytes()
			runtime.KeepAlive(w)
			perTimer = float64(after-before) / outstandingTimers
		}
		b.ReportMetric(perTimer, "B/timer")
	})

	b.Run("heap", func(b *testing.B) {
		var perTimer float64
		for range b.N {
			before := heapAllocBytes()
			h := make(timerHeap, 0, outstandingTimers)
			for i, d := range background {
				heap.Push(&h, &heapItem{due: d, payload: uint64(i)})
			}
			after := heapAllocBytes()
			runtime.KeepAlive(h)
			perTimer = float64(after-before) / outstandingTimers
		}
		b.ReportMetric(perTimer, "B/timer")
	})

	b.Run("afterfunc", func(b *testing.B) {
		f := func() {}
		ts := make([]*time.Timer, outstandingTimers)
		var perTimer float64
		for range b.N {
			before := heapAllocBytes()
			for i, d := range background {
				ts[i] = time.AfterFunc(time.Hour+time.Duration(d)*time.Millisecond, f)
			}
			after := heapAllocBytes()
			perTimer = float64(after-before) / outstandingTimers
			for i, t := range ts {
				t.Stop()
				ts[i] = nil
			}
		}
		b.ReportMetric(perTimer, "B/timer")
	})

	b.Run("wheel10M", func(b *testing.B) {
		const n = 10_000_000
		rng := rand.New(rand.NewPCG(5, 0x5eed))
		var mib, perTimer float64
		for range b.N {
			before := heapAllocBytes()
			w := New(originMs)
			for i := range n {
				w.Add(originMs+1+rng.Int64N(24*hourMs), uint64(i))
			}
			after := heapAllocBytes()
			runtime.KeepAlive(w)
			mib = float64(after-before) / (1 << 20)
			perTimer = float64(after-before) / n
		}
		b.ReportMetric(mib, "MiB")
		b.ReportMetric(perTimer, "B/timer")
	})
}

// heapItem and timerHeap are the container/heap baseline: the PriorityQueue
// of the container/heap documentation, keyed by due time.
type heapItem struct {
	due     int64
	payload uint64
	index   int
}

type timerHeap []*heapItem

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *timerHeap) Push(x any) {
	it := x.(*heapItem)
	it.index = len(*h)
	*h = append(*h, it)
}

func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	it := old[n-1]
	old[n-1] = nil
	it.index = -1
	*h = old[:n-1]
	return it
}

// BenchmarkAddOneDue adds 1,000,000 timers all due at one time an hour away (a
// campaign: "remind everyone at nine"), into one bucket, and reports the slowest
// single Add: a bucket that grew by copying stood still for tens of ms there.
func BenchmarkAddOneDue(b *testing.B) {
	var worst time.Duration
	for b.Loop() {
		w := New(originMs)
		for i := range outstandingTimers {
			t0 := time.Now()
			w.Add(originMs+hourMs, uint64(i))
			worst = max(worst, time.Since(t0))
		}
	}
	b.ReportMetric(float64(worst.Microseconds()), "max-µs/add")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*outstandingTimers), "ns/add")
}
