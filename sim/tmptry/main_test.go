package simtry

import (
	"fmt"
	"testing"
	"time"

	"github.com/kjob/kjob/sim"
)

func TestTry(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		t0 := time.Now()
		r := sim.Run(sim.DefaultConfig(seed))
		fmt.Printf("seed %d: %s steps=%d end=%d hash=%x %v %+v\n", seed, r.Shape, r.Steps, r.EndMs, r.Hash, time.Since(t0), r.Stats)
		if r.Failure != nil {
			fmt.Println(r.Failure.Error())
		}
	}
}
