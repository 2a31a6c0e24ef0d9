package route

import "testing"

func TestParseRoundTrip(t *testing.T) {
	for _, s := range []Shard{Root("a"), {App: "orders.v2", Level: 3, Index: 5}, {App: "x-y_z", Level: 20, Index: 1<<20 - 1}} {
		got, err := Parse(s.String())
		if err != nil || got != s {
			t.Fatalf("Parse(%q) = %v, %v", s.String(), got, err)
		}
	}
	for _, bad := range []string{"", "a", "a/0", "/0/0", "a/x/0", "a/1/2", "a/-1/0", "a/21/0", "a/0/1"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestChildrenPartitionTheRange(t *testing.T) {
	s := Shard{App: "a", Level: 2, Index: 3}
	l, r := s.Children()
	for id := int64(1); id < 20000; id++ {
		h := Hash(id)
		if s.Contains(h) != (l.Contains(h) || r.Contains(h)) || (l.Contains(h) && r.Contains(h)) {
			t.Fatalf("job %d: children do not partition the parent's range", id)
		}
	}
	if l.Parent() != s || r.Parent() != s {
		t.Fatal("Parent is not the inverse of Children")
	}
}

func TestLookupDeepestShard(t *testing.T) {
	root := Root("a")
	l, r := root.Children()
	ll, lr := l.Children()
	shards := []Shard{ll, lr, r}
	counts := map[Shard]int{}
	for id := int64(1); id <= 40000; id++ {
		s, ok := Lookup(shards, id)
		if !ok || !s.ContainsJob(id) {
			t.Fatalf("job %d: lookup %v %v", id, s, ok)
		}
		counts[s]++
	}
	// the hash spreads ids: each quarter gets ~10k, each half ~20k
	if counts[ll] < 9000 || counts[lr] < 9000 || counts[r] < 18000 {
		t.Fatalf("uneven spread %v", counts)
	}
	if _, ok := Lookup(nil, 1); ok {
		t.Fatal("lookup in no shards succeeded")
	}
}

func TestValidApp(t *testing.T) {
	for _, ok := range []string{"a", "orders", "orders.v2", "A_b-9"} {
		if why := ValidApp(ok); why != "" {
			t.Errorf("%q refused: %s", ok, why)
		}
	}
	for _, bad := range []string{"", "has space", "slash/no", "ü", string(make([]byte, 65))} {
		if ValidApp(bad) == "" {
			t.Errorf("%q accepted", bad)
		}
	}
}
