package persistence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture makes a closed journal of n records (stream 1, 100-byte payloads,
// appended and awaited ten at a time, so each batch proves the batches before
// it durable) and returns its directory and segment names.
func fixture(t *testing.T, n int) (dir string, segs []string) {
	t.Helper()
	dir = t.TempDir()
	j := openT(t, Options{Dir: dir})
	for i := 0; i < n; i += 10 {
		var es []Entry
		for k := i; k < min(i+10, n); k++ {
			es = append(es, Entry{Stream: 1, Type: 1, Payload: payloadFor(k, 100)})
		}
		if _, err := j.AppendWait(context.Background(), es...); err != nil {
			t.Fatal(err)
		}
	}
	closeT(t, j)
	m, _ := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	for _, p := range m {
		segs = append(segs, filepath.Base(p))
	}
	return dir, segs
}

// offsets returns the record offsets of a segment file.
func offsets(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int
	if _, err := ScanSegment(b, func(_ Record, off int) error { offs = append(offs, off); return nil }); err != nil {
		t.Fatal(err)
	}
	return offs
}

func patch(t *testing.T, path string, off int, fn func(b []byte)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fn(b[off:])
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func replayCount(t *testing.T, j *Journal) int {
	_, recs := all(t, j)
	for i, r := range recs {
		if !bytes.Equal(r.Payload, payloadFor(i, 100)) {
			t.Fatalf("record %d payload differs", r.LSN)
		}
	}
	return len(recs)
}

func TestRecoverTornTail(t *testing.T) {
	tests := []struct {
		name      string
		damage    func(b []byte) // applied at the last record's offset
		wantBytes int64
	}{
		{"payload cut short", func(b []byte) { clear(b[RecordHeaderSize+40 : FrameSize(100)]) }, RecordHeaderSize + 40},
		{"header only", func(b []byte) { clear(b[RecordHeaderSize:FrameSize(100)]) }, RecordHeaderSize},
		{"partial header", func(b []byte) { clear(b[10:FrameSize(100)]) }, 16},
		{"garbage", func(b []byte) { copy(b, bytes.Repeat([]byte{0xEE}, FrameSize(100))) }, int64(FrameSize(100))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, segs := fixture(t, 50)
			last := filepath.Join(dir, segs[len(segs)-1])
			offs := offsets(t, last)
			at := offs[len(offs)-1]
			patch(t, last, at, tc.damage)
			j := openT(t, Options{Dir: dir})
			rep := j.Report()
			if rep.Records != 49 || rep.LastLSN != 49 || rep.TruncatedAt != fmt.Sprintf("%s:%d", segs[len(segs)-1], at) {
				t.Fatalf("report %+v", rep)
			}
			if rep.TruncatedBytes != tc.wantBytes {
				t.Fatalf("truncated %d bytes, want %d", rep.TruncatedBytes, tc.wantBytes)
			}
			if n := replayCount(t, j); n != 49 {
				t.Fatalf("%d records", n)
			}
			// The tail is zero again: appending continues at LSN 50 and a
			// second open finds nothing to truncate.
			appendN(t, j, 1, 1, 100)
			closeT(t, j)
			j = openT(t, Options{Dir: dir})
			defer closeT(t, j)
			if rep := j.Report(); rep.TruncatedBytes != 0 || rep.LastLSN != 50 {
				t.Fatalf("second open %+v", rep)
			}
		})
	}
}

func TestRecoverCorruptionNamesFileAndOffset(t *testing.T) {
	t.Run("flipped bit mid last segment", func(t *testing.T) {
		dir, segs := fixture(t, 50)
		name := segs[len(segs)-1]
		offs := offsets(t, filepath.Join(dir, name))
		at := offs[len(offs)/2]
		patch(t, filepath.Join(dir, name), at+RecordHeaderSize+3, func(b []byte) { b[0] ^= 0x10 })
		_, err := Open(Options{Dir: dir, SegmentSizeBytes: testSegmentBytes})
		var ce *CorruptionError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.File != name || ce.Offset != int64(at) {
			t.Fatalf("got %v, want corruption at %s:%d", err, name, at)
		}
		if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), fmt.Sprint(at)) {
			t.Fatalf("message %q does not name the place", err)
		}
		// The operator's explicit choice truncates there.
		j := openT(t, Options{Dir: dir, TruncateOnCorruption: true})
		defer closeT(t, j)
		kept := len(offs) / 2
		if rep := j.Report(); rep.TruncatedAt != fmt.Sprintf("%s:%d", name, at) || int(rep.LastLSN) != 50-len(offs)+kept {
			t.Fatalf("report %+v", rep)
		}
	})
	t.Run("flipped bit in sealed segment", func(t *testing.T) {
		dir, segs := fixture(t, 1500)
		if len(segs) < 3 {
			t.Fatalf("%d segments", len(segs))
		}
		name := segs[1]
		offs := offsets(t, filepath.Join(dir, name))
		at := offs[7]
		patch(t, filepath.Join(dir, name), at+9, func(b []byte) { b[0] ^= 1 }) // in the LSN
		_, err := Open(Options{Dir: dir, SegmentSizeBytes: testSegmentBytes})
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.File != name || ce.Offset != int64(at) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("bad segment header", func(t *testing.T) {
		dir, segs := fixture(t, 1500)
		patch(t, filepath.Join(dir, segs[1]), 0, func(b []byte) { b[2] ^= 0xFF })
		_, err := Open(Options{Dir: dir, SegmentSizeBytes: testSegmentBytes})
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.File != segs[1] || ce.Offset != 0 || !strings.Contains(err.Error(), "magic") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("bad header of last segment", func(t *testing.T) {
		dir, segs := fixture(t, 1500)
		patch(t, filepath.Join(dir, segs[len(segs)-1]), 60, func(b []byte) { b[0] ^= 1 }) // header CRC
		_, err := Open(Options{Dir: dir, SegmentSizeBytes: testSegmentBytes})
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), segs[len(segs)-1]) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("gap in LSNs", func(t *testing.T) {
		dir, segs := fixture(t, 1500)
		os.Remove(filepath.Join(dir, segs[1]))
		_, err := Open(Options{Dir: dir, SegmentSizeBytes: testSegmentBytes})
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.File != segs[2] || !strings.Contains(err.Error(), "gap") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("renamed segment", func(t *testing.T) {
		dir, segs := fixture(t, 1500)
		last := segs[len(segs)-1]
		os.Rename(filepath.Join(dir, last), filepath.Join(dir, segmentName(99999)))
		_, err := Open(Options{Dir: dir, SegmentSizeBytes: testSegmentBytes})
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("got %v", err)
		}
	})
}

// Bytes left in a file by an older journal (same offsets, same LSNs, even)
// must never be read as records: frames are bound to the file id.
func TestRecoverIgnoresStaleBytesFromOlderFile(t *testing.T) {
	oldDir, oldSegs := fixture(t, 200)
	newDir, newSegs := fixture(t, 50)
	oldImg, _ := os.ReadFile(filepath.Join(oldDir, oldSegs[0]))
	newPath := filepath.Join(newDir, newSegs[0])
	end := offsets(t, newPath)
	tail := end[len(end)-1] + FrameSize(100)
	patch(t, newPath, tail, func(b []byte) { copy(b, oldImg[tail:]) })
	j := openT(t, Options{Dir: newDir})
	defer closeT(t, j)
	rep := j.Report()
	if rep.LastLSN != 50 || rep.TruncatedBytes == 0 || rep.TruncatedAt != fmt.Sprintf("%s:%d", newSegs[0], tail) {
		t.Fatalf("report %+v", rep)
	}
	if n := replayCount(t, j); n != 50 {
		t.Fatalf("%d records, stale ones read", n)
	}
}

func TestRecoverLeftoversOfInterruptedRollover(t *testing.T) {
	dir, segs := fixture(t, 30)
	// A spare that never became a segment, and a segment whose header never
	// reached the disk (crash between rename and msync).
	os.WriteFile(filepath.Join(dir, "spare-0000000000000001.tmp"), make([]byte, 4096), 0o644)
	zero := segmentName(31)
	os.WriteFile(filepath.Join(dir, zero), make([]byte, testSegmentBytes), 0o644)
	j := openT(t, Options{Dir: dir})
	defer closeT(t, j)
	rep := j.Report()
	if rep.LastLSN != 30 || rep.Segments != len(segs) || rep.TruncatedAt != zero+":0" || rep.TruncatedBytes != 0 {
		t.Fatalf("report %+v", rep)
	}
	// The leftover spare is gone. (The journal's own next spare, which it starts
	// preparing once open, may be there by now under another name.)
	if _, err := os.Stat(filepath.Join(dir, "spare-0000000000000001.tmp")); !os.IsNotExist(err) {
		m, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
		t.Fatalf("leftover spare kept: %v", m)
	}
	if _, err := os.Stat(filepath.Join(dir, zero)); !os.IsNotExist(err) {
		t.Fatal("header-less segment kept")
	}
}

// planRecovery on hand-built images: the sync-lag watermark decides between
// a torn tail and corruption.
func TestPlanRecoveryWatermark(t *testing.T) {
	const size = 8192
	mk := func(fileID, base uint64, durable func(lsn uint64) uint64, n int) []byte {
		img := make([]byte, size)
		EncodeSegmentHeader(img[:0], SegmentHeader{Version: FormatVersion, FileID: fileID, BaseLSN: base, SizeBytes: size})
		off := SegmentHeaderSize
		for i := range n {
			lsn := base + uint64(i)
			off += copy(img[off:], AppendFrame(nil, fileID, durable(lsn), Record{LSN: lsn, Stream: 1, Type: 1, Payload: []byte("payload")}))
		}
		return img
	}
	frame := FrameSize(len("payload"))
	hole := func(img []byte, k int) { clear(img[SegmentHeaderSize+k*frame : SegmentHeaderSize+(k+1)*frame]) }

	t.Run("hole then unacknowledged records is a torn tail", func(t *testing.T) {
		// Written in one batch while only LSN 2 was durable; power loss left
		// a hole at LSN 5 and later pages on disk.
		img := mk(7, 1, func(lsn uint64) uint64 { return min(lsn-1, 2) }, 10)
		hole(img, 4)
		p, err := planRecovery([]segImage{{name: "a", base: 1, buf: img}}, false)
		if err != nil || p.lastLSN != 4 || p.zeroFrom != SegmentHeaderSize+4*frame || p.zeroTo < SegmentHeaderSize+9*frame+RecordHeaderSize+len("payload") {
			t.Fatalf("plan %+v err %v", p, err)
		}
	})
	t.Run("hole before records proving it durable is corruption", func(t *testing.T) {
		img := mk(7, 1, func(lsn uint64) uint64 { return lsn - 1 }, 10)
		hole(img, 4)
		_, err := planRecovery([]segImage{{name: "a", base: 1, buf: img}}, false)
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.File != "a" || ce.Offset != int64(SegmentHeaderSize+4*frame) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("torn end of sealed segment with unacknowledged next segment", func(t *testing.T) {
		a := mk(7, 1, func(lsn uint64) uint64 { return min(lsn-1, 3) }, 8)
		hole(a, 6) // LSN 7 lost, 8 survived
		b := mk(8, 9, func(uint64) uint64 { return 3 }, 3)
		p, err := planRecovery([]segImage{{name: "a", base: 1, buf: a}, {name: "b", base: 9, buf: b}}, false)
		if err != nil || p.lastLSN != 6 || len(p.kept) != 1 || len(p.deleted) != 1 || p.deleted[0] != "b" {
			t.Fatalf("plan %+v err %v", p, err)
		}
	})
	t.Run("torn end of sealed segment, next segment proves it durable", func(t *testing.T) {
		a := mk(7, 1, func(lsn uint64) uint64 { return lsn - 1 }, 8)
		hole(a, 7)
		b := mk(8, 9, func(lsn uint64) uint64 { return lsn - 1 }, 3)
		_, err := planRecovery([]segImage{{name: "a", base: 1, buf: a}, {name: "b", base: 9, buf: b}}, false)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("records without durability info never prove anything", func(t *testing.T) {
		img := mk(7, 1, func(uint64) uint64 { return 0 }, 10)
		hole(img, 2)
		p, err := planRecovery([]segImage{{name: "a", base: 1, buf: img}}, false)
		if err != nil || p.lastLSN != 2 {
			t.Fatalf("plan %+v err %v", p, err)
		}
	})
}

func TestRecoverImages(t *testing.T) {
	a := buildSegment(1, 1, 1024, []byte("a"), []byte("b"))
	b := buildSegment(2, 3, 1024, []byte("c"))
	b[SegmentHeaderSize+RecordHeaderSize] ^= 1 // tear LSN 3, nothing after it
	got, err := RecoverImages([]SegmentImage{{SegmentFileName(1), a}, {SegmentFileName(3), b}}, false)
	if err != nil || got.Kept != 2 || got.LastLSN != 2 || got.Ends[1] != SegmentHeaderSize || got.TruncatedAt != SegmentFileName(3)+":64" {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := RecoverImages([]SegmentImage{{"x", a}}, false); err == nil {
		t.Fatal("bad name accepted")
	}
}
