// Command kjob is kjob's single binary: a server, a demo worker, the job and
// dead-letter CLI, cluster status, a demo, benchmarks and the simulator.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/kjob/kjob/actors/kerr"
)

func main() {
	root := newRoot()
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kjob:", err)
		os.Exit(exitCode(err))
	}
}

// exitCode maps typed errors to distinct exit codes (2 = bad input).
func exitCode(err error) int {
	switch {
	case errors.Is(err, kerr.ErrInvalidArgument):
		return 2
	case errors.Is(err, kerr.ErrNotFound):
		return 3
	case errors.Is(err, kerr.ErrAlreadyExists):
		return 4
	case errors.Is(err, kerr.ErrUnavailable):
		return 5
	}
	return 1
}
