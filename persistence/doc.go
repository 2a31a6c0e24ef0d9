// Package persistence is kjob's journal: one write-ahead log per node,
// shared by every shard (stream) the node hosts, so that one group commit
// makes all their appends durable together. It holds preallocated,
// memory-mapped segment files, a record codec that works on []byte (the
// simulator runs the same code on simulated disks), group commit with one
// flusher, crash recovery, per-stream snapshots and compaction. It imports
// only the standard library, mmap-go and x/sys.
//
// # Files
//
// A journal directory holds:
//
//	LOCK                                   flock'd while a process has the journal open
//	00000000000000000001.seg               segments, named by base LSN (fixed width, so names sort)
//	snap-<stream %016x>-<lsn %020d>.snap   snapshots, the two newest per stream
//	*.tmp                                  a spare segment or an unfinished snapshot; deleted by Open
//	*.snap.corrupt                         a snapshot Open found damaged; kept for the operator
//
// # Segment header
//
// Every segment file starts with 64 bytes (little endian):
//
//	+-----+------+-------------+--------------------------------------------------------------+
//	| off | size | field       | why it exists                                                |
//	+-----+------+-------------+--------------------------------------------------------------+
//	|   0 |    8 | magic       | "kjobseg\0": a file that is not a segment is refused, not    |
//	|     |      |             | scanned                                                      |
//	|   8 |    4 | version     | format version (1), so a later format is refused instead of  |
//	|     |      |             | misread                                                      |
//	|  12 |    4 | header size | 64; lets a later version grow the header                     |
//	|  16 |    8 | file id     | random, non-zero, new for every file. Every frame's CRC is   |
//	|     |      |             | seeded with it, so bytes left by an older file (a reused or  |
//	|     |      |             | copied-over file) fail the CRC and are never read as records |
//	|  24 |    8 | base LSN    | LSN of the first record; must match the file name, and equal |
//	|     |      |             | the previous segment's last LSN + 1 (gap detection)          |
//	|  32 |    8 | size        | preallocated size; a file shorter than this was truncated    |
//	|  40 |   20 | reserved    | zero                                                         |
//	|  60 |    4 | header CRC  | CRC32C of bytes 0..59: a damaged header is an error, never   |
//	|     |      |             | a guess                                                      |
//	+-----+------+-------------+--------------------------------------------------------------+
//
// # Record frame
//
// Frames follow the header back to back, each starting at an offset that is
// a multiple of 8:
//
//	+-----+------+-------------+--------------------------------------------------------------+
//	| off | size | field       | why it exists                                                |
//	+-----+------+-------------+--------------------------------------------------------------+
//	|   0 |    4 | CRC         | CRC32C (Castagnoli) of file id ++ bytes 4..31 ++ payload:    |
//	|     |      |             | covers the header too (RocketMQ checks the body only), so a  |
//	|     |      |             | flipped length, LSN or stream is caught like a flipped       |
//	|     |      |             | payload bit                                                  |
//	|   4 |    4 | length      | payload length; the frame is 32+length rounded up to 8       |
//	|   8 |    8 | LSN         | gap-free, increasing across segments; orders the log and     |
//	|     |      |             | proves nothing is missing                                    |
//	|  16 |    8 | stream      | the shard the record belongs to: one log serves many streams |
//	|  24 |    1 | type        | 1..249 for callers, 250..255 journal-internal (255 = stream  |
//	|     |      |             | drop). 0 is invalid, so zeroed space is never a record       |
//	|  25 |    3 | reserved    | zero                                                         |
//	|  28 |    4 | sync lag    | LSN minus the durable LSN the writer knew (0xFFFFFFFF =      |
//	|     |      |             | unknown). Recovery uses it to tell damage to acknowledged    |
//	|     |      |             | records (an error) from a torn, never acknowledged tail      |
//	|  32 |    n | payload     | the caller's bytes (protobuf in kjob)                        |
//	|     |  pad | zero        | to a multiple of 8, so recovery can probe for frames after   |
//	|     |      |             | damage at 1/8 of the offsets                                 |
//	+-----+------+-------------+--------------------------------------------------------------+
//
// The unused rest of a segment is zero (fallocated and zero-filled, so that
// commits do not convert unwritten extents; only fallocated where a rollover
// found no spare ready, for segments over 1 GiB, and past the records of a
// segment reopened for appending), and a zero header ends
// the segment's records. A frame never straddles segments: a record that
// does not fit starts the next segment, and one larger than an empty
// segment is refused (RecordTooLargeError).
//
// # Snapshot file
//
//	+-----+------+-------------+--------------------------------------------------------------+
//	|   0 |    8 | magic       | "kjobsnap"                                                   |
//	|   8 |    4 | version     | 1                                                            |
//	|  12 |    4 | reserved    | zero                                                         |
//	|  16 |    8 | stream      | must match the file name: a misnamed file is not trusted     |
//	|  24 |    8 | LSN         | the snapshot covers the stream's records up to this LSN      |
//	|  32 |    8 | length      | data length: a short (torn) file is detected before the CRC  |
//	|  40 |    4 | CRC         | CRC32C of bytes 0..39 ++ data                                |
//	|  44 |    4 | reserved    | zero                                                         |
//	|  48 |    n | data        | the caller's state                                           |
//	+-----+------+-------------+--------------------------------------------------------------+
//
// Snapshots are written to a *.tmp file, fsynced, renamed, and the directory
// fsynced, so a crash leaves either the old set or the new one.
//
// # Recovery
//
// Open scans the segments in order. The log ends at the first offset that
// does not hold the next record (the cut). Open then probes everything after
// the cut for valid frames; their sync-lag fields say which LSNs their
// writers knew to be durable. If one proves the record expected at the cut
// was durable, acknowledged data is damaged: Open fails with a
// CorruptionError naming the file and offset (or, with
// TruncateOnCorruption, truncates there and logs it). Otherwise the bytes
// after the cut are a torn tail no acknowledgement covered: Open zeroes them,
// deletes later segment files, and reports the cut in RecoveryReport.
//
// # The codec without I/O
//
// AppendFrame, DecodeFrame, EncodeSegmentHeader, DecodeSegmentHeader and
// ScanSegment build and read segment images in memory; RecoverImages makes
// Open's recovery decision (what to keep, what to zero, what is corruption)
// on such images. The simulator runs its simulated disks through them, so
// its crashes are judged by the same rules as real ones. AppendRecord and
// DecodeRecord frame single records outside a segment (file id 0).
//
// # Limitations
//
//   - A damaged record with nothing valid after it is indistinguishable from
//     a torn write; it is truncated and reported, not refused.
//   - Sealed segments are not checked for non-zero garbage after their last
//     record; the next segment's base LSN must still follow without a gap.
//   - One process per directory (LOCK); the journal is not safe for use over
//     network file systems whose mmap or flock semantics differ.
package persistence
