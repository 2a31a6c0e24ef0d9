package shard

import "testing"

// TestSnapshotCadence: a snapshot is due once the cadence's records are appended; a
// busy shard defers it, but never past SnapshotDeferFactor times the cadence.
func TestSnapshotCadence(t *testing.T) {
	const every = 400_000
	for _, c := range []struct {
		since uint64
		busy  bool
		want  bool
	}{
		{0, false, false},
		{every - 1, false, false},
		{every - 1, true, false},
		{every, false, true},
		{every, true, false}, // deferred while fires are at hand
		{SnapshotDeferFactor*every - 1, true, false},
		{SnapshotDeferFactor * every, true, true}, // deferred long enough
		{SnapshotDeferFactor * every, false, true},
	} {
		if got := snapshotNow(c.since, every, c.busy); got != c.want {
			t.Errorf("snapshotNow(since %d, every %d, busy %v) = %v, want %v", c.since, every, c.busy, got, c.want)
		}
	}
}
