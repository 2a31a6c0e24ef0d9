package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const (
	snapshotSuffix     = ".snap"
	corruptSuffix      = ".corrupt"
	snapshotHeaderSize = 48
	// snapshotsKept is how many snapshots of a stream stay on disk: the
	// newest, and the one to fall back to if the newest turns out corrupt.
	snapshotsKept = 2
)

var snapshotMagic = [8]byte{'k', 'j', 'o', 'b', 's', 'n', 'a', 'p'}

// ErrBadSnapshot is matched by errors about unreadable snapshot files.
var ErrBadSnapshot = errors.New("persistence: bad snapshot")

// openSnapshot is a snapshot read and checked at Open, kept for the first Replay so
// recovery reads each snapshot file once.
type openSnapshot struct {
	lsn  uint64
	data []byte
}

type snapInfo struct {
	lsn  uint64
	name string
}

func snapshotName(stream, lsn uint64) string {
	return fmt.Sprintf("snap-%016x-%020d%s", stream, lsn, snapshotSuffix)
}

// snapshotCopyName names a second snapshot of a stream at the same LSN as its
// newest (WriteSnapshot).
func snapshotCopyName(stream, lsn uint64) string {
	return fmt.Sprintf("snap-%016x-%020d%s%s", stream, lsn, snapshotCopyTag, snapshotSuffix)
}

const snapshotCopyTag = ".copy"

func parseSnapshotName(name string) (stream, lsn uint64, ok bool) {
	s, ok := strings.CutSuffix(name, snapshotSuffix)
	if !ok {
		return 0, 0, false
	}
	s, _ = strings.CutSuffix(s, snapshotCopyTag)
	s, ok = strings.CutPrefix(s, "snap-")
	if !ok || len(s) != 16+1+20 || s[16] != '-' {
		return 0, 0, false
	}
	stream, err1 := strconv.ParseUint(s[:16], 16, 64)
	lsn, err2 := strconv.ParseUint(s[17:], 10, 64)
	return stream, lsn, err1 == nil && err2 == nil
}

// EncodeSnapshot appends a snapshot file image to dst.
func EncodeSnapshot(dst []byte, stream, lsn uint64, data []byte) []byte {
	h := snapshotHeader(stream, lsn, data)
	dst = append(dst, h[:]...)
	return append(dst, data...)
}

// snapshotHeader is the header of a snapshot file holding data.
func snapshotHeader(stream, lsn uint64, data []byte) [snapshotHeaderSize]byte {
	var h [snapshotHeaderSize]byte
	copy(h[0:8], snapshotMagic[:])
	binary.LittleEndian.PutUint32(h[8:], FormatVersion)
	binary.LittleEndian.PutUint64(h[16:], stream)
	binary.LittleEndian.PutUint64(h[24:], lsn)
	binary.LittleEndian.PutUint64(h[32:], uint64(len(data)))
	crc := crc32.Update(0, castagnoli, h[:40])
	crc = crc32.Update(crc, castagnoli, data)
	binary.LittleEndian.PutUint32(h[40:], crc)
	return h
}

// DecodeSnapshot checks a snapshot file image and returns its contents; data
// aliases buf.
func DecodeSnapshot(buf []byte) (stream, lsn uint64, data []byte, err error) {
	if len(buf) < snapshotHeaderSize {
		return 0, 0, nil, fmt.Errorf("%w: %d bytes, shorter than the header", ErrBadSnapshot, len(buf))
	}
	h := buf[:snapshotHeaderSize]
	if [8]byte(h[0:8]) != snapshotMagic {
		return 0, 0, nil, fmt.Errorf("%w: bad magic", ErrBadSnapshot)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != FormatVersion {
		return 0, 0, nil, fmt.Errorf("%w: version %d", ErrBadSnapshot, v)
	}
	n := binary.LittleEndian.Uint64(h[32:])
	if n != uint64(len(buf)-snapshotHeaderSize) {
		return 0, 0, nil, fmt.Errorf("%w: header says %d data bytes, file has %d", ErrBadSnapshot, n, len(buf)-snapshotHeaderSize)
	}
	data = buf[snapshotHeaderSize:]
	crc := crc32.Update(0, castagnoli, h[:40])
	crc = crc32.Update(crc, castagnoli, data)
	if crc != binary.LittleEndian.Uint32(h[40:]) {
		return 0, 0, nil, fmt.Errorf("%w: checksum mismatch", ErrBadSnapshot)
	}
	return binary.LittleEndian.Uint64(h[16:]), binary.LittleEndian.Uint64(h[24:]), data, nil
}

// readSnapshotFile reads and checks one snapshot file against its name. The buffer
// is sized from the file (io.ReadAll's doubling costs a large snapshot several copies
// and clears).
func readSnapshotFile(f *os.File, name string) ([]byte, error) {
	var buf []byte
	if st, err := f.Stat(); err == nil && st.Size() > 0 && st.Size() < 1<<40 {
		buf = make([]byte, st.Size())
		n, err := io.ReadFull(f, buf)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("persistence: read %s: %w", name, err)
		}
		buf = buf[:n]
		// A file that grew since Stat is read to its end, as before.
		rest, err := io.ReadAll(f)
		if err != nil {
			return nil, fmt.Errorf("persistence: read %s: %w", name, err)
		}
		buf = append(buf, rest...)
	} else {
		var err error
		if buf, err = io.ReadAll(f); err != nil {
			return nil, fmt.Errorf("persistence: read %s: %w", name, err)
		}
	}
	stream, lsn, data, err := DecodeSnapshot(buf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if ns, nl, _ := parseSnapshotName(name); ns != stream || nl != lsn {
		return nil, fmt.Errorf("%w: %s holds stream %d at LSN %d", ErrBadSnapshot, name, stream, lsn)
	}
	return data, nil
}

func (j *Journal) readSnapshot(name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(j.dirPath, name))
	if err != nil {
		return nil, fmt.Errorf("persistence: %w", err)
	}
	defer f.Close()
	return readSnapshotFile(f, name)
}

// loadSnapshots picks, at Open, each stream's usable snapshots. A corrupt
// file is renamed *.corrupt (kept for the operator, ignored from then on)
// and the next older one is used. It reports whether it changed the
// directory.
func (j *Journal) loadSnapshots(names []string) (changed bool, err error) {
	byStream := map[uint64][]snapInfo{}
	for _, n := range names {
		stream, lsn, ok := parseSnapshotName(n)
		if !ok {
			return changed, fmt.Errorf("persistence: unexpected file %s in %s", n, j.dirPath)
		}
		byStream[stream] = append(byStream[stream], snapInfo{lsn: lsn, name: n})
	}
	firstLSN := j.next // the oldest LSN still in the log
	if len(j.segs) > 0 {
		firstLSN = j.segs[0].idx.firstLSN
	}
	lastLSN := j.next - 1
	remove := func(name string) error {
		changed = true
		if err := os.Remove(filepath.Join(j.dirPath, name)); err != nil {
			return fmt.Errorf("persistence: remove %s: %w", name, err)
		}
		return nil
	}
	streams := make([]uint64, 0, len(byStream))
	for s := range byStream {
		streams = append(streams, s)
	}
	slices.Sort(streams)
	for _, stream := range streams {
		infos := byStream[stream]
		slices.SortFunc(infos, func(a, b snapInfo) int {
			if c := cmpU64(a.lsn, b.lsn); c != 0 {
				return -c
			}
			return strings.Compare(a.name, b.name) // a copy at the same LSN: either will do
		})
		var valid []snapInfo
		skipped := false
		for _, in := range infos {
			if d, ok := j.drops[stream]; ok && in.lsn < d {
				// Left behind by a DropStream that crashed before deleting it.
				if err := remove(in.name); err != nil {
					return changed, err
				}
				continue
			}
			if len(valid) == snapshotsKept {
				if err := remove(in.name); err != nil {
					return changed, err
				}
				continue
			}
			data, rerr := j.readSnapshot(in.name)
			if rerr == nil && in.lsn > lastLSN && len(j.segs) > 0 {
				rerr = fmt.Errorf("%w: %s covers LSN %d but the journal ends at %d", ErrBadSnapshot, in.name, in.lsn, lastLSN)
				if !j.opts.TruncateOnCorruption {
					return changed, rerr
				}
			}
			if rerr != nil {
				j.log.Error("unusable snapshot, falling back to an older one", "file", in.name, "err", rerr)
				changed = true
				if err := os.Rename(filepath.Join(j.dirPath, in.name), filepath.Join(j.dirPath, in.name+corruptSuffix)); err != nil {
					return changed, fmt.Errorf("persistence: rename %s: %w", in.name, err)
				}
				if len(valid) == 0 {
					skipped = true
				}
				continue
			}
			if len(valid) == 0 && rerr == nil {
				// The newest one is what Replay loads next: keep it for that.
				j.openSnaps[stream] = openSnapshot{lsn: in.lsn, data: data}
			}
			valid = append(valid, in)
		}
		if skipped {
			j.report.FallbackSnapshots++
			if len(valid) == 0 && firstLSN > 1 {
				err := fmt.Errorf("%w: stream %d has no usable snapshot and the journal no longer holds LSNs before %d", ErrCorrupt, stream, firstLSN)
				if !j.opts.TruncateOnCorruption {
					return changed, err
				}
				j.log.Error("replaying a stream without its history on operator request", "err", err)
			}
		}
		if len(valid) > 0 {
			j.snaps[stream] = valid
			j.report.Snapshots++
		}
	}
	return changed, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// WriteSnapshot stores data as stream's state covering every record of the
// stream with an LSN up to lsn. It first waits until lsn is durable (a
// snapshot must never be ahead of the log it summarizes), then writes a
// temporary file, fsyncs it, renames it into place and fsyncs the directory.
// The two newest snapshots of a stream are kept. A snapshot at the LSN of the
// stream's newest is kept as a second copy (once: a third is not written), which
// lets Compact release the records up to that LSN.
func (j *Journal) WriteSnapshot(stream, lsn uint64, data []byte) error {
	j.snapMu.Lock()
	defer j.snapMu.Unlock()
	j.mu.Lock()
	err := j.usable()
	last := j.next - 1
	var newest uint64
	name := snapshotName(stream, lsn)
	if infos := j.snaps[stream]; len(infos) > 0 {
		newest = infos[0].lsn
		if newest == lsn {
			// A second snapshot at the newest's LSN: Compact releases a stream's
			// records only up to its older retained snapshot, so a shard that
			// appends nothing after a snapshot (an app gone quiet) would pin them,
			// and every segment after them, for as long as it stays quiet. A copy
			// under another name is the fallback the older one was for.
			if err == nil && len(infos) >= snapshotsKept && infos[snapshotsKept-1].lsn == lsn {
				j.mu.Unlock()
				return nil // two already
			}
			if infos[0].name == name {
				name = snapshotCopyName(stream, lsn)
			}
		}
	}
	drop := j.drops[stream]
	j.mu.Unlock()
	switch {
	case err != nil:
		return err
	case lsn == 0 || lsn > last:
		return fmt.Errorf("%w: snapshot LSN %d, journal holds 1..%d", ErrBadLSN, lsn, last)
	case lsn < newest:
		return fmt.Errorf("%w: snapshot LSN %d is older than stream %d's newest snapshot at %d", ErrBadLSN, lsn, stream, newest)
	case lsn < drop:
		return fmt.Errorf("%w: snapshot LSN %d is older than stream %d's drop at %d", ErrBadLSN, lsn, stream, drop)
	}
	if err := j.waitDurable(lsn); err != nil {
		return err
	}
	tmp := name + tmpSuffix
	h := snapshotHeader(stream, lsn, data) // written ahead of data: no copy of a large snapshot
	if err := writeFileSynced(filepath.Join(j.dirPath, tmp), h[:], data); err != nil {
		os.Remove(filepath.Join(j.dirPath, tmp))
		return err
	}
	if err := os.Rename(filepath.Join(j.dirPath, tmp), filepath.Join(j.dirPath, name)); err != nil {
		return fmt.Errorf("persistence: rename %s: %w", tmp, err)
	}
	if err := syncDir(j.dir); err != nil {
		return err
	}
	j.mu.Lock()
	infos := append([]snapInfo{{lsn: lsn, name: name}}, j.snaps[stream]...)
	infos = slices.CompactFunc(infos, func(a, b snapInfo) bool { return a.name == b.name })
	var old []snapInfo
	if len(infos) > snapshotsKept {
		old = slices.Clone(infos[snapshotsKept:])
		infos = infos[:snapshotsKept]
	}
	j.snaps[stream] = infos
	j.mu.Unlock()
	for _, in := range old {
		if err := os.Remove(filepath.Join(j.dirPath, in.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			j.log.Warn("cannot remove old snapshot", "file", in.name, "err", err)
		}
	}
	return nil
}

func writeFileSynced(path string, parts ...[]byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("persistence: %w", err)
	}
	for _, b := range parts {
		if _, err := f.Write(b); err != nil {
			f.Close()
			return fmt.Errorf("persistence: write %s: %w", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("persistence: fsync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("persistence: close %s: %w", path, err)
	}
	return nil
}

// LatestSnapshot returns stream's newest snapshot, or lsn 0 and nil data if
// it has none. Use it with ReadStream(stream, lsn+1, ...) to ship a stream.
func (j *Journal) LatestSnapshot(stream uint64) (lsn uint64, data []byte, err error) {
	j.snapMu.Lock()
	defer j.snapMu.Unlock()
	j.mu.Lock()
	if err := j.usable(); err != nil && !errors.Is(err, ErrSyncFailed) {
		j.mu.Unlock()
		return 0, nil, err
	}
	infos := j.snaps[stream]
	j.mu.Unlock()
	if len(infos) == 0 {
		return 0, nil, nil
	}
	data, err = j.readSnapshot(infos[0].name)
	if err != nil {
		return 0, nil, err
	}
	return infos[0].lsn, data, nil
}
