package persistence

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestOpenKeepsWrittenPagesCached checks that reopening a journal leaves the
// written part of its active segment in the page cache: the remap for
// appending drops cached pages (they may be large folios, which msync would
// write back whole) only from the folio boundary below the written end.
// Dropping them all made recovery read the segment back from disk a page per
// fault. It also checks that Replay (which prefetches) reads every record.
func TestOpenKeepsWrittenPagesCached(t *testing.T) {
	const n = 40_000 // 100-byte payloads: about 5.4 MiB, two whole folios of 2 MiB
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentSizeBytes: 16 << 20}
	j := openT(t, opts)
	for i := 0; i < n; i += 500 {
		var es []Entry
		for k := i; k < i+500; k++ {
			es = append(es, Entry{Stream: 1, Type: 1, Payload: payloadFor(k, 100)})
		}
		if _, err := j.AppendWait(context.Background(), es...); err != nil {
			t.Fatal(err)
		}
	}
	closeT(t, j)
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	if len(segs) != 1 {
		t.Fatalf("%d segments, want 1", len(segs))
	}
	// The newest segment is the one Open remaps for appending.
	path := segs[0]
	end := offsets(t, path)
	written := end[len(end)-1]
	if written < 2*maxFolioBytes {
		t.Fatalf("active segment holds %d bytes, want at least two folios", written)
	}
	if _, err := os.ReadFile(path); err != nil { // bring it into the page cache
		t.Fatal(err)
	}

	j = openT(t, opts)
	defer closeT(t, j)

	keep := written &^ (maxFolioBytes - 1)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mm, err := unix.Mmap(int(f.Fd()), 0, keep, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mm)
	vec := make([]byte, (keep+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mm[0])), uintptr(len(mm)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Skipf("mincore: %v", errno)
	}
	resident := 0
	for _, v := range vec {
		resident += int(v & 1)
	}
	if resident != len(vec) {
		t.Fatalf("after Open, %d of the %d written pages below %d are in the page cache, want all", resident, len(vec), keep)
	}

	count := 0
	if err := j.Replay(nil, func(Record) error { count++; return nil }); err != nil {
		t.Fatal(err)
	}
	if count != n {
		t.Fatalf("Replay read %d records, want %d", count, n)
	}
}
