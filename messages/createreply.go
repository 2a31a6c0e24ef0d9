package messages

import (
	"bytes"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// Lean returns the lean form (see CreateJobs in kjob.proto) of replies, the full
// replies to the creates of reqs, one per create in order: each create that
// succeeded with the definition it asked for is answered by its stamp, every other
// one in full. A stamp field that would be zero for every create is left empty.
func Lean(reqs []*CreateJob, replies []*JobReply) *CreateJobsReply {
	n := len(reqs)
	out := &CreateJobsReply{}
	for i, r := range replies {
		var req *Job
		if i < n && reqs[i] != nil {
			req = reqs[i].Job
		}
		j := r.GetJob()
		if r.GetError().GetCode() != Code_OK || j == nil || req == nil || j.Id != req.Id || !sameDefinition(j, req) {
			out.FullAt = append(out.FullAt, int32(i))
			out.Replies = append(out.Replies, r)
			continue
		}
		if j.State != JobState_JOB_STATE_UNSPECIFIED {
			if out.State == nil {
				out.State = make([]JobState, n)
			}
			out.State[i] = j.State
		}
		stamp(&out.Version, i, n, j.Version)
		stamp(&out.CreatedMs, i, n, j.CreatedMs)
		stamp(&out.UpdatedMs, i, n, j.UpdatedMs)
		stamp(&out.NextDueMs, i, n, j.NextDueMs)
		stamp(&out.Runs, i, n, j.Runs)
		stamp(&out.LastDueMs, i, n, j.LastDueMs)
		stamp(&out.LastFinishMs, i, n, j.LastFinishMs)
	}
	return out
}

// stamp sets (*f)[i] = v, making the field one entry per create at its first
// nonzero value.
func stamp(f *[]int64, i, n int, v int64) {
	if v == 0 {
		return
	}
	if *f == nil {
		*f = make([]int64, n)
	}
	(*f)[i] = v
}

// Expand returns the reply to each create of reqs, in order, from r in either form:
// full (one reply per create, as a shard that predates lean replies sends) or lean.
// A create answered by its stamp gets a new Job of its request's definition (App,
// Handler, and the request's own Params, Schedule and Policy, shared, not copied)
// and the stamp's fields; its RequestId is 0. A reply that fits neither form — a
// batch's replies and creates out of step — is an error, naming what is off.
func (r *CreateJobsReply) Expand(reqs []*CreateJob) ([]*JobReply, error) {
	n := len(reqs)
	if len(r.FullAt) == 0 && len(r.Replies) == n {
		return r.Replies, nil // full (or nothing to answer)
	}
	if len(r.FullAt) != len(r.Replies) {
		return nil, fmt.Errorf("create batch reply: %d full replies at %d indexes", len(r.Replies), len(r.FullAt))
	}
	lens := [...]int{len(r.State), len(r.Version), len(r.CreatedMs), len(r.UpdatedMs), len(r.NextDueMs), len(r.Runs),
		len(r.LastDueMs), len(r.LastFinishMs)}
	for k, l := range lens {
		if l != 0 && l != n {
			names := [...]string{"state", "version", "created_ms", "updated_ms", "next_due_ms", "runs", "last_due_ms", "last_finish_ms"}
			return nil, fmt.Errorf("create batch reply: %d entries in %s for %d creates", l, names[k], n)
		}
	}
	out := make([]*JobReply, n)
	for k, at := range r.FullAt {
		if at < 0 || int(at) >= n || (k > 0 && at <= r.FullAt[k-1]) {
			return nil, fmt.Errorf("create batch reply: full_at %v is not ascending within %d creates", r.FullAt, n)
		}
		out[at] = r.Replies[k]
	}
	rs := make([]JobReply, n-len(r.FullAt)) // the stamped creates' replies, in one allocation (full_at ascends within n)
	for i := range out {
		if out[i] != nil {
			continue
		}
		req := reqs[i].GetJob()
		if req == nil {
			return nil, fmt.Errorf("create batch reply: create %d has no job and no full reply", i)
		}
		if len(rs) == 0 { // a full reply that was nil: answered by its stamp too
			rs = make([]JobReply, 1)
		}
		rep := &rs[0]
		rs = rs[1:]
		rep.Job = &Job{Id: req.Id, App: req.App, Handler: req.Handler, Params: req.Params,
			Schedule: req.Schedule, Policy: req.Policy, State: at(r.State, i), Version: at(r.Version, i),
			CreatedMs: at(r.CreatedMs, i), UpdatedMs: at(r.UpdatedMs, i), NextDueMs: at(r.NextDueMs, i),
			Runs: at(r.Runs, i), LastDueMs: at(r.LastDueMs, i), LastFinishMs: at(r.LastFinishMs, i)}
		out[i] = rep
	}
	return out, nil
}

func at[T any](f []T, i int) T {
	if f == nil {
		var zero T
		return zero
	}
	return f[i]
}

// sameDefinition: a and b define the same job (what a create sets), the common
// case — the shard's job holding the request's own messages — without reflection.
func sameDefinition(a, b *Job) bool {
	return a.App == b.App && a.Handler == b.Handler && bytes.Equal(a.Params, b.Params) &&
		(a.Schedule == b.Schedule || proto.Equal(a.Schedule, b.Schedule)) &&
		(a.Policy == b.Policy || proto.Equal(a.Policy, b.Policy))
}
