package persistence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// CompactReport says what Compact did.
type CompactReport struct {
	DeletedSegments []string // file names, oldest first
	// PinnedBy lists, ascending, the streams whose records keep the oldest
	// remaining segment alive: snapshot them (twice, see Compact) to release it.
	PinnedBy []uint64
}

// cover is the highest LSN of stream that no longer needs the log: its drop,
// or its older retained snapshot. The older one, not the newest, because
// Open falls back to it when the newest is corrupt, and the records after it
// must then still be there. j.mu must be held.
func (j *Journal) cover(stream uint64) uint64 {
	c := j.drops[stream]
	if infos := j.snaps[stream]; len(infos) > 0 {
		c = max(c, infos[len(infos)-1].lsn)
	}
	return c
}

// Compact deletes the oldest segments whose records every stream's
// snapshots (or drops) cover, stopping at the first segment that some stream
// still needs, and reports those streams. The active segment is never
// deleted. A stream's first snapshot releases the records it covers; after
// that, a segment is released once the stream's second-newest snapshot
// covers it, so that falling back from a corrupt newest snapshot never needs
// a deleted record.
func (j *Journal) Compact() (CompactReport, error) {
	var rep CompactReport
	// snapMu makes the choice consistent with DropStream and WriteSnapshot;
	// it is released before unmapping, which waits for readers whose
	// callbacks may be writing snapshots.
	j.snapMu.Lock()
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		j.snapMu.Unlock()
		return rep, err
	}
	var del []*segment
	for _, s := range j.segs[:len(j.segs)-1] {
		if s.inDirty {
			break // not all synced yet: nothing after it can be covered either
		}
		for stream, maxLSN := range s.idx.streams {
			if j.cover(stream) < maxLSN {
				rep.PinnedBy = append(rep.PinnedBy, stream)
			}
		}
		if len(rep.PinnedBy) > 0 {
			break
		}
		del = append(del, s)
	}
	j.segs = slices.Clone(j.segs[len(del):])
	j.mu.Unlock()
	j.snapMu.Unlock()
	slices.Sort(rep.PinnedBy)
	if len(del) == 0 {
		return rep, nil
	}
	j.rw.Lock()
	var err error
	for _, s := range del {
		err = errors.Join(err, s.release())
	}
	j.rw.Unlock()
	for _, s := range del {
		if rerr := os.Remove(filepath.Join(j.dirPath, s.name)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("persistence: remove %s: %w", s.name, rerr))
			continue
		}
		rep.DeletedSegments = append(rep.DeletedSegments, s.name)
	}
	if len(rep.DeletedSegments) > 0 {
		err = errors.Join(err, syncDir(j.dir))
	}
	j.log.Info("journal compacted", "deleted", len(rep.DeletedSegments), "pinned_by", rep.PinnedBy)
	return rep, err
}

// DropStream forgets stream: it appends a tombstone, waits until it is
// durable, then deletes the stream's snapshots. From then on recovery,
// Replay and ReadStream skip the stream's earlier records, and the stream no
// longer pins segments. The id may be used again; its records after the
// tombstone form a new history.
func (j *Journal) DropStream(stream uint64) error {
	j.snapMu.Lock()
	defer j.snapMu.Unlock()
	lsn, err := j.appendInternal(stream, typeDropStream)
	if err != nil {
		return err
	}
	j.mu.Lock()
	j.drops[stream] = lsn
	infos := j.snaps[stream]
	delete(j.snaps, stream)
	j.mu.Unlock()
	for _, in := range infos {
		if err := os.Remove(filepath.Join(j.dirPath, in.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("persistence: remove %s: %w", in.name, err)
		}
	}
	if len(infos) > 0 {
		return syncDir(j.dir)
	}
	return nil
}
