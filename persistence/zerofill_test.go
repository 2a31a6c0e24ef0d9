package persistence

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unwrittenBytes sums the extents of f that the file system reports unwritten
// (fallocated, never written: FIEMAP_EXTENT_UNWRITTEN); it skips the test where
// FIEMAP is not supported.
func unwrittenBytes(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const (
		fsIocFiemap        = 0xC020660B
		fiemapFlagSync     = 0x1
		fiemapExtentLast   = 0x1
		fiemapExtentUnwrit = 0x800
		headerBytes        = 32
		extentBytes        = 56
		extents            = 64
	)
	var total int64
	for start := uint64(0); ; {
		buf := make([]byte, headerBytes+extents*extentBytes)
		*(*uint64)(unsafe.Pointer(&buf[0])) = start              // fm_start
		*(*uint64)(unsafe.Pointer(&buf[8])) = ^uint64(0) - start // fm_length
		*(*uint32)(unsafe.Pointer(&buf[16])) = fiemapFlagSync    // fm_flags
		*(*uint32)(unsafe.Pointer(&buf[24])) = extents           // fm_extent_count
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			t.Skipf("FIEMAP: %v", errno)
		}
		n := int(*(*uint32)(unsafe.Pointer(&buf[20]))) // fm_mapped_extents
		if n == 0 {
			return total
		}
		for i := 0; i < n; i++ {
			e := buf[headerBytes+i*extentBytes:]
			logical := *(*uint64)(unsafe.Pointer(&e[0]))
			length := *(*uint64)(unsafe.Pointer(&e[16]))
			flags := *(*uint32)(unsafe.Pointer(&e[40]))
			if flags&fiemapExtentUnwrit != 0 {
				total += int64(length)
			}
			if flags&fiemapExtentLast != 0 {
				return total
			}
			start = logical + length
		}
	}
}

// A journal's segments are zero-filled, not only fallocated: a sync over
// fallocated blocks also commits the file system's journal (the extents turn
// written), which made each group commit's msync about twice as dear. The first
// segment (made by Open) and the spare (made in the background) both have no
// unwritten extent, and the first one's pages past its header are in the page
// cache (written a page at a time, kept for the mapping: its faults read nothing).
func TestNewSegmentsAreZeroFilled(t *testing.T) {
	const size = 4 << 20
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir, SegmentSizeBytes: size})
	defer closeT(t, j)
	j.mu.Lock()
	s := j.segs[0]
	j.mu.Unlock()
	if n := unwrittenBytes(t, filepath.Join(dir, s.name)); n != 0 {
		t.Fatalf("first segment %s: %d bytes unwritten (fallocated only), want 0", s.name, n)
	}
	from := (SegmentHeaderSize + pageSizeBytes - 1) &^ (pageSizeBytes - 1)
	if got, want := residentPages(t, s.buf[from:]), (size-from)/pageSizeBytes; got != want {
		t.Fatalf("first segment: %d of its %d pages past the header in the page cache, want all", got, want)
	}
	var spare string
	for deadline := time.Now().Add(20 * time.Second); spare == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if len(j.spares) > 0 {
			sp := <-j.spares
			spare = sp.name
			j.spares <- sp
		}
	}
	if spare == "" {
		t.Fatal("no spare prepared in 20 s")
	}
	if n := unwrittenBytes(t, filepath.Join(dir, spare)); n != 0 {
		t.Fatalf("spare %s: %d bytes unwritten, want 0", spare, n)
	}
	j.mu.Lock()
	var sp *segment
	select {
	case sp = <-j.spares:
		j.spares <- sp
	default:
	}
	j.mu.Unlock()
	if sp == nil {
		t.Fatal("the spare went")
	}
	if got, want := residentPages(t, sp.buf), size/pageSizeBytes; got != want {
		t.Fatalf("spare: %d of its %d pages in the page cache, want all", got, want)
	}
}

// A segment reopened for appending reads nothing back from disk as the records
// go on past its end: the zeros written when it was made are turned back into
// unwritten extents (makeWritable), whose faults need no read. Without that,
// appending 4 MiB after a reopen read about as much.
func TestReopenedSegmentReadsNothingAhead(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentSizeBytes: 16 << 20}
	j := openT(t, opts)
	appendN(t, j, 100, 1, 3000)
	closeT(t, j)
	j = openT(t, opts)
	defer closeT(t, j)
	before := procIO(t, "read_bytes")
	appendN(t, j, 1400, 1, 3000) // about 4 MiB
	if n := procIO(t, "read_bytes") - before; n > 512<<10 {
		t.Fatalf("appending 4 MiB to a reopened segment read %d bytes from disk, want under 512 KiB", n)
	}
}

// A paced zero-fill ends at the journal's close, and the spare it was making
// is removed, not left behind.
func TestZeroingStopsAtClose(t *testing.T) {
	dir := t.TempDir()
	stop := make(chan struct{})
	close(stop)
	before := zeroFilledBytes.Load()
	s, err := createSpare(dir, 8<<20, backendMmap, &zeroing{pause: time.Hour, stop: stop})
	if err != errZeroingStopped || s != nil {
		t.Fatalf("createSpare with the journal closing: %v, %v; want errZeroingStopped", s, err)
	}
	if n := zeroFilledBytes.Load() - before; n != zeroStepBytes {
		t.Fatalf("zeroed %d bytes before stopping, want one step (%d)", n, zeroStepBytes)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}
