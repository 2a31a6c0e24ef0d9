package persistence

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// procWriteBytes is this process's write_bytes from /proc/self/io: the bytes of
// page cache it dirtied, counted when a clean page (or folio) becomes dirty.
func procWriteBytes(t *testing.T) int64 {
	t.Helper()
	return procIO(t, "write_bytes")
}

// procIO is one counter of /proc/self/io (read_bytes: what this process had read
// from storage, page faults included).
func procIO(t *testing.T, key string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io (task I/O accounting): %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+": "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("parse %q: %v", sc.Text(), err)
			}
			return n
		}
	}
	t.Skipf("no %s in /proc/self/io", key)
	return 0
}

// TestSyncedCommitsDirtyOnlyTheirPages: a group commit of a few kilobytes
// dirties the page or two it wrote, not a large folio around them. A kernel that
// caches files in large folios (ext4 from Linux 6.16) dirties the whole folio
// when a mapping writes one byte of it, and msync writes the whole folio back:
// without the advice in mapWritable a node firing 20,000 jobs a second wrote
// 1.5 GB/s (and this test, 30 KiB a commit). Folios grow past the first 8 MiB
// or so of a file, so the test writes 24 MB. Both ways to a writable mapping are
// checked: a new segment, and the tail segment of a journal opened again
// (recovery read it, with readahead); and a new segment only fallocated (what a
// rollover makes when no zero-filled spare is ready), on a fresh journal.
func TestSyncedCommitsDirtyOnlyTheirPages(t *testing.T) {
	const (
		commits = 8000
		size    = 3000
		perPage = 4096
	)
	dir := t.TempDir()
	for round, name := range []string{"new segment", "recovered tail segment", "new fallocated segment"} {
		opts := Options{Dir: dir, SegmentSizeBytes: 64 << 20}
		if round == 2 {
			opts.Dir, opts.noZeroFill = t.TempDir(), true
		}
		j := openT(t, opts)
		before, zeroedBefore := procWriteBytes(t), zeroFilledBytes.Load()
		appendN(t, j, commits, 1, size)
		closeT(t, j)
		// Less the spare's zeros (zeroFill), written while the commits went on.
		dirtied := procWriteBytes(t) - before - (zeroFilledBytes.Load() - zeroedBefore)
		// A commit of 3000 bytes dirties at most two pages; allow three, and 1 MiB
		// for the segment header, the directory and the next spare.
		limit := int64(commits*3*perPage + 1<<20)
		t.Logf("%s: %d commits of %d bytes dirtied %d bytes (%.1f KiB a commit)",
			name, commits, size, dirtied, float64(dirtied)/commits/1024)
		if dirtied > limit {
			t.Fatalf("round %d, %s: %d synced commits of %d bytes dirtied %d bytes of page cache, over %d: "+
				"the mapping dirties folios larger than the pages written", round, name, commits, size, dirtied, limit)
		}
	}
}
