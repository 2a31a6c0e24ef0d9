package simtry

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/kjob/kjob/sim"
)

func TestTrace(t *testing.T) {
	seed, _ := strconv.ParseUint(os.Getenv("SEED"), 10, 64)
	f, _ := os.Create("/tmp/trace.txt")
	defer f.Close()
	cfg := sim.DefaultConfig(seed)
	if fs := os.Getenv("FAULTS"); fs != "" {
		cfg.Faults, _ = sim.ParseFaults(fs)
	}
	cfg.Trace = f
	r := sim.Run(cfg)
	if r.Failure != nil {
		fmt.Println(r.Failure.Invariant, r.Failure.Message)
	} else {
		fmt.Println("ok", r.Stats)
	}
}
