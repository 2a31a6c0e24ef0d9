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
