package persistence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const testSegmentBytes = 64 << 10

func openT(t testing.TB, opts Options) *Journal {
	t.Helper()
	if opts.SegmentSizeBytes == 0 {
		opts.SegmentSizeBytes = testSegmentBytes
	}
	j, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return j
}

func closeT(t testing.TB, j *Journal) {
	t.Helper()
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func payloadFor(lsnHint, size int) []byte {
	p := make([]byte, size)
	for i := range p {
		p[i] = byte(lsnHint*31 + i)
	}
	return p
}

func appendN(t testing.TB, j *Journal, n, stream, size int) []uint64 {
	t.Helper()
	var lsns []uint64
	for i := range n {
		l, err := j.AppendWait(context.Background(), Entry{Stream: uint64(stream), Type: 1, Payload: payloadFor(i, size)})
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		lsns = append(lsns, l)
	}
	return lsns
}

// all replays j and returns the records (payloads copied).
func all(t testing.TB, j *Journal) (snaps map[uint64]string, recs []Record) {
	t.Helper()
	snaps = map[uint64]string{}
	err := j.Replay(func(stream, lsn uint64, data []byte) error {
		snaps[stream] = fmt.Sprintf("%d:%s", lsn, data)
		return nil
	}, func(r Record) error {
		r.Payload = bytes.Clone(r.Payload)
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	return snaps, recs
}

func TestAppendAssignsGapFreeLSNs(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	if j.LastLSN() != 0 || j.DurableLSN() != 0 {
		t.Fatalf("fresh journal at %d/%d", j.LastLSN(), j.DurableLSN())
	}
	first, last, err := j.Append([]Entry{{Stream: 1, Type: 1, Payload: []byte("a")}, {Stream: 2, Type: 2, Payload: []byte("b")}}, nil)
	if err != nil || first != 1 || last != 2 {
		t.Fatalf("Append: %d %d %v", first, last, err)
	}
	l, err := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 3, Payload: []byte("c")})
	if err != nil || l != 3 || j.DurableLSN() < 3 {
		t.Fatalf("AppendWait: %d %v durable %d", l, err, j.DurableLSN())
	}
	closeT(t, j)
	j = openT(t, Options{Dir: dir})
	defer closeT(t, j)
	_, recs := all(t, j)
	want := []string{"1/1/1/a", "2/2/2/b", "3/1/3/c"}
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%d/%d/%d/%s", r.LSN, r.Stream, r.Type, r.Payload))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if rep := j.Report(); rep.Records != 3 || rep.LastLSN != 3 || rep.TruncatedBytes != 0 || rep.Segments != 1 {
		t.Fatalf("report %+v", rep)
	}
	if l, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1}); l != 4 {
		t.Fatalf("after reopen LSN %d, want 4", l)
	}
}

func TestAppendRefusesBadInput(t *testing.T) {
	j := openT(t, Options{Dir: t.TempDir()})
	defer closeT(t, j)
	if _, _, err := j.Append(nil, nil); !errors.Is(err, ErrNoEntries) {
		t.Errorf("empty: %v", err)
	}
	for _, typ := range []uint8{0, 250, 255} {
		if _, _, err := j.Append([]Entry{{Type: typ}}, nil); !errors.Is(err, ErrInvalidType) {
			t.Errorf("type %d: %v", typ, err)
		}
	}
	limit := MaxPayloadBytes(testSegmentBytes)
	_, _, err := j.Append([]Entry{{Type: 1, Payload: make([]byte, limit+1)}}, nil)
	var tl *RecordTooLargeError
	if !errors.As(err, &tl) || !errors.Is(err, ErrTooLarge) || tl.LimitBytes != limit || !strings.Contains(err.Error(), fmt.Sprint(limit)) {
		t.Fatalf("too large: %v", err)
	}
	// The largest allowed record fills a segment on its own.
	if _, err := j.AppendWait(context.Background(), Entry{Type: 1, Payload: make([]byte, limit)}); err != nil {
		t.Fatalf("limit-sized record: %v", err)
	}
	if j.LastLSN() != 1 {
		t.Fatalf("refused appends took LSNs: last %d", j.LastLSN())
	}
}

func TestCallbacksInLSNOrderAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	const appenders, per = 8, 300
	var mu sync.Mutex
	var acked []uint64
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				done := make(chan struct{})
				// Batches of 1..3 entries, some spanning a segment boundary.
				n := 1 + (a+i)%3
				es := make([]Entry, n)
				for k := range es {
					es[k] = Entry{Stream: uint64(a), Type: 1, Payload: payloadFor(i, 200+a*10)}
				}
				_, _, err := j.Append(es, func(last uint64, err error) {
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					acked = append(acked, last)
					mu.Unlock()
					close(done)
				})
				if err != nil {
					t.Error(err)
					return
				}
				<-done
			}
		}()
	}
	wg.Wait()
	if !slices.IsSorted(acked) {
		t.Fatal("callbacks out of LSN order")
	}
	last := j.LastLSN()
	closeT(t, j)
	j = openT(t, Options{Dir: dir})
	defer closeT(t, j)
	rep := j.Report()
	if rep.LastLSN != last || rep.Records != last || rep.Segments < 3 {
		t.Fatalf("report %+v, last %d", rep, last)
	}
	_, recs := all(t, j)
	for i, r := range recs {
		if r.LSN != uint64(i+1) {
			t.Fatalf("record %d has LSN %d", i, r.LSN)
		}
	}
}

func TestReadStream(t *testing.T) {
	j := openT(t, Options{Dir: t.TempDir()})
	defer closeT(t, j)
	for i := range 600 {
		if _, _, err := j.Append([]Entry{{Stream: uint64(i % 3), Type: 1, Payload: payloadFor(i, 300)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j.AppendWait(context.Background(), Entry{Stream: 9, Type: 1}); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	if err := j.ReadStream(1, 300, func(r Record) error {
		if r.Stream != 1 || !bytes.Equal(r.Payload, payloadFor(int(r.LSN-1), 300)) {
			t.Fatalf("bad record %d", r.LSN)
		}
		got = append(got, r.LSN)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 100 || got[0] != 302 || got[99] != 599 {
		t.Fatalf("got %d records %v..", len(got), got[:3])
	}
	stop := errors.New("stop")
	if err := j.ReadStream(1, 0, func(Record) error { return stop }); err != stop {
		t.Fatalf("callback error not returned: %v", err)
	}
}

func TestSnapshotsReplayAndFallback(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	appendN(t, j, 10, 1, 10) // LSN 1..10
	appendN(t, j, 5, 2, 10)  // 11..15
	if err := j.WriteSnapshot(1, 5, []byte("s1@5")); err != nil {
		t.Fatal(err)
	}
	if err := j.WriteSnapshot(1, 8, []byte("s1@8")); err != nil {
		t.Fatal(err)
	}
	if err := j.WriteSnapshot(1, 7, nil); !errors.Is(err, ErrBadLSN) {
		t.Fatalf("older snapshot: %v", err)
	}
	if err := j.WriteSnapshot(1, 99, nil); !errors.Is(err, ErrBadLSN) {
		t.Fatalf("future snapshot: %v", err)
	}
	if lsn, data, err := j.LatestSnapshot(1); err != nil || lsn != 8 || string(data) != "s1@8" {
		t.Fatalf("LatestSnapshot: %d %q %v", lsn, data, err)
	}
	closeT(t, j)

	check := func(wantSnap string, wantStream1 []uint64, rep RecoveryReport) {
		t.Helper()
		j := openT(t, Options{Dir: dir})
		defer closeT(t, j)
		snaps, recs := all(t, j)
		if snaps[1] != wantSnap || len(snaps) != 1 {
			t.Fatalf("snapshots %v, want %q", snaps, wantSnap)
		}
		var s1 []uint64
		for _, r := range recs {
			if r.Stream == 1 {
				s1 = append(s1, r.LSN)
			}
		}
		if !slices.Equal(s1, wantStream1) {
			t.Fatalf("stream 1 records %v, want %v", s1, wantStream1)
		}
		if got := j.Report(); got.Snapshots != rep.Snapshots || got.FallbackSnapshots != rep.FallbackSnapshots {
			t.Fatalf("report %+v", got)
		}
	}
	check("8:s1@8", []uint64{9, 10}, RecoveryReport{Snapshots: 1})
	// Corrupt the newest snapshot: Open falls back to the previous one.
	newest := filepath.Join(dir, snapshotName(1, 8))
	b, _ := os.ReadFile(newest)
	b[len(b)-1] ^= 1
	os.WriteFile(newest, b, 0o644)
	check("5:s1@5", []uint64{6, 7, 8, 9, 10}, RecoveryReport{Snapshots: 1, FallbackSnapshots: 1})
	if _, err := os.Stat(newest + corruptSuffix); err != nil {
		t.Fatalf("corrupt snapshot not kept aside: %v", err)
	}
	// A leftover temporary snapshot is ignored and removed.
	os.WriteFile(filepath.Join(dir, snapshotName(1, 9)+tmpSuffix), []byte("half"), 0o644)
	check("5:s1@5", []uint64{6, 7, 8, 9, 10}, RecoveryReport{Snapshots: 1})
	if _, err := os.Stat(filepath.Join(dir, snapshotName(1, 9)+tmpSuffix)); !os.IsNotExist(err) {
		t.Fatal("temporary snapshot left behind")
	}
}

func TestSnapshotRetentionKeepsTwo(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	defer closeT(t, j)
	appendN(t, j, 5, 1, 1)
	for lsn := uint64(1); lsn <= 5; lsn++ {
		if err := j.WriteSnapshot(1, lsn, []byte{byte(lsn)}); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := filepath.Glob(filepath.Join(dir, "*"+snapshotSuffix))
	if len(m) != 2 {
		t.Fatalf("snapshot files %v", m)
	}
}

func TestDropStreamIsDurable(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	appendN(t, j, 3, 1, 4)
	appendN(t, j, 3, 2, 4)
	if err := j.WriteSnapshot(1, 2, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := j.DropStream(1); err != nil {
		t.Fatal(err)
	}
	appendN(t, j, 1, 1, 4) // a new history under the same id
	closeT(t, j)
	j = openT(t, Options{Dir: dir})
	defer closeT(t, j)
	snaps, recs := all(t, j)
	if len(snaps) != 0 {
		t.Fatalf("dropped stream's snapshot resurrected: %v", snaps)
	}
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%d@%d", r.Stream, r.LSN))
	}
	if want := []string{"2@4", "2@5", "2@6", "1@8"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	var s1 []uint64
	j.ReadStream(1, 0, func(r Record) error { s1 = append(s1, r.LSN); return nil })
	if !slices.Equal(s1, []uint64{8}) {
		t.Fatalf("ReadStream after drop: %v", s1)
	}
}

func TestCompactDeletesCoveredSegmentsAndNamesPinners(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	// Streams 1 and 2 interleave over several segments; stream 3 writes once.
	appendN(t, j, 1, 3, 100)
	for i := range 400 {
		if _, _, err := j.Append([]Entry{{Stream: uint64(1 + i%2), Type: 1, Payload: payloadFor(i, 500)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	last, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1})
	segsBefore := len(j.segs)
	if segsBefore < 3 {
		t.Fatalf("only %d segments", segsBefore)
	}
	rep, err := j.Compact()
	if err != nil || len(rep.DeletedSegments) != 0 || !slices.Equal(rep.PinnedBy, []uint64{1, 2, 3}) {
		t.Fatalf("nothing covered: %+v %v", rep, err)
	}
	if err := j.DropStream(3); err != nil {
		t.Fatal(err)
	}
	for _, s := range []uint64{1, 2} {
		if err := j.WriteSnapshot(s, last, []byte("all")); err != nil {
			t.Fatal(err)
		}
	}
	rep, err = j.Compact()
	if err != nil || len(rep.DeletedSegments) != segsBefore-1 || len(rep.PinnedBy) != 0 {
		t.Fatalf("all covered: %+v %v (segments before %d)", rep, err, segsBefore)
	}
	for _, n := range rep.DeletedSegments {
		if _, err := os.Stat(filepath.Join(dir, n)); !os.IsNotExist(err) {
			t.Fatalf("%s still there", n)
		}
	}
	closeT(t, j)
	j = openT(t, Options{Dir: dir})
	defer closeT(t, j)
	snaps, recs := all(t, j)
	if len(snaps) != 2 {
		t.Fatalf("snapshots %v", snaps)
	}
	for _, r := range recs {
		if r.LSN <= last {
			t.Fatalf("record %d replayed though covered", r.LSN)
		}
	}
	if l, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1}); l != j.Report().LastLSN+1 {
		t.Fatalf("LSN after compaction %d", l)
	}
}

// A stream's first snapshot releases what it covers; later, the fallback
// (second-newest) snapshot decides, so falling back never needs a deleted record.
func TestCompactHonoursFallbackSnapshot(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	for i := range 300 {
		j.Append([]Entry{{Stream: 1, Type: 1, Payload: payloadFor(i, 500)}}, nil)
	}
	mid, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1})
	for i := range 300 {
		j.Append([]Entry{{Stream: 1, Type: 1, Payload: payloadFor(i, 500)}}, nil)
	}
	last, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1})
	if err := j.WriteSnapshot(1, mid, []byte("mid")); err != nil {
		t.Fatal(err)
	}
	if err := j.WriteSnapshot(1, last, []byte("last")); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Compact(); err != nil {
		t.Fatal(err)
	}
	if first := j.segs[0].idx.firstLSN; first > mid+1 {
		t.Fatalf("compaction deleted records after the fallback snapshot: first LSN %d, fallback %d", first, mid)
	}
	closeT(t, j)
	b, _ := os.ReadFile(filepath.Join(dir, snapshotName(1, last)))
	b[len(b)-1] ^= 0xFF
	os.WriteFile(filepath.Join(dir, snapshotName(1, last)), b, 0o644)
	j = openT(t, Options{Dir: dir})
	defer closeT(t, j)
	snaps, recs := all(t, j)
	if snaps[1] != fmt.Sprintf("%d:mid", mid) || len(recs) != int(last-mid) || recs[0].LSN != mid+1 {
		t.Fatalf("fallback replay: %v, %d records", snaps, len(recs))
	}
}

// A stream that appends nothing after its newest snapshot (a shard gone quiet)
// releases its records only once a second snapshot at the same LSN is written: it is
// kept as a copy, a third is not written, and a corrupt copy falls back to the other.
func TestCompactReleasesAQuietStreamWithASecondCopy(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	appendN(t, j, 1, 1, 100)
	first, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1})
	if err := j.WriteSnapshot(1, first, []byte("first")); err != nil {
		t.Fatal(err)
	}
	quiet, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1, Payload: []byte("last words")})
	if err := j.WriteSnapshot(1, quiet, []byte("quiet")); err != nil {
		t.Fatal(err)
	}
	for i := range 400 { // stream 2 fills segments, each covered at once
		if _, _, err := j.Append([]Entry{{Stream: 2, Type: 1, Payload: payloadFor(i, 500)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	last, _ := j.AppendWait(context.Background(), Entry{Stream: 2, Type: 1})
	if err := j.WriteSnapshot(2, last, []byte("two")); err != nil {
		t.Fatal(err)
	}
	segs := len(j.segs)
	rep, err := j.Compact()
	if err != nil || len(rep.DeletedSegments) != 0 || !slices.Equal(rep.PinnedBy, []uint64{1}) {
		t.Fatalf("the quiet stream's fallback snapshot is older than its last record: %+v %v", rep, err)
	}
	if err := j.WriteSnapshot(1, quiet, []byte("quiet")); err != nil {
		t.Fatal(err)
	}
	copyName := snapshotCopyName(1, quiet)
	if _, err := os.Stat(filepath.Join(dir, copyName)); err != nil {
		t.Fatalf("no second copy: %v", err)
	}
	if err := j.WriteSnapshot(1, quiet, []byte("quiet")); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "snap-0000000000000001-*")); len(m) != 2 {
		t.Fatalf("stream 1's snapshot files %v, want the two copies", m)
	}
	rep, err = j.Compact()
	if err != nil || len(rep.DeletedSegments) != segs-1 || len(rep.PinnedBy) != 0 {
		t.Fatalf("with the copy: %+v %v (segments %d)", rep, err, segs)
	}
	closeT(t, j)
	// Either copy serves: corrupt one, then the other.
	for _, name := range []string{copyName, snapshotName(1, quiet)} {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		b[len(b)-1] ^= 0xFF
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
		j = openT(t, Options{Dir: dir})
		snaps, _ := all(t, j)
		fallback := 0 // Open tries the copy first (by name)
		if name == copyName {
			fallback = 1
		}
		if snaps[1] != fmt.Sprintf("%d:quiet", quiet) || j.Report().FallbackSnapshots != fallback {
			t.Fatalf("after %s went bad: %v, report %+v", name, snaps, j.Report())
		}
		closeT(t, j)
		if name == copyName {
			// Put the copy back whole, from the other (same LSN, same data).
			b, _ := os.ReadFile(filepath.Join(dir, snapshotName(1, quiet)))
			os.WriteFile(filepath.Join(dir, copyName), b, 0o644)
			os.Remove(filepath.Join(dir, copyName+corruptSuffix))
		}
	}
}

func TestFatalSyncError(t *testing.T) {
	j := openT(t, Options{Dir: t.TempDir()})
	appendN(t, j, 2, 1, 8)
	boom := errors.New("EIO")
	j.mu.Lock()
	j.syncRange = func(*segment, int, int) error { return boom }
	j.mu.Unlock()
	var cbErrs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		if _, _, err := j.Append([]Entry{{Type: 1}}, func(_ uint64, err error) {
			mu.Lock()
			cbErrs = append(cbErrs, err)
			mu.Unlock()
			wg.Done()
		}); err != nil {
			wg.Done() // already failed
		}
	}
	wg.Wait()
	for _, err := range cbErrs {
		if !errors.Is(err, ErrSyncFailed) || !errors.Is(err, boom) {
			t.Fatalf("callback error %v", err)
		}
	}
	if !errors.Is(j.Err(), ErrSyncFailed) {
		t.Fatalf("Err() = %v", j.Err())
	}
	if _, _, err := j.Append([]Entry{{Type: 1}}, nil); !errors.Is(err, ErrSyncFailed) {
		t.Fatalf("append after fatal: %v", err)
	}
	if j.DurableLSN() != 2 {
		t.Fatalf("durable LSN moved past the failure: %d", j.DurableLSN())
	}
	if err := j.WriteSnapshot(1, 1, nil); !errors.Is(err, ErrSyncFailed) {
		t.Fatalf("snapshot after fatal: %v", err)
	}
	if err := j.Close(); !errors.Is(err, ErrSyncFailed) {
		t.Fatalf("Close: %v", err)
	}
}

func TestSyncPolicies(t *testing.T) {
	for _, p := range []SyncPolicy{SyncInterval, SyncNone} {
		t.Run(p.String(), func(t *testing.T) {
			dir := t.TempDir()
			j := openT(t, Options{Dir: dir, Sync: p, SyncIntervalMs: 2})
			var calls int
			j.syncRange = func(s *segment, from, to int) error { calls++; return s.sync(from, to) }
			start := time.Now()
			appendN(t, j, 20, 1, 16)
			if p == SyncInterval && time.Since(start) < 20*2*time.Millisecond/2 {
				t.Errorf("20 interval acks took only %v", time.Since(start))
			}
			closeT(t, j)
			if p == SyncNone && (calls != 0 || j.Syncs() != 0) {
				t.Errorf("SyncNone synced %d times (Syncs() %d)", calls, j.Syncs())
			}
			if p == SyncInterval && j.Syncs() == 0 {
				t.Error("SyncInterval: Syncs() = 0")
			}
			j = openT(t, Options{Dir: dir})
			defer closeT(t, j)
			if _, recs := all(t, j); len(recs) != 20 {
				t.Fatalf("%d records", len(recs))
			}
		})
	}
}

func TestOpenOptionsAndLock(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []Options{{}, {Dir: dir, SegmentSizeBytes: 100}, {Dir: dir, Sync: 7}} {
		if _, err := Open(o); err == nil {
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
	j := openT(t, Options{Dir: dir})
	if _, err := Open(Options{Dir: dir}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v", err)
	}
	closeT(t, j)
	if err := j.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := j.Append([]Entry{{Type: 1}}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v", err)
	}
	if err := j.Replay(nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Replay after Close: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, segmentName(1))); err != nil || fi.Size() != testSegmentBytes {
		t.Fatalf("segment not preallocated: %v %v", fi, err)
	}
}

func TestAppendWaitContext(t *testing.T) {
	j := openT(t, Options{Dir: t.TempDir(), Sync: SyncInterval, SyncIntervalMs: 1000})
	defer closeT(t, j)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := j.AppendWait(ctx, Entry{Type: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
}

// Replay's callbacks may append, wait and snapshot while Compact runs
// concurrently: the flusher takes no reader lock, and Compact releases the
// snapshot lock before waiting for readers.
func TestReplayCallbacksMayAppendDuringCompact(t *testing.T) {
	j := openT(t, Options{Dir: t.TempDir()})
	defer closeT(t, j)
	for i := range 400 {
		j.Append([]Entry{{Stream: 1, Type: 1, Payload: payloadFor(i, 500)}}, nil)
	}
	last, _ := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1})
	compacted := make(chan error, 1)
	n := 0
	err := j.Replay(nil, func(r Record) error {
		n++
		if n == 1 {
			go func() { _, err := j.Compact(); compacted <- err }()
			time.Sleep(10 * time.Millisecond) // let Compact queue for the write lock
		}
		if n%100 == 0 {
			if _, err := j.AppendWait(context.Background(), Entry{Stream: 2, Type: 1}); err != nil {
				return err
			}
			if err := j.WriteSnapshot(1, last, []byte("s")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || n < 400 {
		t.Fatalf("replay: %d records, %v", n, err)
	}
	select {
	case err := <-compacted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Compact deadlocked")
	}
}

// countSyncs makes j count its msyncs (set before the first append).
func countSyncs(j *Journal) *atomic.Int64 {
	var n atomic.Int64
	j.syncRange = func(s *segment, from, to int) error { n.Add(1); return s.sync(from, to) }
	return &n
}

// A lazy append starts no sync of its own: it waits for the next one an urgent
// append (or a wait) asks for, and is carried by it; with nothing else, its
// deadline's timer makes it durable.
func TestAppendWithinRidesOnTheNextSync(t *testing.T) {
	j := openT(t, Options{Dir: t.TempDir()})
	syncs := countSyncs(j)
	durable := make(chan uint64, 16)
	cb := func(lsn uint64, err error) {
		if err != nil {
			t.Errorf("callback: %v", err)
		}
		durable <- lsn
	}
	_, lazy1, err := j.AppendWithin([]Entry{{Stream: 1, Type: 1, Payload: []byte("a")}}, time.Hour, cb)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.AppendWithin([]Entry{{Stream: 1, Type: 1, Payload: []byte("b")}}, time.Hour, cb); err != nil {
		t.Fatal(err)
	}
	select {
	case lsn := <-durable:
		t.Fatalf("a lazy append due in an hour was durable (%d) with no other sync", lsn)
	case <-time.After(50 * time.Millisecond):
	}
	if n := syncs.Load(); n != 0 {
		t.Fatalf("%d syncs for lazy appends only", n)
	}
	urgent, err := j.AppendWait(context.Background(), Entry{Stream: 1, Type: 1, Payload: []byte("c")})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case lsn := <-durable:
			if lsn > urgent || lsn < lazy1 {
				t.Fatalf("lazy callback with LSN %d (lazy from %d, urgent %d)", lsn, lazy1, urgent)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the urgent append's sync did not call the lazy appends' callbacks")
		}
	}
	if n := syncs.Load(); n != 1 {
		t.Fatalf("the urgent append's sync should carry the lazy ones: %d syncs", n)
	}
	if d := j.DurableLSN(); d != urgent {
		t.Fatalf("durable %d, want %d", d, urgent)
	}

	// Alone, a lazy append is durable once its deadline has passed.
	start := time.Now()
	_, last, err := j.AppendWithin([]Entry{{Stream: 1, Type: 1, Payload: []byte("d")}}, 20*time.Millisecond, cb)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case lsn := <-durable:
		if lsn != last {
			t.Fatalf("durable %d, want %d", lsn, last)
		}
		if el := time.Since(start); el < 20*time.Millisecond {
			t.Fatalf("a lazy append was synced after %v, before its 20 ms", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lazy append alone never became durable")
	}
	// An earlier deadline than the one waiting moves the timer forward.
	if _, _, err := j.AppendWithin([]Entry{{Stream: 1, Type: 1, Payload: []byte("e")}}, time.Hour, cb); err != nil {
		t.Fatal(err)
	}
	if _, last, err = j.AppendWithin([]Entry{{Stream: 1, Type: 1, Payload: []byte("f")}}, 10*time.Millisecond, cb); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-durable:
		case <-time.After(10 * time.Second):
			t.Fatal("an earlier lazy deadline did not move the flusher's timer")
		}
	}
	if d := j.DurableLSN(); d != last {
		t.Fatalf("durable %d, want %d", d, last)
	}
	closeT(t, j)
}

// Close makes lazy appends durable and calls their callbacks; a reopened journal
// has them.
func TestAppendWithinDurableAtClose(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, Options{Dir: dir})
	var got []error
	var mu sync.Mutex
	for i := range 5 {
		if _, _, err := j.AppendWithin([]Entry{{Stream: 2, Type: 1, Payload: payloadFor(i, 40)}}, time.Hour, func(_ uint64, err error) {
			mu.Lock()
			got = append(got, err)
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	closeT(t, j)
	if len(got) != 5 || slices.ContainsFunc(got, func(e error) bool { return e != nil }) {
		t.Fatalf("callbacks at Close: %v", got)
	}
	j = openT(t, Options{Dir: dir})
	defer closeT(t, j)
	if _, recs := all(t, j); len(recs) != 5 {
		t.Fatalf("%d records after reopen, want 5", len(recs))
	}
}

// Under the other policies AppendWithin is Append.
func TestAppendWithinOtherPolicies(t *testing.T) {
	for _, p := range []SyncPolicy{SyncInterval, SyncNone} {
		t.Run(p.String(), func(t *testing.T) {
			j := openT(t, Options{Dir: t.TempDir(), Sync: p, SyncIntervalMs: 2})
			defer closeT(t, j)
			done := make(chan error, 1)
			if _, _, err := j.AppendWithin([]Entry{{Stream: 1, Type: 1}}, time.Hour, func(_ uint64, err error) { done <- err }); err != nil {
				t.Fatal(err)
			}
			j.mu.Lock()
			lazyBy := j.lazyBy
			j.mu.Unlock()
			if !lazyBy.IsZero() {
				t.Fatalf("%s: a lazy deadline was kept (%v)", p, lazyBy)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: AppendWithin waited for its hour", p)
			}
		})
	}
}

// SyncNow syncs what lazy appends left waiting, without an append of its own.
func TestSyncNowCarriesLazyAppends(t *testing.T) {
	j := openT(t, Options{Dir: t.TempDir()})
	defer closeT(t, j)
	syncs := countSyncs(j)
	j.SyncNow() // nothing appended: nothing to sync
	done := make(chan uint64, 1)
	_, last, err := j.AppendWithin([]Entry{{Stream: 1, Type: 1}}, time.Hour, func(lsn uint64, err error) {
		if err != nil {
			t.Errorf("callback: %v", err)
		}
		done <- lsn
	})
	if err != nil {
		t.Fatal(err)
	}
	j.SyncNow()
	select {
	case lsn := <-done:
		if lsn != last {
			t.Fatalf("durable %d, want %d", lsn, last)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SyncNow did not sync a lazy append")
	}
	if n := syncs.Load(); n != 1 {
		t.Fatalf("%d syncs, want 1", n)
	}
	if n := j.Syncs(); n != 1 {
		t.Fatalf("Syncs() = %d, want 1", n)
	}
}

// The lazy deadline's timer is Options.AfterFunc when given.
func TestLazyTimerIsOptionsAfterFunc(t *testing.T) {
	var calls atomic.Int64
	j := openT(t, Options{Dir: t.TempDir(), AfterFunc: func(d time.Duration, fn func()) interface{ Stop() bool } {
		calls.Add(1)
		return time.AfterFunc(d, fn)
	}})
	defer closeT(t, j)
	done := make(chan error, 1)
	if _, _, err := j.AppendWithin([]Entry{{Stream: 1, Type: 1}}, 5*time.Millisecond, func(_ uint64, err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lazy append was never synced")
	}
	if calls.Load() == 0 {
		t.Fatal("the journal did not use Options.AfterFunc for the lazy deadline")
	}
}

// OnSync hears of every group commit that synced, with how long its syncs took,
// and of none that failed or that the policy skipped.
func TestOnSyncTimesEverySync(t *testing.T) {
	type call struct {
		took time.Duration
		at   time.Time
	}
	var mu sync.Mutex
	var calls []call
	onSync := func(took time.Duration, at time.Time) {
		mu.Lock()
		calls = append(calls, call{took, at})
		mu.Unlock()
	}
	j := openT(t, Options{Dir: t.TempDir(), OnSync: onSync})
	const slow = 30 * time.Millisecond
	j.mu.Lock()
	j.syncRange = func(s *segment, from, to int) error { time.Sleep(slow); return s.sync(from, to) }
	j.mu.Unlock()
	before := time.Now()
	appendN(t, j, 3, 1, 8) // one at a time: three syncs
	mu.Lock()
	got := slices.Clone(calls)
	mu.Unlock()
	if uint64(len(got)) != j.Syncs() || len(got) < 3 {
		t.Fatalf("%d OnSync calls for %d syncs", len(got), j.Syncs())
	}
	for i, c := range got {
		if c.took < slow || c.took > time.Since(before) || c.at.Before(before.Add(c.took)) || c.at.After(time.Now()) {
			t.Errorf("call %d: took %v at %v (syncs sleep %v; started %v)", i, c.took, c.at, slow, before)
		}
	}
	boom := errors.New("EIO")
	j.mu.Lock()
	j.syncRange = func(*segment, int, int) error { return boom }
	j.mu.Unlock()
	if _, err := j.AppendWait(context.Background(), Entry{Type: 1}); !errors.Is(err, boom) {
		t.Fatalf("append on a failing disk: %v", err)
	}
	mu.Lock()
	if len(calls) != len(got) {
		t.Errorf("a failed sync was reported: %d calls after it, %d before", len(calls), len(got))
	}
	mu.Unlock()
	_ = j.Close()

	calls = nil
	j = openT(t, Options{Dir: t.TempDir(), Sync: SyncNone, OnSync: onSync})
	appendN(t, j, 3, 1, 8)
	closeT(t, j)
	if len(calls) != 0 {
		t.Errorf("SyncNone: %d OnSync calls", len(calls))
	}
}

// TestFailSyncOption: the fault injection of a test process fails the next sync as
// the disk would (the journal stops, every waiter hears it), and Failed is closed
// then, not before.
func TestFailSyncOption(t *testing.T) {
	var fail atomic.Bool
	j := openT(t, Options{Dir: t.TempDir(), FailSync: func() error {
		if fail.Load() {
			return errors.New("injected")
		}
		return nil
	}})
	defer func() { _ = j.Close() }() // its error is the sync's
	if _, err := j.AppendWait(context.Background(), Entry{Type: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.Failed():
		t.Fatal("Failed closed on a healthy journal")
	default:
	}
	fail.Store(true)
	if _, err := j.AppendWait(context.Background(), Entry{Type: 1}); !errors.Is(err, ErrSyncFailed) {
		t.Fatalf("append with the sync failing: %v, want ErrSyncFailed", err)
	}
	select {
	case <-j.Failed():
	case <-time.After(5 * time.Second):
		t.Fatal("Failed not closed after a failed sync")
	}
	if !errors.Is(j.Err(), ErrSyncFailed) || j.DurableLSN() != 1 {
		t.Fatalf("Err %v, durable %d: want ErrSyncFailed and 1", j.Err(), j.DurableLSN())
	}
}
