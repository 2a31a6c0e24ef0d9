package persistence

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// model is the reference: what Replay must hand back.
type model struct {
	recs  []Record          // every appended record, in LSN order
	snaps map[uint64]Record // newest snapshot per stream (LSN + data in Payload)
	drops map[uint64]uint64 // stream -> LSN of its latest drop
	kept  map[uint64][]uint64
}

// snapshotted is what the journal keeps of stream's snapshots after one at lsn:
// the two newest, newest first, a second at the same LSN counting as one of them
// (a third is not kept).
func (m *model) snapshotted(stream, lsn uint64) {
	k := m.kept[stream]
	if len(k) >= 2 && k[0] == lsn && k[1] == lsn {
		return
	}
	k = append([]uint64{lsn}, k...)
	m.kept[stream] = k[:min(len(k), 2)]
}

func snapData(stream, lsn uint64) []byte { return []byte(fmt.Sprintf("state-%d-%d", stream, lsn)) }

func (m *model) expect() (snaps []string, recs []string) {
	for _, s := range slices.Sorted(maps.Keys(m.snaps)) {
		snaps = append(snaps, fmt.Sprintf("%d@%d:%x", s, m.snaps[s].LSN, m.snaps[s].Payload))
	}
	for _, r := range m.recs {
		if sn, ok := m.snaps[r.Stream]; ok && r.LSN <= sn.LSN {
			continue
		}
		if r.LSN < m.drops[r.Stream] {
			continue
		}
		recs = append(recs, fmt.Sprintf("%d@%d:%x", r.Stream, r.LSN, r.Payload))
	}
	return snaps, recs
}

func observe(t *rapid.T, j *Journal) (snaps []string, recs []string) {
	err := j.Replay(func(stream, lsn uint64, data []byte) error {
		snaps = append(snaps, fmt.Sprintf("%d@%d:%x", stream, lsn, data))
		return nil
	}, func(r Record) error {
		recs = append(recs, fmt.Sprintf("%d@%d:%x", r.Stream, r.LSN, r.Payload))
		return nil
	})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	return snaps, recs
}

// TestJournalModel drives a journal with random appends, snapshots, drops,
// compactions and reopens (tiny segments, so rollovers and compaction happen
// constantly) and checks Replay and ReadStream against the model. Two more
// actions check compaction: a corrupt newest snapshot falls back to the one kept
// before it and finds every record after it still there, and snapshotting every
// stream at the last LSN (once or twice) and compacting deletes what is covered;
// when each was snapshotted twice, every segment but the active one (a stream
// that appends nothing after its snapshot must not hold the log).
func TestJournalModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		dir, err := os.MkdirTemp("", "kjob-model-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		opts := Options{Dir: dir, SegmentSizeBytes: MinSegmentSizeBytes, Sync: SyncNone}
		j, err := Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { j.Close() }()
		m := &model{snaps: map[uint64]Record{}, drops: map[uint64]uint64{}, kept: map[uint64][]uint64{}}
		stream := rapid.Uint64Range(0, 4)
		// corrupt damages the snapshot of s that Open tries first and reopens: Open
		// falls back to the one kept before it, and the records after that must all
		// still be there (the "" check).
		corrupt := func(t *rapid.T, s uint64) {
			// The file Open tries first: the highest LSN, then the first name.
			var files []string
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if st, _, ok := parseSnapshotName(e.Name()); ok && st == s {
					files = append(files, e.Name())
				}
			}
			slices.SortFunc(files, func(a, b string) int {
				_, la, _ := parseSnapshotName(a)
				_, lb, _ := parseSnapshotName(b)
				if la != lb {
					return -cmpU64(la, lb)
				}
				return strings.Compare(a, b)
			})
			if len(files) != 2 {
				t.Fatalf("stream %d: snapshot files %v, want the 2 kept (%v)", s, files, m.kept[s])
			}
			b, err := os.ReadFile(filepath.Join(dir, files[0]))
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-1] ^= 0xFF
			if err := os.WriteFile(filepath.Join(dir, files[0]), b, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			if j, err = Open(opts); err != nil {
				t.Fatal(err)
			}
			if rep := j.Report(); rep.FallbackSnapshots != 1 {
				t.Fatalf("reopen after corrupting %s reported %+v", files[0], rep)
			}
			fall := m.kept[s][1]
			m.snaps[s] = Record{LSN: fall, Payload: snapData(s, fall)}
			m.kept[s] = m.kept[s][1:]
		}
		t.Repeat(map[string]func(*rapid.T){
			"append": func(t *rapid.T) {
				n := rapid.IntRange(1, 4).Draw(t, "n")
				var es []Entry
				for range n {
					es = append(es, Entry{
						Stream:  stream.Draw(t, "stream"),
						Type:    uint8(rapid.IntRange(1, int(MaxUserType)).Draw(t, "type")),
						Payload: rapid.SliceOfN(rapid.Byte(), 0, 900).Draw(t, "payload"),
					})
				}
				first, _, err := j.Append(es, nil)
				if err != nil {
					t.Fatal(err)
				}
				for i, e := range es {
					m.recs = append(m.recs, Record{LSN: first + uint64(i), Stream: e.Stream, Type: e.Type, Payload: bytes.Clone(e.Payload)})
				}
			},
			"snapshot": func(t *rapid.T) {
				s := stream.Draw(t, "stream")
				last := j.LastLSN()
				lo := max(m.snaps[s].LSN, m.drops[s], 1)
				if last < lo {
					t.Skip("nothing to cover")
				}
				lsn := rapid.Uint64Range(lo, last).Draw(t, "lsn")
				data := snapData(s, lsn)
				if err := j.WriteSnapshot(s, lsn, data); err != nil {
					t.Fatal(err)
				}
				m.snaps[s] = Record{LSN: lsn, Payload: data}
				m.snapshotted(s, lsn)
			},
			"corrupt newest snapshot": func(t *rapid.T) {
				s := stream.Draw(t, "stream")
				if len(m.kept[s]) < 2 {
					t.Skip("no snapshot to fall back to")
				}
				corrupt(t, s)
			},
			"settle and compact": func(t *rapid.T) {
				// Filler first, so that what came before is in segments compaction may
				// delete (the active one never goes).
				for range rapid.IntRange(0, 8).Draw(t, "filler") {
					e := Entry{Stream: stream.Draw(t, "stream"), Type: 1, Payload: bytes.Repeat([]byte{7}, 900)}
					first, _, err := j.Append([]Entry{e}, nil)
					if err != nil {
						t.Fatal(err)
					}
					m.recs = append(m.recs, Record{LSN: first, Stream: e.Stream, Type: e.Type, Payload: e.Payload})
				}
				last := j.LastLSN()
				if last == 0 {
					t.Skip("empty")
				}
				all := true // every stream twice: then nothing holds the log
				for s := uint64(0); s <= 4; s++ {
					times := 2
					if !rapid.Bool().Draw(t, "twice") {
						times, all = 1, false
					}
					for range times {
						if err := j.WriteSnapshot(s, last, snapData(s, last)); err != nil {
							t.Fatal(err)
						}
						m.snaps[s] = Record{LSN: last, Payload: snapData(s, last)}
						m.snapshotted(s, last)
					}
				}
				if _, err := j.Compact(); err != nil {
					t.Fatal(err)
				}
				if n := j.Segments(); all && n != 1 {
					t.Fatalf("%d segments after every stream was snapshotted twice at the last LSN %d and compacted, want only the active one", n, last)
				}
				// A stream snapshotted once now falls back to its snapshot before:
				// compaction must have kept the records after that.
				for s := uint64(0); s <= 4; s++ {
					if k := m.kept[s]; len(k) == 2 && k[1] < k[0] && rapid.Bool().Draw(t, "corrupt") {
						corrupt(t, s)
						break
					}
				}
			},
			"drop": func(t *rapid.T) {
				s := stream.Draw(t, "stream")
				if err := j.DropStream(s); err != nil {
					t.Fatal(err)
				}
				m.recs = append(m.recs, Record{LSN: j.LastLSN(), Stream: s, Type: typeDropStream})
				m.drops[s] = j.LastLSN()
				delete(m.snaps, s)
				delete(m.kept, s)
			},
			"compact": func(t *rapid.T) {
				if _, err := j.Compact(); err != nil {
					t.Fatal(err)
				}
			},
			"reopen": func(t *rapid.T) {
				if err := j.Close(); err != nil {
					t.Fatal(err)
				}
				if j, err = Open(opts); err != nil {
					t.Fatal(err)
				}
				if rep := j.Report(); rep.TruncatedBytes != 0 || rep.FallbackSnapshots != 0 {
					t.Fatalf("clean reopen reported %+v", rep)
				}
			},
			"": func(t *rapid.T) {
				// Drop internal records from the model's view before comparing.
				var visible []Record
				for _, r := range m.recs {
					if r.Type <= MaxUserType {
						visible = append(visible, r)
					}
				}
				if last := j.LastLSN(); last > 0 {
					if err := j.waitDurable(last); err != nil {
						t.Fatal(err)
					}
				}
				mm := &model{recs: visible, snaps: m.snaps, drops: m.drops}
				ws, wr := mm.expect()
				gs, gr := observe(t, j)
				if !slices.Equal(ws, gs) {
					t.Fatalf("snapshots: got %v, want %v", gs, ws)
				}
				if !slices.Equal(wr, gr) {
					t.Fatalf("records: got %d, want %d\ngot  %.300v\nwant %.300v", len(gr), len(wr), gr, wr)
				}
				// ReadStream from just after the snapshot yields the same records.
				s := stream.Draw(t, "stream")
				var got []string
				if err := j.ReadStream(s, m.snaps[s].LSN+1, func(r Record) error {
					got = append(got, fmt.Sprintf("%d@%d:%x", r.Stream, r.LSN, r.Payload))
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				var want []string
				for _, r := range wr {
					if r[:len(fmt.Sprint(s))+1] == fmt.Sprintf("%d@", s) {
						want = append(want, r)
					}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("ReadStream(%d): got %v, want %v", s, got, want)
				}
				if j.LastLSN() != uint64(len(m.recs)) {
					t.Fatalf("LastLSN %d, model has %d records", j.LastLSN(), len(m.recs))
				}
			},
		})
	})
}
