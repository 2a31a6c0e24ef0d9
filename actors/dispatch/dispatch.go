// Package dispatch is a proto.actor dispatcher that runs mailboxes on a pool of
// goroutines kept between runs.
//
// proto.actor's default dispatcher starts a new goroutine each time a mailbox goes
// from idle to busy. A new goroutine has an 8 KiB stack, and the receive paths of
// kjob's hot actors (a shard journaling and dispatching, a worker starting runs)
// are deep enough to grow it two or three times: the runtime copies the stack each
// time. In the fire benchmark (20,000 fires a second, every mailbox waking
// thousands of times a second) that copying (runtime.newstack → copystack) was
// 7.7% of the process's CPU. A pooled goroutine keeps its grown stack for the next
// mailbox run (the garbage collector may halve an idle one's stack; it grows back
// once, not on every run).
//
// Semantics are those of the default dispatcher: Schedule runs fn on some other
// goroutine, never on the caller's, and a mailbox is never run twice at once
// (proto.actor's mailbox guarantees that itself).
package dispatch

import (
	"runtime"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Throughput is how many messages a mailbox processes before it yields (the value
// of proto.actor's default dispatcher).
const Throughput = 300

// Pool is a Dispatcher that reuses goroutines. Idle goroutines wait on work; when
// none waits, Schedule starts a new one. At most maxIdle stay idle: a goroutine
// finishing a run when that many already wait ends, so a burst's goroutines do not
// stay forever.
type Pool struct {
	work    chan func()
	idle    atomic.Int32
	maxIdle int32
	started atomic.Int64 // goroutines started (for tests)
}

var _ actor.Dispatcher = (*Pool)(nil)

// New is a pool keeping at most maxIdle idle goroutines (at least 1).
func New(maxIdle int) *Pool {
	return &Pool{work: make(chan func()), maxIdle: int32(max(maxIdle, 1))}
}

// Shared is the process's pool for kjob's actors: as many idle goroutines as
// there can be mailboxes running at once on all CPUs, four times over.
var Shared = New(4 * runtime.GOMAXPROCS(0))

// Schedule runs fn on an idle pooled goroutine, or on a new one.
func (p *Pool) Schedule(fn func()) {
	select {
	case p.work <- fn:
	default:
		p.started.Add(1)
		go p.run(fn)
	}
}

// Throughput is the messages per mailbox run before it yields.
func (p *Pool) Throughput() int { return Throughput }

// Started is the number of goroutines the pool has started.
func (p *Pool) Started() int64 { return p.started.Load() }

func (p *Pool) run(fn func()) {
	for {
		fn()
		fn = nil // nothing of the last run stays reachable while idle
		if p.idle.Add(1) > p.maxIdle {
			p.idle.Add(-1)
			return
		}
		fn = <-p.work
		p.idle.Add(-1)
	}
}
