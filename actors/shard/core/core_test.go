package core

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// fakeEnv journals into memory and records what is sent.
type fakeEnv struct {
	lsn  uint64
	log  []persistence.Record
	sent []sentMsg
}

type sentMsg struct {
	to *messages.Ref
	m  proto.Message
}

func (e *fakeEnv) Append(es []persistence.Entry) (uint64, error) {
	for _, x := range es {
		e.lsn++
		e.log = append(e.log, persistence.Record{LSN: e.lsn, Stream: x.Stream, Type: x.Type, Payload: append([]byte(nil), x.Payload...)})
	}
	return e.lsn, nil
}

func (e *fakeEnv) Send(to *messages.Ref, m proto.Message) { e.sent = append(e.sent, sentMsg{to, m}) }

func (e *fakeEnv) take() []sentMsg { s := e.sent; e.sent = nil; return s }

// testEnv is an Env the tests' helpers drive: a fakeEnv, or one that embeds it.
type testEnv interface {
	Env
	fake() *fakeEnv
}

func (e *fakeEnv) fake() *fakeEnv { return e }

var (
	client = &messages.Ref{Address: "c", Id: "client"}
	wref   = &messages.Ref{Address: "w", Id: "worker"}
)

func newCore(now int64) (*Core, *fakeEnv) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, now, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(now, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e)
	return c, e
}

// dispatchedJob7 is a core whose one-shot job 7, due at 1000, has been dispatched
// (run "7:1000", attempt 1, epoch 1), with nothing left to send.
func dispatchedJob7() (*Core, *fakeEnv) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 0)}, e)
	c.Tick(1000, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	return c, e
}

func onceJob(id, delayMs int64) *messages.Job {
	return &messages.Job{Id: id, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: delayMs}}
}

func TestReplyWaitsForDurability(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	if len(e.sent) != 0 {
		t.Fatalf("reply sent before the journal was durable: %v", e.sent)
	}
	c.Durable(e.lsn-1, nil, e) // an older LSN is not enough
	if len(e.sent) != 0 {
		t.Fatal("reply sent at an LSN below its record's")
	}
	c.Durable(e.lsn, nil, e)
	s := e.take()
	if len(s) != 1 || s[0].to != client || s[0].m.(*messages.JobReply).Job.GetId() != 7 {
		t.Fatalf("after durability: %v", s)
	}
}

func TestNeverEarlyAndExactlyOneDispatch(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	if at, ok := c.NextWake(); !ok || at != 1050 {
		t.Fatalf("next wake %d %v, want 1050", at, ok)
	}
	c.Tick(1049, e)
	c.Durable(e.lsn, nil, e)
	if len(e.take()) != 0 {
		t.Fatal("dispatched 1 ms early")
	}
	c.Tick(1050, e)
	if len(e.sent) != 0 {
		t.Fatal("dispatch sent before its RUN_DISPATCHED record was durable")
	}
	c.Durable(e.lsn, nil, e)
	s := e.take()
	if len(s) != 1 || s[0].to != wref {
		t.Fatalf("dispatches %v", s)
	}
	d := s[0].m.(*messages.Dispatch)
	if d.DueMs != 1050 || d.Attempt != 1 || d.Epoch != 1 || d.RunId != "7:1050" {
		t.Fatalf("dispatch %v", d)
	}
	c.Tick(2000, e)
	c.Durable(e.lsn, nil, e)
	for _, m := range e.take() {
		if _, ok := m.m.(*messages.Dispatch); ok {
			t.Fatal("a one-shot job dispatched twice")
		}
	}
}

func TestDeleteMeansDelete(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 50)}, e)
	c.Handle(1001, client, &messages.DeleteJob{App: "app", Id: 7}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Tick(5000, e)
	c.Durable(e.lsn, nil, e)
	if s := e.take(); len(s) != 0 {
		t.Fatalf("deleted job fired: %v", s)
	}
}

func TestStaleEpochResultIgnored(t *testing.T) {
	c, e := dispatchedJob7()
	c.Handle(1010, wref, &messages.RunResult{RunId: "7:1000", JobId: 7, Attempt: 1, Epoch: 0, Outcome: messages.Outcome_SUCCEEDED}, e)
	c.Durable(e.lsn, nil, e)
	if s := e.take(); len(s) != 0 || c.InFlight() != 1 {
		t.Fatalf("a result of another epoch was recorded: sent %v, in flight %d", s, c.InFlight())
	}
	c.Handle(1011, wref, &messages.RunResult{RunId: "7:1000", JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED}, e)
	c.Durable(e.lsn, nil, e)
	if s := e.take(); len(s) != 1 || c.InFlight() != 0 {
		t.Fatalf("the current epoch's result: sent %v, in flight %d", s, c.InFlight())
	}
}

// A result that comes without a sender (a worker sends its results with proto.actor's
// Send) is acknowledged to the worker it names, and so is its duplicate.
func TestResultWithoutSenderIsAckedToItsWorker(t *testing.T) {
	c, e := dispatchedJob7()
	res := &messages.RunResult{RunId: "7:1000", JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_SUCCEEDED, WorkerId: "w1", Worker: wref}
	for i, what := range []string{"the result", "its duplicate"} {
		c.Handle(1010+int64(i), nil, &messages.RunResults{Results: []*messages.RunResult{res}}, e)
		c.Durable(e.lsn, nil, e)
		s := e.take()
		if len(s) != 1 || s[0].to != wref {
			t.Fatalf("%s: sent %v, want one ack to the worker", what, s)
		}
		if a, ok := s[0].m.(*messages.ResultAck); !ok || a.RunId != "7:1000" {
			t.Fatalf("%s: sent %v, want the ack of run 7:1000", what, s[0].m)
		}
	}
}

// Replaying the journal rebuilds the state: the dispatched-but-unfinished run goes
// out again, the delayed job keeps its due time.
func TestRecoveryRedispatchesAndKeepsDue(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 0)}, e)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(8, 10_000)}, e)
	c.Tick(1000, e)
	c.Durable(e.lsn, nil, e)
	e.take()

	r := New(Config{Shard: route.Root("app")}, 3000, 0)
	for _, rec := range e.log {
		if err := r.Replay(rec); err != nil {
			t.Fatal(err)
		}
	}
	e2 := &fakeEnv{lsn: e.lsn}
	r.SetWorkers(3000, []*messages.WorkerInfo{{WorkerId: "w1", Ref: wref}}, e2)
	r.Recovered(3000, e.lsn, e2)
	r.Durable(e2.lsn, nil, e2)
	s := e2.take()
	if len(s) != 1 || s[0].m.(*messages.Dispatch).RunId != "7:1000" {
		t.Fatalf("after recovery sent %v %v, want the unfinished run 7:1000 again", s[0].m, s[len(s)-1].m)
	}
	if r.Epoch() != 1 {
		t.Fatalf("epoch %d after replay, want 1", r.Epoch())
	}
	if at, ok := r.NextWake(); !ok || at > 11_000 {
		t.Fatalf("next wake %d %v", at, ok)
	}
	r.Tick(11_000, e2)
	r.Durable(e2.lsn, nil, e2)
	got := false
	for _, m := range e2.take() {
		if d, ok := m.m.(*messages.Dispatch); ok && d.RunId == "8:11000" {
			got = true
		}
	}
	if !got {
		t.Fatal("the delayed job did not fire at its due time after recovery")
	}
}

func TestJournalFailureStopsTheShard(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 0)}, e)
	c.Durable(0, errSync, e)
	if len(e.take()) != 0 {
		t.Fatal("acknowledged a create whose journal write failed")
	}
	c.Handle(1001, client, &messages.GetJob{App: "app", Id: 7}, e)
	s := e.take()
	if len(s) != 1 || s[0].m.(*messages.JobReply).Error.GetCode() != messages.Code_UNAVAILABLE {
		t.Fatalf("a failed shard answered %v, want UNAVAILABLE", s)
	}
}

type syncErr struct{}

func (syncErr) Error() string { return "msync: input/output error" }

var errSync = syncErr{}

// A refusal (the worker's queue was full) is back-pressure: the run goes out again
// with the same attempt, and nothing is journaled as finished.
func TestRefusedDispatchIsNotAnAttempt(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE}, Policy: &messages.Policy{Attempts: 1}}}, e)
	c.Tick(1000, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	records := len(e.log)
	c.Handle(1001, wref, &messages.RunResult{RunId: "7:1000", JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_REFUSED}, e)
	c.Durable(e.lsn, nil, e)
	if len(e.log) != records || c.DeadLetters() != 0 || c.InFlight() != 1 {
		t.Fatalf("a refusal was recorded: %d new records, %d dead letters, %d in flight", len(e.log)-records, c.DeadLetters(), c.InFlight())
	}
	e.take()
	c.Tick(1001+RefusedRetryMs, e)
	c.Durable(e.lsn, nil, e)
	s := e.take()
	if len(s) != 1 || s[0].m.(*messages.Dispatch).Attempt != 1 {
		t.Fatalf("after a refusal sent %v, want the same attempt again", s)
	}
}

// A batch of creates is applied as the same creates one by one would be, and
// answered once, in order, when all of them are durable.
func TestCreateBatch(t *testing.T) {
	c, e := newCore(1000)
	a, ae := newCore(1000)
	jobs := []*messages.CreateJob{
		{Job: onceJob(1, 50), RequestId: 11},
		{Job: &messages.Job{Id: 2, App: "app", Handler: ""}, RequestId: 12}, // invalid: no handler
		{Job: onceJob(3, 70), RequestId: 13},
		{Job: onceJob(1, 50), RequestId: 11}, // the same request again
		{Job: &messages.Job{Id: 1, App: "app", Handler: "other", Schedule: onceJob(1, 5).Schedule}, RequestId: 14}, // exists, differs
	}
	c.Handle(1000, client, &messages.CreateJobs{Jobs: jobs}, e)
	if len(e.sent) != 0 {
		t.Fatalf("batch reply sent before its records were durable: %v", e.sent)
	}
	c.Durable(e.lsn, nil, e)
	s := e.take()
	if len(s) != 1 {
		t.Fatalf("%d messages after the batch, want one reply", len(s))
	}
	rep := s[0].m.(*messages.CreateJobsReply)
	if len(rep.Replies) != len(jobs) {
		t.Fatalf("%d replies to %d creates", len(rep.Replies), len(jobs))
	}
	for i, x := range jobs {
		a.Handle(1000, client, proto.Clone(x), ae)
		a.Durable(ae.lsn, nil, ae)
		one := ae.take()
		if len(one) != 1 || !proto.Equal(one[0].m, rep.Replies[i]) {
			t.Errorf("create %d: batch reply %v, alone %v", i, rep.Replies[i], one)
		}
	}
	if rep.Replies[1].Error.GetField() != "handler" || rep.Replies[4].Error.GetCode() != messages.Code_ALREADY_EXISTS {
		t.Errorf("errors: %v / %v", rep.Replies[1].Error, rep.Replies[4].Error)
	}
	if !bytes.Equal(c.Snapshot(), a.Snapshot()) {
		t.Error("a batch left another state than the same creates alone")
	}

	// Asked for lean replies, the same batch on a third shard is answered with the
	// stamps of the two new jobs and of the create repeated, and the two errors in
	// full; expanded, the replies are the full ones.
	l, le := newCore(1000)
	l.Handle(1000, client, &messages.CreateJobs{Jobs: jobs, LeanReplies: true}, le)
	l.Durable(le.lsn, nil, le)
	ls := le.take()
	if len(ls) != 1 {
		t.Fatalf("%d messages after the lean batch, want one reply", len(ls))
	}
	lean := ls[0].m.(*messages.CreateJobsReply)
	if fmt.Sprint(lean.FullAt) != "[1 4]" || len(lean.Replies) != 2 {
		t.Fatalf("lean reply answers %v in full (%d replies), want [1 4]", lean.FullAt, len(lean.Replies))
	}
	expanded, err := lean.Expand(jobs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range jobs {
		want := proto.Clone(rep.Replies[i]).(*messages.JobReply)
		if want.Job != nil {
			want.Job.RequestId = 0
		}
		if !proto.Equal(expanded[i], want) {
			t.Errorf("create %d: lean reply expands to %v, full %v", i, expanded[i], want)
		}
	}
	if !bytes.Equal(l.Snapshot(), a.Snapshot()) {
		t.Error("a lean batch left another state than the same creates alone")
	}
	c.Freeze(&messages.Error{Code: messages.Code_NOT_OWNER, Message: "moving"})
	c.Handle(1000, client, &messages.CreateJobs{Jobs: jobs[:2]}, e)
	c.Durable(e.lsn, nil, e)
	if s := e.take(); len(s) != 1 || len(s[0].m.(*messages.CreateJobsReply).Replies) != 2 ||
		s[0].m.(*messages.CreateJobsReply).Replies[1].Error.GetCode() != messages.Code_NOT_OWNER {
		t.Fatalf("frozen shard's answer to a batch: %v", s)
	}
}

// A packed batch is handled as the CreateJobs it stands for: the same reply (which
// says the shard reads the packed form), the same records and state. One that does
// not unpack is refused as a whole at once, with nothing journaled.
func TestCreateBatchPacked(t *testing.T) {
	jobs := []*messages.CreateJob{
		{Job: onceJob(1, 50), RequestId: 11},
		{Job: &messages.Job{Id: 2, App: "app", Handler: ""}, RequestId: 12}, // invalid: no handler
		{Job: onceJob(3, 70), RequestId: 13},
		{Job: onceJob(1, 50), RequestId: 11},
	}
	jobs[2].Job.Policy = &messages.Policy{Attempts: 2, LadderMs: []int64{100}}
	plain, pe := newCore(1000)
	packed, ke := newCore(1000)
	req := &messages.CreateJobs{Jobs: jobs, LeanReplies: true}
	p := messages.PackCreateJobs(req)
	if p == nil {
		t.Fatal("not packed")
	}
	plain.Handle(1000, client, req, pe)
	packed.Handle(1000, client, p, ke)
	if len(pe.sent)+len(ke.sent) != 0 {
		t.Fatal("a reply before the records were durable")
	}
	plain.Durable(pe.lsn, nil, pe)
	packed.Durable(ke.lsn, nil, ke)
	a, b := pe.take(), ke.take()
	if len(a) != 1 || len(b) != 1 || !proto.Equal(a[0].m, b[0].m) || !b[0].m.(*messages.CreateJobsReply).TakesPacked {
		t.Fatalf("replies: plain %v, packed %v", a, b)
	}
	if pe.lsn != ke.lsn || !bytes.Equal(plain.Snapshot(), packed.Snapshot()) {
		t.Fatalf("the packed batch left another journal (lsn %d against %d) or state", ke.lsn, pe.lsn)
	}
	lsn := ke.lsn
	packed.Handle(1000, client, &messages.CreateJobs{Packed: p.Packed[:len(p.Packed)-3]}, ke)
	s := ke.take()
	if len(s) != 1 || s[0].m.(*messages.CreateJobsReply).Error.GetCode() != messages.Code_INVALID_ARGUMENT ||
		s[0].m.(*messages.CreateJobsReply).Error.GetField() != "packed" || ke.lsn != lsn {
		t.Fatalf("a packed batch cut short: %v (lsn %d, was %d)", s, ke.lsn, lsn)
	}
	packed.Handle(1000, nil, &messages.CreateJobs{Packed: p.Packed[:len(p.Packed)-3]}, ke) // no sender: nobody to answer
	if s := ke.take(); len(s) != 0 || ke.lsn != lsn {
		t.Fatalf("a packed batch cut short without a sender: %v", s)
	}
}

// A run's trace id is a W3C traceparent: version 00, a 32-hex trace id, a 16-hex
// nonzero span id, flags 01; and hex64 spells what fmt does.
func TestTraceparentFormat(t *testing.T) {
	c, _ := newCore(1000)
	re := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{15}[13579bdf]-01$`)
	seen := map[string]bool{}
	for range 1000 {
		tp := c.traceparent()
		if !re.MatchString(tp) || seen[tp] {
			t.Fatalf("traceparent %q: malformed or repeated", tp)
		}
		seen[tp] = true
	}
	for _, v := range []uint64{0, 1, 0xf, 0xdeadbeef, 1<<64 - 1, 0x0123456789abcdef} {
		var b [16]byte
		hex64(b[:], v)
		if want := fmt.Sprintf("%016x", v); string(b[:]) != want {
			t.Errorf("hex64(%#x) = %s, want %s", v, b[:], want)
		}
	}
}

// A run taken over while no worker list is known yet (a restart, a handoff, a split)
// waits, and then goes back to the worker it was sent to, which dedupes it, even
// when that worker is outside the shard's group now: not to another worker, which
// would run it a second time.
func TestTakenOverRunGoesBackToItsWorker(t *testing.T) {
	c, e := newCore(1000)
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 10)}, e)
	c.Durable(e.lsn, nil, e)
	c.Tick(1010, e)
	c.Durable(e.lsn, nil, e)
	var sent int
	for _, s := range e.take() {
		if _, ok := s.m.(*messages.Dispatch); ok && s.to == wref {
			sent++
		}
	}
	if sent != 1 {
		t.Fatalf("setup: %d dispatches to w1", sent)
	}
	snap := c.Snapshot()

	b := New(Config{Shard: c.Shard(), Self: &messages.Ref{Address: "s2", Id: "shard"}}, 1020, 2)
	if err := b.LoadSnapshot(snap, c.AppliedLSN()); err != nil {
		t.Fatal(err)
	}
	be := &fakeEnv{lsn: c.AppliedLSN()}
	b.Recovered(1020, be.lsn, be) // no workers known: the run waits
	b.Tick(1020+NoWorkerRetryMs, be)
	w2 := &messages.Ref{Address: "w2", Id: "worker"}
	b.SetWorkersOf(1600, []*messages.WorkerInfo{{WorkerId: "w2", App: "app", Ref: w2, Capacity: 4}},
		[]*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}, {WorkerId: "w2", App: "app", Ref: w2, Capacity: 4}}, be)
	b.Durable(be.lsn, nil, be)
	var to []string
	for _, s := range be.take() {
		if d, ok := s.m.(*messages.Dispatch); ok && d.JobId == 7 {
			to = append(to, s.to.Address)
		}
	}
	if len(to) != 1 || to[0] != "w" {
		t.Fatalf("the taken-over run went to %v, want once to w1 (address w)", to)
	}
}

// A failed attempt's RUN_FINISHED and its retry (or, after the last attempt, its
// dead letter) are two records of one append. A crash may keep the first and lose
// the second: recovery then follows the failure itself, or the run would never be
// tried again nor dead-lettered (sim seed 86: a fixed-delay job stopped for good).
func TestRecoveryFollowsAFailureWhoseRetryWasLost(t *testing.T) {
	for _, attempts := range []int32{3, 1} { // a retry lost; a dead letter lost
		c, e := newCore(1000)
		j := onceJob(7, 0)
		j.Policy = &messages.Policy{Attempts: attempts, LadderMs: []int64{300}}
		c.Handle(1000, client, &messages.CreateJob{Job: j}, e)
		c.Tick(1000, e)
		c.Durable(e.lsn, nil, e)
		e.take()
		c.Handle(1100, wref, &messages.RunResult{RunId: "7:1000", Attempt: 1, Epoch: 1, WorkerId: "w1", Outcome: messages.Outcome_FAILED, Error: "boom", StartMs: 1000, EndMs: 1100}, e)
		c.Durable(e.lsn, nil, e)
		n := len(e.log)
		follow := messages.RecordType(e.log[n-1].Type)
		if messages.RecordType(e.log[n-2].Type) != messages.RecordType_RUN_FINISHED || (follow != messages.RecordType_RETRY_SCHEDULED && follow != messages.RecordType_DEAD_LETTERED) {
			t.Fatalf("attempts=%d: the failure's records are %v, %v", attempts, messages.RecordType(e.log[n-2].Type), follow)
		}
		// The crash kept every record but the last.
		r := New(Config{Shard: c.Shard(), Self: &messages.Ref{Address: "s", Id: "shard"}}, 1200, 1)
		for _, rec := range e.log[:n-1] {
			if err := r.Replay(rec); err != nil {
				t.Fatal(err)
			}
		}
		e2 := &fakeEnv{lsn: e.log[n-2].LSN}
		r.Recovered(1200, e2.lsn, e2)
		r.Durable(e2.lsn, nil, e2)
		r.SetWorkers(1200, []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: 4}}, e2)
		var got []messages.RecordType
		for _, rec := range e2.log {
			got = append(got, messages.RecordType(rec.Type))
		}
		if !slices.Contains(got, follow) {
			t.Fatalf("attempts=%d: recovery journaled %v; want the lost %v again", attempts, got, follow)
		}
		if attempts == 1 {
			if l := r.dead["7:1000"]; l == nil || l.LastError != "boom" || l.Attempts != 1 {
				t.Fatalf("the dead letter after recovery: %v", l)
			}
			continue
		}
		run := r.runs["7:1000"]
		if run == nil || run.st.Level != 0 || run.st.Attempt != 2 || run.st.DeadlineMs != 1200+300 || run.st.LastError != "boom" {
			t.Fatalf("the retry after recovery: %v", run)
		}
		r.Tick(1500, e2) // its ladder delay over: the second attempt goes out
		r.Durable(e2.lsn, nil, e2)
		sent := false
		for _, m := range e2.take() {
			if d, ok := m.m.(*messages.Dispatch); ok && d.RunId == "7:1000" && d.Attempt == 2 {
				sent = true
			}
		}
		if !sent {
			t.Fatal("the retry recovered was not dispatched at its due")
		}
	}
}
