package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Record types. The caller owns 1..MaxUserType; 0 marks unwritten space and
// the types above MaxUserType are the journal's own.
const (
	// TypeInvalid is never written: a frame whose type is 0 is not a record,
	// so unwritten (zeroed) space can never be mistaken for one.
	TypeInvalid uint8 = 0
	// MinUserType is the smallest type a caller may append.
	MinUserType uint8 = 1
	// MaxUserType is the largest type a caller may append; 250..255 are
	// reserved for the journal's internal records.
	MaxUserType uint8 = 249
	// typeDropStream is the tombstone written by DropStream.
	typeDropStream uint8 = 255
)

// Frame and segment geometry.
const (
	// RecordHeaderSize is the size of a record frame's fixed header.
	RecordHeaderSize = 32
	// SegmentHeaderSize is the size of a segment file's header; the first
	// record starts right after it.
	SegmentHeaderSize = 64
	// FormatVersion is the segment format version this package writes.
	FormatVersion = 1
	// frameAlign is the alignment of every frame inside a segment: it lets
	// recovery resynchronize after damage by probing only every 8th offset.
	frameAlign = 8
	// lagUnknown is the stored durability lag when the writer knew nothing
	// about durability (AppendRecord); it proves nothing at recovery.
	lagUnknown = math.MaxUint32
)

var segmentMagic = [8]byte{'k', 'j', 'o', 'b', 's', 'e', 'g', 0}

// Decoding errors. They are sentinels: test them with errors.Is.
var (
	// ErrZero means the frame header is all zero bytes: unwritten space, the
	// normal end of a segment's records.
	ErrZero = errors.New("persistence: zeroed frame")
	// ErrTorn means the buffer ends inside the frame (or the frame claims to
	// be longer than the buffer): a write that did not finish.
	ErrTorn = errors.New("persistence: torn frame")
	// ErrCRC means the frame's checksum does not match its contents.
	ErrCRC = errors.New("persistence: checksum mismatch")
	// ErrInvalid means the checksum matched but the frame breaks a format
	// rule (type 0, non-zero reserved bytes).
	ErrInvalid = errors.New("persistence: invalid frame")
	// ErrLSN means a well-formed frame carries an LSN other than the next
	// one expected (a gap, a repeat, or a record from another history).
	ErrLSN = errors.New("persistence: unexpected LSN")
	// ErrBadHeader means a segment header is malformed (magic, version,
	// checksum or size).
	ErrBadHeader = errors.New("persistence: bad segment header")
	// ErrTooLarge is matched by RecordTooLargeError.
	ErrTooLarge = errors.New("persistence: record too large")
	// ErrInvalidType means Append was given a type outside 1..249.
	ErrInvalidType = errors.New("persistence: invalid record type")
)

// RecordTooLargeError is returned by Append for an entry whose frame cannot
// fit in an empty segment. It matches ErrTooLarge.
type RecordTooLargeError struct {
	PayloadBytes int // the payload that was refused
	LimitBytes   int // the largest payload a segment of this size can hold
}

func (e *RecordTooLargeError) Error() string {
	return fmt.Sprintf("persistence: record payload of %d bytes exceeds the limit of %d bytes (SegmentSizeBytes minus %d bytes of headers)",
		e.PayloadBytes, e.LimitBytes, SegmentHeaderSize+RecordHeaderSize)
}

// Is makes errors.Is(err, ErrTooLarge) true.
func (e *RecordTooLargeError) Is(target error) bool { return target == ErrTooLarge }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Record is one journal record as read back.
type Record struct {
	LSN     uint64
	Stream  uint64
	Type    uint8
	Payload []byte
}

// FrameSize is the number of bytes a record with payloadLen bytes occupies
// in a segment, padding included.
func FrameSize(payloadLen int) int {
	return (RecordHeaderSize + payloadLen + frameAlign - 1) &^ (frameAlign - 1)
}

// MaxPayloadBytes is the largest payload a segment of segmentSizeBytes holds.
func MaxPayloadBytes(segmentSizeBytes int64) int {
	n := int(segmentSizeBytes) - SegmentHeaderSize - RecordHeaderSize
	n &^= frameAlign - 1
	if n < 0 {
		return 0
	}
	return n
}

// crcSeed is the checksum state after the file id: every frame's CRC starts
// from it, which binds a frame to the segment it was written in.
func crcSeed(fileID uint64) uint32 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], fileID)
	return crc32.Update(0, castagnoli, b[:])
}

// AppendRecord appends r to dst as an unbound frame (file id 0, durability
// unknown): the form for carrying records outside a segment. r.Type must not
// be 0. Records inside a segment are written with AppendFrame.
func AppendRecord(dst []byte, r Record) []byte {
	return AppendFrame(dst, 0, 0, r)
}

// DecodeRecord decodes the unbound frame at the start of buf (see
// AppendRecord) and returns it with the number of bytes it occupies. The
// payload aliases buf.
func DecodeRecord(buf []byte) (r Record, n int, err error) {
	r, _, n, err = DecodeFrame(buf, 0)
	return r, n, err
}

// AppendFrame appends r framed for the segment with the given file id.
// durableLSN is the highest LSN known durable when r is written (0 if
// unknown); it is stored as a lag behind r.LSN so recovery can tell damage to
// acknowledged records from a torn unacknowledged tail.
func AppendFrame(dst []byte, fileID, durableLSN uint64, r Record) []byte {
	n := FrameSize(len(r.Payload))
	start := len(dst)
	if cap(dst)-start < n {
		grown := make([]byte, start, start+n+start/2)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:start+n]
	putFrame(dst[start:], crcSeed(fileID), durableLSN, r.LSN, r.Stream, r.Type, r.Payload)
	return dst
}

// putFrame writes a frame into b, which must be exactly FrameSize bytes.
func putFrame(b []byte, seed uint32, durableLSN, lsn, stream uint64, typ uint8, payload []byte) {
	_ = b[RecordHeaderSize-1]
	binary.LittleEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(b[8:], lsn)
	binary.LittleEndian.PutUint64(b[16:], stream)
	b[24], b[25], b[26], b[27] = typ, 0, 0, 0
	lag := uint64(lagUnknown)
	if durableLSN != 0 && durableLSN < lsn && lsn-durableLSN < lagUnknown {
		lag = lsn - durableLSN
	} else if durableLSN >= lsn && durableLSN != 0 {
		lag = 0
	}
	binary.LittleEndian.PutUint32(b[28:], uint32(lag))
	copy(b[RecordHeaderSize:], payload)
	clear(b[RecordHeaderSize+len(payload):])
	crc := crc32.Update(seed, castagnoli, b[4:RecordHeaderSize])
	crc = crc32.Update(crc, castagnoli, payload)
	binary.LittleEndian.PutUint32(b[0:], crc)
}

// DecodeFrame decodes the frame at the start of buf written for fileID. It
// returns the record (payload aliasing buf), the durable watermark the writer
// recorded (0 if unknown), and the frame's size.
func DecodeFrame(buf []byte, fileID uint64) (r Record, durableLSN uint64, n int, err error) {
	return decodeFrame(buf, crcSeed(fileID))
}

func decodeFrame(buf []byte, seed uint32) (r Record, durableLSN uint64, n int, err error) {
	if len(buf) < RecordHeaderSize {
		if allZero(buf) {
			return Record{}, 0, 0, ErrZero
		}
		return Record{}, 0, 0, ErrTorn
	}
	h := buf[:RecordHeaderSize]
	if allZero(h) {
		return Record{}, 0, 0, ErrZero
	}
	plen := binary.LittleEndian.Uint32(h[4:])
	if uint64(plen) > uint64(len(buf)-RecordHeaderSize) {
		return Record{}, 0, 0, ErrTorn
	}
	payload := buf[RecordHeaderSize : RecordHeaderSize+int(plen)]
	crc := crc32.Update(seed, castagnoli, h[4:])
	crc = crc32.Update(crc, castagnoli, payload)
	if crc != binary.LittleEndian.Uint32(h[0:]) {
		return Record{}, 0, 0, ErrCRC
	}
	typ := h[24]
	if typ == TypeInvalid || h[25]|h[26]|h[27] != 0 {
		return Record{}, 0, 0, ErrInvalid
	}
	r = Record{
		LSN:     binary.LittleEndian.Uint64(h[8:]),
		Stream:  binary.LittleEndian.Uint64(h[16:]),
		Type:    typ,
		Payload: payload[:plen:plen],
	}
	if lag := binary.LittleEndian.Uint32(h[28:]); lag != lagUnknown && uint64(lag) < r.LSN {
		durableLSN = r.LSN - uint64(lag)
	}
	n = FrameSize(int(plen))
	if n > len(buf) {
		// The padding is missing: only possible at the very end of a buffer.
		n = len(buf)
	}
	return r, durableLSN, n, nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// SegmentHeader is the fixed header at the start of every segment file.
type SegmentHeader struct {
	Version   uint32 // FormatVersion
	FileID    uint64 // random, non-zero; every frame's CRC is seeded with it
	BaseLSN   uint64 // LSN of the segment's first record
	SizeBytes int64  // the preallocated file size
}

// EncodeSegmentHeader appends the SegmentHeaderSize-byte encoding of h to dst.
func EncodeSegmentHeader(dst []byte, h SegmentHeader) []byte {
	var b [SegmentHeaderSize]byte
	copy(b[0:8], segmentMagic[:])
	binary.LittleEndian.PutUint32(b[8:], h.Version)
	binary.LittleEndian.PutUint32(b[12:], SegmentHeaderSize)
	binary.LittleEndian.PutUint64(b[16:], h.FileID)
	binary.LittleEndian.PutUint64(b[24:], h.BaseLSN)
	binary.LittleEndian.PutUint64(b[32:], uint64(h.SizeBytes))
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
	return append(dst, b[:]...)
}

// DecodeSegmentHeader decodes the header at the start of a segment. An
// all-zero header yields ErrZero (a segment whose header never reached the
// disk); any other defect yields an error matching ErrBadHeader.
func DecodeSegmentHeader(buf []byte) (SegmentHeader, error) {
	if len(buf) < SegmentHeaderSize {
		return SegmentHeader{}, fmt.Errorf("%w: %d bytes, need %d", ErrBadHeader, len(buf), SegmentHeaderSize)
	}
	b := buf[:SegmentHeaderSize]
	if allZero(b) {
		return SegmentHeader{}, ErrZero
	}
	if [8]byte(b[0:8]) != segmentMagic {
		return SegmentHeader{}, fmt.Errorf("%w: bad magic %q", ErrBadHeader, b[0:8])
	}
	if got, want := binary.LittleEndian.Uint32(b[60:]), crc32.Checksum(b[:60], castagnoli); got != want {
		return SegmentHeader{}, fmt.Errorf("%w: checksum %08x, computed %08x", ErrBadHeader, got, want)
	}
	h := SegmentHeader{
		Version:   binary.LittleEndian.Uint32(b[8:]),
		FileID:    binary.LittleEndian.Uint64(b[16:]),
		BaseLSN:   binary.LittleEndian.Uint64(b[24:]),
		SizeBytes: int64(binary.LittleEndian.Uint64(b[32:])),
	}
	if h.Version != FormatVersion {
		return SegmentHeader{}, fmt.Errorf("%w: version %d, this build reads %d", ErrBadHeader, h.Version, FormatVersion)
	}
	if hs := binary.LittleEndian.Uint32(b[12:]); hs != SegmentHeaderSize {
		return SegmentHeader{}, fmt.Errorf("%w: header size %d, want %d", ErrBadHeader, hs, SegmentHeaderSize)
	}
	if h.FileID == 0 || h.BaseLSN == 0 {
		return SegmentHeader{}, fmt.Errorf("%w: zero file id or base LSN", ErrBadHeader)
	}
	if h.SizeBytes < SegmentHeaderSize+RecordHeaderSize || h.SizeBytes > int64(len(buf)) {
		return SegmentHeader{}, fmt.Errorf("%w: size %d bytes, file holds %d", ErrBadHeader, h.SizeBytes, len(buf))
	}
	return h, nil
}

// ScanResult describes how far a segment's records reach.
type ScanResult struct {
	Header  SegmentHeader
	Records int    // records decoded, all with consecutive LSNs from BaseLSN
	LastLSN uint64 // LSN of the last record, BaseLSN-1 if none
	End     int    // offset just past the last record
	// Stop says why scanning ended at End: nil when the segment is full (less
	// than a frame header left), ErrZero at unwritten space, or the error of
	// the frame found at End (ErrTorn, ErrCRC, ErrInvalid, ErrLSN).
	Stop error
}

// ScanSegment decodes the header of the segment image buf and then its
// records in order, calling fn (if non-nil) with each record and its offset.
// The payload passed to fn aliases buf. It stops at the first offset that does
// not hold the next record and reports why in ScanResult.Stop; the returned
// error is a header error or fn's error.
func ScanSegment(buf []byte, fn func(r Record, off int) error) (ScanResult, error) {
	h, err := DecodeSegmentHeader(buf)
	if err != nil {
		return ScanResult{}, err
	}
	buf = buf[:h.SizeBytes]
	res := ScanResult{Header: h, LastLSN: h.BaseLSN - 1, End: SegmentHeaderSize}
	seed := crcSeed(h.FileID)
	next := h.BaseLSN
	for {
		if len(buf)-res.End < RecordHeaderSize {
			if !allZero(buf[res.End:]) {
				res.Stop = ErrTorn
			}
			return res, nil
		}
		r, _, n, err := decodeFrame(buf[res.End:], seed)
		if err == nil && r.LSN != next {
			err = fmt.Errorf("%w: found %d, expected %d", ErrLSN, r.LSN, next)
		}
		if err != nil {
			res.Stop = err
			return res, nil
		}
		if fn != nil {
			if err := fn(r, res.End); err != nil {
				return res, err
			}
		}
		res.Records++
		res.LastLSN = next
		res.End += n
		next++
	}
}
