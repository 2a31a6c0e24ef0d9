package core

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// randRunRecord is a run record with any of its fields set, at their extremes too
// (negative and extreme times, attempts and outcomes the .proto does not name,
// long and multi-byte strings).
func randRunRecord(rng *rand.Rand) *messages.RunRecord {
	i64 := func() int64 { return randI64(rng) }
	str := func() string { return randStr(rng, 20000) }
	i32 := []int32{0, 1, -1, math.MaxInt32, math.MinInt32, 3}
	return &messages.RunRecord{RunId: str(), JobId: i64(), DueMs: i64(), DispatchedMs: i64(), StartMs: i64(),
		EndMs: i64(), Attempt: i32[rng.IntN(len(i32))], WorkerId: str(), Outcome: messages.Outcome(i32[rng.IntN(len(i32))]),
		Error: str(), TraceId: str(), SetsNext: rng.IntN(2) == 0, JobNextDueMs: i64()}
}

// The run record's fast encoder writes the bytes proto.Marshal writes for every
// record it takes; it takes every record whose strings are UTF-8 and that has no
// unknown fields, and leaves the others to proto.Marshal with the buffer as it was.
func TestAppendRunRecordFastMatchesProto(t *testing.T) {
	if !runRecordFieldsKnown() {
		t.Skip("messages.RunRecord has fields the fast encoder does not know")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	prefix := []byte("earlier records")
	for i := range 20_000 {
		r := randRunRecord(rng)
		odd := i % 8
		switch odd {
		case 0: // an unknown field
			r.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
		case 1: // invalid UTF-8
			switch rng.IntN(4) {
			case 0:
				r.RunId = "a\xff"
			case 1:
				r.WorkerId = "\xc3"
			case 2:
				r.Error = "failed: \xed\xa0\x80"
			default:
				r.TraceId = "\xfe"
			}
		}
		buf := append(make([]byte, 0, rng.IntN(64)), prefix...)
		got, ok := appendRunRecordFast(buf, r)
		if odd <= 1 {
			if ok || !bytes.Equal(got, prefix) {
				t.Fatalf("record %d (case %d) should have been left to proto.Marshal, the buffer as it was: took it %v, %q", i, odd, ok, got)
			}
			continue
		}
		if !ok {
			t.Fatalf("record %d was left to proto.Marshal: %v", i, r)
		}
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:len(prefix)], prefix) || !bytes.Equal(got[len(prefix):], want) {
			t.Fatalf("record %d: fast %x\nproto %x\n(%v)", i, got[len(prefix):], want, r)
		}
	}
}

// FuzzAppendRunRecordFast: any run record protobuf can decode, encoded again by the
// fast encoder, gives proto.Marshal's bytes (or is left to it).
func FuzzAppendRunRecordFast(f *testing.F) {
	rng := rand.New(rand.NewPCG(13, 14))
	for range 20 {
		b, _ := proto.Marshal(randRunRecord(rng))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &messages.RunRecord{}
		if proto.Unmarshal(b, r) != nil {
			return
		}
		got, ok := appendRunRecordFast(nil, r)
		want, err := proto.Marshal(r)
		if !ok {
			if err == nil && runRecordFieldsKnown() && len(r.ProtoReflect().GetUnknown()) == 0 {
				t.Fatalf("a record proto.Marshal takes, without unknown fields, was left to it: %v", r)
			}
			return
		}
		if err != nil {
			t.Fatalf("the fast encoder took a record proto.Marshal refuses (%v): %v", err, r)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("fast %x\nproto %x\n(%v)", got, want, r)
		}
	})
}

// A packed job is the bytes a ShardSnapshot of the job and its history marshals
// to, whatever the lengths (a one-byte length, and the two- and three-byte ones
// appendMessage moves the bytes up for), and unpacks to them.
func TestPackOfIsSnapshotBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for i := range 2_000 {
		jm := randJobForEncode(rng)
		if i%5 == 0 {
			jm.Params = randBytes(rng, 20_000+rng.IntN(20_000))
		}
		if i%7 == 0 {
			jm.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5)) // left to proto.Marshal
		}
		j := &job{j: jm}
		for range rng.IntN(4) {
			j.history = append(j.history, randRunRecord(rng))
		}
		got := packOf([]byte("x"), j)[1:]
		want, err := proto.Marshal(&messages.ShardSnapshot{Jobs: []*messages.Job{jm}, History: j.history})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("job %d: packed %x\nsnapshot %x", i, got, want)
		}
		back, hist := unpack(got)
		if !proto.Equal(back, jm) || len(hist) != len(j.history) {
			t.Fatalf("job %d: unpacks to %v and %d records", i, back, len(hist))
		}
		for k := range hist {
			if !proto.Equal(hist[k], j.history[k]) {
				t.Fatalf("job %d: record %d unpacks to %v, not %v", i, k, hist[k], j.history[k])
			}
		}
	}
}
