package core

import (
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
