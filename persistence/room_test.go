package persistence

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestRoomOnAFullDisk: with the disk full (FailSegment returns ENOSPC), the journal
// says it has no room only once no spare is ready and the active segment is down to
// its reserve; it says so no longer once a spare is made again (retried without
// being asked); and a rollover that finds neither a spare nor space stops the
// journal with ErrNoSegment, keeping every record acknowledged before.
func TestRoomOnAFullDisk(t *testing.T) {
	const segBytes = 64 << 10
	dir := t.TempDir()
	var full atomic.Bool
	enospc := syscall.ENOSPC
	j := openT(t, Options{Dir: dir, SegmentSizeBytes: segBytes, FailSegment: func() error {
		if full.Load() {
			return enospc
		}
		return nil
	}})
	defer func() { _ = j.Close() }() // its error is the rollover's
	ctx := context.Background()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !cond(); {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	left := func() int {
		j.mu.Lock()
		defer j.mu.Unlock()
		s := j.segs[len(j.segs)-1]
		return len(s.buf) - s.idx.end
	}
	var acked uint64
	appendOne := func() error {
		lsn, err := j.AppendWait(ctx, Entry{Stream: 1, Type: 1, Payload: payloadFor(int(acked), 1000)})
		if err == nil {
			acked = lsn
		}
		return err
	}
	waitUntil("the first spare", func() bool { return len(j.spares) == 1 })
	if err := j.Room(); err != nil {
		t.Fatalf("Room with a spare ready: %v", err)
	}

	// The disk fills: the rollover takes the spare, and the next one cannot be made.
	full.Store(true)
	for segs := j.Segments(); j.Segments() == segs; {
		if err := appendOne(); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil("the failed spare", func() bool { return j.spareErr.Load() != nil })
	reserve := segBytes / ReserveDivisor
	for j.Room() == nil {
		if l := left(); l < reserve {
			t.Fatalf("Room says there is room with %d bytes left, under the reserve of %d, and no spare", l, reserve)
		}
		if err := appendOne(); err != nil {
			t.Fatal(err)
		}
	}
	err := j.Room()
	var nr *NoRoomError
	if !errors.As(err, &nr) || !errors.Is(err, syscall.ENOSPC) || nr.ReserveBytes != reserve || nr.LeftBytes >= reserve ||
		nr.LeftBytes != left() || nr.Dir != dir || !strings.Contains(err.Error(), "out of disk space") {
		t.Fatalf("Room: %v (%#v); want a NoRoomError wrapping ENOSPC, under the reserve of %d", err, nr, reserve)
	}
	// The reserve still takes records: what callers accepted goes on.
	if err := appendOne(); err != nil {
		t.Fatalf("append into the reserve: %v", err)
	}

	// Space comes back: a spare is made again without an append asking for it.
	full.Store(false)
	waitUntil("a spare made again", func() bool { return j.Room() == nil && len(j.spares) == 1 })

	// The disk fills again and stays full: the rollover after the spare's segment
	// finds nothing and stops the journal.
	full.Store(true)
	for segs := j.Segments(); j.Segments() == segs; {
		if err := appendOne(); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil("the failed spare", func() bool { return j.spareErr.Load() != nil })
	for {
		err = appendOne()
		if err != nil {
			break
		}
	}
	if !errors.Is(err, ErrNoSegment) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append past the last segment: %v, want ErrNoSegment wrapping ENOSPC", err)
	}
	select {
	case <-j.Failed():
	default:
		t.Fatal("Failed not closed after a rollover without a segment")
	}
	if err := appendOne(); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("append after the stop: %v, want ErrNoSegment", err)
	}
	if err := j.Close(); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("Close: %v, want the fatal ErrNoSegment", err)
	}

	// Every acknowledged record is there after a reopen.
	j2 := openT(t, Options{Dir: dir, SegmentSizeBytes: segBytes})
	defer closeT(t, j2)
	var n, last uint64
	if err := j2.Replay(nil, func(r Record) error {
		if r.Stream == 1 {
			n++
			last = r.LSN
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if last != acked || n != acked {
		t.Fatalf("after a reopen: %d records up to LSN %d, want all %d acknowledged", n, last, acked)
	}
}
