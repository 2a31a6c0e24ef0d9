package core

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// A compact job rebuilds into exactly the job it was made from.
func TestCompactRoundTrip(t *testing.T) {
	base := func() *messages.Job {
		return &messages.Job{Id: 42, App: "app", Handler: "remind", Params: []byte(`{"order":42}`),
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 5_000},
			State:    messages.JobState_ACTIVE, Version: 1, CreatedMs: 1_000, UpdatedMs: 1_000, NextDueMs: 5_000}
	}
	cases := map[string]func(j *messages.Job){
		"at": func(*messages.Job) {},
		"delay": func(j *messages.Job) {
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 900}
			j.NextDueMs = 1_900
		},
		"delay 0": func(j *messages.Job) {
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE}
			j.NextDueMs = 1_000
		},
		"no params":      func(j *messages.Job) { j.Params = nil },
		"28-byte params": func(j *messages.Job) { j.Params = bytes.Repeat([]byte{0xff}, coldParams) },
		"updated":        func(j *messages.Job) { j.Version, j.UpdatedMs = 7, 1_000+1<<32-1 },
		"at in the past": func(j *messages.Job) { j.Schedule.AtMs, j.NextDueMs = 5, 5 },
	}
	for name, f := range cases {
		j := base()
		f(j)
		var s coldStore
		hi, _, _ := s.handler(j.Handler)
		cj, ok := coldOf(j, "app", hi)
		if !ok {
			t.Errorf("%s: not kept compact", name)
			continue
		}
		for _, share := range []bool{false, true} {
			got, sched := &messages.Job{}, &messages.Schedule{}
			coldMessage(got, sched, &cj, "app", s.handlers, share)
			if !proto.Equal(got, j) {
				t.Errorf("%s (share %v): rebuilt\n %v\nwant\n %v", name, share, got, j)
			}
		}
	}
}

// Only what a compact job can say exactly is kept compact.
func TestCompactRefuses(t *testing.T) {
	base := func() *messages.Job {
		return &messages.Job{Id: 42, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 5_000},
			State: messages.JobState_ACTIVE, Version: 1, CreatedMs: 1_000, UpdatedMs: 1_000, NextDueMs: 5_000}
	}
	cases := map[string]func(j *messages.Job){
		"periodic": func(j *messages.Job) {
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 10}
		},
		"policy":         func(j *messages.Job) { j.Policy = &messages.Policy{} },
		"paused":         func(j *messages.Job) { j.State = messages.JobState_PAUSED },
		"no due":         func(j *messages.Job) { j.NextDueMs = 0 },
		"ran":            func(j *messages.Job) { j.Runs = 1 },
		"last due":       func(j *messages.Job) { j.LastDueMs = 5 },
		"finished":       func(j *messages.Job) { j.LastFinishMs = 5 },
		"29-byte params": func(j *messages.Job) { j.Params = make([]byte, coldParams+1) },
		"other app":      func(j *messages.Job) { j.App = "other" },
		"tz":             func(j *messages.Job) { j.Schedule.Tz = "UTC" },
		"window":         func(j *messages.Job) { j.Schedule.NotAfterMs = 9_000 },
		"max runs":       func(j *messages.Job) { j.Schedule.MaxRuns = 1 },
		"at and delay":   func(j *messages.Job) { j.Schedule.DelayMs = 3 },
		"due is not at":  func(j *messages.Job) { j.NextDueMs = 5_001 },
		"due is not created + delay": func(j *messages.Job) {
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 900}
			j.NextDueMs = 1_901
		},
		"negative delay": func(j *messages.Job) {
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: -1}
			j.NextDueMs = 999
		},
		"version 0":     func(j *messages.Job) { j.Version = 0 },
		"huge version":  func(j *messages.Job) { j.Version = 1 << 32 },
		"updated early": func(j *messages.Job) { j.UpdatedMs = 999 },
		"updated late":  func(j *messages.Job) { j.UpdatedMs = 1_000 + 1<<32 },
		"unknown field": func(j *messages.Job) {
			j.ProtoReflect().SetUnknown([]byte{0xf8, 0x06, 0x01}) // field 111, varint 1
		},
	}
	for name, f := range cases {
		j := base()
		f(j)
		if _, ok := coldOf(j, "app", 0); ok {
			t.Errorf("%s: kept compact", name)
		}
	}
}

// A shard with compact jobs behaves exactly like one that keeps every job full:
// the same replies and dispatches, in the same order, and the same snapshot bytes,
// under a random mix of every command, fires, results and time; and so do both
// after a restart from their journals.
func TestCompactMatchesFull(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { compactMatchesFull(t, seed) })
	}
}

func compactMatchesFull(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	mk := func(full bool) (*Core, *fakeEnv) {
		c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, FullJobs: full, History: 3, DoneRetentionMs: 3000}, 1000, 1)
		e := &fakeEnv{}
		c.Open(e)
		c.Durable(e.lsn, nil, e)
		c.SetWorkers(1000, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
		return c, e
	}
	cc, ce := mk(false)
	fc, fe := mk(true)
	handlers := []string{"a", "b", "c"}
	randJob := func(id int64) *messages.Job {
		j := &messages.Job{Id: id, App: "app", Handler: handlers[rng.IntN(len(handlers))]}
		if n := rng.IntN(40); n > 0 {
			j.Params = []byte(fmt.Sprintf("%0*d", n, rng.IntN(1000)))
		}
		switch rng.IntN(10) {
		case 0:
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 50 + rng.Int64N(200)}
		case 1:
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_API_ONLY}
		case 2, 3, 4:
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: rng.Int64N(2000)}
		default:
			j.Schedule = &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 1000 + rng.Int64N(4000)}
		}
		if rng.IntN(8) == 0 {
			j.Policy = &messages.Policy{Attempts: 2, LadderMs: []int64{30}}
		}
		if rng.IntN(12) == 0 {
			j.State = messages.JobState_PAUSED
		}
		return j
	}
	now := int64(1000)
	var reqID int64
	var maxCompact, minFull, maxPacked int
	// Pack in replay at once, not in batches, so replays pack too.
	defer func(b int) { packBatch = b }(packBatch)
	packBatch = 1
	step := func(m proto.Message, both func(c *Core, e *fakeEnv)) {
		both(cc, ce)
		both(fc, fe)
		cc.Durable(ce.lsn, nil, ce)
		fc.Durable(fe.lsn, nil, fe)
		a, b := ce.take(), fe.take()
		if len(a) != len(b) {
			t.Fatalf("seed %d after %v: %d messages sent with compact jobs, %d with full ones", seed, m, len(a), len(b))
		}
		for i := range a {
			if !proto.Equal(a[i].m, b[i].m) {
				t.Fatalf("seed %d after %v: message %d\ncompact %v\n   full %v", seed, m, i, a[i].m, b[i].m)
			}
			// Results for dispatches, from the full side's copy, applied to both next.
			if d, ok := b[i].m.(*messages.Dispatch); ok && rng.IntN(4) != 0 {
				out := messages.Outcome_SUCCEEDED
				if rng.IntN(3) == 0 {
					out = messages.Outcome_FAILED
				}
				res := &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Attempt: d.Attempt, Epoch: d.Epoch,
					Outcome: out, StartMs: now, EndMs: now, WorkerId: "w1"}
				defer func() {
					cc.Handle(now, wref, res, ce)
					fc.Handle(now, wref, proto.Clone(res), fe)
				}()
			}
		}
	}
	for i := 0; i < 600; i++ {
		id := 1 + rng.Int64N(60)
		reqID++
		var m proto.Message
		switch k := rng.IntN(20); {
		case k < 6:
			m = &messages.CreateJob{Job: randJob(id), RequestId: reqID}
		case k < 7:
			m = &messages.UpdateJob{Job: randJob(id), RequestId: reqID}
		case k < 8:
			m = &messages.DeleteJob{App: "app", Id: id, RequestId: reqID}
		case k < 9:
			m = &messages.PauseJob{App: "app", Id: id, RequestId: reqID}
		case k < 10:
			m = &messages.ResumeJob{App: "app", Id: id, RequestId: reqID}
		case k < 11:
			m = &messages.TriggerJob{App: "app", Id: id, RequestId: reqID}
		case k < 13:
			m = &messages.GetJob{App: "app", Id: id}
		case k < 14:
			l := &messages.ListJobs{App: "app", Limit: int32(1 + rng.IntN(30)), AfterId: rng.Int64N(30)}
			if rng.IntN(2) == 0 {
				l.State = messages.JobState(rng.IntN(4))
			}
			if rng.IntN(2) == 0 {
				l.Handler = handlers[rng.IntN(len(handlers))]
			}
			m = l
		case k < 15:
			m = &messages.GetRuns{App: "app", Id: id}
		case k < 16 && reqID > 3:
			// A retried request: answered from the window, the same way on both sides.
			m = &messages.CreateJob{Job: randJob(id), RequestId: reqID - 1 - rng.Int64N(3)}
		default:
			now += rng.Int64N(120)
			step(&messages.GetJob{}, func(c *Core, e *fakeEnv) { c.Tick(now, e) })
			continue
		}
		step(m, func(c *Core, e *fakeEnv) { c.Handle(now, client, proto.Clone(m), e) })
		maxCompact = max(maxCompact, cc.Compact())
		maxPacked = max(maxPacked, cc.PackedJobs())
		if n := cc.Jobs() - cc.Compact(); n > 0 && (minFull == 0 || n < minFull) {
			minFull = n
		}
		if i%50 == 49 {
			if a, b := cc.Snapshot(), fc.Snapshot(); !bytes.Equal(a, b) {
				t.Fatalf("seed %d step %d: snapshots differ (compact %d bytes, full %d)", seed, i, len(a), len(b))
			}
		}
	}
	if minFull == 0 || maxCompact == 0 || maxPacked == 0 {
		t.Fatalf("seed %d: at most %d jobs compact, %d packed, at least %d full: the mix did not exercise every kind", seed, maxCompact, maxPacked, minFull)
	}
	if fc.Compact() != 0 || fc.PackedJobs() != 0 {
		t.Fatalf("FullJobs: %d jobs compact, %d packed", fc.Compact(), fc.PackedJobs())
	}
	// Restarts from the journals rebuild the same state on both sides.
	// Replay decodes a JOB_PUT that can be compact to a compact job, not a message
	// (DecodeRecord); msgs replays every record as its message instead, as apply
	// takes them live.
	replay := func(e *fakeEnv, full, msgs bool) *Core {
		c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, FullJobs: full, History: 3, DoneRetentionMs: 3000}, now, 1)
		if msgs {
			if err := replayMessages(c, e.log); err != nil {
				t.Fatal(err)
			}
			return c
		}
		for _, r := range e.log {
			if err := c.Replay(r); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	// (Replay does not rebuild the live fire window, so replays are compared with a
	// replay.)
	want := replay(fe, true, true).Snapshot()
	for _, full := range []bool{false, true} {
		for _, e := range []*fakeEnv{ce, fe} {
			if got := replay(e, full, true).Snapshot(); !bytes.Equal(got, want) {
				t.Fatalf("seed %d: journal replayed as messages (full %v) snapshots differently", seed, full)
			}
			if got := replay(e, full, false).Snapshot(); !bytes.Equal(got, want) {
				a, b := &messages.ShardSnapshot{}, &messages.ShardSnapshot{}
				_ = proto.Unmarshal(got, a)
				_ = proto.Unmarshal(want, b)
				for i := range min(len(a.Jobs), len(b.Jobs)) {
					if !proto.Equal(a.Jobs[i], b.Jobs[i]) {
						t.Logf("job %d: replayed %v\nwant %v", i, a.Jobs[i], b.Jobs[i])
						break
					}
				}
				a.Jobs, b.Jobs = nil, nil
				t.Logf("the rest equal: %v", proto.Equal(a, b))
				t.Fatalf("seed %d: replayed journal (full %v) snapshots differently", seed, full)
			}
		}
	}
	// And so do loads of each side's snapshot, into either kind of shard (a load
	// leaves a run's fire flag behind, so loads are compared with a load).
	load := func(snap []byte, full bool) []byte {
		c := New(Config{Shard: route.Root("app"), FullJobs: full, History: 3, DoneRetentionMs: 3000}, now, 1)
		if err := c.LoadSnapshot(snap, cc.AppliedLSN()); err != nil {
			t.Fatal(err)
		}
		return c.Snapshot()
	}
	want = load(fc.Snapshot(), true)
	for _, full := range []bool{false, true} {
		for _, snap := range [][]byte{cc.Snapshot(), fc.Snapshot()} {
			if got := load(snap, full); !bytes.Equal(got, want) {
				t.Fatalf("seed %d: loaded snapshot (full %v) snapshots differently", seed, full)
			}
		}
	}
}

// A view of compact jobs stays as it was taken while the core creates, fires and
// deletes them (the chunks are copy-on-write).
func TestCompactViewIsFrozen(t *testing.T) {
	c, e := newCore(1000)
	for id := int64(1); id <= 2*coldChunk+100; id++ {
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 100+id%500)}, e)
	}
	c.Durable(e.lsn, nil, e)
	e.take()
	if c.Compact() != 2*coldChunk+100 {
		t.Fatalf("%d compact jobs, want %d", c.Compact(), 2*coldChunk+100)
	}
	want := c.Snapshot()
	v := c.SnapshotView()
	c.Tick(1300, e) // fires (and so makes full) a few hundred
	for id := int64(1); id <= coldChunk; id += 3 {
		c.Handle(1300, client, &messages.DeleteJob{App: "app", Id: id}, e)
	}
	for id := int64(100_000); id < 100_000+coldChunk; id++ {
		c.Handle(1300, client, &messages.CreateJob{Job: onceJob(id, 50)}, e)
	}
	c.Durable(e.lsn, nil, e)
	if bytes.Equal(c.Snapshot(), want) {
		t.Fatal("the state did not change after the view: the test proves nothing")
	}
	if got := v.Encode(); !bytes.Equal(got, want) {
		t.Fatal("the view of compact jobs changed after it was taken")
	}
}

// Chunks emptied are given back, and the id map shrinks with the jobs.
func TestCompactGivesBackMemory(t *testing.T) {
	c, e := newCore(1000)
	const n = 5 * coldChunk
	for id := int64(1); id <= n; id++ {
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 1_000_000)}, e)
	}
	c.Durable(e.lsn, nil, e)
	live := func() int {
		k := 0
		for _, ch := range c.cold.chunks {
			if ch.slots != nil {
				k++
			}
		}
		return k
	}
	if live() != 5 {
		t.Fatalf("%d chunks for %d jobs, want 5", live(), n)
	}
	for id := int64(1); id <= n; id++ {
		if id%coldChunk != 0 { // one job left per chunk
			c.Handle(1000, client, &messages.DeleteJob{App: "app", Id: id}, e)
		}
	}
	c.Durable(e.lsn, nil, e)
	cells := 0
	for _, p := range c.cold.idx.parts {
		cells += len(p.cells)
	}
	if c.Compact() != 5 || live() != 5 || cells > 16*idxParts {
		t.Fatalf("after deletes: %d compact, %d chunks, %d index cells; want 5, 5, at most %d (the index shrank)", c.Compact(), live(), cells, 16*idxParts)
	}
	// Freed slots are used again before a new chunk is made.
	for id := int64(n + 1); id <= n+coldChunk; id++ {
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 1_000_000)}, e)
	}
	c.Durable(e.lsn, nil, e)
	if live() != 5 {
		t.Fatalf("%d chunks after refilling freed slots, want 5", live())
	}
	for id := int64(1); id <= n+coldChunk; id++ {
		c.Handle(1000, client, &messages.DeleteJob{App: "app", Id: id}, e)
	}
	c.Durable(e.lsn, nil, e)
	if c.Compact() != 0 || live() != 0 || c.Jobs() != 0 {
		t.Fatalf("after deleting all: %d compact, %d chunks, %d jobs", c.Compact(), live(), c.Jobs())
	}
	for id := int64(1); id <= 10; id++ { // and a dropped chunk's place is reused
		c.Handle(1000, client, &messages.CreateJob{Job: onceJob(id, 1_000_000)}, e)
	}
	c.Durable(e.lsn, nil, e)
	if live() != 1 || len(c.cold.chunks) > 6 {
		t.Fatalf("%d live chunks of %d after a new start", live(), len(c.cold.chunks))
	}
}

// replayMessages replays log into c decoding every record to its message, as
// Replay did before DecodeRecord: the reference its compact JOB_PUTs must match.
func replayMessages(c *Core, log []persistence.Record) error {
	for _, r := range log {
		m, err := Decode(messages.RecordType(r.Type), r.Payload)
		if err != nil {
			return err
		}
		c.apply(messages.RecordType(r.Type), m)
		c.appended, c.durable = r.LSN, r.LSN
	}
	return nil
}
