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

// randResult is a result with any of its fields set, at their extremes too.
func randResult(rng *rand.Rand) *messages.RunResult {
	i64 := func() int64 {
		switch rng.IntN(6) {
		case 0:
			return 0
		case 1:
			return -rng.Int64N(1 << 40)
		case 2:
			return math.MinInt64
		case 3:
			return math.MaxInt64
		case 4:
			return rng.Int64N(200)
		}
		return rng.Int64()
	}
	str := func() string {
		switch rng.IntN(5) {
		case 0:
			return ""
		case 1:
			return "日本語-ü"
		case 2:
			return string(bytes.Repeat([]byte{'e'}, 100+rng.IntN(20000)))
		}
		return "w" + string(rune('a'+rng.IntN(26)))
	}
	i32 := []int32{0, 1, -1, math.MaxInt32, math.MinInt32, 6}
	r := &messages.RunResult{RunId: str(), JobId: i64(), Shard: str(), Epoch: i64(), Attempt: i32[rng.IntN(len(i32))],
		DueMs: i64(), Outcome: messages.Outcome(i32[rng.IntN(len(i32))]), Error: str(), StartMs: i64(), EndMs: i64(),
		WorkerId: str(), Duplicate: rng.IntN(2) == 0}
	switch rng.IntN(3) {
	case 0:
	case 1:
		r.Worker = &messages.Ref{}
	default:
		r.Worker = &messages.Ref{Address: str(), Id: str()}
	}
	return r
}

// The fast encoder gives proto.Marshal's bytes and size for every result it takes;
// it takes every one whose strings are UTF-8 and that has no unknown fields.
func TestAppendResultMatchesProto(t *testing.T) {
	if !resultFieldsKnown() {
		t.Skip("messages.RunResult has fields the fast encoder does not know")
	}
	rng := rand.New(rand.NewPCG(21, 22))
	for i := range 20_000 {
		r := randResult(rng)
		odd := i % 8
		switch odd {
		case 0: // an unknown field, in the result or its worker
			if r.Worker != nil && rng.IntN(2) == 0 {
				r.Worker.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
			} else {
				r.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
			}
		case 1: // invalid UTF-8
			switch rng.IntN(6) {
			case 0:
				r.RunId = "a\xff"
			case 1:
				r.Shard = "\xc3"
			case 2:
				r.Error = "failed: \xed\xa0\x80"
			case 3:
				r.WorkerId = "\xfe"
			case 4:
				r.Worker = &messages.Ref{Address: "127.0.0.1:\xff"}
			default:
				r.Worker = &messages.Ref{Id: "\xc0"}
			}
		}
		n, ok := resultSize(r)
		if odd <= 1 {
			if ok {
				t.Fatalf("result %d (case %d) should have been left to proto.Marshal: %v", i, odd, r)
			}
			continue
		}
		if !ok {
			t.Fatalf("result %d was left to proto.Marshal: %v", i, r)
		}
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got := appendResult([]byte("before"), r)
		if n != len(want) || !bytes.Equal(got[:6], []byte("before")) || !bytes.Equal(got[6:], want) {
			t.Fatalf("result %d: size %d, fast %x\nproto (%d) %x\n(%v)", i, n, got[6:], len(want), want, r)
		}
	}
}

// FuzzAppendResult: any result protobuf can decode, encoded again by the fast
// encoder, gives proto.Marshal's bytes (or is left to it).
func FuzzAppendResult(f *testing.F) {
	rng := rand.New(rand.NewPCG(23, 24))
	for range 20 {
		b, _ := proto.Marshal(randResult(rng))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &messages.RunResult{}
		if proto.Unmarshal(b, r) != nil {
			return
		}
		n, ok := resultSize(r)
		want, err := proto.Marshal(r)
		if !ok {
			if err == nil && resultFieldsKnown() && len(r.ProtoReflect().GetUnknown()) == 0 &&
				(r.Worker == nil || len(r.Worker.ProtoReflect().GetUnknown()) == 0) {
				t.Fatalf("a result proto.Marshal takes, without unknown fields, was left to it: %v", r)
			}
			return
		}
		if err != nil {
			t.Fatalf("the fast encoder took a result proto.Marshal refuses (%v): %v", err, r)
		}
		if got := appendResult(nil, r); n != len(got) || !bytes.Equal(got, want) {
			t.Fatalf("size %d, fast %x\nproto %x\n(%v)", n, got, want, r)
		}
	})
}
