// Package core is the pure bookkeeping of the worker runtime embedded in a user's process: it receives
// dispatches, runs handlers on a bounded pool, drops duplicate dispatches by run id
// (+ attempt), reports results until the shard acknowledges them, and heartbeats.
//
// Core is the pure bookkeeping (dedupe, pool, result retention); shell.go runs the
// handlers and talks to proto.actor.
package core

import (
	"google.golang.org/protobuf/proto"

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

type entry struct {
	d       *messages.Dispatch
	result  *messages.RunResult // nil while running
	sentMs  int64
	resends int
	waiting bool   // in Core.waiting: finished, not acknowledged, not forgotten, not given up
	sameRun *entry // the next waiting result of the same run id (another attempt), for Acked
}

// Core is the worker's state machine.
//
// The results the shard has not acknowledged yet are kept apart from the remembered
// runs, so the resend tick costs what is due, not what is remembered:
//
//   - waiting is a FIFO of those results in the order they were last sent, so in
//     the order they fall due (sentMs never decreases along it: see clock). Unacked
//     pops from its front what is due, and what stopped waiting since (acked,
//     forgotten or given up: waiting false), and stops at the first result still
//     waiting and not due. A result resent goes to the back.
//   - waitingRun maps a run id to its waiting results (a list through sameRun,
//     usually one attempt), so Acked does not look up every possible attempt.
//
// An entry is in waitingRun exactly when waiting is true, and then it is in waiting
// exactly once; an entry that stopped waiting may still be in waiting until Unacked
// pops it.
type Core struct {
	capacity   int
	busy       int
	queue      []*messages.Dispatch
	seen       map[key]*entry
	order      []key    // finished runs, oldest first, for eviction
	waiting    []*entry // results not acknowledged yet, oldest send first
	waitingRun map[string]*entry
	clockMs    int64              // the latest nowMs seen: a clock going back is held here
	lastSlim   *messages.Dispatch // the latest slim dispatch, whose shard and reply_to the next shares
}

// New makes a worker core with capacity pool slots.
func New(capacity int) *Core {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Core{capacity: capacity, seen: make(map[key]*entry), waitingRun: make(map[string]*entry)}
}

// Busy is the number of handlers running.
func (c *Core) Busy() int { return c.busy }

// Capacity is the pool size.
func (c *Core) Capacity() int { return c.capacity }

// Queued is the number of dispatches waiting for a free pool slot.
func (c *Core) Queued() int { return len(c.queue) }

// Unacknowledged is the number of runs whose result waits for its shard's ack (and
// is sent again every ResultResendMs until it comes).
func (c *Core) Unacknowledged() int { return len(c.waitingRun) }

// Dispatch decides what to do with an incoming dispatch.
func (c *Core) Dispatch(d *messages.Dispatch) (Action, *messages.RunResult) {
	k := key{d.RunId, d.Attempt}
	if e := c.seen[k]; e != nil {
		if e.result == nil {
			if d.Epoch > e.d.Epoch {
				e.d = d // a new owner (a handoff) asks for a run still going: answer it there
			}
			return Duplicate, nil
		}
		r := proto.Clone(e.result).(*messages.RunResult)
		r.Duplicate = true
		r.Epoch, r.Shard = d.Epoch, d.Shard
		e.d = c.slim(d) // a new owner may ask: answer where it asks
		return Resend, r
	}
	if c.busy < c.capacity {
		c.busy++
		c.seen[k] = &entry{d: d}
		return Start, nil
	}
	if len(c.queue) >= c.capacity*QueuePerSlot {
		return Refuse, nil
	}
	c.seen[k] = &entry{d: d}
	c.queue = append(c.queue, d)
	return Queued, nil
}

// Latest is the dispatch of run/attempt to answer: the one from the newest owner
// that asked for it (nil when unknown). Once the run finished, it holds only where
// to answer (see slim).
func (c *Core) Latest(runID string, attempt int32) *messages.Dispatch {
	if e := c.seen[key{runID, attempt}]; e != nil {
		return e.d
	}
	return nil
}

// Finished records a run's result and returns the next queued dispatch to start,
// and where to send the result: the newest owner that asked for the run (a handoff
// while the handler ran moves it; r's epoch and shard are set to that owner's). A
// run the core started is known until it finishes; for one it does not know, to is
// nil.
func (c *Core) Finished(nowMs int64, r *messages.RunResult) (next *messages.Dispatch, to *messages.Ref) {
	nowMs = c.clock(nowMs)
	k := key{r.RunId, r.Attempt}
	if e := c.seen[k]; e != nil {
		if e.d.Epoch > r.Epoch { // the shard moved while the handler ran: report to its new owner
			r.Epoch, r.Shard = e.d.Epoch, e.d.Shard
		}
		to = e.d.ReplyTo
		e.result = r
		e.d = c.slim(e.d)
		c.order = append(c.order, k)
		if !e.waiting { // (a run finishes once: waiting already would be a second report)
			e.sentMs = nowMs
			c.wait(e)
		}
	}
	for len(c.order) > RememberRuns {
		if e := c.seen[c.order[0]]; e != nil && e.waiting {
			c.unwait(e) // forgotten: no longer resent
		}
		delete(c.seen, c.order[0])
		c.order = c.order[1:]
	}
	if len(c.queue) > 0 {
		d := c.queue[0]
		c.queue = c.queue[1:]
		return d, to
	}
	c.busy--
	return nil, to
}

// Acked marks a result as recorded by its shard: every attempt of runID waiting for
// an ack stops waiting.
func (c *Core) Acked(runID string) {
	e := c.waitingRun[runID]
	if e == nil {
		return
	}
	delete(c.waitingRun, runID)
	for e != nil {
		next := e.sameRun
		e.waiting, e.sameRun = false, nil
		e = next
	}
}

// Unacked returns results to send again (no ack after ResultResendMs), with their
// dispatches (for reply_to). It walks only the front of the waiting results: those
// due, and those acknowledged or forgotten since the last call.
func (c *Core) Unacked(nowMs int64) (rs []*messages.RunResult, to []*messages.Ref) {
	nowMs = c.clock(nowMs)
	for len(c.waiting) > 0 {
		e := c.waiting[0]
		if e.waiting && nowMs-e.sentMs < ResultResendMs {
			break // this one and every one after it sent too recently
		}
		c.waiting[0] = nil
		c.waiting = c.waiting[1:]
		if !e.waiting {
			continue // acknowledged, forgotten or given up
		}
		e.resends++
		e.sentMs = nowMs
		r := proto.Clone(e.result).(*messages.RunResult)
		r.Epoch, r.Shard = e.d.Epoch, e.d.Shard
		rs = append(rs, r)
		to = append(to, e.d.ReplyTo)
		if e.resends >= MaxResultResends {
			c.unwait(e) // given up
			continue
		}
		c.waiting = append(c.waiting, e)
	}
	return rs, to
}

// slim is what a finished run keeps of its dispatch: where and at which epoch to
// answer. A remembered run (RememberRuns of them) kept the whole dispatch, its
// params (up to the params limit each), trace and names, for nothing; runs in a
// row usually come from one shard, so its name and reference are shared.
func (c *Core) slim(d *messages.Dispatch) *messages.Dispatch {
	s := &messages.Dispatch{RunId: d.RunId, JobId: d.JobId, Attempt: d.Attempt, DueMs: d.DueMs,
		Shard: d.Shard, Epoch: d.Epoch, ReplyTo: d.ReplyTo}
	if p := c.lastSlim; p != nil {
		if p.Shard == s.Shard {
			s.Shard = p.Shard
		}
		if p.ReplyTo != nil && s.ReplyTo != nil && p.ReplyTo.Address == s.ReplyTo.Address && p.ReplyTo.Id == s.ReplyTo.Id {
			s.ReplyTo = p.ReplyTo
		}
	}
	c.lastSlim = s
	return s
}

// wait puts a finished run's result among those waiting for an ack.
func (c *Core) wait(e *entry) {
	e.waiting = true
	e.sameRun = c.waitingRun[e.d.RunId]
	c.waitingRun[e.d.RunId] = e
	c.waiting = append(c.waiting, e)
}

// unwait takes a result out of those waiting for an ack (it stays in c.waiting until
// Unacked pops it).
func (c *Core) unwait(e *entry) {
	id := e.d.RunId
	if c.waitingRun[id] == e {
		if e.sameRun == nil {
			delete(c.waitingRun, id)
		} else {
			c.waitingRun[id] = e.sameRun
		}
	} else {
		for p := c.waitingRun[id]; p != nil; p = p.sameRun {
			if p.sameRun == e {
				p.sameRun = e.sameRun
				break
			}
		}
	}
	e.waiting, e.sameRun = false, nil
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
