package simtry

import (
	"fmt"
	"testing"

	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/sim"
)

func TestMut(t *testing.T) {
	muts := map[string]shardcore.Mutations{
		"ack":    {AckBeforeDurable: true},
		"epoch":  {SkipEpochCheck: true},
		"early":  {FireEarlyMs: 1},
		"forget": {ForgetRetryRecord: true},
	}
	for _, name := range []string{"ack", "epoch", "early", "forget"} {
		caught := map[string]int{}
		first := uint64(0)
		n := 0
		for seed := uint64(1); seed <= 200; seed++ {
			cfg := sim.DefaultConfig(seed)
			cfg.Mutations = muts[name]
			r := sim.Run(cfg)
			if r.Failure != nil && r.Failure.Invariant != "duplicate-placement" {
				caught[r.Failure.Invariant]++
				n++
				if first == 0 {
					first = seed
				}
			}
		}
		fmt.Printf("%s: caught in %d/200 seeds, first at seed %d: %v\n", name, n, first, caught)
	}
}
