package core

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

func randJobForDecode(rng *rand.Rand) *messages.Job {
	j := &messages.Job{Id: rng.Int64(), App: "app", Handler: "h" + string(rune('a'+rng.IntN(26))),
		State: messages.JobState(rng.IntN(4)), Version: rng.Int64N(10), CreatedMs: rng.Int64(), UpdatedMs: -rng.Int64N(5),
		NextDueMs: rng.Int64N(1 << 50), Runs: rng.Int64N(3), LastDueMs: rng.Int64N(9), LastFinishMs: rng.Int64N(9), RequestId: rng.Int64()}
	if rng.IntN(3) > 0 {
		j.Params = make([]byte, rng.IntN(40))
		for i := range j.Params {
			j.Params[i] = byte(rng.IntN(256))
		}
	}
	switch rng.IntN(4) {
	case 0:
	case 1:
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: rng.Int64(), DelayMs: rng.Int64N(100)}
	case 2:
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "0 0 2 * * *", Tz: "Asia/Shanghai",
			NotBeforeMs: rng.Int64(), NotAfterMs: rng.Int64(), MaxRuns: rng.Int64N(5)}
	case 3:
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind(rng.IntN(8)), EveryMs: rng.Int64N(1e6), StartMs: -rng.Int64N(9)}
	}
	if rng.IntN(5) == 0 {
		j.Policy = &messages.Policy{Attempts: 3}
	}
	return j
}

// The fast decoder gives what proto.Unmarshal gives, for every job it takes; it
// takes every job without a policy; it gives up on what it does not know.
func TestDecodeJobFastMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	took := 0
	for i := range 20_000 {
		j := randJobForDecode(rng)
		b, err := proto.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		switch i % 10 {
		case 0: // an unknown field
			b = protowire.AppendVarint(protowire.AppendTag(b, 99, protowire.VarintType), 5)
		case 1: // invalid UTF-8 in the handler
			b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), []byte{0xff, 0xfe})
		case 2: // a truncated record
			if len(b) > 3 {
				b = b[:len(b)-2]
			}
		}
		want := &messages.Job{}
		werr := proto.Unmarshal(b, want)
		got, ok := decodeJobFast(b)
		if !ok {
			if i%10 >= 3 && j.Policy == nil {
				t.Fatalf("job %d without a policy or anything odd was left to proto.Unmarshal: %v", i, j)
			}
			continue
		}
		took++
		if werr != nil {
			t.Fatalf("job %d: fast decode accepted what proto.Unmarshal refuses (%v)", i, werr)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("job %d: fast %v\nproto %v", i, got, want)
		}
		if i%10 < 3 {
			t.Fatalf("job %d (case %d) should have been left to proto.Unmarshal", i, i%10)
		}
	}
	if took < 10_000 {
		t.Fatalf("the fast path took only %d of 20,000", took)
	}
}

// FuzzDecodeJobFast: on any bytes, what the fast decoder takes proto.Unmarshal
// decodes to the same job.
func FuzzDecodeJobFast(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		b, _ := proto.Marshal(randJobForDecode(rng))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeJobFast(b)
		if !ok {
			return
		}
		want := &messages.Job{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatalf("fast decode took bytes proto.Unmarshal refuses: %v", err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("fast %v\nproto %v", got, want)
		}
	})
}
