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
	acked   bool
}

// Core is the worker's state machine.
type Core struct {
	capacity int
	busy     int
	queue    []*messages.Dispatch
	seen     map[key]*entry
	order    []key // finished runs, oldest first, for eviction
	unacked  []key // finished runs whose result the shard has not acknowledged yet
}

// New makes a worker core with capacity pool slots.
func New(capacity int) *Core {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Core{capacity: capacity, seen: make(map[key]*entry)}
}

// Busy is the number of handlers running.
func (c *Core) Busy() int { return c.busy }

// Capacity is the pool size.
func (c *Core) Capacity() int { return c.capacity }

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
		e.d = d // a new owner may ask: answer where it asks
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
// that asked for it (nil when unknown).
func (c *Core) Latest(runID string, attempt int32) *messages.Dispatch {
	if e := c.seen[key{runID, attempt}]; e != nil {
		return e.d
	}
	return nil
}

// Finished records a run's result and returns the next queued dispatch to start.
func (c *Core) Finished(nowMs int64, r *messages.RunResult) *messages.Dispatch {
	k := key{r.RunId, r.Attempt}
	if e := c.seen[k]; e != nil {
		e.result, e.sentMs = r, nowMs
		c.order = append(c.order, k)
		c.unacked = append(c.unacked, k)
	}
	for len(c.order) > RememberRuns {
		delete(c.seen, c.order[0])
		c.order = c.order[1:]
	}
	if len(c.queue) > 0 {
		d := c.queue[0]
		c.queue = c.queue[1:]
		return d
	}
	c.busy--
	return nil
}

// Acked marks a result as recorded by its shard.
func (c *Core) Acked(runID string) {
	for a := int32(1); a <= 64; a++ {
		if e := c.seen[key{runID, a}]; e != nil && e.result != nil {
			e.acked = true
		}
	}
}

// Unacked returns results to send again (no ack after ResultResendMs), with their
// dispatches (for reply_to).
// Only the results still waiting for an ack are walked, not every remembered run.
func (c *Core) Unacked(nowMs int64) (rs []*messages.RunResult, to []*messages.Ref) {
	keep := c.unacked[:0]
	for _, k := range c.unacked {
		e := c.seen[k]
		if e == nil || e.acked || e.result == nil || e.resends >= MaxResultResends {
			continue // acknowledged, forgotten or given up: no longer waiting
		}
		keep = append(keep, k)
		if nowMs-e.sentMs < ResultResendMs {
			continue
		}
		e.resends++
		e.sentMs = nowMs
		r := proto.Clone(e.result).(*messages.RunResult)
		r.Epoch, r.Shard = e.d.Epoch, e.d.Shard
		rs = append(rs, r)
		to = append(to, e.d.ReplyTo)
	}
	clear(c.unacked[len(keep):])
	c.unacked = keep
	return rs, to
}
