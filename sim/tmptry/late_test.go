package simtry

import (
	"fmt"
	"testing"

	"github.com/kjob/kjob/sim"
)

func TestLate(t *testing.T) {
	var maxLate, exact, retries int64
	hist := map[int64]int{}
	for seed := uint64(1); seed <= 500; seed++ {
		r := sim.Run(sim.DefaultConfig(seed))
		maxLate = max(maxLate, r.Stats.MaxLateMs)
		hist[r.Stats.MaxLateMs/10*10]++
		exact += r.Stats.RetriesExact
		retries += r.Stats.Retries
	}
	fmt.Println("max late", maxLate, "hist", hist, "retries", retries, "exact", exact)
}
