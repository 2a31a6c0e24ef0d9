package simtry

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/kjob/kjob/sim"
)

func TestReport(t *testing.T) {
	seed, _ := strconv.ParseUint(os.Getenv("SEED"), 10, 64)
	cfg := sim.DefaultConfig(seed)
	cfg.TailLines = 25
	if q := os.Getenv("QUIRKS"); q != "" {
		cfg.Quirks, _ = sim.ParseQuirks(q)
	}
	r := sim.Run(cfg)
	if r.Failure != nil {
		fmt.Print(r.Failure.Error())
	} else {
		fmt.Println("ok", r.Hash)
	}
}
