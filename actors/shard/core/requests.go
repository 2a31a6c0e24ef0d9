package core

import (
	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/messages"
	"google.golang.org/protobuf/proto"
)

// The request window makes commands idempotent. Every command that changes something
// carries the caller's request id (the Go client takes a snowflake id per call and
// keeps it across retries); the record that carries the change carries the id, and
// applying the record — live or in recovery — enters the id here. A command whose id
// is in the window was applied already (its reply was lost, or the network delivered
// it twice, or late): it is answered from the current state, never applied again. So
// a retried update moves the version once, a retried trigger starts one run, and a
// create that arrives after its job was deleted does not bring the job back.
//
// The window is bounded in time (RequestWindowMs, far longer than any client's
// retries) and in size (MaxRequestWindow per shard, the oldest leaving first), and it
// is part of the shard's snapshot, so it survives restarts and handoffs.
const (
	RequestWindowMs  = 10 * 60_000
	MaxRequestWindow = 100_000
)

type seenReq struct {
	jobID int64
	atMs  int64
}

type reqWindow struct {
	seen  map[int64]seenReq
	order []int64 // insertion order; head first
	head  int

	// While a shard recovers, nothing asks the window, and most of what a long
	// journal enters would leave it again (a million creates enter a million ids
	// into a window of MaxRequestWindow): recovery only logs the adds, keeping the
	// last 2×MaxRequestWindow, and settle enters those when the shard goes live.
	// That is the window the adds one by one would have left, unless more than
	// MaxRequestWindow of the logged ids repeat one (a purge's records share
	// theirs, a handful at a time). It saved 0.4 s of a million-job replay.
	deferring bool
	deferred  []deferredReq
}

type deferredReq struct{ id, jobID, atMs int64 }

func (w *reqWindow) has(id int64) (seenReq, bool) {
	w.settle()
	s, ok := w.seen[id]
	return s, ok
}

// settle enters the adds logged while deferring, and stops deferring.
func (w *reqWindow) settle() {
	if !w.deferring {
		return
	}
	w.deferring = false
	for _, d := range w.deferred {
		w.add(d.id, d.jobID, d.atMs)
	}
	w.deferred = nil
}

// add enters request id (applied at atMs, for jobID) and lets out what fell out of
// the window.
func (w *reqWindow) add(id, jobID, atMs int64) {
	if id == 0 {
		return
	}
	if w.deferring {
		if len(w.deferred) >= 2*MaxRequestWindow {
			w.deferred = append(w.deferred[:0], w.deferred[MaxRequestWindow:]...)
		}
		w.deferred = append(w.deferred, deferredReq{id, jobID, atMs})
		return
	}
	if w.seen == nil {
		w.seen = make(map[int64]seenReq)
	}
	if _, ok := w.seen[id]; ok {
		return
	}
	w.seen[id] = seenReq{jobID: jobID, atMs: atMs}
	w.order = append(w.order, id)
	for w.head < len(w.order) {
		old := w.order[w.head]
		s := w.seen[old]
		if len(w.seen) <= MaxRequestWindow && s.atMs >= atMs-RequestWindowMs {
			break
		}
		delete(w.seen, old)
		w.head++
	}
	if w.head > 1024 && w.head > len(w.order)/2 { // compact the consumed prefix
		w.order = append(w.order[:0], w.order[w.head:]...)
		w.head = 0
	}
}

func (w *reqWindow) len() int {
	w.settle()
	return len(w.seen)
}

// entries lists the window oldest first (for the snapshot).
func (w *reqWindow) entries() []*messages.RequestSeen {
	w.settle()
	out := make([]*messages.RequestSeen, 0, len(w.seen))
	for _, id := range w.order[w.head:] {
		s := w.seen[id]
		out = append(out, &messages.RequestSeen{RequestId: id, JobId: s.jobID, AtMs: s.atMs})
	}
	return out
}

// RequestWindow is the number of request ids the shard remembers.
func (c *Core) RequestWindow() int { return c.reqs.len() }

func requestID(m proto.Message) int64 {
	switch x := m.(type) {
	case *messages.CreateJob:
		return x.RequestId
	case *messages.UpdateJob:
		return x.RequestId
	case *messages.DeleteJob:
		return x.RequestId
	case *messages.PauseJob:
		return x.RequestId
	case *messages.ResumeJob:
		return x.RequestId
	case *messages.TriggerJob:
		return x.RequestId
	case *messages.ReplayDeadLetter:
		return x.RequestId
	case *messages.PurgeDeadLetters:
		return x.RequestId
	}
	return 0
}

// duplicate answers a command whose request was applied already: with the job as it
// is now (the caller asked for a change that was made), success for a delete, a
// replay or a purge, and NOT_FOUND when the job the request changed is gone since.
func (c *Core) duplicate(m proto.Message, s seenReq) proto.Message {
	switch m.(type) {
	case *messages.DeleteJob:
		return &messages.JobReply{}
	case *messages.ReplayDeadLetter, *messages.PurgeDeadLetters:
		return &messages.DeadLetterReply{}
	}
	j := c.reply(s.jobID)
	if j == nil {
		return &messages.JobReply{Error: kerr.New(messages.Code_NOT_FOUND, "id",
			"job %d was changed by this request (applied at %d ms) and has been deleted since", s.jobID, s.atMs)}
	}
	return &messages.JobReply{Job: j}
}
