// Command kjob is kjob's single binary: a server, a demo worker, the job and
// dead-letter CLI, cluster status, a demo, benchmarks and the simulator.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/kjob/kjob/actors/kerr"
)

func main() {
	runtime.GOMAXPROCS(procs(os.Getenv("GOMAXPROCS") != "", runtime.GOMAXPROCS(0)))
	root := newRoot()
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kjob:", err)
		os.Exit(exitCode(err))
	}
}

// procs is the number of Ps the kjob binary runs with: one more than the CPUs the
// runtime found (its own choice: the machine's, or its cgroup's limit), unless
// GOMAXPROCS is set, which is then left as it is. A node spends much of its time
// in what stalls a thread while it holds a P — msync, page faults, the remote's
// socket writes — and on a 2-core VM where those are dear (a first-touch fault 13
// µs, an msync 0.7 ms at the median and 9.7 ms at p999) the spare P kept the
// fires' tail shorter: kjob bench's fire scenario in 10 alternating pairs had p99
// 13.0 ms (median) with 3 Ps against 22.6 ms with 2, lower in 7 pairs, p999 26 against
// 40 ms, for 5 % more CPU; creates alike either way (2026-12-05). Setting it stops
// the runtime's own updates of GOMAXPROCS when a cgroup limit changes.
func procs(envSet bool, found int) int {
	if envSet {
		return found
	}
	return found + 1
}

// exitCode maps typed errors to distinct exit codes (2 = bad input). A command
// that ran out of time — the client retries what the cluster cannot serve now
// until its deadline, and then gives up with the deadline's error and the last one
// it saw — is unavailable too: a script may try it again later.
func exitCode(err error) int {
	switch {
	case errors.Is(err, kerr.ErrInvalidArgument):
		return 2
	case errors.Is(err, kerr.ErrNotFound):
		return 3
	case errors.Is(err, kerr.ErrAlreadyExists):
		return 4
	case errors.Is(err, kerr.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return 5
	}
	return 1
}
