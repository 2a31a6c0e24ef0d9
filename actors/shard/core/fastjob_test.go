package core

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// randBytes is n random bytes.
func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	return b
}

func randJobForDecode(rng *rand.Rand) *messages.Job {
	j := &messages.Job{Id: rng.Int64(), App: "app", Handler: "h" + string(rune('a'+rng.IntN(26))),
		State: messages.JobState(rng.IntN(4)), Version: rng.Int64N(10), CreatedMs: rng.Int64(), UpdatedMs: -rng.Int64N(5),
		NextDueMs: rng.Int64N(1 << 50), Runs: rng.Int64N(3), LastDueMs: rng.Int64N(9), LastFinishMs: rng.Int64N(9), RequestId: rng.Int64()}
	if rng.IntN(3) > 0 {
		j.Params = randBytes(rng, rng.IntN(40))
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

// compactishJob is a job that can be kept compact, or, now and then, one that
// misses by a single field.
func compactishJob(rng *rand.Rand) *messages.Job {
	j := &messages.Job{Id: rng.Int64(), App: "app", Handler: "h" + string(rune('a'+rng.IntN(3))),
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 5_000},
		State:    messages.JobState_ACTIVE, Version: 1 + rng.Int64N(3), CreatedMs: 1_000, UpdatedMs: 1_000 + rng.Int64N(9),
		NextDueMs: 5_000, RequestId: rng.Int64()}
	if n := rng.IntN(coldParams + 2); n > 0 {
		j.Params = make([]byte, n-1) // present and empty, too
	}
	if rng.IntN(2) == 0 {
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 400}
		j.NextDueMs = 1_400
	}
	switch rng.IntN(16) {
	case 0:
		j.App = "other"
	case 1:
		j.Runs = 1
	case 2:
		j.State = messages.JobState_PAUSED
	case 3:
		j.Version = 1 << 32
	case 4:
		j.UpdatedMs = j.CreatedMs - 1
	case 5:
		j.NextDueMs++
	case 6:
		j.Schedule.Tz = "UTC"
	case 7:
		j.Schedule.MaxRuns = 1
	case 8:
		j.Schedule = nil
	case 9:
		j.LastFinishMs = 1
	}
	return j
}

// DecodeRecord leaves compact exactly the JOB_PUTs coldOf keeps compact, as the job
// proto.Unmarshal decodes; every other record is decoded as Decode decodes it.
func TestDecodeRecordMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	puts := 0
	for i := range 20_000 {
		var j *messages.Job
		if i%2 == 0 {
			j = compactishJob(rng)
		} else {
			j = randJobForDecode(rng)
		}
		b, err := proto.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 { // an unknown field
			b = protowire.AppendVarint(protowire.AppendTag(b, 99, protowire.VarintType), 5)
		}
		if put := checkDecodeRecord(t, b); put {
			puts++
		}
	}
	if puts < 2_000 {
		t.Fatalf("only %d of 20,000 jobs were left compact", puts)
	}
	// Records of other types are their messages.
	ref, _ := proto.Marshal(&messages.JobRef{Id: 7, RequestId: 9})
	d := DecodeRecord(messages.RecordType_JOB_DELETED, ref)
	if want, _ := Decode(messages.RecordType_JOB_DELETED, ref); d.put || d.err != nil || !proto.Equal(d.m, want) {
		t.Fatalf("JOB_DELETED decoded to %+v, want %v", d, want)
	}
}

// checkDecodeRecord checks DecodeRecord of JOB_PUT payload b against
// proto.Unmarshal and coldOf, and reports whether it was left compact.
func checkDecodeRecord(t *testing.T, b []byte) bool {
	t.Helper()
	want := &messages.Job{}
	werr := proto.Unmarshal(b, want)
	d := DecodeRecord(messages.RecordType_JOB_PUT, b)
	if (d.err != nil) != (werr != nil) {
		t.Fatalf("DecodeRecord error %v, proto.Unmarshal %v", d.err, werr)
	}
	if werr != nil {
		return false
	}
	wantCold, compact := coldOf(want, want.App, 0)
	if d.put != compact {
		t.Fatalf("left compact %v, coldOf says %v: %v", d.put, compact, want)
	}
	got := d.m
	if d.put {
		got = d.message(b)
		cj := d.cold
		cj.handle = wantCold.handle
		if cj != wantCold {
			t.Fatalf("compact %+v, coldOf %+v", d.cold, wantCold)
		}
	}
	if !proto.Equal(got, want) {
		t.Fatalf("decoded %v\nproto %v", got, want)
	}
	return d.put
}

// FuzzDecodeRecord: on any bytes, DecodeRecord of a JOB_PUT agrees with
// proto.Unmarshal and coldOf.
func FuzzDecodeRecord(f *testing.F) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20 {
		b, _ := proto.Marshal(compactishJob(rng))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecodeRecord(t, b) })
}

// A compact JOB_PUT the shard cannot keep compact (its handler table is full, the
// job is of another app, the shard keeps every job full) is replayed as its
// message would be.
func TestReplayCompactPutFallsBack(t *testing.T) {
	var log []persistence.Record
	put := func(j *messages.Job) {
		b, err := proto.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		log = append(log, persistence.Record{LSN: uint64(len(log) + 1), Type: uint8(messages.RecordType_JOB_PUT), Payload: b})
	}
	once := func(id int64, handler, app string) *messages.Job {
		return &messages.Job{Id: id, App: app, Handler: handler, Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 5_000},
			State: messages.JobState_ACTIVE, Version: 1, CreatedMs: 1_000, UpdatedMs: 1_000, NextDueMs: 5_000, RequestId: 100 + id}
	}
	for i := range maxInterned {
		put(once(int64(i+1), fmt.Sprint("h", i), "app"))
	}
	put(once(maxInterned+1, "one too many", "app"))
	put(once(maxInterned+2, "h0", "other"))
	put(once(1, "h1", "app")) // a new version of a compact job
	for _, full := range []bool{false, true} {
		cfg := Config{Shard: route.Root("app"), FullJobs: full}
		want := New(cfg, 1000, 1)
		if err := replayMessages(want, log); err != nil {
			t.Fatal(err)
		}
		got := New(cfg, 1000, 1)
		for _, r := range log {
			if err := got.Replay(r); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got.Snapshot(), want.Snapshot()) {
			t.Fatalf("full %v: replayed differently from the messages", full)
		}
		wantCompact := maxInterned
		if full {
			wantCompact = 0
		}
		if got.Compact() != wantCompact || got.Jobs() != maxInterned+2 {
			t.Fatalf("full %v: %d jobs, %d compact; want %d, %d", full, got.Jobs(), got.Compact(), maxInterned+2, wantCompact)
		}
	}
}
