package simtry

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kjob/kjob/sim"
)

func TestSweep(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("N"))
	from, _ := strconv.Atoi(os.Getenv("FROM"))
	t0 := time.Now()
	fails := map[string][]uint64{}
	var steps int64
	for seed := uint64(from); seed < uint64(from+n); seed++ {
		cfg := sim.DefaultConfig(seed)
		if fs := os.Getenv("FAULTS"); fs != "" {
			cfg.Faults, _ = sim.ParseFaults(fs)
		}
		r := sim.Run(cfg)
		steps += r.Steps
		if r.Failure != nil {
			k := r.Failure.Invariant
			fails[k] = append(fails[k], seed)
			if len(fails[k]) <= 2 {
				fmt.Printf("seed %d: %s: %s\n", seed, k, r.Failure.Message)
			}
		}
	}
	d := time.Since(t0)
	fmt.Printf("%d seeds in %v (%.1f seeds/s, %d steps)\n", n, d, float64(n)/d.Seconds(), steps)
	for k, v := range fails {
		fmt.Printf("  %s: %d %v\n", k, len(v), v[:min(len(v), 10)])
	}
}
