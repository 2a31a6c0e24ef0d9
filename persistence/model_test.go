package persistence

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// model is the reference: what Replay must hand back.
type model struct {
	recs  []Record          // every appended record, in LSN order
	snaps map[uint64]Record // newest snapshot per stream (LSN + data in Payload)
	drops map[uint64]uint64 // stream -> LSN of its latest drop
}

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
// constantly) and checks Replay and ReadStream against the model.
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
		m := &model{snaps: map[uint64]Record{}, drops: map[uint64]uint64{}}
		stream := rapid.Uint64Range(0, 4)
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
				data := []byte(fmt.Sprintf("state-%d-%d", s, lsn))
				if err := j.WriteSnapshot(s, lsn, data); err != nil {
					t.Fatal(err)
				}
				m.snaps[s] = Record{LSN: lsn, Payload: data}
			},
			"drop": func(t *rapid.T) {
				s := stream.Draw(t, "stream")
				if err := j.DropStream(s); err != nil {
					t.Fatal(err)
				}
				m.recs = append(m.recs, Record{LSN: j.LastLSN(), Stream: s, Type: typeDropStream})
				m.drops[s] = j.LastLSN()
				delete(m.snaps, s)
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
