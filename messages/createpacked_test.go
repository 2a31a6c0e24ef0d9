package messages

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// packedTestBatch is a batch with every field of the packed form set, left out or
// at its extremes somewhere: apps and handlers that repeat and change, negative and
// huge ints, empty and multi-byte strings and params, schedules of every field,
// policies, creates without a job, and an empty create.
func packedTestBatch(r *rand.Rand, n int) *CreateJobs {
	ints := []int64{0, 1, -1, 127, 128, math.MaxInt64, math.MinInt64, 1 << 41}
	i64 := func() int64 {
		if r.IntN(2) == 0 {
			return ints[r.IntN(len(ints))]
		}
		return r.Int64() - r.Int64()
	}
	strs := []string{"", "app", "naïve-日本", strings.Repeat("x", 300)}
	m := &CreateJobs{LeanReplies: r.IntN(2) == 0}
	for range n {
		c := &CreateJob{RequestId: i64()}
		switch r.IntN(12) {
		case 0:
			m.Jobs = append(m.Jobs, c) // no job
			continue
		case 1:
			m.Jobs = append(m.Jobs, &CreateJob{}) // empty
			continue
		}
		j := &Job{Id: i64(), App: strs[r.IntN(2)+1], Handler: strs[r.IntN(len(strs))], State: JobState(r.IntN(4)),
			Version: i64(), CreatedMs: i64(), UpdatedMs: i64(), NextDueMs: i64(), Runs: i64(), LastDueMs: i64(),
			LastFinishMs: i64(), RequestId: i64()}
		if r.IntN(3) > 0 {
			j.Params = []byte(strs[r.IntN(len(strs))])
		}
		if r.IntN(5) > 0 {
			j.Schedule = &Schedule{Kind: ScheduleKind(r.IntN(6)), AtMs: i64(), DelayMs: i64(), EveryMs: i64(), StartMs: i64(),
				NotBeforeMs: i64(), NotAfterMs: i64(), MaxRuns: i64(), Cron: strs[r.IntN(len(strs))], Tz: strs[r.IntN(len(strs))]}
		}
		if r.IntN(4) == 0 {
			j.Policy = &Policy{Attempts: int32(r.IntN(5)), LadderMs: []int64{10, i64()}, TimeoutMs: i64(), RouteKey: strs[r.IntN(len(strs))]}
		}
		c.Job = j
		m.Jobs = append(m.Jobs, c)
	}
	return m
}

// A packed batch, through the wire, unpacks to a CreateJobs equal to the one
// packed, and to what the same batch sent plain unmarshals to.
func TestPackedCreateJobsRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 300 {
		m := packedTestBatch(r, r.IntN(60))
		p := PackCreateJobs(m)
		if p == nil {
			t.Fatalf("round %d: a batch of known fields was not packed", round)
		}
		wire, err := proto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var got CreateJobs
		if err := proto.Unmarshal(wire, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Jobs) != 0 || got.LeanReplies {
			t.Fatalf("round %d: the packed form carries %d plain creates", round, len(got.Jobs))
		}
		u, err := got.Unpacked()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		plainWire, _ := proto.Marshal(m)
		plain := &CreateJobs{}
		if err := proto.Unmarshal(plainWire, plain); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(u, m) || !proto.Equal(u, plain) {
			t.Fatalf("round %d: unpacked\n%v\nwant\n%v", round, u, m)
		}
		for i, c := range u.Jobs {
			if c == nil {
				t.Fatalf("round %d: create %d unpacked nil", round, i)
			}
			if j := c.Job; j != nil && len(j.Params) > 0 && len(m.Jobs[i].Job.Params) > 0 && &j.Params[0] == &m.Jobs[i].Job.Params[0] {
				t.Fatalf("round %d: create %d's params share the sender's", round, i)
			}
		}
	}
}

// A message with unknown fields (from a newer sender) is not packed: packing would
// drop them. Nor is one with a string that is not UTF-8, which protobuf refuses.
func TestPackedCreateJobsKeepsUnknownFieldsPlain(t *testing.T) {
	unknown := protowire.AppendTag(nil, 99, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 7)
	cases := map[string]func(m *CreateJobs){
		"batch":             func(m *CreateJobs) { m.ProtoReflect().SetUnknown(unknown) },
		"create":            func(m *CreateJobs) { m.Jobs[1].ProtoReflect().SetUnknown(unknown) },
		"job":               func(m *CreateJobs) { m.Jobs[1].Job.ProtoReflect().SetUnknown(unknown) },
		"schedule":          func(m *CreateJobs) { m.Jobs[1].Job.Schedule.ProtoReflect().SetUnknown(unknown) },
		"non-UTF-8 handler": func(m *CreateJobs) { m.Jobs[1].Job.Handler = "h\xff" },
		"non-UTF-8 tz":      func(m *CreateJobs) { m.Jobs[1].Job.Schedule.Tz = "\xc0" },
	}
	for name, set := range cases {
		m := &CreateJobs{Jobs: []*CreateJob{
			{RequestId: 1, Job: &Job{Id: 1, App: "a", Handler: "h", Schedule: &Schedule{Kind: ScheduleKind_ONCE, AtMs: 5}}},
			{RequestId: 2, Job: &Job{Id: 2, App: "a", Handler: "h", Schedule: &Schedule{Kind: ScheduleKind_ONCE, AtMs: 6}}},
		}}
		if PackCreateJobs(m) == nil {
			t.Fatalf("%s: the batch without unknown fields was not packed", name)
		}
		set(m)
		if p := PackCreateJobs(m); p != nil {
			t.Fatalf("%s: the batch was packed", name)
		}
	}
	if !packedFieldsKnown() {
		t.Fatal("the packed form does not know every field of CreateJobs, CreateJob, Job and Schedule: " +
			"a field was added to kjob.proto; carry it in createpacked.go (and its count in packedFieldsKnown), or batches go plain")
	}
}

// Data that is cut short, has bytes flipped or trails garbage is refused with
// ErrPacked, never a panic or a batch of other creates.
func TestPackedCreateJobsRefusesBadData(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	m := packedTestBatch(r, 40)
	good := PackCreateJobs(m).Packed
	unpack := func(b []byte) (*CreateJobs, error) { return (&CreateJobs{Packed: b}).Unpacked() }
	for cut := 1; cut < len(good); cut++ { // (cut 0: not packed at all)
		u, err := unpack(good[:cut])
		if err == nil || !errors.Is(err, ErrPacked) {
			t.Fatalf("cut at %d of %d: %v, %d creates", cut, len(good), err, len(u.GetJobs()))
		}
	}
	if _, err := unpack(append(append([]byte(nil), good...), 0)); !errors.Is(err, ErrPacked) {
		t.Fatalf("a trailing byte: %v", err)
	}
	for _, bad := range [][]byte{{1}, {2, 0, 0}, {1, 2, 0}, {1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, {1, 0, 1, 0, 0x40}, {1, 0, 1, 0, 2},
		{1, 0, 1, 0, 3, 2, 0xff, 0xfe}, // an app that is not UTF-8
	} {
		if _, err := unpack(bad); !errors.Is(err, ErrPacked) {
			t.Fatalf("%x: %v", bad, err)
		}
	}
	if _, err := (&CreateJobs{Packed: good, Jobs: m.Jobs[:1]}).Unpacked(); !errors.Is(err, ErrPacked) {
		t.Fatalf("packed beside plain creates: %v", err)
	}
	if u, err := (&CreateJobs{Jobs: m.Jobs}).Unpacked(); err != nil || u.Jobs[0] != m.Jobs[0] {
		t.Fatalf("a plain batch unpacked: %v", err)
	}
	for range 20_000 { // flipped bytes: an error, or a batch (of other values) that packs and unpacks to itself
		b := append([]byte(nil), good...)
		for range 1 + r.IntN(3) {
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
		}
		u, err := unpack(b)
		if err != nil {
			if !errors.Is(err, ErrPacked) {
				t.Fatalf("not ErrPacked: %v", err)
			}
			continue
		}
		p := PackCreateJobs(u)
		if p == nil {
			t.Fatalf("flipped data unpacked to a batch that does not pack")
		}
		if u2, err := p.Unpacked(); err != nil || !proto.Equal(u, u2) {
			t.Fatalf("flipped data unpacked to a batch that does not go round: %v", err)
		}
	}
}

// BenchmarkCreateJobsWire is a batch of 52 creates as the bench sends them, plain
// (protobuf, as proto.actor's remote layer marshals it) and packed, each way.
func BenchmarkCreateJobsWire(b *testing.B) {
	m := &CreateJobs{LeanReplies: true}
	for i := range 52 {
		m.Jobs = append(m.Jobs, &CreateJob{RequestId: 1<<50 + int64(i), Job: &Job{Id: 1<<51 + int64(i), App: "bench", Handler: "noop",
			Params: []byte("12345           "), Schedule: &Schedule{Kind: ScheduleKind_ONCE, AtMs: 1_800_000_000_000}}})
	}
	plain, _ := proto.Marshal(m)
	packed, _ := proto.Marshal(PackCreateJobs(m))
	b.Run("plain-marshal", func(b *testing.B) {
		for range b.N {
			_, _ = proto.Marshal(m)
		}
	})
	b.Run("plain-unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = proto.Unmarshal(plain, &CreateJobs{})
		}
	})
	b.Run("packed-marshal", func(b *testing.B) {
		for range b.N {
			_, _ = proto.Marshal(PackCreateJobs(m))
		}
	})
	b.Run("packed-unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var p CreateJobs
			_ = proto.Unmarshal(packed, &p)
			_, _ = p.Unpacked()
		}
	})
	b.ReportMetric(float64(len(plain)), "plain-bytes")
	b.ReportMetric(float64(len(packed)), "packed-bytes")
}
