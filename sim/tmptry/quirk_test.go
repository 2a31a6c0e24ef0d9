package simtry

import (
	"fmt"
	"os"
	"testing"

	"github.com/kjob/kjob/sim"
)

func TestQuirk(t *testing.T) {
	q, _ := sim.ParseQuirks(os.Getenv("QUIRKS"))
	found := map[string][]uint64{}
	for seed := uint64(1); seed <= 600; seed++ {
		cfg := sim.DefaultConfig(seed)
		cfg.Quirks = q
		r := sim.Run(cfg)
		if r.Failure != nil {
			found[r.Failure.Invariant] = append(found[r.Failure.Invariant], seed)
		}
	}
	for k, v := range found {
		fmt.Println(k, len(v), v[:min(8, len(v))])
	}
}
