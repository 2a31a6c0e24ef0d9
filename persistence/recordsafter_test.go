package persistence

import (
	"math/rand/v2"
	"testing"
)

// RecordsAfter bounds from above the records of a stream after an LSN that the
// journal held when it was opened (exactly, from before the first record), counting
// them in the segments that hold a record after the LSN; a stream it never saw has
// none, and neither has one after its last record.
func TestRecordsAfterBoundsReplay(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3_000 { // several segments of 64 KiB, runs of one stream and single records
		s := 1 + rng.IntN(3)
		for range 1 + rng.IntN(5) {
			appendN(t, j, 1, s, 10+i%200)
		}
	}
	closeT(t, j)
	j = openT(t, Options{Dir: dir})
	defer closeT(t, j)
	if j.Report().Segments < 3 {
		t.Fatalf("%d segments: the test needs several", j.Report().Segments)
	}
	_, recs := all(t, j)
	last := recs[len(recs)-1].LSN
	for _, after := range []uint64{0, 1, last / 3, last / 2, last - 7, last} {
		for stream := uint64(1); stream <= 4; stream++ {
			want, total := 0, 0
			for _, r := range recs {
				if r.Stream == stream {
					total++
					if r.LSN > after {
						want++
					}
				}
			}
			got := j.RecordsAfter(stream, after)
			if got < want || got > total || (after == 0 && got != total) || (want == 0 && after == last && got != 0) {
				t.Errorf("stream %d after %d: %d records, want %d (of %d)", stream, after, got, want, total)
			}
		}
	}
	// Records appended since Open are not counted.
	before := j.RecordsAfter(1, 0)
	appendN(t, j, 10, 1, 16)
	if got := j.RecordsAfter(1, 0); got != before {
		t.Fatalf("after appends: %d records, want %d as at Open", got, before)
	}
}
