package core

import (
	"math/rand/v2"
	"testing"
)

// The index agrees with a map under random inserts and removes, through growth,
// shrinking and the backward shifts of deletion.
func TestColdIndexMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		var x coldIndex
		ids := []int64{}           // by ref
		free := []uint32{}         // refs to reuse
		want := map[int64]uint32{} // id → ref
		idOf := func(ref uint32) int64 { return ids[ref] }
		minN, maxN := 1<<30, 0
		check := func(step int) {
			if x.n != len(want) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, x.n, len(want))
			}
			for id, ref := range want {
				if got, ok := x.get(id, idOf); !ok || got != ref {
					t.Fatalf("seed %d step %d: id %d → %d %v, want %d", seed, step, id, got, ok, ref)
				}
			}
			for range 50 {
				id := rng.Int64N(1 << 40)
				if _, in := want[id]; !in {
					if _, ok := x.get(id, idOf); ok {
						t.Fatalf("seed %d step %d: absent id %d found", seed, step, id)
					}
				}
			}
		}
		// Snowflake-like ids (a time prefix and a sequence) and random ones; the
		// population grows to 40,000, falls to a few, grows again.
		for step := range 120_000 {
			grow := (step/30_000)%2 == 0
			removeP := 2 // in 10: the population grows, then falls to a few
			if !grow {
				removeP = 9
			}
			if len(want) > 0 && rng.IntN(10) < removeP || len(want) > 40_000 {
				for id, ref := range want { // a random-ish victim
					if !x.remove(id, idOf) {
						t.Fatalf("seed %d step %d: remove %d failed", seed, step, id)
					}
					delete(want, id)
					ids[ref] = -1
					free = append(free, ref)
					break
				}
				continue
			}
			id := int64(step)<<22 | rng.Int64N(4096)
			if rng.IntN(4) == 0 {
				id = rng.Int64N(1 << 62)
			}
			if _, in := want[id]; in {
				continue
			}
			var ref uint32
			if n := len(free); n > 0 {
				ref, free = free[n-1], free[:n-1]
				ids[ref] = id
			} else {
				ref = uint32(len(ids))
				ids = append(ids, id)
			}
			x.insert(id, ref, idOf)
			want[id] = ref
			maxN = max(maxN, len(want))
			if step > 30_000 {
				minN = min(minN, len(want))
			}
			if step%10_000 == 0 {
				check(step)
			}
		}
		check(-1)
		if minN > 100 || maxN < 15_000 {
			t.Fatalf("seed %d: population %d..%d: the test did not shrink and grow", seed, minN, maxN)
		}
		if x.remove(-5, idOf) {
			t.Fatal("removed an id never inserted")
		}
	}
}
