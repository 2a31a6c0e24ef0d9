package persistence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// SyncPolicy says when appended records are made durable.
type SyncPolicy int

const (
	// SyncAlways (the default) msyncs as soon as records are appended: one
	// flusher syncs whatever has accumulated since its last sync (group
	// commit), and a record is acknowledged only after that msync returned.
	SyncAlways SyncPolicy = iota
	// SyncInterval msyncs every Options.SyncIntervalMs milliseconds, like an
	// asynchronous broker flush; acknowledgements wait for that flush.
	SyncInterval
	// SyncNone never syncs: records are "durable" once copied into the page
	// cache. They survive a process crash but not a machine crash. Tests only.
	SyncNone
)

func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "sync"
	case SyncInterval:
		return "interval"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncPolicy(%d)", int(p))
}

// Defaults and limits.
const (
	DefaultSegmentSizeBytes = 64 << 20
	MinSegmentSizeBytes     = 4096
	DefaultSyncIntervalMs   = 10
)

// Options configure Open.
type Options struct {
	Dir              string
	SegmentSizeBytes int64 // default 64 MiB; at least MinSegmentSizeBytes
	Sync             SyncPolicy
	SyncIntervalMs   int // for SyncInterval, default 10
	// TruncateOnCorruption makes Open truncate the log at a corruption
	// instead of failing: records from there on are lost. An operator's
	// choice, never a default; the report and the log say where.
	TruncateOnCorruption bool
	Logger               *slog.Logger // may be nil
	// AfterFunc is the timer of lazy appends' deadlines (AppendWithin): nil for
	// time.AfterFunc. A node gives it the shards' precise alarm clock, since an
	// idle Go runtime wakes its timers up to a millisecond late.
	AfterFunc func(d time.Duration, fn func()) interface{ Stop() bool }
	// OnSync, if set, is told how long each group commit's syncs took (the
	// msyncs of its segments, and a directory fsync when a segment was new),
	// when they ended, on the flusher's goroutine: it must return quickly. A
	// failed sync is not reported here (the journal stops; Err says why).
	OnSync func(took time.Duration, at time.Time)
	// FailSync is a test process's fault injection (a node sets it from
	// KJOB_TEST_FAIL_SYNC_FILE): asked before every sync, an error it returns fails
	// that sync as the disk's would, and the journal stops. Nil in production.
	FailSync func() error
	// FailSegment is a test process's fault injection (a node sets it from
	// KJOB_TEST_NO_SPACE_FILE): asked before every new segment is made, an error
	// it returns fails that segment as a full disk's fallocate would. Nil in
	// production.
	FailSegment func() error

	backend    backend // tests and benchmarks only
	noZeroFill bool    // tests only: segments only fallocated, as a rollover that finds no spare makes them
}

// Entry is one record to append; the journal assigns its LSN.
type Entry struct {
	Stream  uint64
	Type    uint8 // MinUserType..MaxUserType
	Payload []byte
}

// RecoveryReport says what Open found.
type RecoveryReport struct {
	Segments          int    // segment files kept
	Records           uint64 // records in them (internal ones included)
	LastLSN           uint64 // highest LSN recovered (0 for an empty journal)
	TruncatedBytes    int64  // bytes dropped from the torn tail (or at a corruption, on request)
	TruncatedAt       string // "file:offset" of the cut, or ""
	Snapshots         int    // streams whose snapshot was loaded
	FallbackSnapshots int    // streams whose newest snapshot was unusable, so an older one (or none) was used
}

// Errors returned by the journal.
var (
	// ErrClosed is returned by calls on a closed journal.
	ErrClosed = errors.New("persistence: journal closed")
	// ErrSyncFailed is matched by the fatal error a failed msync or fsync
	// leaves behind. Nothing is retried: after a failed sync the page cache
	// may claim data the disk never took.
	ErrSyncFailed = errors.New("persistence: sync failed, journal stopped")
	// ErrLocked means another process has the journal directory open.
	ErrLocked = errors.New("persistence: journal directory is locked by another process")
	// ErrNoEntries means Append was called with nothing to append.
	ErrNoEntries = errors.New("persistence: no entries to append")
	// ErrBadLSN means an LSN argument is outside what the journal holds.
	ErrBadLSN = errors.New("persistence: LSN out of range")
	// ErrNoSegment is matched by the fatal error of a rollover that found no
	// spare segment and could not make one (a full disk): the journal stops, as
	// on a failed sync, rather than leave its callers refused one by one.
	ErrNoSegment = errors.New("persistence: cannot make the next segment, journal stopped")
)

// NoRoomError is Room's answer while the journal is short of disk: no spare
// segment is ready, the last attempt to make one failed (Err), and the active
// segment has less than its reserve left. The reserve is for what the journal's
// callers have accepted already (a shard's fires and results); new work should
// be refused until a spare is made again (retried every SpareRetry).
type NoRoomError struct {
	Dir          string
	LeftBytes    int // what is left in the active segment
	ReserveBytes int // Room's threshold: a segment's ReserveDivisor-th part
	Err          error
}

func (e *NoRoomError) Error() string {
	return fmt.Sprintf("journal in %s is out of disk space: cannot make its next segment (%v), and its active segment has %d bytes left, under the %d kept for work already accepted",
		e.Dir, e.Err, e.LeftBytes, e.ReserveBytes)
}

func (e *NoRoomError) Unwrap() error { return e.Err }

const (
	// ReserveDivisor: Room reports no room once a segment's ReserveDivisor-th
	// part is all that is left of the active one (8 MiB of 64) with no spare.
	ReserveDivisor = 8
	// SpareRetry is how often a spare that could not be made is tried again.
	SpareRetry = time.Second
)

type waiter struct {
	last uint64
	cb   func(lastLSN uint64, err error)
}

type syncJob struct {
	s        *segment
	from, to int
	dir      bool
}

// Journal is a node's write-ahead log: a directory of preallocated, mapped
// segment files holding the records of many streams under one gap-free LSN
// sequence, plus per-stream snapshots.
//
// Durability contract. A record is durable once the msync (or fsync) that
// covers it has returned; under SyncAlways nothing is acknowledged earlier.
// Append returns once the record is in the mapping and its callback fires
// once that record and every record before it are durable, so
// acknowledgements come in LSN order. A failed sync is fatal: every pending
// and later caller gets the error, and nothing is retried. After a crash,
// Open recovers every acknowledged record; what it drops is only a tail that
// no acknowledgement covered, and it says so in Report. Damage it cannot
// prove unacknowledged is an error naming the file and offset.
//
// Concurrency. Appenders serialize on one mutex only to assign LSNs and copy
// bytes into the mapping; a single flusher goroutine takes the dirty ranges
// accumulated meanwhile, syncs them outside the mutex, publishes the durable
// LSN and runs the callbacks:
//
//	append:  lock; lsn = next++; copy frame into mapping; queue cb; unlock; kick flusher
//	flusher: lock; take dirty ranges and queued cbs; unlock
//	         msync ranges (+ fsync dir for new segments)
//	         durable = last LSN taken; run cbs
//
// A reader holds an RWMutex shared while it reads mappings, so compaction
// never unmaps a segment under it; the flusher takes no lock while it syncs,
// so a reader's callback may append and wait.
type Journal struct {
	opts       Options
	dirPath    string
	log        *slog.Logger
	dir        *os.File
	lock       *os.File
	maxPayload int

	mu          sync.Mutex
	segs        []*segment // oldest first; the last one is active
	next        uint64     // next LSN to assign
	waiters     []waiter
	idleWaiters []waiter // the flusher's spare buffer
	dirty       []*segment
	fatal       error
	failed      chan struct{} // closed when fatal is set
	closed      bool
	urgent      bool                    // something appended or waited for since the last flush wants its sync now
	lazyBy      time.Time               // the earliest deadline of lazy appends since the last flush (zero: none)
	snaps       map[uint64][]snapInfo   // per stream, newest first, at most two
	drops       map[uint64]uint64       // stream -> LSN of its latest tombstone
	openSnaps   map[uint64]openSnapshot // the snapshots read at Open, until the first Replay (snapMu)

	durable atomic.Uint64
	last    atomic.Uint64
	syncs   atomic.Uint64 // flushes that synced something (Syncs)

	rw     sync.RWMutex // shared by readers of mappings, exclusive to unmap
	snapMu sync.Mutex   // serializes WriteSnapshot, DropStream and Compact

	kick      chan struct{}
	spares    chan *segment
	spareErr  atomic.Pointer[error] // why the last spare could not be made; nil once one is
	needSpare chan struct{}
	ahead     chan syncJob // flusher -> aheadLoop: where a group commit's sync ended
	stop      chan struct{}
	wg        sync.WaitGroup
	jobs      []syncJob // flusher-owned

	report RecoveryReport

	// Seams for tests.
	syncRange func(s *segment, from, to int) error
	syncDirFn func() error
}

// Open opens (creating if needed) the journal in opts.Dir and recovers it:
// it scans the segments, truncates a torn tail, and loads the snapshots. See
// Report for what it found.
func Open(opts Options) (*Journal, error) {
	if opts.Dir == "" {
		return nil, errors.New("persistence: Options.Dir is empty")
	}
	if opts.SegmentSizeBytes == 0 {
		opts.SegmentSizeBytes = DefaultSegmentSizeBytes
	}
	if opts.SegmentSizeBytes < MinSegmentSizeBytes || opts.SegmentSizeBytes > 1<<40 {
		return nil, fmt.Errorf("persistence: Options.SegmentSizeBytes %d outside [%d, %d]", opts.SegmentSizeBytes, MinSegmentSizeBytes, int64(1<<40))
	}
	if opts.Sync < SyncAlways || opts.Sync > SyncNone {
		return nil, fmt.Errorf("persistence: unknown Options.Sync %d", int(opts.Sync))
	}
	if opts.SyncIntervalMs <= 0 {
		opts.SyncIntervalMs = DefaultSyncIntervalMs
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("persistence: %w", err)
	}
	j := &Journal{
		opts:       opts,
		failed:     make(chan struct{}),
		dirPath:    opts.Dir,
		log:        log.With("journal", opts.Dir),
		maxPayload: MaxPayloadBytes(opts.SegmentSizeBytes),
		snaps:      map[uint64][]snapInfo{},
		drops:      map[uint64]uint64{},
		openSnaps:  map[uint64]openSnapshot{},
		kick:       make(chan struct{}, 1),
		spares:     make(chan *segment, 1),
		needSpare:  make(chan struct{}, 1),
		ahead:      make(chan syncJob, 1),
		stop:       make(chan struct{}),
	}
	j.syncRange = func(s *segment, from, to int) error { return s.sync(from, to) }
	j.syncDirFn = func() error { return syncDir(j.dir) }
	if err := j.openDir(); err != nil {
		return nil, err
	}
	if err := j.recover(); err != nil {
		j.releaseAll()
		return nil, err
	}
	j.wg.Add(3)
	go j.flushLoop()
	go j.prepareLoop()
	go j.aheadLoop()
	j.requestSpare()
	return j, nil
}

func (j *Journal) openDir() error {
	d, err := os.Open(j.dirPath)
	if err != nil {
		return fmt.Errorf("persistence: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(j.dirPath, "LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		d.Close()
		return fmt.Errorf("persistence: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		d.Close()
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s", ErrLocked, j.dirPath)
		}
		return fmt.Errorf("persistence: lock %s: %w", j.dirPath, err)
	}
	j.dir, j.lock = d, lock
	return nil
}

// recover runs at Open, before any goroutine starts.
func (j *Journal) recover() error {
	names, err := j.dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("persistence: read %s: %w", j.dirPath, err)
	}
	slices.Sort(names)
	var segNames []string
	var snapNames []string
	removedTmp := false
	for _, n := range names {
		switch {
		case strings.HasSuffix(n, tmpSuffix):
			// A spare segment or an unfinished snapshot: never part of the log.
			if err := os.Remove(filepath.Join(j.dirPath, n)); err != nil {
				return fmt.Errorf("persistence: remove %s: %w", n, err)
			}
			removedTmp = true
		case strings.HasSuffix(n, segmentSuffix):
			if _, ok := parseSegmentName(n); !ok {
				return fmt.Errorf("persistence: unexpected file %s in %s", n, j.dirPath)
			}
			segNames = append(segNames, n) // sorted by base: fixed-width names
		case strings.HasSuffix(n, snapshotSuffix):
			snapNames = append(snapNames, n)
		}
	}
	segs := make([]*segment, 0, len(segNames))
	imgs := make([]segImage, 0, len(segNames))
	for _, n := range segNames {
		s, err := openSegmentFile(j.dirPath, n)
		if err != nil {
			for _, s := range segs {
				s.release()
			}
			return err
		}
		base, _ := parseSegmentName(n)
		segs = append(segs, s)
		imgs = append(imgs, segImage{name: n, base: base, buf: s.buf})
	}
	j.segs = segs // released by releaseAll on failure
	plan, err := planRecovery(imgs, j.opts.TruncateOnCorruption)
	if err != nil {
		return err
	}
	if plan.corruption != nil {
		j.log.Error("truncating journal at corruption on operator request", "err", plan.corruption, "truncated_bytes", plan.truncatedBytes)
	}
	changed := removedTmp
	// Delete what lies after the cut, newest first.
	for k := len(segs) - 1; k >= len(plan.kept); k-- {
		segs[k].release()
		if err := os.Remove(filepath.Join(j.dirPath, segs[k].name)); err != nil {
			return fmt.Errorf("persistence: remove %s: %w", segs[k].name, err)
		}
		changed = true
	}
	segs = segs[:len(plan.kept)]
	j.segs = segs
	for k, s := range segs {
		s.idx = plan.kept[k]
		s.seed = crcSeed(s.idx.hdr.FileID)
		// Trim the image to the header's size: bytes past it are not ours.
		s.buf = s.buf[:s.idx.hdr.SizeBytes]
		s.synced = s.idx.end
	}
	if len(segs) > 0 {
		active := segs[len(segs)-1]
		if err := active.makeWritable(j.opts.backend); err != nil {
			return err
		}
		active.buf = active.buf[:active.idx.hdr.SizeBytes]
		if plan.zeroTo > plan.zeroFrom {
			j.log.Warn("truncating torn journal tail", "at", plan.truncatedAt, "bytes", plan.truncatedBytes)
			clear(active.buf[plan.zeroFrom:plan.zeroTo])
			active.synced = plan.zeroFrom
		}
		// Recovered records may still be only in the page cache (the process
		// crashed, the machine did not): make them durable before anyone is
		// told they are.
		for _, s := range segs {
			if s == active {
				if err := s.sync(0, max(s.idx.end, plan.zeroTo)); err != nil {
					return err
				}
				s.synced = s.idx.end
			} else if err := s.f.Sync(); err != nil {
				return fmt.Errorf("persistence: fsync %s: %w", s.name, err)
			}
		}
	}
	j.next = plan.nextLSN
	j.drops = plan.drops
	j.report = RecoveryReport{
		Segments:       len(segs),
		Records:        plan.records,
		TruncatedBytes: plan.truncatedBytes,
		TruncatedAt:    plan.truncatedAt,
	}
	snapChanged, err := j.loadSnapshots(snapNames)
	if err != nil {
		return err
	}
	changed = changed || snapChanged
	if len(j.segs) == 0 {
		// An empty journal, or one whose every segment was cut away: start
		// past every LSN a snapshot has seen so no LSN is ever reused.
		for _, infos := range j.snaps {
			j.next = max(j.next, infos[0].lsn+1)
		}
		s, err := j.createSpare(j.zeroing(&zeroing{})) // nothing to pace yet
		if err != nil {
			return err
		}
		if err := s.activate(j.dirPath, j.next); err != nil {
			s.release()
			return err
		}
		j.segs = append(j.segs, s)
		if err := s.sync(0, SegmentHeaderSize); err != nil {
			return err
		}
		s.synced, s.needDirSync = SegmentHeaderSize, false
		changed = true
	}
	if changed {
		if err := syncDir(j.dir); err != nil {
			return err
		}
	}
	j.report.LastLSN = j.next - 1
	j.durable.Store(j.next - 1)
	j.last.Store(j.next - 1)
	j.log.Info("journal recovered", "segments", j.report.Segments, "records", j.report.Records,
		"last_lsn", j.report.LastLSN, "truncated_bytes", j.report.TruncatedBytes, "snapshots", j.report.Snapshots)
	return nil
}

// releaseAll closes everything Open acquired; for failed Opens and Close.
func (j *Journal) releaseAll() error {
	var err error
	for _, s := range j.segs {
		err = errors.Join(err, s.release())
	}
	j.segs = nil
	if j.lock != nil {
		unix.Flock(int(j.lock.Fd()), unix.LOCK_UN)
		err = errors.Join(err, j.lock.Close())
		j.lock = nil
	}
	if j.dir != nil {
		err = errors.Join(err, j.dir.Close())
		j.dir = nil
	}
	return err
}

// Report returns what Open found.
func (j *Journal) Report() RecoveryReport { return j.report }

// RecordsAfter is an upper bound on the records of stream with an LSN above lsn
// that the journal held when it was opened: those of the stream in every segment
// that holds a record above lsn (records appended since Open are not counted).
// Recovery sizes a stream's tables by it before it replays the stream.
func (j *Journal) RecordsAfter(stream, lsn uint64) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, s := range j.segs {
		if s.idx.lastLSN > lsn {
			n += s.idx.opened[stream]
		}
	}
	return n
}

// Syncs is how many group commits the journal has made: flushes that msynced or
// fsynced something. Records appended per sync is the group commit's gain.
func (j *Journal) Syncs() uint64 { return j.syncs.Load() }

// Segments is how many segment files the log holds, the active one included (the
// spare being zero-filled is not counted).
func (j *Journal) Segments() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.segs)
}

// DurableLSN returns the highest LSN known durable.
func (j *Journal) DurableLSN() uint64 { return j.durable.Load() }

// LastLSN returns the highest LSN assigned.
func (j *Journal) LastLSN() uint64 { return j.last.Load() }

// Failed is closed when the journal stops on a failed sync, or on a rollover that
// could not make its segment (Err then says why).
func (j *Journal) Failed() <-chan struct{} { return j.failed }

// Err returns the fatal error that stopped the journal, or nil.
func (j *Journal) Err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.fatal
}

// usable reports why the journal cannot take appends; j.mu must be held.
func (j *Journal) usable() error {
	if j.fatal != nil {
		return j.fatal
	}
	if j.closed {
		return ErrClosed
	}
	return nil
}

// Append assigns consecutive LSNs to entries and copies them into the
// mapping; it does not wait for the disk. cb, if not nil, is called exactly
// once from the flusher goroutine: with lastLSN once every entry is durable,
// or with the fatal error. cb must not block; it runs in LSN order with the
// other callbacks. If Append returns an error nothing was appended and cb is
// never called. The entries' payloads are copied before Append returns.
func (j *Journal) Append(entries []Entry, cb func(lastLSN uint64, err error)) (firstLSN, lastLSN uint64, err error) {
	return j.AppendWithin(entries, 0, cb)
}

// AppendWithin is Append for records nothing waits for at once: under SyncAlways
// the flusher makes them durable with the next sync that any other append (or a
// wait) asks for, and at the latest once within has passed, instead of starting a
// sync of their own. The durability contract is Append's: cb is called only once
// they are durable. Under SyncInterval and SyncNone it is Append.
//
// It is for a busy caller whose records come in a steady stream with little or
// nothing waiting on each (a shard's results, whose acknowledgements a worker can
// wait a few milliseconds for): each msync costs tens of microseconds of CPU
// whatever it carries, and the syncs the caller's urgent appends start carry the
// lazy records along.
func (j *Journal) AppendWithin(entries []Entry, within time.Duration, cb func(lastLSN uint64, err error)) (firstLSN, lastLSN uint64, err error) {
	if len(entries) == 0 {
		return 0, 0, ErrNoEntries
	}
	for i := range entries {
		if t := entries[i].Type; t < MinUserType || t > MaxUserType {
			return 0, 0, fmt.Errorf("%w: entry %d has type %d, callers may use %d..%d", ErrInvalidType, i, t, MinUserType, MaxUserType)
		}
		if n := len(entries[i].Payload); n > j.maxPayload {
			return 0, 0, &RecordTooLargeError{PayloadBytes: n, LimitBytes: j.maxPayload}
		}
	}
	if within <= 0 || j.opts.Sync != SyncAlways {
		return j.append(entries, cb, time.Time{})
	}
	return j.append(entries, cb, time.Now().Add(within))
}

// append appends entries; by is the latest time they must be synced by (lazy), or
// zero for now.
func (j *Journal) append(entries []Entry, cb func(uint64, error), by time.Time) (firstLSN, lastLSN uint64, err error) {
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		return 0, 0, err
	}
	active := j.segs[len(j.segs)-1]
	// Obtain every segment the batch will need before writing anything, so
	// that a failure (a full disk) leaves nothing half appended.
	need, off := 0, active.idx.end
	for i := range entries {
		n := FrameSize(len(entries[i].Payload))
		if off+n > len(active.buf) {
			need++
			off = SegmentHeaderSize
		}
		off += n
	}
	var fresh []*segment
	for range need {
		s, err := j.takeSpare()
		if err != nil {
			// Nothing of the batch is written. Every later append needs the
			// segment too, so the journal stops here (as on a failed sync: a
			// node exits for its supervisor to restart it), rather than refuse
			// its callers one by one; Room warned them while the reserve lasted.
			for _, s := range fresh {
				j.discardSpare(s)
			}
			j.mu.Unlock()
			j.failWith(ErrNoSegment, err, nil)
			return 0, 0, j.Err()
		}
		fresh = append(fresh, s)
	}
	durable := j.durable.Load()
	firstLSN = j.next
	j.markDirty(active)
	for i := range entries {
		e := &entries[i]
		n := FrameSize(len(e.Payload))
		if active.idx.end+n > len(active.buf) {
			s := fresh[0]
			fresh = fresh[1:]
			if err := s.activate(j.dirPath, j.next); err != nil {
				// A failed rename is as bad as a failed sync: the directory
				// no longer says what the log is.
				j.discardSpare(s)
				for _, s := range fresh {
					j.discardSpare(s)
				}
				j.mu.Unlock()
				j.fail(err, nil)
				return 0, 0, j.Err()
			}
			j.segs = append(j.segs, s)
			active = s
			j.markDirty(active)
		}
		lsn := j.next
		end := active.idx.end
		putFrame(active.buf[end:end+n], active.seed, durable, lsn, e.Stream, e.Type, e.Payload)
		active.idx.end = end + n
		active.idx.records++
		active.idx.lastLSN = lsn
		active.idx.streams[e.Stream] = lsn
		j.next++
	}
	lastLSN = j.next - 1
	j.last.Store(lastLSN)
	if cb != nil {
		j.waiters = append(j.waiters, waiter{last: lastLSN, cb: cb})
	}
	kick := j.opts.Sync != SyncInterval
	if by.IsZero() {
		j.urgent = true
	} else if j.urgent || (!j.lazyBy.IsZero() && !by.Before(j.lazyBy)) {
		kick = false // a sync is asked for already, as early or earlier
	} else {
		j.lazyBy = by // the flusher sets its timer again
	}
	j.mu.Unlock()
	if kick {
		select {
		case j.kick <- struct{}{}:
		default:
		}
	}
	return firstLSN, lastLSN, nil
}

// AppendWait appends entries and waits until they are durable or ctx is
// done. On ctx's end it returns ctx's error: the entries may still become
// durable later.
func (j *Journal) AppendWait(ctx context.Context, entries ...Entry) (lastLSN uint64, err error) {
	done := make(chan error, 1)
	_, last, err := j.Append(entries, func(_ uint64, err error) { done <- err })
	if err != nil {
		return 0, err
	}
	select {
	case err := <-done:
		return last, err
	case <-ctx.Done():
		return last, ctx.Err()
	}
}

// SyncNow asks the flusher to sync everything appended so far, lazy appends
// included, without waiting for it. Under SyncInterval and SyncNone it does
// nothing (their syncs come as they always do).
func (j *Journal) SyncNow() {
	if j.opts.Sync != SyncAlways {
		return
	}
	j.mu.Lock()
	ask := !j.closed && j.fatal == nil && j.next-1 > j.durable.Load()
	if ask {
		j.urgent = true
	}
	j.mu.Unlock()
	if ask {
		j.kickNow()
	}
}

// appendInternal appends one journal-owned record and waits for it.
func (j *Journal) appendInternal(stream uint64, typ uint8) (uint64, error) {
	done := make(chan error, 1)
	_, last, err := j.append([]Entry{{Stream: stream, Type: typ}}, func(_ uint64, err error) { done <- err }, time.Time{})
	if err != nil {
		return 0, err
	}
	if j.opts.Sync == SyncInterval {
		j.kickNow()
	}
	return last, <-done
}

// waitDurable blocks until lsn is durable.
func (j *Journal) waitDurable(lsn uint64) error {
	if j.durable.Load() >= lsn {
		return nil
	}
	done := make(chan error, 1)
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		return err
	}
	if lsn >= j.next {
		j.mu.Unlock()
		return fmt.Errorf("%w: %d is past the last LSN %d", ErrBadLSN, lsn, j.next-1)
	}
	j.waiters = append(j.waiters, waiter{last: lsn, cb: func(_ uint64, err error) { done <- err }})
	j.urgent = true
	j.mu.Unlock()
	j.kickNow()
	return <-done
}

func (j *Journal) kickNow() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// markDirty lists s for the flusher; j.mu must be held.
func (j *Journal) markDirty(s *segment) {
	if !s.inDirty {
		s.inDirty = true
		j.dirty = append(j.dirty, s)
	}
}

func (j *Journal) flushLoop() {
	defer j.wg.Done()
	var tick <-chan time.Time
	if j.opts.Sync == SyncInterval {
		t := time.NewTicker(time.Duration(j.opts.SyncIntervalMs) * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	afterFunc := j.opts.AfterFunc
	if afterFunc == nil {
		afterFunc = func(d time.Duration, fn func()) interface{ Stop() bool } { return time.AfterFunc(d, fn) }
	}
	lazyC := make(chan struct{}, 1)
	var lazy interface{ Stop() bool }
	defer func() {
		if lazy != nil {
			lazy.Stop()
		}
	}()
	for {
		select {
		case <-j.stop:
			j.flush()
			return
		case <-j.kick:
		case <-tick:
		case <-lazyC:
		}
		if wait := j.lazyWait(); wait > 0 {
			// Only lazy records wait, and none is due yet: wake at the earliest.
			if lazy != nil {
				lazy.Stop()
			}
			lazy = afterFunc(wait, func() {
				select {
				case lazyC <- struct{}{}:
				default:
				}
			})
			continue
		}
		j.flush()
	}
}

// lazyWait is how long the flusher may wait before its next sync: zero when an
// append or a wait asked for one now, or the earliest lazy deadline has come.
func (j *Journal) lazyWait() time.Duration {
	if j.opts.Sync != SyncAlways {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.urgent || j.lazyBy.IsZero() {
		return 0
	}
	return time.Until(j.lazyBy)
}

// flush makes everything appended so far durable and runs the callbacks.
// Only the flusher goroutine calls it (and Close, after the flusher ended).
func (j *Journal) flush() {
	j.mu.Lock()
	if j.fatal != nil {
		j.mu.Unlock()
		return
	}
	target := j.next - 1
	j.urgent, j.lazyBy = false, time.Time{} // this sync takes everything appended so far
	jobs := j.jobs[:0]
	for _, s := range j.dirty {
		jobs = append(jobs, syncJob{s: s, from: s.synced, to: s.idx.end, dir: s.needDirSync})
	}
	waiters := j.waiters
	j.waiters = j.idleWaiters[:0]
	j.idleWaiters = nil
	j.mu.Unlock()
	j.jobs = jobs

	// No lock is held while syncing: Compact never unmaps a segment that is
	// still listed dirty, and Close stops this goroutine before unmapping.
	var err error
	if j.opts.Sync != SyncNone {
		synced := false
		var t0 time.Time
		if j.opts.OnSync != nil {
			t0 = time.Now()
		}
		if f := j.opts.FailSync; f != nil && len(jobs) > 0 {
			err = f()
		}
		for _, jb := range jobs {
			if err != nil {
				break
			}
			synced = synced || jb.to > jb.from || jb.dir
			if jb.to > jb.from {
				if err = j.syncRange(jb.s, jb.from, jb.to); err != nil {
					break
				}
			}
			if jb.dir {
				if err = j.syncDirFn(); err != nil {
					break
				}
			}
		}
		if synced {
			j.syncs.Add(1)
			if j.opts.OnSync != nil && err == nil {
				now := time.Now()
				j.opts.OnSync(now.Sub(t0), now)
			}
		}
	}
	if err != nil {
		j.fail(err, waiters)
		return
	}
	if j.opts.Sync != SyncNone {
		for _, jb := range jobs {
			jb.s.dropDurable(jb.to) // still listed dirty: Compact does not unmap it meanwhile
		}
	}
	j.mu.Lock()
	for _, jb := range jobs {
		jb.s.synced = jb.to
		if jb.dir {
			jb.s.needDirSync = false
		}
	}
	keep := j.dirty[:0]
	for _, s := range j.dirty {
		if s.synced < s.idx.end || s.needDirSync {
			keep = append(keep, s)
		} else {
			s.inDirty = false
		}
	}
	clear(j.dirty[len(keep):])
	j.dirty = keep
	j.mu.Unlock()
	if target > j.durable.Load() {
		j.durable.Store(target)
	}
	for _, w := range waiters {
		w.cb(w.last, nil)
	}
	if n := len(jobs); n > 0 {
		select { // the newest segment synced: the active one
		case j.ahead <- syncJob{s: jobs[n-1].s, to: jobs[n-1].to}:
		default: // busy: the next commit tells it again
		}
	}
	clear(waiters)
	j.mu.Lock()
	j.idleWaiters = waiters[:0]
	j.mu.Unlock()
}

// fail makes err the journal's fatal error and hands it to every waiter.
func (j *Journal) fail(err error, taken []waiter) { j.failWith(ErrSyncFailed, err, taken) }

// failWith is fail with the fatal error matching kind (ErrSyncFailed, ErrNoSegment).
func (j *Journal) failWith(kind, err error, taken []waiter) {
	j.mu.Lock()
	if j.fatal == nil {
		j.fatal = fmt.Errorf("%w: %w", kind, err)
		j.log.Error("journal stopped", "err", err)
		close(j.failed)
	}
	fatal := j.fatal
	rest := j.waiters
	j.waiters = nil
	j.mu.Unlock()
	for _, w := range taken {
		w.cb(w.last, fatal)
	}
	for _, w := range rest {
		w.cb(w.last, fatal)
	}
}

func (j *Journal) requestSpare() {
	select {
	case j.needSpare <- struct{}{}:
	default:
	}
}

// prepareLoop keeps one spare segment ready so that a rollover costs a
// rename, not a fallocate and an fsync under the append mutex. It zero-fills
// the spare, paced (zeroing).
func (j *Journal) prepareLoop() {
	defer j.wg.Done()
	var retry <-chan time.Time // set after a failure: try again without being asked
	for {
		select {
		case <-j.stop:
			return
		case <-j.needSpare:
		case <-retry:
		}
		retry = nil
		if len(j.spares) > 0 {
			continue
		}
		s, err := j.createSpare(j.zeroing(&zeroing{pause: zeroPause, stop: j.stop, hurry: j.activeNearlyFull}))
		if errors.Is(err, errZeroingStopped) {
			return
		}
		if err != nil {
			if j.spareErr.Swap(&err) == nil {
				j.log.Warn("cannot prepare the next segment; retrying every second", "err", err)
			}
			retry = time.After(SpareRetry)
			continue
		}
		if j.spareErr.Swap(nil) != nil {
			j.log.Info("next segment prepared again")
		}
		select {
		case j.spares <- s:
		default:
			j.discardSpare(s)
		}
	}
}

// aheadLoop faults in the pages past where each group commit's sync ended
// (segment.populateAhead), off the flusher's and the appenders' way.
func (j *Journal) aheadLoop() {
	defer j.wg.Done()
	for {
		select {
		case <-j.stop:
			return
		case jb := <-j.ahead:
			j.rw.RLock() // Compact unmaps under rw
			jb.s.populateAhead(jb.to)
			j.rw.RUnlock()
		}
	}
}

// takeSpare returns a prepared spare, or makes one now.
func (j *Journal) takeSpare() (*segment, error) {
	defer j.requestSpare()
	select {
	case s := <-j.spares:
		return s, nil
	default:
	}
	j.log.Warn("no spare segment ready at a rollover: making one now, fallocated only (not zero-filled), under the append lock",
		"segment_bytes", j.opts.SegmentSizeBytes)
	return j.createSpare(nil) // under the append mutex: quick, not zeroed
}

// createSpare makes a spare segment of the journal's size (FailSegment first).
func (j *Journal) createSpare(z *zeroing) (*segment, error) {
	if f := j.opts.FailSegment; f != nil {
		if err := f(); err != nil {
			return nil, fmt.Errorf("persistence: create segment: %w", err)
		}
	}
	return createSpare(j.dirPath, j.opts.SegmentSizeBytes, j.opts.backend, z)
}

// SpareErr is why the last attempt to make a spare segment failed (a full disk,
// most often), nil once one is made: an early warning, before Room refuses.
func (j *Journal) SpareErr() error {
	if p := j.spareErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Room says whether the journal should take new work: nil, or a *NoRoomError
// while it is short of disk (see NoRoomError). Cheap while spares are being
// made (one atomic load): a caller may ask before every command.
func (j *Journal) Room() error {
	p := j.spareErr.Load()
	if p == nil || len(j.spares) > 0 {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.segs) == 0 {
		return nil
	}
	s := j.segs[len(j.segs)-1]
	left, reserve := len(s.buf)-s.idx.end, int(j.opts.SegmentSizeBytes/ReserveDivisor)
	if left >= reserve {
		return nil
	}
	return &NoRoomError{Dir: j.dirPath, LeftBytes: left, ReserveBytes: reserve, Err: *p}
}

// zeroing is z, or nil where the options say segments are only fallocated.
func (j *Journal) zeroing(z *zeroing) *zeroing {
	if j.opts.noZeroFill {
		return nil
	}
	return z
}

// activeNearlyFull says whether the active segment is over three quarters
// full: a spare still being zero-filled then hurries (zeroing.hurry).
func (j *Journal) activeNearlyFull() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.segs) == 0 {
		return true
	}
	s := j.segs[len(j.segs)-1]
	return s.idx.end > len(s.buf)/4*3
}

func (j *Journal) discardSpare(s *segment) {
	name := s.name
	s.release()
	os.Remove(filepath.Join(j.dirPath, name))
}

// Close makes everything appended durable (except under SyncNone), runs the
// remaining callbacks, and releases the files. It returns the fatal error,
// if the journal had one.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return ErrClosed
	}
	j.closed = true
	j.mu.Unlock()
	close(j.stop)
	j.wg.Wait()
	for len(j.spares) > 0 {
		j.discardSpare(<-j.spares)
	}
	// A snapshot being written (shards write theirs from goroutines of their own)
	// still uses the directory: let it finish first.
	j.snapMu.Lock()
	j.rw.Lock()
	err := j.releaseAll()
	j.rw.Unlock()
	j.snapMu.Unlock()
	if f := j.Err(); f != nil {
		return f
	}
	return err
}
