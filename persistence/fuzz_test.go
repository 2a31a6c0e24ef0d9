package persistence

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
)

func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, Record{LSN: 1, Stream: 2, Type: 3, Payload: []byte("hello")}))
	f.Add(make([]byte, 40))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := DecodeRecord(b)
		if err != nil {
			return
		}
		if n < RecordHeaderSize+len(r.Payload) || n > len(b) || r.Type == 0 {
			t.Fatalf("n=%d for %d bytes, payload %d, type %d", n, len(b), len(r.Payload), r.Type)
		}
		crc := crc32.Update(crcSeed(0), castagnoli, b[4:RecordHeaderSize])
		crc = crc32.Update(crc, castagnoli, b[RecordHeaderSize:RecordHeaderSize+len(r.Payload)])
		if crc != binary.LittleEndian.Uint32(b) {
			t.Fatal("decoded a frame whose CRC does not match")
		}
	})
}

func FuzzScanSegment(f *testing.F) {
	f.Add(buildSegment(9, 1, 1024, []byte("a"), []byte("bb")))
	f.Add(buildSegment(9, 5, 256, nil, nil, nil))
	f.Add(make([]byte, 128))
	f.Fuzz(func(t *testing.T, b []byte) {
		res, err := ScanSegment(b, func(r Record, off int) error {
			h, _ := DecodeSegmentHeader(b)
			fr := b[off:]
			crc := crc32.Update(crcSeed(h.FileID), castagnoli, fr[4:RecordHeaderSize])
			crc = crc32.Update(crc, castagnoli, fr[RecordHeaderSize:RecordHeaderSize+len(r.Payload)])
			if crc != binary.LittleEndian.Uint32(fr) {
				t.Fatalf("record at %d: CRC does not match", off)
			}
			return nil
		})
		if err == nil && (res.End > len(b) || res.LastLSN != res.Header.BaseLSN+uint64(res.Records)-1) {
			t.Fatalf("inconsistent result %+v for %d bytes", res, len(b))
		}
	})
}

// FuzzRecovery runs recovery's planning over arbitrary bytes cut into one to
// three segment files: it must not panic, and what it keeps must decode with
// matching CRCs and consecutive LSNs.
func FuzzRecovery(f *testing.F) {
	seg1 := buildSegment(3, 1, 512, []byte("one"), []byte("two"), []byte("three"))
	seg2 := buildSegment(4, 4, 512, []byte("four"))
	f.Add(uint16(512), uint16(1024), append(append([]byte{}, seg1...), seg2...))
	torn := append([]byte{}, seg1...)
	torn[SegmentHeaderSize+FrameSize(3)+5] ^= 0x40
	f.Add(uint16(512), uint16(512), torn)
	f.Add(uint16(10), uint16(20), make([]byte, 300))
	f.Fuzz(func(t *testing.T, cut1, cut2 uint16, b []byte) {
		c1 := min(int(cut1), len(b))
		c2 := min(max(int(cut2), c1), len(b))
		var imgs []segImage
		for i, part := range [][]byte{b[:c1], b[c1:c2], b[c2:]} {
			if len(part) == 0 {
				continue
			}
			base := uint64(1)
			if len(part) >= 32 {
				base = binary.LittleEndian.Uint64(part[24:]) // whatever the header claims
			}
			imgs = append(imgs, segImage{name: segmentName(base) + string(rune('a'+i)), base: base, buf: part})
		}
		p, err := planRecovery(imgs, cut1%2 == 0)
		if err != nil {
			return
		}
		if len(p.kept)+len(p.deleted) > len(imgs) {
			t.Fatalf("kept %d + deleted %d of %d", len(p.kept), len(p.deleted), len(imgs))
		}
		next := uint64(0)
		for k, idx := range p.kept {
			buf := imgs[k].buf
			if p.zeroTo > p.zeroFrom && k == len(p.kept)-1 && (p.zeroFrom < idx.end || p.zeroTo > len(buf)) {
				t.Fatalf("zero range [%d,%d) outside the tail of %d..%d", p.zeroFrom, p.zeroTo, idx.end, len(buf))
			}
			views := []segView{{s: &segment{buf: buf, seed: crcSeed(idx.hdr.FileID), idx: idx}, end: idx.end}}
			if err := iterate(views, ^uint64(0), func(r Record) error {
				if next != 0 && r.LSN != next {
					t.Fatalf("LSN %d, want %d", r.LSN, next)
				}
				next = r.LSN + 1
				return nil
			}); err != nil {
				t.Fatalf("kept bytes do not decode: %v", err)
			}
		}
	})
}
