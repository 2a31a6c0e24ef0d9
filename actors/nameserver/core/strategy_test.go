package core

import (
	"testing"

	"github.com/kjob/kjob/messages"
)

func srv(id string, shards ...int64) ServerLoad {
	s := ServerLoad{ID: id}
	for i, f := range shards {
		s.Shards = append(s.Shards, &messages.ShardLoad{Shard: id + "-s" + string(rune('a'+i)), FiresWindow: f})
		s.Fires += f
	}
	return s
}

func TestLeastScheduleCountPlace(t *testing.T) {
	cases := []struct {
		name    string
		servers []ServerLoad
		want    string
	}{
		{"none", nil, ""},
		{"fewest fires", []ServerLoad{srv("a", 10), srv("b", 3), srv("c", 7)}, "b"},
		{"tie on fires: fewest shards", []ServerLoad{srv("a", 1, 1), srv("b", 2)}, "b"},
		{"tie on all: first in id order", []ServerLoad{srv("a", 5), srv("b", 5)}, "a"},
	}
	for _, tc := range cases {
		if got := (LeastScheduleCount{}).Place(tc.servers); got != tc.want {
			t.Errorf("%s: placed on %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The k-job rule: move when the busiest count is more than 2× the minimum.
func TestLeastScheduleCountRebalanceThreshold(t *testing.T) {
	ls := LeastScheduleCount{}
	cases := []struct {
		name    string
		servers []ServerLoad
		move    bool
		shard   string
	}{
		{"exactly 2x: no move", []ServerLoad{srv("a", 100, 100), srv("b", 100)}, false, ""},
		{"just over 2x: move", []ServerLoad{srv("a", 100, 101), srv("b", 100)}, true, "a-sa"},
		{"10x skew", []ServerLoad{srv("a", 900, 50, 50), srv("b", 50), srv("c", 50)}, true, "a-sb"},
		{"one shard only: moving it would not improve", []ServerLoad{srv("a", 1000), srv("b", 10)}, false, ""},
		{"min 0 counts as 1", []ServerLoad{srv("a", 2, 1), srv("b")}, true, "a-sb"},
		{"single server", []ServerLoad{srv("a", 10, 10)}, false, ""},
	}
	for _, tc := range cases {
		m, ok := ls.Rebalance(tc.servers, nil)
		if ok != tc.move || (ok && m.Shard != tc.shard) {
			t.Errorf("%s: got %+v %v, want move=%v shard %q", tc.name, m, ok, tc.move, tc.shard)
		}
		if ok && (m.From != "a" || m.To == "a") {
			t.Errorf("%s: move %+v not from the busiest to a lighter server", tc.name, m)
		}
	}
}

// Hysteresis: after the proposed move the pair is never less balanced, and applying
// moves repeatedly converges (no flapping).
func TestRebalanceConverges(t *testing.T) {
	servers := []ServerLoad{srv("a", 400, 300, 200, 100, 90, 80, 70, 60, 50, 40), srv("b", 30), srv("c", 20)}
	ls := LeastScheduleCount{}
	for step := 0; step < 20; step++ {
		m, ok := ls.Rebalance(servers, nil)
		if !ok {
			hi, lo := servers[0].Fires, servers[0].Fires
			for _, s := range servers {
				hi, lo = max(hi, s.Fires), min(lo, s.Fires)
			}
			if hi > MoveFactor*max(lo, 1) && step == 0 {
				t.Fatal("no move proposed on a skewed cluster")
			}
			return
		}
		var from, to *ServerLoad
		for i := range servers {
			switch servers[i].ID {
			case m.From:
				from = &servers[i]
			case m.To:
				to = &servers[i]
			}
		}
		before := abs(from.Fires - to.Fires)
		for i, sh := range from.Shards {
			if sh.Shard == m.Shard {
				from.Shards = append(from.Shards[:i], from.Shards[i+1:]...)
				to.Shards = append(to.Shards, sh)
				from.Fires -= sh.FiresWindow
				to.Fires += sh.FiresWindow
				break
			}
		}
		if after := abs(from.Fires - to.Fires); after >= before {
			t.Fatalf("step %d: move %+v did not improve the pair (%d → %d)", step, m, before, after)
		}
	}
	t.Fatal("rebalancing did not converge in 20 moves")
}

func TestRebalanceSkipsBusyServers(t *testing.T) {
	servers := []ServerLoad{srv("a", 100, 100, 100), srv("b", 1)}
	if _, ok := (LeastScheduleCount{}).Rebalance(servers, map[string]bool{"a": true}); ok {
		t.Fatal("proposed a second move for a server with one in flight")
	}
}

func TestWeightedPlace(t *testing.T) {
	w := Weighted{}
	servers := []ServerLoad{{ID: "a", CPU: 0.9, Mem: 0.1, SuccessRate: 1}, {ID: "b", CPU: 0.2, Mem: 0.5, SuccessRate: 1}, {ID: "c", CPU: 0.1, Mem: 0.1, SuccessRate: 0.5}}
	// a: 0.1*0.9 = 0.09, b: 0.8*0.5 = 0.40, c: 0.9*0.9*0.5 = 0.405
	if got := w.Place(servers); got != "c" {
		t.Fatalf("weighted placed on %q, want c", got)
	}
	if s := w.Score(ServerLoad{CPU: 0.5, Mem: 0.5}); s != 0.25 {
		t.Fatalf("score with unknown success rate = %v, want 0.25", s)
	}
}
