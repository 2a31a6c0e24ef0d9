package simtry

import (
	"fmt"
	"testing"

	"github.com/kjob/kjob/sim"
)

func TestStale(t *testing.T) {
	var stale, moves, done, seeds int64
	for seed := uint64(1); seed <= 200; seed++ {
		r := sim.Run(sim.DefaultConfig(seed))
		stale += r.Stats.StaleResults
		moves += r.Stats.Moves
		done += r.Stats.MovesDone
		if r.Stats.StaleResults > 0 {
			seeds++
		}
	}
	fmt.Println("stale", stale, "in seeds", seeds, "moves", moves, done)
}
