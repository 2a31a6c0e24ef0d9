package messages

import (
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func leanTestJob(id int64, r *rand.Rand) *Job {
	j := &Job{Id: id, App: "app", Handler: "h", Schedule: &Schedule{Kind: ScheduleKind_ONCE, AtMs: 1000 + id}}
	if r.IntN(2) == 0 {
		j.Params = []byte("p" + strings.Repeat("x", r.IntN(20)))
	}
	if r.IntN(3) == 0 {
		j.Policy = &Policy{Attempts: 3, LadderMs: []int64{10, 20}}
	}
	return j
}

// A lean reply, through the wire, expands to the full replies it was made from
// (without the journal-only request id), for every kind of answer a create gets:
// new jobs, a create of an existing job with an equal definition in other
// messages, another definition, errors, an empty create; and only what is not a
// stamp goes in full.
func TestLeanExpandsToTheFullReplies(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := r.IntN(40)
		reqs := make([]*CreateJob, n)
		full := make([]*JobReply, n)
		wantFull := 0
		for i := range reqs {
			in := leanTestJob(int64(i+1), r)
			reqs[i] = &CreateJob{Job: in, RequestId: int64(100 + i)}
			stored := &Job{Id: in.Id, App: in.App, Handler: in.Handler, Params: in.Params, Schedule: in.Schedule,
				Policy: in.Policy, State: JobState_ACTIVE, Version: 1, CreatedMs: 500, UpdatedMs: 500,
				NextDueMs: in.Schedule.AtMs, RequestId: reqs[i].RequestId}
			switch r.IntN(8) {
			case 0: // an error
				full[i] = &JobReply{Error: &Error{Code: Code_INVALID_ARGUMENT, Field: "handler", Message: "is required"}}
				wantFull++
				continue
			case 1: // the id holds another definition (answered in full, as an update's reply would be)
				stored = proto.Clone(stored).(*Job)
				stored.Handler = "other"
				wantFull++
			case 2: // the same create again, later: an equal definition in the shard's own messages, fired since
				stored = proto.Clone(stored).(*Job)
				stored.State, stored.Runs, stored.LastDueMs, stored.LastFinishMs, stored.NextDueMs = JobState_DONE, 1, 1001, 1002, 0
				stored.Version, stored.UpdatedMs = 2, 900
			case 3: // an empty create in the batch
				reqs[i] = nil
				full[i] = &JobReply{Error: &Error{Code: Code_INVALID_ARGUMENT, Field: "jobs"}}
				wantFull++
				continue
			case 4: // paused
				stored.State = JobState_PAUSED
			}
			full[i] = &JobReply{Job: stored}
		}
		lean := Lean(reqs, full)
		if len(lean.Replies) != wantFull || len(lean.FullAt) != wantFull {
			t.Fatalf("round %d: %d full replies at %d indexes, want %d", round, len(lean.Replies), len(lean.FullAt), wantFull)
		}
		wire, err := proto.Marshal(lean)
		if err != nil {
			t.Fatal(err)
		}
		got := &CreateJobsReply{}
		if err := proto.Unmarshal(wire, got); err != nil {
			t.Fatal(err)
		}
		replies, err := got.Expand(reqs)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(replies) != n {
			t.Fatalf("round %d: %d replies to %d creates", round, len(replies), n)
		}
		for i := range replies {
			want := proto.Clone(full[i]).(*JobReply)
			if want.Job != nil && want.Error == nil && reqs[i] != nil && want.Job.Handler == reqs[i].Job.Handler {
				want.Job.RequestId = 0 // not in a stamp
			}
			if !proto.Equal(replies[i], want) {
				t.Fatalf("round %d, create %d: expanded %v, want %v", round, i, replies[i], want)
			}
		}
		fullWire, _ := proto.Marshal(&CreateJobsReply{Replies: full})
		if n > 0 && wantFull == 0 && len(wire) >= len(fullWire) {
			t.Errorf("round %d: lean reply %d bytes, full %d", round, len(wire), len(fullWire))
		}
	}
}

// A full reply (a shard without lean replies, a frozen shard's refusal) is taken
// as it is; a reply out of step with its batch is an error that says how.
func TestExpandChecksTheForm(t *testing.T) {
	reqs := []*CreateJob{{Job: &Job{Id: 1, App: "a", Handler: "h"}}, {Job: &Job{Id: 2, App: "a", Handler: "h"}}}
	full := &CreateJobsReply{Replies: []*JobReply{{Error: &Error{Code: Code_NOT_OWNER}}, {Error: &Error{Code: Code_NOT_OWNER}}}}
	if got, err := full.Expand(reqs); err != nil || len(got) != 2 || got[1].Error.Code != Code_NOT_OWNER {
		t.Fatalf("full reply: %v, %v", got, err)
	}
	for _, c := range []struct {
		r    *CreateJobsReply
		want string
	}{
		{&CreateJobsReply{Replies: full.Replies[:1]}, "1 full replies at 0 indexes"},
		{&CreateJobsReply{Replies: full.Replies, FullAt: []int32{1, 0}}, "not ascending"},
		{&CreateJobsReply{Replies: full.Replies[:1], FullAt: []int32{2}}, "not ascending"},
		{&CreateJobsReply{Version: []int64{1}}, "1 entries in version for 2 creates"},
		{&CreateJobsReply{Replies: full.Replies[:1], FullAt: []int32{0}, CreatedMs: []int64{0, 5, 6}}, "3 entries in created_ms"},
	} {
		if _, err := c.r.Expand(reqs); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one saying %q", c.r, err, c.want)
		}
	}
	// A full reply that is nil (a shard does not send one) leaves its create to the
	// stamp, as if it had none: no panic, however few creates are left to stamp.
	got, err := (&CreateJobsReply{Replies: []*JobReply{nil, nil}, FullAt: []int32{0, 1}, Version: []int64{3, 4}}).Expand(reqs)
	if err != nil || len(got) != 2 || got[0].GetJob().GetId() != 1 || got[1].GetJob().GetVersion() != 4 {
		t.Errorf("nil full replies: %v, %v", got, err)
	}
	if _, err := (&CreateJobsReply{Version: []int64{1, 1}}).Expand([]*CreateJob{{}, {Job: &Job{Id: 2}}}); err == nil ||
		!strings.Contains(err.Error(), "create 0 has no job") {
		t.Errorf("a stamp for an empty create: %v", err)
	}
}

// BenchmarkCreateJobsReply: a batch of 50 new one-shot jobs' reply, the shard's
// side (building the form and marshalling it) and the client's (unmarshalling it
// and taking one reply per create), full against lean; per create.
func BenchmarkCreateJobsReply(b *testing.B) {
	const n = 50
	reqs := make([]*CreateJob, n)
	full := make([]*JobReply, n)
	for i := range reqs {
		in := &Job{Id: 1234567890123456789 + int64(i), App: "bench-create", Handler: "noop", Params: []byte("0123456789abcdef"),
			Schedule: &Schedule{Kind: ScheduleKind_ONCE, AtMs: 1800000000000 + int64(i)}}
		reqs[i] = &CreateJob{Job: in, RequestId: 99999999999 + int64(i)}
		full[i] = &JobReply{Job: &Job{Id: in.Id, App: in.App, Handler: in.Handler, Params: in.Params, Schedule: in.Schedule,
			State: JobState_ACTIVE, Version: 1, CreatedMs: 1800000000000, UpdatedMs: 1800000000000, NextDueMs: in.Schedule.AtMs,
			RequestId: reqs[i].RequestId}}
	}
	for _, lean := range []bool{false, true} {
		name := "full"
		if lean {
			name = "lean"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			size := 0
			for range b.N / n {
				out := &CreateJobsReply{Replies: full}
				if lean {
					out = Lean(reqs, full)
				}
				wire, err := proto.Marshal(out)
				if err != nil {
					b.Fatal(err)
				}
				size = len(wire)
				got := &CreateJobsReply{}
				if err := proto.Unmarshal(wire, got); err != nil {
					b.Fatal(err)
				}
				replies, err := got.Expand(reqs)
				if err != nil || len(replies) != n || replies[n-1].Job.NextDueMs != full[n-1].Job.NextDueMs {
					b.Fatalf("expand: %v", err)
				}
			}
			b.ReportMetric(float64(size)/n, "wire-B/create")
		})
	}
}
