package core

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkReqIndex checks x's invariants: chunks non-empty and sorted within and
// across, last[i] each chunk's greatest id, n the ids held.
func checkReqIndex(t *testing.T, x *reqIndex) {
	t.Helper()
	if len(x.chunks) != len(x.last) {
		t.Fatalf("%d chunks, %d last ids", len(x.chunks), len(x.last))
	}
	n, prev := 0, int64(0)
	for c, ch := range x.chunks {
		if ch.lo >= ch.n || ch.n > reqChunkCap {
			t.Fatalf("chunk %d holds [%d, %d)", c, ch.lo, ch.n)
		}
		for i := ch.lo; i < ch.n; i++ {
			if (c > 0 || i > ch.lo) && ch.ids[i] <= prev {
				t.Fatalf("chunk %d: id %d after %d", c, ch.ids[i], prev)
			}
			prev = ch.ids[i]
		}
		if ch.n-ch.lo < reqChunkMin && c < len(x.chunks)-1 {
			t.Fatalf("chunk %d of %d holds %d ids, fewer than %d", c, len(x.chunks), ch.n-ch.lo, reqChunkMin)
		}
		if x.last[c] != ch.ids[ch.n-1] {
			t.Fatalf("chunk %d: last %d, greatest id %d", c, x.last[c], ch.ids[ch.n-1])
		}
		n += ch.n - ch.lo
	}
	if n != x.n {
		t.Fatalf("n %d, chunks hold %d", x.n, n)
	}
}

// The index against a map, with ids in the orders a shard can see: rising (one
// client), rising with a lagging client's ids among them, random, falling, and in
// clusters; the oldest taken out first mostly, any one now and then.
func TestReqIndexMatchesMap(t *testing.T) {
	for _, mode := range []string{"rising", "lagging", "random", "falling", "clusters"} {
		t.Run(mode, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(len(mode))))
			var x reqIndex
			model := map[int64]seenReq{}
			var fifo []int64
			next := int64(1 << 40)
			newID := func(i int) int64 {
				switch mode {
				case "rising":
					next += 1 + rng.Int64N(3)
					return next
				case "lagging":
					next += 1 + rng.Int64N(3)
					if rng.IntN(4) == 0 {
						return next - 5_000 - rng.Int64N(2_000) // a client a few thousand ids behind
					}
					return next
				case "random":
					return rng.Int64N(1<<62) - 1<<61
				case "falling":
					next -= 1 + rng.Int64N(3)
					return next
				}
				return int64(rng.IntN(8))<<32 + int64(i) // eight rising runs, interleaved
			}
			for i := range 200_000 {
				id := newID(i)
				if _, ok := model[id]; !ok && rng.IntN(10) < 7 {
					v := seenReq{jobID: int64(i), atMs: rng.Int64()}
					x.put(id, v)
					model[id] = v
					fifo = append(fifo, id)
				}
				size := 3_000 + 2_000*(i/50_000%2) // grows and shrinks
				for len(model) > size {
					k := 0
					if rng.IntN(20) == 0 {
						k = rng.IntN(len(fifo))
					}
					x.del(fifo[k])
					delete(model, fifo[k])
					fifo = slices.Delete(fifo, k, k+1)
				}
				probe := id
				if rng.IntN(2) == 0 && len(fifo) > 0 {
					probe = fifo[rng.IntN(len(fifo))]
				} else if rng.IntN(2) == 0 {
					probe = id + int64(rng.IntN(5)) - 2
				}
				got, ok := x.get(probe)
				want, wok := model[probe]
				if ok != wok || got != want {
					t.Fatalf("step %d: get(%d) = %v %v, map %v %v", i, probe, got, ok, want, wok)
				}
				if i%1_000 == 0 {
					checkReqIndex(t, &x)
				}
			}
			checkReqIndex(t, &x)
			for _, id := range fifo {
				x.del(id)
			}
			checkReqIndex(t, &x)
			if x.len() != 0 || len(x.chunks) != 0 {
				t.Fatalf("emptied: %d ids in %d chunks", x.len(), len(x.chunks))
			}
		})
	}
}

// Ids chosen to leave one id in each chunk (a client picks its request ids): the
// window stays within n/reqChunkMin+2 chunks. Before chunks were rebalanced, this
// kept 100,000 ids in 48,413 chunks (143 MiB).
func TestRequestWindowChunksBounded(t *testing.T) {
	var w reqWindow
	const gap = int64(1) << 40
	next, adds := int64(1), 0
	add := func(id int64) { w.add(id, 1, 0); adds++ }
	has := func(id int64) bool { _, ok := w.seen.get(id); return ok }
	for range MaxRequestWindow {
		add(next * gap)
		next++
	}
	for round := 0; round < 60 && adds < 3_000_000; round++ {
		lasts := append([]int64(nil), w.seen.last...)
		for k, l := range lasts { // one fresh id in every chunk, just below its greatest
			if k > 0 && l-1 <= lasts[k-1] {
				continue
			}
			if id := l - 1 - int64(round); !has(id) {
				add(id)
			}
		}
		for range MaxRequestWindow / 2 { // new ranges: the old chunks empty out but for those ids
			add(next * gap)
			next++
		}
		if n, chunks := w.seen.len(), len(w.seen.chunks); chunks > n/reqChunkMin+2 {
			t.Fatalf("round %d: %d ids in %d chunks, more than %d", round, n, chunks, n/reqChunkMin+2)
		}
	}
	checkReqIndex(t, &w.seen)
}

// A full chunk most of whose front has left takes an insert into its middle by
// closing up, not splitting; an id that left and comes back (its stale copy
// still before lo) is found and let out again.
func TestReqIndexCompactsAndReenters(t *testing.T) {
	var x reqIndex
	for i := int64(1); i <= reqChunkCap; i++ {
		x.put(2*i, seenReq{jobID: i})
	}
	for i := int64(1); i <= 100; i++ {
		x.del(2 * i)
		checkReqIndex(t, &x)
	}
	x.put(2*reqChunkCap-1, seenReq{jobID: -1})
	checkReqIndex(t, &x)
	if v, ok := x.get(2*reqChunkCap - 1); !ok || v.jobID != -1 {
		t.Fatalf("the inserted id: %v %v", v, ok)
	}
	var y reqIndex // one chunk, not full
	for i := int64(10); i < 110; i++ {
		y.put(i, seenReq{jobID: i})
	}
	y.del(10)
	y.del(11)
	y.put(10, seenReq{jobID: 100}) // back: a stale copy of 10 sits in ids[:lo]
	y.put(5, seenReq{jobID: 5})    // and a lesser id before it
	checkReqIndex(t, &y)
	if v, ok := y.get(10); !ok || v.jobID != 100 {
		t.Fatalf("the id that came back: %v %v", v, ok)
	}
	y.del(10)
	checkReqIndex(t, &y)
	if _, ok := y.get(10); ok {
		t.Fatal("the id that came back did not leave again")
	}
	for _, id := range []int64{5, 12} {
		if _, ok := y.get(id); !ok {
			t.Fatalf("%d left with it", id)
		}
	}
}

// A window smaller than a chunk, ids rising: one chunk, closed up as it goes, and
// never a second one under a quarter full.
func TestReqIndexSmallWindow(t *testing.T) {
	var x reqIndex
	for id := int64(1); id <= 10*reqChunkCap; id++ {
		x.put(id, seenReq{jobID: id})
		checkReqIndex(t, &x)
		if id > 20 {
			x.del(id - 20)
			checkReqIndex(t, &x)
		}
	}
	if len(x.chunks) != 1 || x.len() != 20 {
		t.Fatalf("%d ids in %d chunks, want 20 in 1", x.len(), len(x.chunks))
	}
}

// Small and dense: the invariants after every step, ids near the int64 extremes.
func TestReqIndexEveryStep(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 99))
		var x reqIndex
		model := map[int64]seenReq{}
		var held []int64
		for step := range 3_000 {
			base := []int64{math.MinInt64, 0, math.MaxInt64 - 4_000}[rng.IntN(3)]
			id := base + rng.Int64N(4_000)
			if _, ok := model[id]; !ok && (rng.IntN(3) > 0 || len(held) == 0) {
				v := seenReq{jobID: int64(step) + 1, atMs: id}
				x.put(id, v)
				model[id] = v
				held = append(held, id)
			} else if len(held) > 0 {
				k := rng.IntN(len(held))
				if rng.IntN(2) == 0 {
					k = 0
				}
				x.del(held[k])
				delete(model, held[k])
				held = slices.Delete(held, k, k+1)
			}
			checkReqIndex(t, &x)
			probe := id + int64(rng.IntN(3)) - 1
			if got, ok := x.get(probe); ok != (model[probe] != seenReq{}) || got != model[probe] {
				t.Fatalf("seed %d step %d: get(%d) = %v %v, model %v", seed, step, probe, got, ok, model[probe])
			}
		}
	}
}
