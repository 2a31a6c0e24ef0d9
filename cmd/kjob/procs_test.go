package main

import "testing"

// One P more than the CPUs found, unless GOMAXPROCS was set.
func TestProcs(t *testing.T) {
	for _, c := range []struct {
		env         bool
		found, want int
	}{{false, 2, 3}, {false, 1, 2}, {false, 16, 17}, {true, 2, 2}, {true, 7, 7}} {
		if got := procs(c.env, c.found); got != c.want {
			t.Errorf("procs(set=%v, %d) = %d, want %d", c.env, c.found, got, c.want)
		}
	}
}
