package persistence

import (
	"bytes"
	"errors"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		r    Record
	}{
		{"empty payload", Record{LSN: 1, Stream: 0, Type: 1}},
		{"small", Record{LSN: 2, Stream: 7, Type: 9, Payload: []byte("hello")}},
		{"aligned", Record{LSN: 1 << 40, Stream: 1<<64 - 1, Type: MaxUserType, Payload: bytes.Repeat([]byte{0xAB}, 128)}},
		{"internal type", Record{LSN: 3, Stream: 5, Type: typeDropStream}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf := AppendRecord([]byte("prefix"), tc.r)
			if len(buf)-6 != FrameSize(len(tc.r.Payload)) || (len(buf)-6)%frameAlign != 0 {
				t.Fatalf("frame is %d bytes, FrameSize says %d", len(buf)-6, FrameSize(len(tc.r.Payload)))
			}
			got, n, err := DecodeRecord(buf[6:])
			if err != nil {
				t.Fatal(err)
			}
			if n != len(buf)-6 || got.LSN != tc.r.LSN || got.Stream != tc.r.Stream || got.Type != tc.r.Type || !bytes.Equal(got.Payload, tc.r.Payload) {
				t.Fatalf("got %+v n=%d, want %+v", got, n, tc.r)
			}
		})
	}
}

func TestFrameBoundToFileID(t *testing.T) {
	r := Record{LSN: 5, Stream: 1, Type: 1, Payload: []byte("x")}
	buf := AppendFrame(nil, 42, 4, r)
	if _, d, _, err := DecodeFrame(buf, 42); err != nil || d != 4 {
		t.Fatalf("own file id: durable %d, err %v", d, err)
	}
	if _, _, _, err := DecodeFrame(buf, 43); !errors.Is(err, ErrCRC) {
		t.Fatalf("other file id: err %v, want ErrCRC", err)
	}
}

func TestDurableWatermark(t *testing.T) {
	tests := []struct{ lsn, durable, want uint64 }{
		{10, 0, 0}, {10, 9, 9}, {10, 1, 1}, {1 << 40, 1, 0}, {10, 10, 10},
	}
	for _, tc := range tests {
		buf := AppendFrame(nil, 1, tc.durable, Record{LSN: tc.lsn, Type: 1})
		_, d, _, err := DecodeFrame(buf, 1)
		if err != nil || d != tc.want {
			t.Errorf("lsn %d durable %d: got %d (%v), want %d", tc.lsn, tc.durable, d, err, tc.want)
		}
	}
}

// Every single-bit flip in a frame's header or payload must be caught.
func TestEveryBitFlipDetected(t *testing.T) {
	for _, plen := range []int{0, 1, 7, 8, 128, 1000} {
		payload := make([]byte, plen)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		frame := AppendFrame(nil, 99, 3, Record{LSN: 4, Stream: 12, Type: 3, Payload: payload})
		for bit := 0; bit < (RecordHeaderSize+plen)*8; bit++ {
			b := bytes.Clone(frame)
			b[bit/8] ^= 1 << (bit % 8)
			if _, _, _, err := DecodeFrame(b, 99); err == nil {
				t.Fatalf("payload %d: flip of bit %d not detected", plen, bit)
			}
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	frame := AppendRecord(nil, Record{LSN: 1, Stream: 1, Type: 1, Payload: []byte("abcdefgh")})
	if _, _, err := DecodeRecord(make([]byte, 64)); !errors.Is(err, ErrZero) {
		t.Errorf("zeros: %v", err)
	}
	for cut := 1; cut < len(frame)-frameAlign; cut++ {
		if _, _, err := DecodeRecord(frame[:cut]); err == nil {
			t.Errorf("cut at %d decoded", cut)
		}
	}
	typ0 := bytes.Clone(frame)
	typ0[24] = 0
	if _, _, err := DecodeRecord(typ0); !errors.Is(err, ErrCRC) {
		t.Errorf("type 0 with stale CRC: %v", err)
	}
	inv := AppendRecord(nil, Record{LSN: 1, Type: 0})
	if _, _, err := DecodeRecord(inv); !errors.Is(err, ErrInvalid) {
		t.Errorf("type 0 with valid CRC: %v", err)
	}
}

func TestSegmentHeader(t *testing.T) {
	h := SegmentHeader{Version: FormatVersion, FileID: 0xdeadbeef, BaseLSN: 77, SizeBytes: 4096}
	img := make([]byte, 4096)
	EncodeSegmentHeader(img[:0], h)
	got, err := DecodeSegmentHeader(img)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v", got, err)
	}
	for bit := 0; bit < SegmentHeaderSize*8; bit++ {
		b := bytes.Clone(img)
		b[bit/8] ^= 1 << (bit % 8)
		if _, err := DecodeSegmentHeader(b); !errors.Is(err, ErrBadHeader) {
			t.Fatalf("flip of bit %d: %v", bit, err)
		}
	}
	if _, err := DecodeSegmentHeader(make([]byte, 4096)); !errors.Is(err, ErrZero) {
		t.Fatalf("zero header: %v", err)
	}
	if _, err := DecodeSegmentHeader(img[:2048]); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("short file: %v", err)
	}
}

// buildSegment is a segment image holding records with LSNs base.. for the
// given payloads, each written as if everything before it was durable.
func buildSegment(fileID, base uint64, size int, payloads ...[]byte) []byte {
	img := make([]byte, size)
	EncodeSegmentHeader(img[:0], SegmentHeader{Version: FormatVersion, FileID: fileID, BaseLSN: base, SizeBytes: int64(size)})
	off := SegmentHeaderSize
	for i, p := range payloads {
		lsn := base + uint64(i)
		f := AppendFrame(nil, fileID, lsn-1, Record{LSN: lsn, Stream: uint64(i % 3), Type: 1, Payload: p})
		off += copy(img[off:], f)
	}
	return img
}

func TestScanSegment(t *testing.T) {
	img := buildSegment(5, 10, 4096, []byte("a"), []byte("bb"), []byte("ccc"))
	var lsns []uint64
	res, err := ScanSegment(img, func(r Record, off int) error {
		lsns = append(lsns, r.LSN)
		return nil
	})
	if err != nil || !errors.Is(res.Stop, ErrZero) || res.Records != 3 || res.LastLSN != 12 {
		t.Fatalf("res %+v err %v", res, err)
	}
	if want := SegmentHeaderSize + FrameSize(1) + FrameSize(2) + FrameSize(3); res.End != want {
		t.Fatalf("end %d, want %d", res.End, want)
	}
	if len(lsns) != 3 || lsns[0] != 10 || lsns[2] != 12 {
		t.Fatalf("lsns %v", lsns)
	}
	// A frame with the wrong LSN stops the scan.
	bad := bytes.Clone(img)
	copy(bad[res.End:], AppendFrame(nil, 5, 0, Record{LSN: 20, Type: 1}))
	if res, _ := ScanSegment(bad, nil); !errors.Is(res.Stop, ErrLSN) || res.Records != 3 {
		t.Fatalf("gap: %+v", res)
	}
	// A full segment ends cleanly.
	full := buildSegment(5, 1, SegmentHeaderSize+FrameSize(0), nil)
	if res, _ := ScanSegment(full, nil); res.Stop != nil || res.Records != 1 {
		t.Fatalf("full: %+v", res)
	}
}

func TestSnapshotCodec(t *testing.T) {
	img := EncodeSnapshot(nil, 3, 99, []byte("state"))
	s, l, d, err := DecodeSnapshot(img)
	if err != nil || s != 3 || l != 99 || string(d) != "state" {
		t.Fatalf("%d %d %q %v", s, l, d, err)
	}
	for bit := 0; bit < len(img)*8; bit++ {
		b := bytes.Clone(img)
		b[bit/8] ^= 1 << (bit % 8)
		if bit/8 >= 44 && bit/8 < 48 {
			continue // reserved, outside the CRC
		}
		if _, _, _, err := DecodeSnapshot(b); err == nil {
			t.Fatalf("flip of bit %d not detected", bit)
		}
	}
	if _, _, _, err := DecodeSnapshot(img[:len(img)-1]); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("torn: %v", err)
	}
}
