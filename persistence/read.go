package persistence

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// prefetchChunkBytes is how much of a mapped segment prefetch brings in at a
// time: small enough that the reader, which follows, is never far behind.
const prefetchChunkBytes = 4 << 20

// prefetch brings the mapped pages of views into the page cache and the
// process's page tables (MADV_POPULATE_READ), in order, a chunk at a time,
// in a goroutine, ahead of a reader going through them: otherwise the reader
// takes a page fault every few pages and, when the journal is not in the page
// cache (after a reboot, or once the kernel dropped it), a small synchronous
// read with each. Replaying 1,000,000 records (128 MiB) from a cold cache,
// the faults cost more than decoding them. It returns a function that stops
// the goroutine and waits for it, which the caller calls before it lets the
// segments go. Where the advice is not supported, the first chunk's error
// ends the goroutine and the reader faults as before.
func prefetch(views []segView) (stop func()) {
	var bufs [][]byte
	for _, v := range views {
		if v.s.mm != nil && v.end > 0 { // mapped (not the pwrite backend's memory)
			bufs = append(bufs, v.s.buf[:v.end])
		}
	}
	if len(bufs) == 0 {
		return func() {}
	}
	var stopped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, buf := range bufs {
			for off := 0; off < len(buf); off += prefetchChunkBytes {
				if stopped.Load() {
					return
				}
				if unix.Madvise(buf[off:min(off+prefetchChunkBytes, len(buf))], unix.MADV_POPULATE_READ) != nil {
					return
				}
			}
		}
	}()
	return func() {
		stopped.Store(true)
		<-done
	}
}

type segView struct {
	s   *segment
	end int
}

// view copies, under j.mu, what a reader needs: the segments and how far
// they are written, the durable limit, and (if stream is set) which segments
// hold the stream at or after from. The caller holds j.rw shared.
func (j *Journal) view(stream *uint64, from uint64) (views []segView, limit uint64, drops map[uint64]uint64, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, 0, nil, ErrClosed
	}
	limit = j.durable.Load()
	for _, s := range j.segs {
		if stream != nil {
			if maxLSN, ok := s.idx.streams[*stream]; !ok || maxLSN < from {
				continue
			}
		}
		views = append(views, segView{s: s, end: s.idx.end})
	}
	return views, limit, maps.Clone(j.drops), nil
}

// iterate decodes, checksum included, every record of views up to limit.
func iterate(views []segView, limit uint64, fn func(Record) error) error {
	defer prefetch(views)()
	for _, v := range views {
		buf := v.s.buf[:v.end]
		next := v.s.idx.firstLSN
		for off := SegmentHeaderSize; off < v.end; {
			r, _, n, err := decodeFrame(buf[off:], v.s.seed)
			if err == nil && r.LSN != next {
				err = fmt.Errorf("%w: found %d, expected %d", ErrLSN, r.LSN, next)
			}
			if err != nil {
				return &CorruptionError{File: v.s.name, Offset: int64(off), Reason: "reading: " + err.Error()}
			}
			if r.LSN > limit {
				return nil
			}
			if err := fn(r); err != nil {
				return err
			}
			off += n
			next++
		}
	}
	return nil
}

// Replay hands the journal's contents to the caller: first, for each stream
// with a snapshot, in ascending stream order, onSnapshot(stream, lsn, data);
// then, in global LSN order, onRecord for every durable record whose LSN is
// greater than its stream's snapshot LSN. Records of dropped streams and the
// journal's internal records are skipped. Either callback may be nil; an
// error from one stops the replay and is returned. A Record's Payload aliases
// the mapping and is valid only during the call; snapshot data is the
// caller's. Callbacks may Append but must not call Compact or Close.
func (j *Journal) Replay(onSnapshot func(stream, lsn uint64, data []byte) error, onRecord func(Record) error) error {
	// Open the newest snapshot files first, under snapMu, so a concurrent
	// WriteSnapshot cannot delete one between choosing and reading it.
	// A snapshot Open already read and checked is used as read (the first Replay
	// after Open, which is recovery's): recovery reads each file once.
	type openSnap struct {
		stream, lsn uint64
		f           *os.File
		name        string
		data        []byte // read at Open; f is nil
	}
	j.snapMu.Lock()
	j.mu.Lock()
	streams := slices.Sorted(maps.Keys(j.snaps))
	var opened []openSnap
	for _, s := range streams {
		in := j.snaps[s][0]
		o := openSnap{stream: s, lsn: in.lsn, name: in.name}
		if c, ok := j.openSnaps[s]; ok && c.lsn == in.lsn {
			o.data = c.data
		}
		opened = append(opened, o)
	}
	j.mu.Unlock()
	clear(j.openSnaps)
	var err error
	for i := range opened {
		if opened[i].data != nil {
			continue
		}
		if opened[i].f, err = os.Open(filepath.Join(j.dirPath, opened[i].name)); err != nil {
			break
		}
	}
	j.snapMu.Unlock()
	defer func() {
		for _, o := range opened {
			if o.f != nil {
				o.f.Close()
			}
		}
	}()
	if err != nil {
		return fmt.Errorf("persistence: %w", err)
	}

	j.rw.RLock()
	defer j.rw.RUnlock()
	views, limit, drops, err := j.view(nil, 0)
	if err != nil {
		return err
	}
	snapLSN := make(map[uint64]uint64, len(opened))
	for i, o := range opened {
		data := o.data
		opened[i].data = nil // let the GC have it once the callback is done with it
		if data == nil {
			var err error
			if data, err = readSnapshotFile(o.f, o.name); err != nil {
				return err
			}
		}
		snapLSN[o.stream] = o.lsn
		if onSnapshot != nil {
			if err := onSnapshot(o.stream, o.lsn, data); err != nil {
				return err
			}
		}
	}
	return iterate(views, limit, func(r Record) error {
		if r.Type > MaxUserType {
			return nil
		}
		if len(snapLSN) > 0 && r.LSN <= snapLSN[r.Stream] {
			return nil
		}
		if len(drops) > 0 && r.LSN < drops[r.Stream] {
			return nil
		}
		if onRecord == nil {
			return nil
		}
		return onRecord(r)
	})
}

// ReadStream calls fn, in LSN order, for every durable record of stream with
// an LSN of at least fromLSN that the journal still holds (compaction removes
// what snapshots cover; see LatestSnapshot). Records before the stream's
// latest DropStream are skipped. A Record's Payload aliases the mapping and
// is valid only during the call. fn must not call Compact or Close.
func (j *Journal) ReadStream(stream, fromLSN uint64, fn func(Record) error) error {
	j.rw.RLock()
	defer j.rw.RUnlock()
	views, limit, drops, err := j.view(&stream, fromLSN)
	if err != nil {
		return err
	}
	drop := drops[stream]
	return iterate(views, limit, func(r Record) error {
		if r.Stream != stream || r.LSN < fromLSN || r.LSN < drop || r.Type > MaxUserType {
			return nil
		}
		return fn(r)
	})
}
