// Package core is the pure bookkeeping of the worker runtime embedded in a user's process: it receives
// dispatches, runs handlers on a bounded pool, drops duplicate dispatches by run id
// (+ attempt), reports results until the shard acknowledges them, and heartbeats.
//
// Core is the pure bookkeeping (dedupe, pool, result retention); shell.go runs the
// handlers and talks to proto.actor.
package core

import (
	"hash/maphash"

	"github.com/kjob/kjob/messages"
)

// Limits.
const (
	DefaultCapacity  = 64
	QueuePerSlot     = 16    // queued dispatches per pool slot before refusing
	RememberRuns     = 65536 // finished runs remembered for duplicate detection
	ResultResendMs   = 2000
	MaxResultResends = 30
)

// Action says what the shell should do with a dispatch.
type Action int

const (
	Start     Action = iota // run it now
	Queued                  // wait for a free slot
	Duplicate               // already running: drop
	Resend                  // already finished: send the remembered result again
	Refuse                  // queue full
)

type key struct {
	run     string
	attempt int32
}

// Core is the worker's state machine.
//
// A run dispatched and not finished (started or queued: at most capacity ×
// (1 + QueuePerSlot) of them) is in running, with the dispatch of the newest owner
// that asked for it. A finished run is remembered, RememberRuns of them, in the
// order they finished, without a pointer the garbage collector would follow (see
// memory.go): in a worker sharing its process with a busy application, 65,536
// finished runs as messages were the largest heap the collector marked.
//
// The results the shard has not acknowledged yet are listed apart from the
// remembered runs, so the resend tick costs what is due, not what is remembered:
//
//   - waiting is a FIFO of those results (by finish sequence number) in the order
//     they were last sent, so in the order they fall due (sentMs never decreases
//     along it: see clock). Unacked pops from its front what is due, and what
//     stopped waiting since (acked, forgotten or given up), and stops at the first
//     result still waiting and not due. A result resent goes to the back.
//   - waitingRun maps the hash of a run id to its waiting results (a list through
//     record.sameRun: usually one attempt of one run), so Acked does not look up
//     every possible attempt.
//
// A record is in a waitingRun list exactly when its waiting is true, and then its
// sequence number is in waiting exactly once; one that stopped waiting may still be
// in waiting until Unacked pops it.
type Core struct {
	capacity    int
	busy        int
	queue       []*messages.Dispatch
	running     map[key]*messages.Dispatch
	memory                        // the finished runs (memory.go)
	waiting     []uint64          // sequence numbers of results not acknowledged yet, oldest send first
	waitingRun  map[uint64]uint32 // run id hash → slot of its newest waiting result
	runsWaiting int               // distinct run ids with a result waiting
	clockMs     int64             // the latest nowMs seen: a clock going back is held here
}

// New makes a worker core with capacity pool slots.
func New(capacity int) *Core {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	seed := maphash.MakeSeed()
	return newCore(capacity, func(s string) uint64 { return maphash.String(seed, s) })
}

// newCore makes a core that hashes run ids with hash (tests make it collide).
func newCore(capacity int, hash func(string) uint64) *Core {
	c := &Core{capacity: capacity, running: make(map[key]*messages.Dispatch), waitingRun: make(map[uint64]uint32)}
	c.memory.init(hash)
	return c
}

// Busy is the number of handlers running.
func (c *Core) Busy() int { return c.busy }

// Capacity is the pool size.
func (c *Core) Capacity() int { return c.capacity }

// Queued is the number of dispatches waiting for a free pool slot.
func (c *Core) Queued() int { return len(c.queue) }

// Unacknowledged is the number of runs whose result waits for its shard's ack (and
// is sent again every ResultResendMs until it comes).
func (c *Core) Unacknowledged() int { return c.runsWaiting }

// Dispatch decides what to do with an incoming dispatch.
func (c *Core) Dispatch(d *messages.Dispatch) (Action, *messages.RunResult) {
	k := key{d.RunId, d.Attempt}
	if cur := c.running[k]; cur != nil {
		if d.Epoch > cur.Epoch {
			c.running[k] = d // a new owner (a handoff) asks for a run still going: answer it there
		}
		return Duplicate, nil
	}
	if s, ok := c.find(d.RunId, d.Attempt); ok {
		r := c.result(s)
		r.Duplicate = true
		r.Epoch, r.Shard = d.Epoch, d.Shard
		c.answerAt(s, d) // a new owner may ask: answer where it asks
		return Resend, r
	}
	if c.busy < c.capacity {
		c.busy++
		c.running[k] = d
		return Start, nil
	}
	if len(c.queue) >= c.capacity*QueuePerSlot {
		return Refuse, nil
	}
	c.running[k] = d
	c.queue = append(c.queue, d)
	return Queued, nil
}

// Latest is the dispatch of run/attempt to answer: the one from the newest owner
// that asked for it (nil when unknown). Once the run finished, it holds only where
// to answer: run id, job id, attempt, due time, shard, epoch and reply-to, the
// reply-to shared by every run answering there.
func (c *Core) Latest(runID string, attempt int32) *messages.Dispatch {
	if d := c.running[key{runID, attempt}]; d != nil {
		return d
	}
	if s, ok := c.find(runID, attempt); ok {
		r, o := c.result(s), &c.owners[c.records[s].owner]
		return &messages.Dispatch{RunId: r.RunId, JobId: r.JobId, Attempt: r.Attempt, DueMs: r.DueMs,
			Shard: o.shard, Epoch: o.epoch, ReplyTo: o.to}
	}
	return nil
}

// Finished records a run's result and returns the next queued dispatch to start,
// and where to send the result: the newest owner that asked for the run (a handoff
// while the handler ran moves it; r's epoch and shard are set to that owner's). A
// run the core started is known until it finishes; for one it does not know, to is
// nil. A run finishes once: a second report of a run remembered changes nothing but
// r's epoch and shard, and is answered where the run is.
//
// The result is remembered as its encoding: r is the caller's again once Finished
// returns.
func (c *Core) Finished(nowMs int64, r *messages.RunResult) (next *messages.Dispatch, to *messages.Ref) {
	nowMs = c.clock(nowMs)
	k := key{r.RunId, r.Attempt}
	if d := c.running[k]; d != nil {
		delete(c.running, k)
		if d.Epoch > r.Epoch { // the shard moved while the handler ran: report to its new owner
			r.Epoch, r.Shard = d.Epoch, d.Shard
		}
		s := c.remember(r, d)
		to = c.owners[c.records[s].owner].to
		c.records[s].sentMs = nowMs
		c.wait(s)
	} else if s, ok := c.find(r.RunId, r.Attempt); ok {
		o := &c.owners[c.records[s].owner]
		if o.epoch > r.Epoch {
			r.Epoch, r.Shard = o.epoch, o.shard
		}
		to = o.to
	}
	if len(c.queue) > 0 {
		d := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		return d, to
	}
	c.busy--
	return nil, to
}

// Acked marks a result as recorded by its shard: every attempt of runID waiting for
// an ack stops waiting.
func (c *Core) Acked(runID string) {
	h := c.hash(runID)
	head, ok := c.waitingRun[h]
	if !ok {
		return
	}
	// Unlink the records of runID from the list, keeping the others (other run ids
	// with the same hash) in their order.
	acked := false
	var prev uint32 // slot+1 of the last record kept, 0 before the first
	for s, more := head, true; more; {
		r := &c.records[s]
		next, hasNext := r.sameRun, r.sameRun != 0
		if c.isRun(s, runID) {
			acked = true
			r.waiting, r.sameRun = false, 0
			if prev == 0 {
				head = next - 1 // (meaningless when !hasNext: the list is then empty)
				ok = hasNext
			} else {
				c.records[prev-1].sameRun = next
			}
		} else {
			prev = s + 1
		}
		s, more = next-1, hasNext
	}
	if ok {
		c.waitingRun[h] = head
	} else {
		delete(c.waitingRun, h)
	}
	if acked {
		c.runsWaiting--
	}
}

// Unacked returns results to send again (no ack after ResultResendMs), with where
// to send each. It walks only the front of the waiting results: those due, and
// those acknowledged or forgotten since the last call.
func (c *Core) Unacked(nowMs int64) (rs []*messages.RunResult, to []*messages.Ref) {
	nowMs = c.clock(nowMs)
	for len(c.waiting) > 0 {
		seq := c.waiting[0]
		s, live := c.slotOf(seq)
		waiting := live && c.records[s].waiting
		if waiting && nowMs-c.records[s].sentMs < ResultResendMs {
			break // this one and every one after it sent too recently
		}
		c.waiting = c.waiting[1:]
		if !waiting {
			continue // acknowledged, forgotten or given up
		}
		rec := &c.records[s]
		rec.resends++
		rec.sentMs = nowMs
		o := &c.owners[rec.owner]
		r := c.result(s)
		r.Epoch, r.Shard = o.epoch, o.shard
		rs = append(rs, r)
		to = append(to, o.to)
		if rec.resends >= MaxResultResends {
			c.unwait(s) // given up
			continue
		}
		c.waiting = append(c.waiting, seq)
	}
	return rs, to
}

// wait puts the result of the run remembered in slot s among those waiting for an
// ack.
func (c *Core) wait(s uint32) {
	r := &c.records[s]
	head, ok := c.waitingRun[r.runHash]
	if !c.runListed(head, ok, s) {
		c.runsWaiting++
	}
	r.waiting, r.sameRun = true, 0
	if ok {
		r.sameRun = head + 1
	}
	c.waitingRun[r.runHash] = s
	c.waiting = append(c.waiting, r.seq)
}

// unwait takes the result in slot s out of those waiting for an ack (its sequence
// number stays in c.waiting until Unacked pops it).
func (c *Core) unwait(s uint32) {
	r := &c.records[s]
	head := c.waitingRun[r.runHash]
	if head == s {
		if r.sameRun == 0 {
			delete(c.waitingRun, r.runHash)
		} else {
			c.waitingRun[r.runHash] = r.sameRun - 1
		}
	} else {
		for p := head; ; {
			pr := &c.records[p]
			if pr.sameRun == s+1 {
				pr.sameRun = r.sameRun
				break
			}
			if pr.sameRun == 0 {
				panic("worker core: a waiting result is not listed under its run")
			}
			p = pr.sameRun - 1
		}
	}
	r.waiting, r.sameRun = false, 0
	head, ok := c.waitingRun[r.runHash]
	if !c.runListed(head, ok, s) {
		c.runsWaiting--
	}
}

// runListed says whether the waiting list starting at slot head (when ok) holds a
// result of the run in slot s other than s itself.
func (c *Core) runListed(head uint32, ok bool, s uint32) bool {
	for p := head; ok; {
		if p != s && c.sameRunID(p, s) {
			return true
		}
		ok = c.records[p].sameRun != 0
		p = c.records[p].sameRun - 1
	}
	return false
}

// clock keeps the core's time from going back, so that c.waiting stays in the order
// its results fall due: a caller's clock stepping back holds the core at the latest
// time it saw until it catches up (the shell passes a monotonic clock).
func (c *Core) clock(nowMs int64) int64 {
	if nowMs > c.clockMs {
		c.clockMs = nowMs
	}
	return c.clockMs
}
