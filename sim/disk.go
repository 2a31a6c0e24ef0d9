package sim

import (
	"errors"
	"fmt"
	"maps"

	"github.com/kjob/kjob/persistence"
)

// disk is a server's journal device: the bytes written, encoded with the real record
// codec (persistence.AppendRecord), and the prefix an fsync has made durable.
//
// A crash is a machine crash: the page cache is gone. What survives is the synced
// prefix plus, with FaultDisk, any part of the unsynced tail (cut anywhere, so the
// last record may be torn) and possibly a few garbage or zero bytes after it;
// without FaultDisk the unsynced tail survives whole or not at all. Recovery reads
// the records back with persistence.DecodeRecord and stops at the first frame that
// does not decode; damage inside the synced prefix is a broken invariant.
type disk struct {
	log    []byte
	synced int // bytes [0, synced) are durable
	// snaps are the shards' snapshot files, the newest per stream (Config.Snapshots):
	// written whole and synced before they count (persistence.Journal.WriteSnapshot
	// renames a synced file into place), so a crash keeps them as they are.
	snaps map[uint64]diskSnap
}

// diskSnap is one snapshot file: a stream's state up to and including lsn.
type diskSnap struct {
	lsn  uint64
	data []byte
}

// clone is a copy of the disk as it is now (the checker's look at a downed server).
func (d *disk) clone() *disk {
	return &disk{log: append([]byte(nil), d.log...), synced: d.synced, snaps: maps.Clone(d.snaps)}
}

// crash keeps what a machine crash keeps and reports what happened to the tail.
func (d *disk) crash(s *Sim) string {
	tail := len(d.log) - d.synced
	if tail == 0 {
		return "nothing unsynced"
	}
	cut := d.synced
	var how string
	if s.cfg.Faults&FaultDisk != 0 {
		switch s.rng.IntN(4) {
		case 0:
			how = "unsynced tail lost"
		case 1:
			cut = len(d.log)
			how = "unsynced tail survived"
		default:
			cut = d.synced + s.rng.IntN(tail+1)
			how = fmt.Sprintf("unsynced tail cut at %d of %d bytes", cut-d.synced, tail)
		}
	} else if s.chance(0.5) {
		cut = len(d.log)
		how = "unsynced tail survived"
	} else {
		how = "unsynced tail lost"
	}
	d.log = d.log[:cut:cut] // later appends must not write into bytes a reader may hold
	if s.cfg.Faults&FaultDisk != 0 && s.chance(0.3) {
		n := s.between(1, 64)
		junk := make([]byte, n)
		if s.chance(0.5) {
			for i := range junk {
				junk[i] = byte(s.rng.Uint32())
			}
			how += fmt.Sprintf(", %d garbage bytes after it", n)
		} else {
			how += fmt.Sprintf(", %d zero bytes after it", n)
		}
		d.log = append(d.log, junk...)
		s.stats.TornTails++
	}
	return how
}

// recover decodes every record in order and hands it to fn. It truncates the log
// after the last good record, which becomes the durable end. A bad frame inside the
// synced prefix, or an LSN out of sequence there, is reported as an error.
func (d *disk) recover(fn func(r persistence.Record)) (last uint64, truncated int, err error) {
	off := 0
	for off < len(d.log) {
		r, n, derr := persistence.DecodeRecord(d.log[off:])
		if derr == nil && r.LSN != last+1 {
			derr = fmt.Errorf("%w: lsn %d after %d", persistence.ErrLSN, r.LSN, last)
		}
		if derr != nil {
			if off < d.synced {
				return last, 0, fmt.Errorf("durable record at offset %d (synced up to %d) does not decode: %w", off, d.synced, derr)
			}
			if !errors.Is(derr, persistence.ErrZero) && !errors.Is(derr, persistence.ErrTorn) &&
				!errors.Is(derr, persistence.ErrCRC) && !errors.Is(derr, persistence.ErrInvalid) && !errors.Is(derr, persistence.ErrLSN) {
				return last, 0, fmt.Errorf("tail at offset %d: unexpected error %w", off, derr)
			}
			break
		}
		fn(r)
		last = r.LSN
		off += n
	}
	truncated = len(d.log) - off
	d.log = d.log[:off:off]
	// A record whose padding was torn off decodes (DecodeRecord returns the bytes
	// left); put the padding back, as a preallocated zeroed segment would have it,
	// so the next frame starts where a reader expects it.
	for len(d.log)%8 != 0 {
		d.log = append(d.log, 0)
	}
	d.synced = len(d.log)
	return last, truncated, nil
}

// records decodes the durable prefix (for end-of-run checks).
func (d *disk) records(fn func(r persistence.Record)) {
	off := 0
	for off < d.synced {
		r, n, err := persistence.DecodeRecord(d.log[off:d.synced])
		if err != nil {
			return
		}
		fn(r)
		off += n
	}
}

// waiter is an append waiting for its fsync: a shard's batch (core Durable) or one
// of the server's own records (done).
type waiter struct {
	lsn  uint64
	h    *shardHost
	done func(lsn uint64, err error)
}

// journal is a server's one journal, shared by all its shards (as in DESIGN.md):
// appends assign node-wide LSNs, one fsync at a time covers everything appended
// before it started (group commit), and each shard is told Durable for its own
// batches. A failed fsync is fatal for the journal until the process restarts.
type journal struct {
	s       *Sim
	srv     *server
	d       *disk
	last    uint64
	syncing bool
	failed  error
	waiters []waiter
	// urgent: an append since the last fsync began wants one now; lazyAt: the
	// earliest deadline of the lazy appends since then (0: none). A lazy append
	// (shardcore.LazyAppender) starts no fsync of its own: it rides on the next
	// one, or gets one at its deadline, as persistence.Journal.AppendWithin.
	urgent bool
	lazyAt int64
	// drops: each stream's latest DropStream record (this process's): a snapshot
	// older than it is refused, as persistence.Journal.WriteSnapshot refuses it.
	drops map[uint64]uint64
}

// writeSnapshot is persistence.Journal.WriteSnapshot: the snapshot of stream at
// lsn becomes the stream's newest, whole, or is refused with nothing written.
func (j *journal) writeSnapshot(stream, lsn uint64, data []byte) error {
	switch {
	case j.failed != nil:
		return j.failed
	case lsn == 0 || lsn > j.last:
		return fmt.Errorf("snapshot lsn %d, the journal holds 1..%d", lsn, j.last)
	case lsn < j.d.snaps[stream].lsn:
		return fmt.Errorf("snapshot lsn %d is older than stream %x's newest snapshot at %d", lsn, stream, j.d.snaps[stream].lsn)
	case lsn < j.drops[stream]:
		return fmt.Errorf("snapshot lsn %d is older than stream %x's drop at %d", lsn, stream, j.drops[stream])
	}
	if j.s.faulty(FaultDisk) && j.s.chance(0.05) {
		return errors.New("the snapshot file's fsync failed (the file is not renamed into place)")
	}
	if j.d.snaps == nil {
		j.d.snaps = map[uint64]diskSnap{}
	}
	j.d.snaps[stream] = diskSnap{lsn: lsn, data: data}
	return nil
}

func (j *journal) unsynced() int { return len(j.d.log) - j.d.synced }

// append journals entries for h (nil: the server's own records, done is called).
func (j *journal) append(h *shardHost, entries []persistence.Entry, done func(uint64, error)) (uint64, error) {
	return j.appendWithin(h, entries, done, 0)
}

// appendWithin is append for records that may wait up to withinMs for their fsync
// (0: none).
func (j *journal) appendWithin(h *shardHost, entries []persistence.Entry, done func(uint64, error), withinMs int64) (uint64, error) {
	if j.failed != nil {
		return 0, j.failed
	}
	for _, e := range entries {
		j.last++
		r := persistence.Record{LSN: j.last, Stream: e.Stream, Type: e.Type, Payload: e.Payload}
		j.d.log = persistence.AppendRecord(j.d.log, r)
		if h != nil {
			h.sinceSnap++
			j.s.chk.appended(h, r)
		}
	}
	j.waiters = append(j.waiters, waiter{lsn: j.last, h: h, done: done})
	if withinMs <= 0 {
		j.urgent = true
	} else if at := j.s.now + withinMs; j.lazyAt == 0 || at < j.lazyAt {
		j.lazyAt = at
		srv, inc := j.srv, j.srv.inc
		j.s.after(withinMs, func() { // the flusher's timer
			if srv.up && srv.inc == inc {
				j.kick()
			}
		})
	}
	j.kick()
	if j.srv.crashOnAppend {
		j.srv.crashOnAppend = false
		srv := j.srv
		inc := srv.inc
		j.s.after(0, func() {
			if srv.up && srv.inc == inc {
				srv.crash("chaos, between append and fsync")
				j.s.after(j.s.between(100, 3000), srv.restart)
			}
		})
	}
	return j.last, nil
}

// syncNow asks for an fsync of everything appended so far (a shard's SyncNow).
func (j *journal) syncNow() {
	if j.unsynced() > 0 {
		j.urgent = true
		j.kick()
	}
}

// kick starts an fsync if none is running and something is unsynced that an
// append wants synced now (urgent, or a lazy deadline that has come).
func (j *journal) kick() {
	if j.syncing || j.unsynced() == 0 || j.failed != nil {
		return
	}
	if !j.urgent && (j.lazyAt == 0 || j.s.now < j.lazyAt) {
		return
	}
	j.urgent, j.lazyAt = false, 0 // this fsync takes everything appended so far
	j.syncing = true
	target, lsn := len(j.d.log), j.last
	lat := j.s.between(1, 4)
	if j.s.faulty(FaultSlow) && j.srv.slow {
		lat += j.s.between(20, 150)
	}
	if j.s.faulty(FaultDisk) && j.s.chance(0.03) {
		lat += j.s.between(20, 300)
	}
	srv, inc := j.srv, j.srv.inc
	j.s.after(lat, func() {
		if srv.up && srv.inc == inc {
			j.synced(target, lsn)
		}
	})
}

func (j *journal) synced(target int, lsn uint64) {
	j.syncing = false
	if j.s.faulty(FaultDisk) && j.s.chance(0.004) {
		j.failed = fmt.Errorf("fsync of %s's journal failed (simulated EIO)", j.srv.addr)
		j.s.stats.FsyncFailures++
		j.s.tracef("disk: %s fsync failed; journal is dead until restart", j.srv.addr)
		ws := j.waiters
		j.waiters = nil
		for _, w := range ws {
			j.notify(w, 0, j.failed)
		}
		srv, inc := j.srv, j.srv.inc
		j.s.after(j.s.between(200, 2000), func() { // the operator restarts the process
			if srv.up && srv.inc == inc {
				srv.crash("restart after fsync failure")
				srv.restart()
			}
		})
		return
	}
	j.d.synced = target
	var ready []waiter
	i := 0
	for ; i < len(j.waiters) && j.waiters[i].lsn <= lsn; i++ {
		ready = append(ready, j.waiters[i])
	}
	j.waiters = append(j.waiters[:0:0], j.waiters[i:]...)
	for _, w := range ready {
		j.notify(w, w.lsn, nil)
	}
	j.kick()
}

func (j *journal) notify(w waiter, lsn uint64, err error) {
	if w.done != nil {
		w.done(lsn, err)
		return
	}
	h := w.h
	if h == nil || h.gone {
		return
	}
	if err == nil && lsn > h.durable {
		h.durable = lsn
	}
	h.core.Durable(lsn, err, h)
	h.after()
	h.reportOpened()
}
