package cluster

import (
	"errors"
	"math"
	"testing"

	"github.com/kjob/kjob/actors/kerr"
)

// A page size past int32 is refused by the client; it used to wrap to another size
// (1<<32 + 5 asked for 5 jobs, 1<<31 for a negative page) on its way to the shard.
func TestWireLimit(t *testing.T) {
	for _, n := range []int{0, 5, -1, math.MaxInt32} {
		if got, err := wireLimit(n); err != nil || int(got) != n {
			t.Fatalf("wireLimit(%d) = %d, %v", n, got, err)
		}
	}
	for _, n := range []int{math.MaxInt32 + 1, 1<<32 + 5, math.MinInt32 - 1} {
		_, err := wireLimit(n)
		var ke *kerr.Error
		if !errors.Is(err, kerr.ErrInvalidArgument) || !errors.As(err, &ke) || ke.Field != "limit" {
			t.Fatalf("wireLimit(%d): %v, want an invalid argument naming limit", n, err)
		}
	}
}
