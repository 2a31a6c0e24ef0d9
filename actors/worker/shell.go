package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/worker/core"
	"github.com/kjob/kjob/messages"
)

// Run is what a handler receives.
type Run struct {
	ID          string
	JobID       int64
	App         string
	Handler     string
	Params      []byte
	DueMs       int64
	Attempt     int
	Traceparent string
	StartMs     int64
	// DispatchedMs is when the owning shard sent this attempt, on its clock (the
	// Dispatch's dispatched_ms, set as it leaves the shard, after its journal record
	// is durable; a dispatch a full worker refused and the shard sent again carries
	// the resend's time): DispatchedMs - DueMs is how late the shard sent it (its
	// journal commit, or the shard's step when the run was armed ahead), StartMs -
	// DispatchedMs the transport and the worker's queue after.
	DispatchedMs int64
}

// HandlerFunc handles one run; a returned error fails the run (it is retried along
// the job's ladder). ctx carries the job's timeout as its deadline.
type HandlerFunc func(ctx context.Context, r *Run) error

type traceKey struct{}

// Traceparent returns the W3C traceparent of the run a handler context belongs to.
func Traceparent(ctx context.Context) string { s, _ := ctx.Value(traceKey{}).(string); return s }

// runState is one run on the worker: what its handler gets, the handler's context
// and the run's result, in one allocation instead of five (they live about as long
// as each other: the run, then the result until it is sent). A runner sends it back
// to the actor when the handler returns.
type runState struct {
	run Run
	ctx runContext
	res messages.RunResult
}

// runContext is a handler's context: the run's traceparent as a value, the job's
// timeout as its deadline. context.WithValue and WithTimeout made six objects a
// run (two contexts, the boxed traceparent, a timer, two funcs) and set a timer,
// though most handlers never wait on Done; this one is part of the run's allocation
// and sets its timer only when Done is first asked for (a context derived from it
// asks, then registers through AfterFunc rather than a goroutine of its own).
//
// With a timeout it ends at the deadline (DeadlineExceeded: Err says so once the
// deadline passed, timer or not) or when the handler returns (Canceled), as
// WithTimeout's context with its cancel deferred did, and so do the contexts
// derived from it. Without one it never ends, as context.Background's values did.
type runContext struct {
	traceparent string
	deadline    time.Time // zero: no timeout

	mu    sync.Mutex
	err   error         // why it ended; nil until then
	done  chan struct{} // made by the first Done
	timer *time.Timer   // ends it at the deadline, set by the first Done
	after []*afterFunc  // AfterFunc's functions, not run nor stopped yet
}

type afterFunc struct{ f func() }

func (c *runContext) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *runContext) Value(key any) any {
	if _, ok := key.(traceKey); ok {
		return c.traceparent
	}
	return nil
}

func (c *runContext) Done() <-chan struct{} {
	if c.deadline.IsZero() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		} else {
			c.timer = time.AfterFunc(time.Until(c.deadline), c.expire) // (past: at once)
		}
	}
	return c.done
}

func (c *runContext) Err() error {
	if c.deadline.IsZero() {
		return nil
	}
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err == nil && !time.Now().Before(c.deadline) {
		c.end(context.DeadlineExceeded)
		err = context.DeadlineExceeded
	}
	return err
}

// AfterFunc calls f once the context ends, unless stop was called first (stop then
// returns true). The context package registers this way the cancel of a context
// derived from this one, and of context.AfterFunc's (the unexported afterFuncer):
// those are short, and are called at once as a cancelCtx calls its children's, in
// the goroutine that ends the context (context.AfterFunc's own f still runs in a
// goroutine of its own).
func (c *runContext) AfterFunc(f func()) (stop func() bool) {
	if c.deadline.IsZero() {
		return func() bool { return true } // it never ends: f never runs
	}
	c.Done() // the timer
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	c.after = append(c.after, a)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if i := slices.Index(c.after, a); i >= 0 {
			c.after = slices.Delete(c.after, i, i+1)
			return true
		}
		return false
	}
}

// expire ends the context at its deadline (the timer's function).
func (c *runContext) expire() { c.end(context.DeadlineExceeded) }

// finish ends the context when the handler returned.
func (c *runContext) finish() {
	if !c.deadline.IsZero() {
		c.end(context.Canceled)
	}
}

// end ends the context with err, unless it ended already, and calls the AfterFunc
// functions (outside the lock: they ask for Err).
func (c *runContext) end(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.done != nil {
		close(c.done)
	}
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for _, a := range after {
		a.f()
	}
}

type resendTick struct{}

// sendResults makes the actor send the results it holds (see Actor.send).
type sendResults struct{}

// StatsRequest asks the worker actor for its Stats (a local request: the reply is a
// Stats value, not a protobuf message).
type StatsRequest struct{}

// Stats is what a worker has in hand.
type Stats struct {
	Busy           int // handlers running
	Queued         int // dispatches waiting for a free handler
	Unacknowledged int // finished runs whose result no shard has acknowledged yet
}

// Actor is the proto.actor shell of a worker: it receives Dispatch messages.
type Actor struct {
	core     *core.Core
	id       string
	handlers map[string]HandlerFunc
	log      *slog.Logger
	onRun    func(r *Run, res *messages.RunResult)
	ctx      actor.Context
	stop     chan struct{}
	clock0   time.Time // the core's clock is milliseconds since then (monotonic)

	// Results wait here, by shard, until the messages already in the mailbox are
	// handled: a sendResults the actor sends itself with the first one comes after
	// them, and then the results ready meanwhile go as one RunResults per shard.
	out     []resultsTo
	outSent bool // a sendResults is on its way

	selfRef *messages.Ref // the worker's own reference, shared by every result (never changed)

	// Handlers run on kept goroutines, started as the number of runs going first
	// reaches each count, up to the pool's capacity: a new goroutine per run grew its
	// stack every time (context.WithTimeout alone took it past the initial size), which
	// cost more CPU than the worker's bookkeeping. runq never blocks a send: what is in
	// it plus what runs is at most the core's busy count, at most the runners.
	runq    chan runTask
	runners int
}

// runTask is one run for a runner goroutine.
type runTask struct {
	d    *messages.Dispatch
	h    HandlerFunc
	self *messages.Ref
}

type resultsTo struct {
	to  *messages.Ref
	res []*messages.RunResult
}

// NewActor makes a worker shell. onRun (may be nil) is called after each executed run.
func NewActor(id string, capacity int, handlers map[string]HandlerFunc, log *slog.Logger, onRun func(*Run, *messages.RunResult)) *Actor {
	return &Actor{core: core.New(capacity), id: id, handlers: handlers, log: log, onRun: onRun, clock0: time.Now()}
}

// nowMs is the core's clock: monotonic, so a wall clock stepping back does not hold
// the results' resends.
func (a *Actor) nowMs() int64 { return time.Since(a.clock0).Milliseconds() }

// Core exposes the state for heartbeats (read it only from the actor or via Busy).
func (a *Actor) Core() *core.Core { return a.core }

// Receive implements actor.Actor.
func (a *Actor) Receive(ctx actor.Context) {
	a.ctx = ctx
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.stop = make(chan struct{})
		self, sys, stop := ctx.Self(), ctx.ActorSystem(), a.stop
		go func() {
			t := time.NewTicker(core.ResultResendMs * time.Millisecond / 2)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					sys.Root.Send(self, &resendTick{})
				case <-stop:
					return
				}
			}
		}()
	case *actor.Stopping:
		close(a.stop)
		if a.runq != nil {
			close(a.runq) // runners finish what they hold, then exit
			a.runq, a.runners = nil, 0
		}
	case *messages.Dispatch:
		a.dispatch(m)
	case *messages.Dispatches:
		for _, d := range m.Dispatches {
			if d != nil {
				a.dispatch(d)
			}
		}
	case *runState: // a run finished
		next, to := a.core.Finished(a.nowMs(), &m.res) // to: the newest owner that asked
		if next != nil {
			a.start(next)
		}
		a.send(to, &m.res)
	case *messages.ResultAck:
		a.core.Acked(m.RunId)
	case *messages.ResultAcks:
		for _, k := range m.Acks {
			if k != nil {
				a.core.Acked(k.RunId)
			}
		}
	case *sendResults:
		a.outSent = false
		for i := range a.out {
			o := &a.out[i]
			pid := actor.NewPID(o.to.Address, o.to.Id)
			for len(o.res) > 0 {
				n := min(len(o.res), resultBatchMax)
				if n == 1 {
					ctx.Send(pid, o.res[0])
				} else {
					ctx.Send(pid, &messages.RunResults{Results: o.res[:n:n]})
				}
				o.res = o.res[n:]
			}
		}
		clear(a.out)
		a.out = a.out[:0]
	case *StatsRequest:
		ctx.Respond(Stats{Busy: a.core.Busy(), Queued: a.core.Queued(), Unacknowledged: a.core.Unacknowledged()})
	case *resendTick:
		rs, to := a.core.Unacked(a.nowMs())
		for i := range rs {
			a.send(to[i], rs[i])
		}
	}
}

// resultBatchMax bounds a RunResults (a result carries at most an error text).
const resultBatchMax = 512

func (a *Actor) dispatch(m *messages.Dispatch) {
	act, res := a.core.Dispatch(m)
	switch act {
	case core.Start:
		a.start(m)
	case core.Resend:
		a.send(m.ReplyTo, res)
	case core.Refuse:
		a.send(m.ReplyTo, &messages.RunResult{RunId: m.RunId, JobId: m.JobId, Shard: m.Shard, Epoch: m.Epoch,
			Attempt: m.Attempt, DueMs: m.DueMs, Outcome: messages.Outcome_REFUSED, WorkerId: a.id,
			Error: fmt.Sprintf("worker %s queue is full (%d queued)", a.id, a.core.Capacity()*core.QueuePerSlot)})
	}
}

// send queues result m for the shard to (see Actor.out).
func (a *Actor) send(to *messages.Ref, m *messages.RunResult) {
	if to == nil {
		return
	}
	if !a.outSent {
		a.outSent = true
		a.ctx.Send(a.ctx.Self(), &sendResults{})
	}
	for i := range a.out {
		if o := &a.out[i]; o.to == to || (o.to.Address == to.Address && o.to.Id == to.Id) {
			o.res = append(o.res, m)
			return
		}
	}
	a.out = append(a.out, resultsTo{to: to, res: []*messages.RunResult{m}})
}

func (a *Actor) start(d *messages.Dispatch) {
	self := a.ctx.Self()
	if a.selfRef == nil || a.selfRef.Address != self.Address || a.selfRef.Id != self.Id {
		a.selfRef = &messages.Ref{Address: self.Address, Id: self.Id}
	}
	if a.runq == nil {
		a.runq = make(chan runTask, a.core.Capacity())
	}
	if a.runners < a.core.Busy() {
		a.runners++
		go a.runner(a.runq, self, a.ctx.ActorSystem())
	}
	a.runq <- runTask{d: d, h: a.handlers[d.Handler], self: a.selfRef}
}

// runner runs the handlers of the runs it takes from q, one at a time, until q is
// closed, and tells the actor self each result.
func (a *Actor) runner(q <-chan runTask, self *actor.PID, sys *actor.ActorSystem) {
	for t := range q {
		sys.Root.Send(self, a.run(t))
	}
}

// run executes one run's handler and makes its result.
func (a *Actor) run(t runTask) *runState {
	d := t.d
	st := &runState{}
	r, res := &st.run, &st.res
	*r = Run{ID: d.RunId, JobID: d.JobId, App: d.App, Handler: d.Handler, Params: d.Params, DueMs: d.DueMs,
		Attempt: int(d.Attempt), Traceparent: d.Traceparent, StartMs: time.Now().UnixMilli(), DispatchedMs: d.DispatchedMs}
	res.RunId, res.JobId, res.Shard, res.Epoch, res.Attempt = d.RunId, d.JobId, d.Shard, d.Epoch, d.Attempt
	res.DueMs, res.StartMs, res.WorkerId, res.Worker = d.DueMs, r.StartMs, a.id, t.self
	// The arguments of a log call are boxed before the level is checked: at
	// thousands of runs a second, only when debug is on.
	debug := a.log.Enabled(context.Background(), slog.LevelDebug)
	if debug {
		a.log.Debug("run started", "run", d.RunId, "attempt", d.Attempt, "handler", d.Handler, "late_ms", r.StartMs-d.DueMs, "traceparent", d.Traceparent)
	}
	err := a.execute(t.h, d, r, &st.ctx)
	res.EndMs = time.Now().UnixMilli()
	switch {
	case err == nil:
		res.Outcome = messages.Outcome_SUCCEEDED
	case errors.Is(err, context.DeadlineExceeded):
		res.Outcome, res.Error = messages.Outcome_TIMED_OUT, err.Error()
	default:
		res.Outcome, res.Error = messages.Outcome_FAILED, err.Error()
	}
	if debug {
		a.log.Debug("run finished", "run", d.RunId, "attempt", d.Attempt, "outcome", res.Outcome.String(), "traceparent", d.Traceparent)
	}
	if a.onRun != nil {
		a.onRun(r, res)
	}
	return st
}

// execute runs h with rc as its context.
func (a *Actor) execute(h HandlerFunc, d *messages.Dispatch, r *Run, rc *runContext) (err error) {
	if h == nil {
		return fmt.Errorf("no handler %q registered on worker %s", d.Handler, a.id)
	}
	rc.traceparent = d.Traceparent
	if d.TimeoutMs > 0 {
		rc.deadline = time.Now().Add(time.Duration(d.TimeoutMs) * time.Millisecond)
		defer rc.finish()
	}
	var ctx context.Context = rc
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler %q panicked: %v", d.Handler, p)
		}
	}()
	err = h(ctx, r)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return err
}
