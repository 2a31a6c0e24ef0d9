package core

import "github.com/kjob/kjob/messages"

// ServerLoad is one live server as a strategy sees it.
type ServerLoad struct {
	ID          string
	Fires       int64 // scheduled runs in the sliding window, all shards
	CPU, Mem    float64
	SuccessRate float64
	Shards      []*messages.ShardLoad
}

// Strategy makes the NameServer's placement decisions. Servers are given in id order.
type Strategy interface {
	// Place picks the server for a new shard ("" when none is live).
	Place(servers []ServerLoad) string
}

// LeastScheduleCount places a new shard on the server with the fewest scheduled runs
// (ties: fewest shards, then id order). This is k-job's rule.
type LeastScheduleCount struct{}

// Place implements Strategy.
func (LeastScheduleCount) Place(servers []ServerLoad) string {
	best := -1
	for i, s := range servers {
		if best < 0 || s.Fires < servers[best].Fires ||
			(s.Fires == servers[best].Fires && len(s.Shards) < len(servers[best].Shards)) {
			best = i
		}
	}
	if best < 0 {
		return ""
	}
	return servers[best].ID
}

// Weighted places on the server with the highest (1-cpu)·(1-mem)·successRate.
type Weighted struct{}

// Score is the weighted strategy's figure of merit.
func (Weighted) Score(s ServerLoad) float64 {
	sr := s.SuccessRate
	if sr <= 0 {
		sr = 1
	}
	return (1 - s.CPU) * (1 - s.Mem) * sr
}

// Place implements Strategy.
func (w Weighted) Place(servers []ServerLoad) string {
	best, bestScore := "", -1.0
	for _, s := range servers {
		if sc := w.Score(s); sc > bestScore {
			best, bestScore = s.ID, sc
		}
	}
	return best
}

// Move is a strategy's advice to move one shard between servers.
type Move struct {
	Shard    string
	From, To string
}

// Rebalancer is the optional part of a Strategy that proposes shard moves.
type Rebalancer interface {
	// Rebalance proposes at most one move, or ok=false. busy lists servers that
	// already have a move in flight (they take part in no other).
	Rebalance(servers []ServerLoad, busy map[string]bool) (Move, bool)
}

// MoveFactor is k-job's threshold: a server is overloaded when its schedule count
// is more than MoveFactor times the minimum.
const MoveFactor = 2

// Rebalance implements k-job's rule with hysteresis: move a shard away from the
// busiest server when its count exceeds MoveFactor × the least loaded server's
// (note: the minimum — k-job divided by the maximum and never moved), choosing the
// shard whose move best reduces the gap, and only when the move makes the pair
// strictly more balanced (so two servers never swap the same shard back and forth).
func (LeastScheduleCount) Rebalance(servers []ServerLoad, busy map[string]bool) (Move, bool) {
	if len(servers) < 2 {
		return Move{}, false
	}
	hi, lo := -1, -1
	for i, s := range servers {
		if busy[s.ID] {
			continue
		}
		if hi < 0 || s.Fires > servers[hi].Fires {
			hi = i
		}
		if lo < 0 || s.Fires < servers[lo].Fires {
			lo = i
		}
	}
	if hi < 0 || lo < 0 || hi == lo {
		return Move{}, false
	}
	h, l := servers[hi], servers[lo]
	if h.Fires <= MoveFactor*max(l.Fires, 1) {
		return Move{}, false
	}
	gap := h.Fires - l.Fires
	best, bestGap, bestSize := "", gap, int64(0)
	for _, sh := range h.Shards {
		if sh.Frozen {
			continue
		}
		after := abs((h.Fires - sh.FiresWindow) - (l.Fires + sh.FiresWindow))
		// Ties go to the smaller shard: the cheaper handoff.
		if after < bestGap || (best != "" && after == bestGap && sh.FiresWindow < bestSize) {
			best, bestGap, bestSize = sh.Shard, after, sh.FiresWindow
		}
	}
	if best == "" {
		return Move{}, false
	}
	return Move{Shard: best, From: h.ID, To: l.ID}, true
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
