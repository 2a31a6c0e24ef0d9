package core

import (
	"unsafe"

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
	seen  reqIndex
	order []orderedReq // insertion order; head first
	head  int

	// missed is the id has last looked up and did not find, until the next add: the
	// add of the command's own record then skips its lookup. With the order keeping
	// each id's time, a create costs the window three map operations, not five.
	missed int64

	// While a shard recovers, nothing asks the window, and most of what a long
	// journal enters would leave it again (a million creates enter a million ids
	// into a window of MaxRequestWindow): recovery only logs the adds, keeping the
	// last 2×MaxRequestWindow, and settle enters those when the shard goes live.
	// That is the window the adds one by one would have left, unless more than
	// MaxRequestWindow of the logged ids repeat one (a purge's records share
	// theirs, a handful at a time). It saved 0.4 s of a million-job replay.
	deferring bool
	deferred  deferLog
}

type deferredReq struct{ id, jobID, atMs int64 }

// orderedReq is an id in the window's order, with its time (the map's, which is
// what letting it out looks at).
type orderedReq struct{ id, atMs int64 }

// deferBlock is the entries in one block of a deferLog (96 KiB).
const deferBlock = 4096

// deferLog is the log of the adds made while deferring: the last
// 2×MaxRequestWindow of them, and fewer than 2×deferBlock more. It is kept in fixed
// blocks, the oldest block reused for the newest once the log is full, so that a
// long replay writes its 4.8 MiB once, its blocks after the first prefaulted: a
// slice grown by append and cut by copying touched several times that in fresh
// memory, page by page (growslice was 0.1 s of a million-job replay;
// BenchmarkRequestWindowDeferred, in a fresh process, 36–77 ns an add against
// 6–11 now). The first block starts small and doubles up to deferBlock, so a
// shard with a short journal logs into a few hundred bytes.
type deferLog struct {
	blocks [][]deferredReq // oldest first; every one but the last holds deferBlock
	n      int             // entries in all blocks
}

func (l *deferLog) add(d deferredReq) {
	last := len(l.blocks) - 1
	switch {
	case last < 0:
		l.blocks = append(l.blocks, make([]deferredReq, 0, 16))
		last = 0
	case len(l.blocks[last]) == deferBlock:
		var b []deferredReq
		if l.n-deferBlock >= 2*MaxRequestWindow { // the oldest block is not needed
			b = l.blocks[0][:0]
			l.n -= deferBlock
			l.blocks = append(l.blocks[:0], l.blocks[1:]...)
		} else {
			b = make([]deferredReq, 0, deferBlock)
			prefault(unsafe.Pointer(unsafe.SliceData(b)), deferBlock*unsafe.Sizeof(deferredReq{}))
		}
		l.blocks = append(l.blocks, b)
		last = len(l.blocks) - 1
	case len(l.blocks[last]) == cap(l.blocks[last]): // the first block, still growing
		b := make([]deferredReq, len(l.blocks[last]), min(2*cap(l.blocks[last]), deferBlock))
		copy(b, l.blocks[last])
		l.blocks[last] = b
	}
	l.blocks[last] = append(l.blocks[last], d)
	l.n++
}

func (w *reqWindow) has(id int64) (seenReq, bool) {
	w.settle()
	s, ok := w.seen.get(id)
	if !ok {
		w.missed = id
	}
	return s, ok
}

// settle enters the adds logged while deferring, and stops deferring.
func (w *reqWindow) settle() {
	if !w.deferring {
		return
	}
	w.deferring = false
	for _, b := range w.deferred.blocks {
		for _, d := range b {
			w.add(d.id, d.jobID, d.atMs)
		}
	}
	w.deferred = deferLog{}
}

// add enters request id (applied at atMs, for jobID) and lets out what fell out of
// the window.
func (w *reqWindow) add(id, jobID, atMs int64) {
	if id == 0 {
		return
	}
	if w.deferring {
		w.deferred.add(deferredReq{id, jobID, atMs})
		return
	}
	// Nothing enters the window but through add, so an id has missed since the
	// last add is still out of it.
	known := id != w.missed
	w.missed = 0
	if known {
		if _, ok := w.seen.get(id); ok {
			return
		}
	}
	w.seen.put(id, seenReq{jobID: jobID, atMs: atMs})
	w.order = append(w.order, orderedReq{id, atMs})
	for w.head < len(w.order) {
		old := w.order[w.head]
		if w.seen.len() <= MaxRequestWindow && old.atMs >= atMs-RequestWindowMs {
			break
		}
		w.seen.del(old.id)
		w.head++
	}
	if w.head > 1024 && w.head > len(w.order)/2 { // compact the consumed prefix
		w.order = append(w.order[:0], w.order[w.head:]...)
		w.head = 0
	}
}

func (w *reqWindow) len() int {
	w.settle()
	return w.seen.len()
}

// entries lists the window oldest first (for the snapshot).
func (w *reqWindow) entries() []*messages.RequestSeen {
	w.settle()
	out := make([]*messages.RequestSeen, 0, w.seen.len())
	for _, o := range w.order[w.head:] {
		s, _ := w.seen.get(o.id)
		out = append(out, &messages.RequestSeen{RequestId: o.id, JobId: s.jobID, AtMs: s.atMs})
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
