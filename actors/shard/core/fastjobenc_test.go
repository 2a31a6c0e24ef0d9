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

// randI64 is an int64 at its extremes as often as not: zero, negative, the
// smallest and largest, small, any.
func randI64(rng *rand.Rand) int64 {
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

// randStr is a string: empty, multi-byte UTF-8, long (100 bytes and up to long
// more: a two-byte length and, past 16,283, a three-byte one), or short.
func randStr(rng *rand.Rand, long int) string {
	switch rng.IntN(5) {
	case 0:
		return ""
	case 1:
		return "日本語-ü"
	case 2:
		return string(bytes.Repeat([]byte{'x'}, 100+rng.IntN(long)))
	}
	return "h" + string(rune('a'+rng.IntN(26)))
}

// randJobForEncode is a job with any of its fields set, at their extremes too
// (negative ids and times, enum values the .proto does not name, long strings,
// multi-byte UTF-8, empty but non-nil params, an empty schedule, a policy).
func randJobForEncode(rng *rand.Rand) *messages.Job {
	i64 := func() int64 { return randI64(rng) }
	str := func() string { return randStr(rng, 300) }
	j := &messages.Job{Id: i64(), App: str(), Handler: str(), State: messages.JobState(rng.IntN(7) - 2),
		Version: i64(), CreatedMs: i64(), UpdatedMs: i64(), NextDueMs: i64(), Runs: i64(), LastDueMs: i64(),
		LastFinishMs: i64(), RequestId: i64()}
	switch rng.IntN(4) {
	case 0:
	case 1:
		j.Params = []byte{}
	default:
		j.Params = randBytes(rng, rng.IntN(300))
	}
	switch rng.IntN(4) {
	case 0:
	case 1:
		j.Schedule = &messages.Schedule{}
	default:
		j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind(rng.IntN(7) - 2), AtMs: i64(), DelayMs: i64(),
			Cron: str(), Tz: str(), EveryMs: i64(), StartMs: i64(), NotBeforeMs: i64(), NotAfterMs: i64(), MaxRuns: i64()}
	}
	switch rng.IntN(6) {
	case 0:
		j.Policy = &messages.Policy{}
	case 1:
		j.Policy = &messages.Policy{Attempts: int32(rng.IntN(5)) - 1, LadderMs: []int64{1000, i64()}, TimeoutMs: i64(), RouteKey: str(),
			Misfire: messages.Misfire(rng.IntN(6) - 2), Concurrency: messages.Concurrency(rng.IntN(6) - 2), Route: messages.Route(rng.IntN(6) - 2)}
		if rng.IntN(3) == 0 { // a newer writer's field: kept, after the known ones
			j.Policy.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 50, protowire.VarintType), 7))
		}
	}
	return j
}

// The fast encoder writes the bytes proto.Marshal writes, for every job it takes;
// it takes every job whose strings are UTF-8 and that has no unknown fields; it
// leaves the others to proto.Marshal, with the buffer as it was.
func TestAppendJobFastMatchesProto(t *testing.T) {
	if !coldFieldsKnown() {
		t.Skip("messages.Job has fields the fast encoder does not know")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	prefix := []byte("earlier records")
	for i := range 50_000 {
		j := randJobForEncode(rng)
		odd := i % 10
		switch odd {
		case 0: // an unknown field in the job
			j.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
		case 1: // an unknown field in the schedule
			if j.Schedule == nil {
				j.Schedule = &messages.Schedule{}
			}
			j.Schedule.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 42, protowire.VarintType), 1))
		case 2: // invalid UTF-8
			switch rng.IntN(5) {
			case 0:
				j.App = "a\xff"
			case 1:
				j.Handler = "\xc3"
			case 4:
				j.Policy = &messages.Policy{Attempts: 2, RouteKey: "k\xff"}
			default:
				j.Schedule = &messages.Schedule{Cron: "\xfe", Tz: "UTC"}
				if rng.IntN(2) == 0 {
					j.Schedule = &messages.Schedule{Cron: "* * * * * *", Tz: "\xed\xa0\x80"}
				}
			}
		}
		buf := append(make([]byte, 0, rng.IntN(64)), prefix...)
		got, ok := appendJobFast(buf, j)
		if odd <= 2 {
			if ok {
				t.Fatalf("job %d (case %d) should have been left to proto.Marshal", i, odd)
			}
			if !bytes.Equal(got, prefix) {
				t.Fatalf("job %d: a refusal changed the buffer to %q", i, got)
			}
			continue
		}
		if !ok {
			t.Fatalf("job %d was left to proto.Marshal: %v", i, j)
		}
		want, err := proto.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:len(prefix)], prefix) || !bytes.Equal(got[len(prefix):], want) {
			t.Fatalf("job %d: fast %x\nproto %x\n(%v)", i, got[len(prefix):], want, j)
		}
		back := &messages.Job{}
		if err := proto.Unmarshal(got[len(prefix):], back); err != nil || !proto.Equal(back, j) {
			t.Fatalf("job %d: decodes to %v (%v), not %v", i, back, err, j)
		}
	}
}

// FuzzAppendJobFast: any job protobuf can decode, encoded again by the fast
// encoder, gives proto.Marshal's bytes (or is left to it).
func FuzzAppendJobFast(f *testing.F) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20 {
		b, _ := proto.Marshal(randJobForEncode(rng))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		j := &messages.Job{}
		if proto.Unmarshal(b, j) != nil {
			return
		}
		got, ok := appendJobFast(nil, j)
		want, err := proto.Marshal(j)
		if !ok {
			if err == nil && coldFieldsKnown() && len(j.ProtoReflect().GetUnknown()) == 0 &&
				(j.Schedule == nil || len(j.Schedule.ProtoReflect().GetUnknown()) == 0) {
				t.Fatalf("a job proto.Marshal takes, without unknown fields, was left to it: %v", j)
			}
			return
		}
		if err != nil {
			t.Fatalf("the fast encoder took a job proto.Marshal refuses (%v): %v", err, j)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("fast %x\nproto %x\n(%v)", got, want, j)
		}
	})
}

// Through the core: every JOB_PUT a create, an update and a policy's job journal is
// the bytes proto.Marshal gives for the job it decodes to.
func TestJobPutRecordsAreProtoBytes(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50), RequestId: 71}, e)
	pj := onceJob(8, 0)
	pj.Params = []byte(`{"order":42}`)
	pj.Policy = &messages.Policy{Attempts: 3, LadderMs: []int64{1000, 5000}, RouteKey: "k"}
	c.Handle(1000, client, &messages.CreateJob{Job: pj, RequestId: 72}, e)
	cron := &messages.Job{Id: 9, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "0 0 2 * * *", Tz: "Asia/Shanghai"}}
	c.Handle(1000, client, &messages.CreateJob{Job: cron, RequestId: 73}, e)
	c.Durable(e.lsn, nil, e)
	c.Handle(1001, client, &messages.UpdateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h2", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 80}}, RequestId: 74}, e)
	c.Durable(e.lsn, nil, e)
	want := []struct {
		id, reqID        int64
		handler, params  string
		sched            *messages.Schedule
		policy           *messages.Policy
		version, created int64
	}{
		{7, 71, "h", "", onceJob(7, 50).Schedule, nil, 1, 1000},
		{8, 72, "h", `{"order":42}`, pj.Schedule, pj.Policy, 1, 1000},
		{9, 73, "h", "", cron.Schedule, nil, 1, 1000},
		{7, 74, "h2", "", &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 80}, nil, 2, 1001}, // a new delay counts from the update
	}
	k := 0
	for _, r := range e.log {
		if messages.RecordType(r.Type) != messages.RecordType_JOB_PUT {
			continue
		}
		j := &messages.Job{}
		if err := proto.Unmarshal(r.Payload, j); err != nil {
			t.Fatal(err)
		}
		if b, _ := proto.Marshal(j); !bytes.Equal(r.Payload, b) {
			t.Fatalf("record %d: %x\nproto.Marshal %x (%v)", r.LSN, r.Payload, b, j)
		}
		if k >= len(want) {
			t.Fatalf("more JOB_PUT records than %d: %v", len(want), j)
		}
		w := want[k]
		k++
		if j.Id != w.id || j.RequestId != w.reqID || j.App != "app" || j.Handler != w.handler || string(j.Params) != w.params ||
			!proto.Equal(j.Schedule, w.sched) || !proto.Equal(j.Policy, w.policy) || j.Version != w.version ||
			j.CreatedMs != w.created || j.State != messages.JobState_ACTIVE {
			t.Fatalf("record %d: %v, want %+v", r.LSN, j, w)
		}
	}
	if k != len(want) {
		t.Fatalf("%d JOB_PUT records, want %d", k, len(want))
	}
}
