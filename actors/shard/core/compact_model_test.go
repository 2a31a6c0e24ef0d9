package core

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// viewMap is what view v holds: id -> the slot's contents.
func viewMap(v *coldView) map[int64]coldJob {
	m := map[int64]coldJob{}
	v.each(func(cj *coldJob) { m[cj.id] = *cj })
	return m
}

func storeMap(s *coldStore) map[int64]coldJob {
	m := map[int64]coldJob{}
	s.each(func(cj *coldJob) { m[cj.id] = *cj })
	return m
}

// TestColdStoreModelWithViews: random puts and takes (through the first chunk's
// doublings, into later chunks, emptying chunks to holes and reusing them), views
// taken at random moments; every view must keep exactly the jobs as they were, and
// the store must agree with a map model, its invariants held.
func TestColdStoreModelWithViews(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 99))
		var s coldStore
		model := map[int64]coldJob{}
		type held struct {
			v    coldView
			want map[int64]coldJob
		}
		var views []held
		nextID := int64(1)
		target := []int{40, 3000, 9000, 10, 5000, 0, 20}
		for _, tgt := range target {
			for steps := 0; steps < 30000; steps++ {
				if len(model) < tgt && r.IntN(4) != 0 || len(model) == 0 {
					cj := coldJob{id: nextID, created: nextID, next: nextID + 1000, nparams: 3}
					cj.params[0] = byte(nextID)
					nextID++
					if !s.put(cj) {
						t.Fatal("store full")
					}
					model[cj.id] = cj
				} else {
					// take a random id
					k := r.IntN(len(model))
					var id int64
					for x := range model {
						if k == 0 {
							id = x
							break
						}
						k--
					}
					got, ok := s.take(id)
					if !ok || got != model[id] {
						t.Fatalf("seed %d: take %d = %+v %v, want %+v", seed, id, got, ok, model[id])
					}
					delete(model, id)
				}
				if r.IntN(500) == 0 {
					views = append(views, held{s.view(), maps.Clone(model)})
				}
				if len(model) == tgt {
					break
				}
			}
			if got := storeMap(&s); !maps.Equal(got, model) || s.len() != len(model) {
				t.Fatalf("seed %d: store holds %d (len %d), model %d", seed, len(got), s.len(), len(model))
			}
			for id, cj := range model {
				p, ok := s.get(id)
				if !ok || *p != cj {
					t.Fatalf("seed %d: get %d", seed, id)
				}
			}
			for ci := range s.chunks {
				ch := &s.chunks[ci]
				if ch.slots == nil {
					continue
				}
				if len(ch.slots) != cap(ch.slots) || int(ch.high) > len(ch.slots) {
					t.Fatalf("seed %d: chunk %d: len %d cap %d high %d", seed, ci, len(ch.slots), cap(ch.slots), ch.high)
				}
				if ci > 0 && len(ch.slots) != coldChunk {
					t.Fatalf("seed %d: chunk %d of %d slots", seed, ci, len(ch.slots))
				}
				live, free := 0, 0
				for k := range ch.high {
					if ch.slots[k].id != 0 {
						live++
					}
				}
				for f := ch.free; f != 0; f = int32(ch.slots[f-1].next) {
					free++
					if ch.slots[f-1].id != 0 || free > int(ch.high) {
						t.Fatalf("seed %d: chunk %d: bad free list", seed, ci)
					}
				}
				if live != int(ch.live) || live+free != int(ch.high) {
					t.Fatalf("seed %d: chunk %d: live %d/%d free %d high %d", seed, ci, live, ch.live, free, ch.high)
				}
				for k := int(ch.high); k < len(ch.slots); k++ {
					if ch.slots[k] != (coldJob{}) {
						t.Fatalf("seed %d: chunk %d: slot %d above high not zero", seed, ci, k)
					}
				}
			}
		}
		for i, h := range views {
			if got := viewMap(&h.v); !maps.Equal(got, h.want) || h.v.n != len(h.want) {
				t.Fatalf("seed %d: view %d changed: %d jobs, want %d", seed, i, len(got), len(h.want))
			}
		}
		t.Logf("seed %d: %d views, %d chunks", seed, len(views), len(s.chunks))
	}
}

// The same under the race detector: each view read on its own goroutine while the
// store goes on.
func TestColdStoreViewsConcurrent(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	var s coldStore
	model := map[int64]coldJob{}
	ids := []int64{}
	next := int64(1)
	errs := make(chan string, 1000)
	done := make(chan struct{})
	nviews := 0
	for step := 0; step < 20000; step++ {
		if len(ids) < 5000 && (r.IntN(3) != 0 || len(ids) == 0) {
			cj := coldJob{id: next, next: next}
			next++
			s.put(cj)
			model[cj.id] = cj
			ids = append(ids, cj.id)
		} else {
			k := r.IntN(len(ids))
			id := ids[k]
			ids[k] = ids[len(ids)-1]
			ids = ids[:len(ids)-1]
			s.take(id)
			delete(model, id)
		}
		if r.IntN(300) == 0 {
			v, want := s.view(), maps.Clone(model)
			nviews++
			go func() {
				if got := viewMap(&v); !maps.Equal(got, want) {
					errs <- "a view changed"
				}
				done <- struct{}{}
			}()
		}
	}
	for range nviews {
		<-done
	}
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
}

// TestDrainedColdStoreStartsSmallAgain: after a burst past the first chunk drains
// to nothing, the next job gets a first chunk of coldFirst slots again, not a
// whole prefaulted one (the chunk table never shrank, and a first chunk was known
// by the table's length).
func TestDrainedColdStoreStartsSmallAgain(t *testing.T) {
	var s coldStore
	for id := int64(1); id <= coldChunk+1; id++ {
		s.put(coldJob{id: id, next: 1})
	}
	for id := int64(1); id <= coldChunk+1; id++ {
		s.take(id)
	}
	s.put(coldJob{id: 99999, next: 1})
	slots := 0
	for _, ch := range s.chunks {
		slots += len(ch.slots)
	}
	if slots != coldFirst {
		t.Fatalf("a drained store's next job: %d slots in %d chunks, want one chunk of %d", slots, len(s.chunks), coldFirst)
	}
}
