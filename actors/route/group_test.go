package route

import (
	"fmt"
	"testing"

	"github.com/kjob/kjob/messages"
)

func TestGroupPartitionsWorkersAmongShards(t *testing.T) {
	var all []*messages.WorkerInfo
	for i := 0; i < 200; i++ {
		all = append(all, &messages.WorkerInfo{WorkerId: fmt.Sprintf("w%d", i)})
	}
	l, r := Root("a").Children()
	shards := []Shard{l, r}
	gl, gr := Group(l, shards, all), Group(r, shards, all)
	if len(gl)+len(gr) != len(all) || len(gl) < 60 || len(gr) < 60 {
		t.Fatalf("groups of %d and %d workers out of %d", len(gl), len(gr), len(all))
	}
	seen := map[string]bool{}
	for _, w := range append(gl, gr...) {
		if seen[w.WorkerId] {
			t.Fatalf("worker %s in both groups", w.WorkerId)
		}
		seen[w.WorkerId] = true
	}
	if g := Group(Root("a"), []Shard{Root("a")}, all); len(g) != len(all) {
		t.Fatal("a single shard does not get every worker")
	}
	// a shard whose group is empty falls back to all the app's workers
	one := all[:1]
	if gl, gr := Group(l, shards, one), Group(r, shards, one); len(gl) != 1 || len(gr) != 1 {
		t.Fatalf("fallback: %d and %d", len(gl), len(gr))
	}
}
