package core

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestIndexModel inserts and removes slots under key hashes that crowd a few homes
// around the end of the table (so probes wrap and removals shift entries back), and
// requires every slot inserted and not removed to be found under its hash, and no
// other.
func TestIndexModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var x index
		model := map[uint32]uint64{} // slot → key hash
		hashOf := func(t *rapid.T) uint64 {
			home := uint64(rapid.SampledFrom([]int{indexMin - 3, indexMin - 2, indexMin - 1, 0, 1}).Draw(t, "home"))
			low := uint64(rapid.IntRange(0, 3).Draw(t, "low")) << indexSlotBits // a few key hashes a home
			return home<<32 | low
		}
		next := uint32(0)
		for i, n := 0, rapid.IntRange(1, 300).Draw(t, "ops"); i < n; i++ {
			if len(model) == 0 || rapid.IntRange(0, 2).Draw(t, "op") > 0 {
				h := hashOf(t)
				x.insert(h, next)
				model[next] = h
				next++
			} else {
				var slots []uint32
				for s := range model {
					slots = append(slots, s)
				}
				slices.Sort(slots) // (map order is random: a failure must replay)
				s := slots[rapid.IntRange(0, len(slots)-1).Draw(t, "remove")%len(slots)]
				x.remove(model[s], s)
				delete(model, s)
			}
			if x.n != len(model) {
				t.Fatalf("%d entries, want %d", x.n, len(model))
			}
			for s, h := range model {
				if got, ok := x.lookup(h, func(c uint32) bool { return c == s }); !ok || got != s {
					t.Fatalf("slot %d under %x not found", s, h)
				}
			}
			for s := uint32(0); s < next; s++ {
				if _, live := model[s]; live {
					continue
				}
				for _, h := range model {
					if _, ok := x.lookup(h, func(c uint32) bool { return c == s }); ok {
						t.Fatalf("removed slot %d still found", s)
					}
				}
			}
		}
	})
}
