package persistence

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	mmap "github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

// backend says how a segment's bytes reach the disk. Only the mmap backend is
// offered to callers; the pwrite one exists so benchmarks can compare the two
// honestly under the same group commit.
type backend int

const (
	backendMmap   backend = iota // copy into a shared mapping, msync the dirty range
	backendPwrite                // copy into memory, pwrite + fdatasync the dirty range
)

const (
	segmentSuffix = ".seg"
	tmpSuffix     = ".tmp"
)

var pageSizeBytes = os.Getpagesize()

// segment is one segment file, mapped.
type segment struct {
	name string // file name inside the journal directory
	f    *os.File
	mm   mmap.MMap // the mapping; nil when buf is plain memory (pwrite backend)
	buf  []byte    // the whole file's bytes
	seed uint32    // crcSeed(idx.hdr.FileID)
	idx  segIndex  // guarded by Journal.mu while the segment is active

	// Guarded by Journal.mu.
	synced      int  // bytes [0, synced) are durable
	needDirSync bool // the file's name is not yet durable in the directory
	inDirty     bool // listed in Journal.dirty

	unmappedTo int // flusher-owned: bytes [0, unmappedTo) were dropped from the page tables
	aheadTo    int // aheadLoop-owned: bytes [0, aheadTo) were faulted in writable ahead of the writer
}

// unmapChunkBytes is how much durable data accumulates before the flusher drops it
// from the process's page tables (one madvise per chunk).
const unmapChunkBytes = 4 << 20

// dropDurable drops the durable, whole pages below to from the process's resident
// set (MADV_DONTNEED on a shared file mapping keeps them in the page cache, and a
// read faults them back in): a journal is written once and read only by recovery
// and handoffs, so its pages need not stay mapped — they were a tenth of a node's
// resident memory per job. Only the flusher calls it, after syncing [.., to).
func (s *segment) dropDurable(to int) {
	if s.mm == nil {
		return
	}
	end := to &^ (pageSizeBytes - 1) // the page holding to may still be written
	if end-s.unmappedTo < unmapChunkBytes {
		return
	}
	if err := unix.Madvise(s.buf[s.unmappedTo:end], unix.MADV_DONTNEED); err == nil {
		s.unmappedTo = end
	}
}

// Faulting in ahead of the writer. The first write to each page of a new
// segment's mapping is a page fault, taken by whoever appends — the shard's
// goroutine — and over a fallocated (unwritten) extent on ext4 it is a costly
// one: in the create scenario `persistence.putFrame`, the first bytes of a record,
// was 8 % of the process's CPU (0.27 s of 3.22 s for 200,000 creates), about
// 25 µs a page. MADV_POPULATE_WRITE (Linux 5.14) takes the same faults in one
// call, about 2 µs a page here (a 64 MiB segment in 30–40 ms), without changing
// what the pages hold (zeros: the end of the records). So a goroutine of the
// journal (aheadLoop), told by the flusher after each group commit where its sync
// ended, keeps aheadBytes past that end faulted in, in steps of half of it, off
// the flusher's and the appenders' way. Only a window: a whole populated segment
// would be 64 MiB of resident pages per segment before a record is in it. (A new
// segment is zero-filled now, its pages cached before it is mapped — see zeroing
// — so a fault there reads nothing and meets no unwritten extent; it still costs
// the writer a fault a page, which the window spares it. A reopened segment's
// rest is unwritten again: makeWritable.)
//
// Tried and left out: also writing the window back (sync_file_range) so that its
// blocks are converted from unwritten to written before the records come, which
// spares each msync ext4's conversion and the inode write it brings (18 % of
// msync's kernel samples in perf). An 8 KiB msync loop alone got faster (4,000 →
// 5,300 msyncs/s, 102 → 80 µs of CPU each), but BenchmarkAhead got slower (2.7–2.9
// against 2.1–2.3 µs of CPU a record, p99 4.3–5.0 against 2.4–3.6 ms), the
// window's blocks being written twice, first as zeros, on the same disk queue as
// the commits. Zero-filling whole segments when they are made (zeroing), paced
// and before any record, took its place.
const aheadBytes = 1 << 20

// populateOK is cleared once the kernel refuses MADV_POPULATE_WRITE (before 5.14:
// EINVAL), so it is not asked again. Advice only: without it the writer takes the
// faults itself, as before.
var populateOK atomic.Bool

func init() { populateOK.Store(true) }

// PopulateWrite faults in, writable, the pages of b (whose start is page-aligned)
// in one call (MADV_POPULATE_WRITE, Linux 5.14): the faults the first writes into
// fresh memory would take one page at a time, dear where a hypervisor shadows the
// page tables. The contents are untouched. It reports whether the kernel did it;
// once the kernel refuses it (EINVAL) it is not asked again.
func PopulateWrite(b []byte) bool {
	if len(b) == 0 || !populateOK.Load() {
		return false
	}
	err := unix.Madvise(b, unix.MADV_POPULATE_WRITE)
	if errors.Is(err, unix.EINVAL) {
		populateOK.Store(false)
	}
	return err == nil
}

// populateAhead faults in, writable, the pages of up to aheadBytes past to, the
// end of what a group commit synced, when less than half of that is faulted in
// already. Only aheadLoop calls it, holding Journal.rw for reading, so the
// segment is not unmapped meanwhile.
func (s *segment) populateAhead(to int) {
	if s.mm == nil {
		return
	}
	start := max(s.aheadTo, to)
	if start-to >= aheadBytes/2 || start >= len(s.buf) {
		return
	}
	end := min(to+aheadBytes, len(s.buf))
	if PopulateWrite(s.buf[start&^(pageSizeBytes-1) : end]) {
		s.aheadTo = end
	}
}

func segmentName(base uint64) string { return fmt.Sprintf("%020d%s", base, segmentSuffix) }

func parseSegmentName(name string) (uint64, bool) {
	s, ok := strings.CutSuffix(name, segmentSuffix)
	if !ok || len(s) != 20 {
		return 0, false
	}
	base, err := strconv.ParseUint(s, 10, 64)
	return base, err == nil
}

func randomFileID() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id, nil
		}
	}
}

// preallocate reserves sizeBytes of disk for f so that no later write into
// the mapping can fail for lack of space (a full disk under a mapping is a
// SIGBUS, not an error). It reports false where fallocate is unsupported:
// nothing is reserved, and createSpare writes zeros instead (zeroFill).
func preallocate(f *os.File, sizeBytes int64) (bool, error) {
	err := unix.Fallocate(int(f.Fd()), 0, 0, sizeBytes)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return false, fmt.Errorf("persistence: fallocate %s: %w", f.Name(), err)
	}
	return false, nil
}

// zeroing says how createSpare writes zeros over a new segment's reserved
// blocks; nil: it does not (the blocks stay fallocated, unwritten).
//
// Why: a sync that covers fallocated blocks for the first time also commits
// ext4's journal (their extents turn from unwritten to written), and a group
// commit's msync paid that nearly every time (9 KB msyncs: 4,384–5,983 a second
// against 9,213–10,763 over written zeros, in a loop of one writer; create +10 %
// to +16 % in kjob bench; BENCHMARKS.md, 2026-12-06 late evening). The zeros are
// written a page at a time, so that the page cache holds them in one-page folios
// (written in 1 MiB pieces they became large folios, and an msync wrote a whole
// one back: slower than fallocated), and their cached pages are kept for the
// mapping (mapWritable), so its faults read nothing.
//
// The cost: every segment is written twice (zeros, then records), about 16k
// pwrites and, paced, 256 fdatasyncs for 64 MiB, and a spare holds its size in
// clean page cache until it is used (reclaimable; a reclaimed page is read back
// on its fault). Segments larger than maxZeroFillBytes are only fallocated
// (where fallocate works: elsewhere the zeros are the only reservation).
type zeroing struct {
	// pause, when positive, is taken after every zeroStepBytes (written back
	// and synced first), so that a spare prepared while the journal serves
	// does not hold the commits up behind 64 MiB of writes (unpaced, the fire
	// scenario's p999 went from 3–5 to 10–17 ms; in steps of 1 MiB with 4 ms
	// pauses BenchmarkAppendSync's p99 at 8 and 64 appenders still rose by
	// 0.6–0.9 ms; in steps of 256 KiB with 1 ms pauses it stayed as without).
	pause time.Duration
	stop  <-chan struct{} // ends a paced zeroing early (errZeroingStopped)
	// hurry, if set, is asked before each pause: true (the active segment is
	// nearly full) skips the pauses and the steps' syncs, so that the spare is
	// ready before a rollover has to make one at once.
	hurry func() bool
}

const (
	maxZeroFillBytes = 1 << 30
	zeroStepBytes    = 256 << 10
	zeroPause        = time.Millisecond // 64 MiB in about 0.35 s; a segment lasts 2 s or more
)

var errZeroingStopped = errors.New("persistence: segment zeroing stopped (journal closing)")

// zeroFilledBytes counts the bytes zeroFill wrote, for tests that count the
// page cache a journal dirties.
var zeroFilledBytes atomic.Int64

// zeroFill writes zeros over f's first sizeBytes, a page at a time.
func zeroFill(f *os.File, sizeBytes int64, z *zeroing) error {
	page := make([]byte, pageSizeBytes)
	for off := int64(0); off < sizeBytes; {
		end := min(off+zeroStepBytes, sizeBytes)
		for ; off < end; off += int64(len(page)) {
			n, err := f.WriteAt(page[:min(int64(len(page)), end-off)], off)
			zeroFilledBytes.Add(int64(n))
			if err != nil {
				return fmt.Errorf("persistence: zero %s: %w", f.Name(), err)
			}
		}
		if z.pause <= 0 || (z.hurry != nil && z.hurry()) {
			continue
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("persistence: fdatasync %s: %w", f.Name(), err)
		}
		t := time.NewTimer(z.pause)
		select {
		case <-z.stop:
			t.Stop()
			return errZeroingStopped
		case <-t.C:
		}
	}
	return nil
}

// createSpare makes a preallocated (and, with z, zero-filled), synced, mapped
// file under a temporary name. It becomes a segment only when activate gives it
// a header and its final name; a crash before that leaves a *.tmp file that
// Open deletes.
func createSpare(dir string, sizeBytes int64, be backend, z *zeroing) (*segment, error) {
	id, err := randomFileID()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("spare-%016x%s", id, tmpSuffix)
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("persistence: create segment: %w", err)
	}
	s := &segment{name: name, f: f}
	fail := func(err error) (*segment, error) {
		s.release()
		os.Remove(filepath.Join(dir, name))
		return nil, err
	}
	reserved, err := preallocate(f, sizeBytes)
	if err != nil {
		return fail(err)
	}
	switch {
	case !reserved && z == nil:
		z = &zeroing{} // the zeros are the reservation
	case reserved && sizeBytes > maxZeroFillBytes:
		z = nil
	}
	if z != nil {
		if err := zeroFill(f, sizeBytes, z); err != nil {
			return fail(err)
		}
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("persistence: fsync %s: %w", name, err))
	}
	if be == backendPwrite {
		s.buf = make([]byte, sizeBytes)
		return s, nil
	}
	mm, err := mapWritable(f, int(sizeBytes), 0, z != nil)
	if err != nil {
		return fail(fmt.Errorf("persistence: mmap %s: %w", name, err))
	}
	s.mm, s.buf = mm, mm
	return s, nil
}

// mapWritable maps f's first size bytes read-write for appending, in small page
// cache pages.
//
// A kernel whose file system keeps large folios in the page cache (ext4 does from
// Linux 6.16, with readahead growing them up to 2 MiB) marks a whole folio dirty
// when one byte of it is written through a mapping, and msync writes the whole
// folio back: a 5 KiB group commit became a 2 MiB write, and a node firing 20,000
// jobs a second wrote 1.5 GB/s to disk (measured with /proc/PID/io), stalling
// every commit behind the disk. The folios come from readahead on the page faults
// of the first write to each page, so the mapping is advised MADV_RANDOM (no
// readahead: a fault reads one page, and a page is one folio), and the file's
// clean cached pages, which an earlier reader may have read ahead into large
// folios, are dropped first (POSIX_FADV_DONTNEED: they are on disk). Both are
// advice; where they fail the mapping works as before, only slower.
//
// Both apply only from the folio boundary at or below written, the end of what
// the file already holds (0 for a new segment): the bytes below it are never
// written again, and recovery reads them next. Dropping those from the page
// cache, and reading them without readahead, made recovery read the active
// segment back from disk a page per fault (46,143 major faults replaying a
// 128 MiB journal of 1,000,000 jobs).
//
// A spare just zero-filled (cached: its own page-sized writes) keeps its pages.
func mapWritable(f *os.File, size, written int, cached bool) (mmap.MMap, error) {
	keep := min(written&^(maxFolioBytes-1), size)
	if !cached {
		_ = unix.Fadvise(int(f.Fd()), int64(keep), int64(size-keep), unix.FADV_DONTNEED)
	}
	mm, err := mmap.MapRegion(f, size, mmap.RDWR, 0, 0)
	if err != nil {
		return nil, err
	}
	_ = unix.Madvise(mm[keep:], unix.MADV_RANDOM)
	return mm, nil
}

// maxFolioBytes is the largest page-cache folio readahead makes (a PMD, 2 MiB
// on x86-64 and arm64 with 4 KiB pages): a folio wholly below a multiple of it
// is never written through a segment's mapping.
const maxFolioBytes = 2 << 20

// activate turns a spare into the segment starting at base: it writes the
// header into the mapping and renames the file. The flusher makes both
// durable (msync from offset 0, then fsync of the directory) before it
// acknowledges any record in the segment.
func (s *segment) activate(dir string, base uint64) error {
	id, err := randomFileID()
	if err != nil {
		return err
	}
	h := SegmentHeader{Version: FormatVersion, FileID: id, BaseLSN: base, SizeBytes: int64(len(s.buf))}
	EncodeSegmentHeader(s.buf[:0], h)
	name := segmentName(base)
	if err := os.Rename(filepath.Join(dir, s.name), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("persistence: activate segment %s: %w", name, err)
	}
	s.name = name
	s.seed = crcSeed(id)
	s.idx = segIndex{hdr: h, end: SegmentHeaderSize, firstLSN: base, lastLSN: base - 1, streams: map[uint64]uint64{}}
	s.synced = 0
	s.needDirSync = true
	return nil
}

// sync makes buf[from:to] durable.
func (s *segment) sync(from, to int) error {
	if s.mm == nil {
		if _, err := s.f.WriteAt(s.buf[from:to], int64(from)); err != nil {
			return fmt.Errorf("persistence: pwrite %s [%d,%d): %w", s.name, from, to, err)
		}
		if err := unix.Fdatasync(int(s.f.Fd())); err != nil {
			return fmt.Errorf("persistence: fdatasync %s: %w", s.name, err)
		}
		return nil
	}
	start := from &^ (pageSizeBytes - 1)
	if err := unix.Msync(s.buf[start:to], unix.MS_SYNC); err != nil {
		return fmt.Errorf("persistence: msync %s [%d,%d): %w", s.name, start, to, err)
	}
	return nil
}

// release unmaps and closes the segment.
func (s *segment) release() error {
	var err error
	if s.mm != nil {
		err = s.mm.Unmap()
		s.mm = nil
	}
	s.buf = nil
	if s.f != nil {
		err = errors.Join(err, s.f.Close())
		s.f = nil
	}
	return err
}

// openSegmentFile maps an existing segment file read-only for recovery.
func openSegmentFile(dir, name string) (*segment, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("persistence: open %s: %w", name, err)
	}
	s := &segment{name: name, f: f}
	fi, err := f.Stat()
	if err != nil {
		s.release()
		return nil, fmt.Errorf("persistence: stat %s: %w", name, err)
	}
	if fi.Size() == 0 {
		return s, nil
	}
	mm, err := mmap.MapRegion(f, int(fi.Size()), mmap.RDONLY, 0, 0)
	if err != nil {
		s.release()
		return nil, fmt.Errorf("persistence: mmap %s: %w", name, err)
	}
	s.mm, s.buf = mm, mm
	return s, nil
}

// makeWritable remaps a recovered segment read-write (mmap backend) or copies
// it into memory (pwrite backend), so that it can be appended to.
func (s *segment) makeWritable(be backend) error {
	if s.mm == nil {
		return nil
	}
	size := len(s.buf)
	if be == backendPwrite {
		buf := make([]byte, size)
		copy(buf, s.buf)
		if err := s.mm.Unmap(); err != nil {
			return fmt.Errorf("persistence: munmap %s: %w", s.name, err)
		}
		s.mm, s.buf = nil, buf
		return nil
	}
	if err := s.mm.Unmap(); err != nil {
		return fmt.Errorf("persistence: munmap %s: %w", s.name, err)
	}
	s.mm, s.buf = nil, nil
	// Past the records, the segment holds the zeros written when it was made
	// (zeroing), and mapWritable is about to drop their cached pages: a fault on
	// a written block reads it back from disk, a page at a time (6.8 MB read to
	// append 6 MB after a reopen). Turned back into unwritten extents, the
	// faults read nothing; this one segment's commits pay the conversion again,
	// as before zero-filling. Advice only: where it fails, the faults read.
	if from := (s.idx.end + pageSizeBytes - 1) &^ (pageSizeBytes - 1); from < size {
		_ = unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, int64(from), int64(size-from))
	}
	mm, err := mapWritable(s.f, size, s.idx.end, false)
	if err != nil {
		return fmt.Errorf("persistence: mmap %s: %w", s.name, err)
	}
	s.mm, s.buf = mm, mm
	return nil
}

func syncDir(d *os.File) error {
	if err := d.Sync(); err != nil {
		return fmt.Errorf("persistence: fsync directory %s: %w", d.Name(), err)
	}
	return nil
}
