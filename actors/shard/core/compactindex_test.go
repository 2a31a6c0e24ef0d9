package core

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
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
		// Sized ahead or not, and rightly or wrongly: reserve and fit change no
		// answer, and fit leaves no part larger than growing would have.
		reserveAt, reserveN, fitAt := -1, 0, -1
		switch seed {
		case 2:
			reserveAt, reserveN, fitAt = 0, 100, 20_000 // too small
		case 3:
			reserveAt, reserveN, fitAt = 0, 40_000, 25_000 // about right
		case 4:
			reserveAt, reserveN, fitAt = 0, 1_000_000, 60_000 // far too large, fit while falling
		case 5:
			reserveAt, reserveN, fitAt = 50_000, 200_000, 90_000 // over entries already there
		}
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
			if step == reserveAt {
				x.reserve(reserveN, idOf)
				check(step)
			}
			if step == fitAt {
				x.fit(idOf)
				check(step)
				for i := range x.parts {
					if p := &x.parts[i]; (p.n == 0 && p.cells != nil) || (p.n > 0 && len(p.cells) > idxSizeFor(p.n)) {
						t.Fatalf("seed %d: part %d holds %d ids in %d cells after fit", seed, i, p.n, len(p.cells))
					}
				}
			}
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

// Reserve before a replay changes nothing the shard does, however wrong the count,
// and once recovered the index is no larger than without it.
func TestReserveChangesNothing(t *testing.T) {
	c, e := newCore(1000)
	rng := rand.New(rand.NewPCG(9, 9))
	for id := int64(1); id <= 20_000; id++ {
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 100+rng.Int64N(5_000)), RequestId: id}, e)
		if id%3 == 0 {
			c.Handle(1000, client, &messages.DeleteJob{App: "app", Id: 1 + rng.Int64N(id), RequestId: 1_000_000 + id}, e)
		}
	}
	c.Durable(e.lsn, nil, e)
	replay := func(reserve int) *Core {
		r := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, 1000, 1)
		if reserve >= 0 {
			r.Reserve(reserve)
		}
		for _, rec := range e.log {
			if err := r.Replay(rec); err != nil {
				t.Fatal(err)
			}
		}
		r.Recovered(1000, e.lsn, &fakeEnv{})
		return r
	}
	cells := func(c *Core) (n int) {
		for i := range c.cold.idx.parts {
			n += len(c.cold.idx.parts[i].cells)
		}
		return n
	}
	plain := replay(-1)
	want := plain.Snapshot()
	if plain.Compact() < 10_000 {
		t.Fatalf("only %d jobs compact", plain.Compact())
	}
	for _, n := range []int{0, 10, len(e.log), 1 << 22} {
		got := replay(n)
		if !bytes.Equal(got.Snapshot(), want) {
			t.Fatalf("Reserve(%d): the replay snapshots differently", n)
		}
		if cells(got) > cells(plain) {
			t.Fatalf("Reserve(%d): %d cells after recovery, %d without", n, cells(got), cells(plain))
		}
	}
}

// warm reads each id's home cell: the cell find starts at. With one id in each of
// two parts (so nothing is displaced), that is the id's own cell; an id of an
// empty part or of an empty cell reads nothing.
func TestColdIndexWarmReadsHomeCells(t *testing.T) {
	var x coldIndex
	ids := []int64{}
	idOf := func(ref uint32) int64 { return ids[ref] }
	var a, b, emptyPart int64
	for id := int64(1); a == 0 || b == 0 || emptyPart == 0; id++ {
		switch part := idxHash(id) >> 56; {
		case part == 7 && a == 0:
			a = id
		case part == 9 && b == 0:
			b = id
		case part == 11 && emptyPart == 0:
			emptyPart = id
		}
	}
	for _, id := range []int64{a, b} {
		x.insert(id, uint32(len(ids)), idOf)
		ids = append(ids, id)
	}
	cell := func(id int64) uint32 {
		p, i, _ := x.find(id, idOf)
		if i < 0 {
			t.Fatalf("id %d not found", id)
		}
		return p.cells[i]
	}
	one := func(ids ...int64) uint32 { return x.warm(len(ids), func(i int) int64 { return ids[i] }) }
	if got, want := one(a), cell(a); got != want || got == 0 {
		t.Fatalf("warm(a) = %#x, want its cell %#x", got, want)
	}
	if got, want := one(a, b, emptyPart), cell(a)+cell(b); got != want {
		t.Fatalf("warm(a, b, an id of an empty part) = %#x, want %#x", got, want)
	}
	absent := a + 1
	for idxHash(absent)>>56 != 7 || idxHash(absent)&15 == idxHash(a)&15 {
		absent++
	}
	if got := one(absent); got != 0 {
		t.Fatalf("warm(an id whose home cell is empty) = %#x, want 0", got)
	}
	if got := one(); got != 0 {
		t.Fatalf("warm() = %#x, want 0", got)
	}
}
