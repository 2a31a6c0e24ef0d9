package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt is matched by CorruptionError.
var ErrCorrupt = errors.New("persistence: journal corrupt")

// CorruptionError reports damage to records that had been acknowledged (or
// that recovery cannot prove were not). It names the file and the offset.
type CorruptionError struct {
	File   string // segment file name, relative to Options.Dir
	Offset int64  // byte offset inside File
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("persistence: corruption in %s at offset %d: %s (set Options.TruncateOnCorruption to truncate there)", e.File, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptionError) Is(target error) bool { return target == ErrCorrupt }

// segImage is one segment file as recovery sees it: its name, the base LSN
// its name claims and its bytes.
type segImage struct {
	name string
	base uint64
	buf  []byte
}

// segIndex is what the journal keeps in memory about one segment.
type segIndex struct {
	hdr      SegmentHeader
	end      int    // offset just past the last record
	records  int    // number of records
	firstLSN uint64 // == hdr.BaseLSN
	lastLSN  uint64 // firstLSN-1 when empty
	// streams maps each stream with a record here to its highest LSN here;
	// compaction deletes the segment once every one of them is covered.
	streams map[uint64]uint64
	// opened counts each stream's records here when Open scanned the segment
	// (appends since do not count): recovery sizes a stream's tables by it
	// (RecordsAfter).
	opened map[uint64]int
}

// recoveryPlan is the outcome of planRecovery: which segments to keep, what
// to zero and delete, and what the journal knows afterwards.
type recoveryPlan struct {
	kept []segIndex // indexes of imgs[:len(kept)]
	// zeroFrom..zeroTo is the torn tail to zero in the last kept segment.
	zeroFrom, zeroTo int
	deleted          []string // segment files to delete (after the cut)
	drops            map[uint64]uint64
	records          uint64
	lastLSN          uint64 // last recovered LSN, nextLSN-1
	nextLSN          uint64
	truncatedBytes   int64
	truncatedAt      string
	corruption       *CorruptionError // set when damage was truncated on request
}

// planRecovery decides, on bytes alone, what the log holds. It scans the
// segments in order; the log ends at the first place that is not the next
// record (the cut). Everything after the cut is then probed for valid frames:
// each carries the durable LSN its writer knew, and if any of them proves the
// record expected at the cut had been made durable, the damage is corruption
// of acknowledged data, an error unless truncate is set. Otherwise the bytes
// after the cut are a torn tail that never was acknowledged: they are zeroed
// and later segments deleted.
func planRecovery(imgs []segImage, truncate bool) (recoveryPlan, error) {
	p := recoveryPlan{drops: map[uint64]uint64{}, nextLSN: 1}
	if len(imgs) == 0 {
		return p, nil
	}
	p.nextLSN = max(imgs[0].base, 1)
	cutSeg, cutOff := -1, 0 // the log ends at imgs[cutSeg][cutOff]
	reportFile, reportOff, reason := "", 0, ""
	for i, img := range imgs {
		h, err := DecodeSegmentHeader(img.buf)
		if err == nil && h.BaseLSN != img.base {
			err = fmt.Errorf("%w: header base LSN %d, file name says %d", ErrBadHeader, h.BaseLSN, img.base)
		}
		if err == nil && i > 0 && h.BaseLSN != p.nextLSN {
			err = fmt.Errorf("%w: gap in LSNs: segment starts at %d, expected %d", ErrLSN, h.BaseLSN, p.nextLSN)
		}
		if err != nil {
			reportFile, reportOff, reason = img.name, 0, err.Error()
			break
		}
		idx := segIndex{hdr: h, firstLSN: h.BaseLSN, streams: map[uint64]uint64{}, opened: map[uint64]int{}}
		// Records come in runs of one stream: the maps are written once a run.
		var run struct {
			stream, last uint64
			n            int
		}
		endRun := func() {
			if run.n > 0 {
				idx.streams[run.stream] = run.last
				idx.opened[run.stream] += run.n
			}
		}
		res, _ := ScanSegment(img.buf, func(r Record, _ int) error {
			if run.n == 0 || r.Stream != run.stream {
				endRun()
				run.stream, run.n = r.Stream, 0
			}
			run.last = r.LSN
			run.n++
			if r.Type == typeDropStream {
				p.drops[r.Stream] = r.LSN
			}
			return nil
		})
		endRun()
		idx.end, idx.records, idx.lastLSN = res.End, res.Records, res.LastLSN
		p.kept = append(p.kept, idx)
		p.records += uint64(res.Records)
		p.nextLSN = res.LastLSN + 1
		cutSeg, cutOff = i, res.End
		clean := res.Stop == nil || errors.Is(res.Stop, ErrZero)
		if !clean || i == len(imgs)-1 {
			reportFile, reportOff = img.name, res.End
			if res.Stop != nil {
				reason = res.Stop.Error()
			} else {
				reason = "bytes past the last record"
			}
			break
		}
	}
	p.lastLSN = p.nextLSN - 1

	// Probe everything after the cut.
	expected := p.nextLSN
	var maxDurable uint64
	cutNonZeroEnd := cutOff
	var laterBytes int64
	for k := max(cutSeg, 0); k < len(imgs); k++ {
		buf := imgs[k].buf
		from := SegmentHeaderSize
		if k == cutSeg {
			from = cutOff
		}
		var fileID uint64
		if h, err := DecodeSegmentHeader(buf); err == nil {
			fileID = h.FileID
			buf = buf[:h.SizeBytes]
		} else if len(buf) >= SegmentHeaderSize {
			// A damaged header may still name the file id its frames use.
			fileID = binary.LittleEndian.Uint64(buf[16:24])
		}
		w, _, nz := probe(buf, from, crcSeed(fileID), expected)
		maxDurable = max(maxDurable, w)
		if k == cutSeg {
			cutNonZeroEnd = max(nz, cutOff)
		} else {
			laterBytes += int64(nonZeroEnd(buf, 0, min(len(buf), SegmentHeaderSize)))
			if nz > SegmentHeaderSize {
				laterBytes += int64(nz - SegmentHeaderSize)
			}
		}
	}
	laterSegs := len(imgs) - (cutSeg + 1)
	if cutNonZeroEnd == cutOff && laterSegs == 0 {
		return p, nil // clean end
	}
	if maxDurable >= expected {
		ce := &CorruptionError{File: reportFile, Offset: int64(reportOff),
			Reason: fmt.Sprintf("%s; later records prove LSN %d was durable", reason, expected)}
		if !truncate {
			return p, ce
		}
		p.corruption = ce
	}
	if cutSeg >= 0 && cutNonZeroEnd > cutOff {
		p.zeroFrom, p.zeroTo = cutOff, cutNonZeroEnd
		p.truncatedAt = fmt.Sprintf("%s:%d", imgs[cutSeg].name, cutOff)
	} else {
		// Only whole files after the cut go: name the first of them.
		p.truncatedAt = imgs[cutSeg+1].name + ":0"
	}
	for k := cutSeg + 1; k < len(imgs); k++ {
		p.deleted = append(p.deleted, imgs[k].name)
	}
	p.truncatedBytes = int64(cutNonZeroEnd-cutOff) + laterBytes
	return p, nil
}

// probe looks at every 8-byte-aligned offset of buf from from on for frames
// valid under seed with an LSN of at least minLSN. It returns the highest
// durable watermark those frames carry, how many it found, and the end of
// the last non-zero byte (rounded up to 8), or from if all is zero.
func probe(buf []byte, from int, seed uint32, minLSN uint64) (maxDurable uint64, found int, nzEnd int) {
	nzEnd = from
	off := from
	for off+8 <= len(buf) {
		if off+64 <= len(buf) && allZero(buf[off:off+64]) {
			off += 64
			continue
		}
		if binary.LittleEndian.Uint64(buf[off:]) == 0 {
			off += 8
			continue
		}
		nzEnd = off + 8
		if plausibleFrame(buf[off:], minLSN) {
			if r, d, n, err := decodeFrame(buf[off:], seed); err == nil && r.LSN >= minLSN {
				found++
				maxDurable = max(maxDurable, d)
				nzEnd = max(nzEnd, off+nonZeroEnd(buf[off:off+n], 0, n))
				off += n
				continue
			}
		}
		off += 8
	}
	if off < len(buf) && !allZero(buf[off:]) {
		nzEnd = len(buf)
	}
	return maxDurable, found, nzEnd
}

// plausibleFrame is a cheap filter before a checksum: random bytes rarely
// carry a non-zero type, zero reserved bytes, a length that fits and an LSN
// in the window after minLSN.
func plausibleFrame(b []byte, minLSN uint64) bool {
	if len(b) < RecordHeaderSize || b[24] == 0 || b[25]|b[26]|b[27] != 0 {
		return false
	}
	if uint64(binary.LittleEndian.Uint32(b[4:])) > uint64(len(b)-RecordHeaderSize) {
		return false
	}
	lsn := binary.LittleEndian.Uint64(b[8:])
	return lsn >= minLSN && lsn-minLSN < 1<<40
}

// nonZeroEnd returns the end of the last non-zero byte in b[from:to], or from.
func nonZeroEnd(b []byte, from, to int) int {
	for i := to - 1; i >= from; i-- {
		if b[i] != 0 {
			return i + 1
		}
	}
	return from
}

// SegmentFileName is the file name of the segment whose first record has LSN
// base; recovery reads the base from it.
func SegmentFileName(base uint64) string { return segmentName(base) }

// SegmentImage is one segment file, named by SegmentFileName, as bytes.
type SegmentImage struct {
	Name  string
	Bytes []byte
}

// RecoveredImages is what recovery keeps of a set of segment images.
type RecoveredImages struct {
	Kept           int   // images[:Kept] stay; the rest are to be deleted
	Ends           []int // per kept image, the offset just past its last record; bytes after it are to be zeroed
	Records        uint64
	LastLSN        uint64 // 0 if nothing was kept and nothing was compacted
	TruncatedBytes int64
	TruncatedAt    string // "name:offset" or ""
}

// RecoverImages runs Open's recovery decision on in-memory segment images
// (in base-LSN order) without touching them: the simulator uses it to crash
// and recover simulated disks with the real rules. It returns a
// CorruptionError where Open would, unless truncateOnCorruption is set.
func RecoverImages(images []SegmentImage, truncateOnCorruption bool) (RecoveredImages, error) {
	imgs := make([]segImage, len(images))
	for i, im := range images {
		base, ok := parseSegmentName(im.Name)
		if !ok {
			return RecoveredImages{}, fmt.Errorf("persistence: %q is not a segment file name", im.Name)
		}
		imgs[i] = segImage{name: im.Name, base: base, buf: im.Bytes}
	}
	p, err := planRecovery(imgs, truncateOnCorruption)
	if err != nil {
		return RecoveredImages{}, err
	}
	r := RecoveredImages{Kept: len(p.kept), Records: p.records, LastLSN: p.lastLSN,
		TruncatedBytes: p.truncatedBytes, TruncatedAt: p.truncatedAt}
	for _, k := range p.kept {
		r.Ends = append(r.Ends, k.end)
	}
	return r, nil
}
