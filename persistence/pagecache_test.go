package persistence

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
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

// residentPages counts the pages of b (page aligned) that are in the page cache.
func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Skipf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// mappedPages counts the pages of b (page aligned) that are present in this
// process's page tables (/proc/self/pagemap, bit 63): faulted in, not merely in
// the page cache (a zero-filled segment is all cached before it is mapped).
func mappedPages(t *testing.T, b []byte) int {
	t.Helper()
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no /proc/self/pagemap: %v", err)
	}
	defer f.Close()
	page := os.Getpagesize()
	buf := make([]byte, 8*((len(b)+page-1)/page))
	if _, err := f.ReadAt(buf, int64(uintptr(unsafe.Pointer(&b[0]))/uintptr(page))*8); err != nil {
		t.Skipf("read /proc/self/pagemap: %v", err)
	}
	n := 0
	for i := 0; i < len(buf); i += 8 {
		n += int(buf[i+7] >> 7)
	}
	return n
}

// TestJournalPopulatesAhead: after a group commit the pages just past what was
// synced get faulted in, so the appender does not take those faults; and only a
// window of aheadBytes is, not the segment: it moves with the writer.
func TestJournalPopulatesAhead(t *testing.T) {
	if !populateOK.Load() {
		t.Skip("MADV_POPULATE_WRITE refused by this kernel")
	}
	j := openT(t, Options{Dir: t.TempDir(), SegmentSizeBytes: 16 << 20})
	defer closeT(t, j)
	page := os.Getpagesize()
	check := func(step string) {
		t.Helper()
		j.mu.Lock()
		s := j.segs[len(j.segs)-1]
		end := s.idx.end
		j.mu.Unlock()
		from := (end + page - 1) &^ (page - 1)
		win := (end + aheadBytes/2) &^ (page - 1) // at least half a window is always ahead
		want := (win - from) / page
		var resident int
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if resident = mappedPages(t, s.buf[from:win]); resident == want || time.Now().After(deadline) {
				break
			}
		}
		if !populateOK.Load() {
			t.Skip("MADV_POPULATE_WRITE refused by this kernel")
		}
		if resident != want {
			t.Fatalf("%s: %d of the %d pages past the synced end %d are mapped, want all", step, resident, want, end)
		}
		beyond := (end + aheadBytes + page) &^ (page - 1)
		if got := mappedPages(t, s.buf[beyond:beyond+aheadBytes]); got != 0 {
			t.Fatalf("%s: %d pages mapped more than %d bytes past the synced end %d", step, got, aheadBytes, end)
		}
	}
	n := 0
	appendBytes := func(total int) {
		for size := 0; size < total; {
			var es []Entry
			for range 100 {
				es = append(es, Entry{Stream: 1, Type: 1, Payload: payloadFor(n, 200)})
				n++
				size += 200
			}
			if _, err := j.AppendWait(context.Background(), es...); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendBytes(1)
	check("after the first commit")
	appendBytes(3 * aheadBytes)
	check("three windows later")
}
