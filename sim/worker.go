package sim

import (
	"fmt"

	workercore "github.com/kjob/kjob/actors/worker/core"
	"github.com/kjob/kjob/messages"
)

// Handlers every simulated worker registers. Their behaviour is drawn from the
// run's PRNG, so it is the same on a replay.
const (
	handlerOK    = "ok"    // succeeds quickly
	handlerFlaky = "flaky" // fails 35 % of the time
	handlerFail  = "fail"  // always fails: its runs climb the whole ladder into the DLQ
	handlerSlow  = "slow"  // takes up to 1.5 × its timeout, so some time out
)

// worker is a user's process with the kjob worker runtime: the worker core decides
// (start, queue, drop a duplicate, resend a result, refuse), the simulator runs the
// "handler" as a timed event and reports like the worker shell.
type worker struct {
	s     *Sim
	idx   int
	addr  string
	app   string
	ref   *messages.Ref
	up    bool
	inc   int
	id    string // worker id: new per process, as cluster.Worker's default
	clock clock
	slow  bool
	cap   int
	core  *workercore.Core
	next  int // server to heartbeat through
}

func newWorker(s *Sim, i int, app string) *worker {
	addr := fmt.Sprintf("w%d", i+1)
	return &worker{s: s, idx: i, addr: addr, app: app, ref: &messages.Ref{Address: addr, Id: "kjob-worker"},
		cap: 1 + s.rng.IntN(6), next: s.rng.IntN(8)}
}

func (w *worker) address() string  { return w.addr }
func (w *worker) alive() bool      { return w.up }
func (w *worker) incarnation() int { return w.inc }
func (w *worker) clk() *clock      { return &w.clock }
func (w *worker) now() int64       { return w.s.local(&w.clock) }

func (w *worker) start() {
	if w.up {
		return
	}
	w.up = true
	w.inc++
	w.id = fmt.Sprintf("%s-%s.%d", w.app, w.addr, w.inc)
	w.core = workercore.New(w.cap)
	w.s.tracef("%s: worker %s starts (capacity %d)", w.addr, w.id, w.cap)
	inc := w.inc
	alive := func() bool { return w.up && w.inc == inc }
	w.heartbeat()
	w.s.every(heartbeatMs, 50, func() bool {
		if !alive() {
			return false
		}
		w.heartbeat()
		return true
	})
	w.s.every(workercore.ResultResendMs/2, 0, func() bool {
		if !alive() {
			return false
		}
		rs, to := w.core.Unacked(w.now())
		for i := range rs {
			w.s.tracef("%s: resend %s", w.addr, brief(rs[i]))
			w.s.send(w.addr, w.ref, to[i], rs[i])
		}
		return true
	})
}

func (w *worker) crash() {
	w.up = false
	w.inc++
	w.s.stats.WorkerCrashes++
	w.s.tracef("%s: worker %s crashes", w.addr, w.id)
}

func (w *worker) heartbeat() {
	srv := w.s.servers[w.next%len(w.s.servers)]
	w.next++
	hb := &messages.WorkerHeartbeat{SentMs: w.now(), Worker: &messages.WorkerInfo{WorkerId: w.id, App: w.app, Ref: w.ref,
		Capacity: int32(w.core.Capacity()), Busy: int32(w.core.Busy())}}
	w.s.send(w.addr, w.ref, srv.ref, hb)
}

func (w *worker) deliver(from, to *messages.Ref, m any) {
	switch x := m.(type) {
	case *messages.Dispatch:
		act, res := w.core.Dispatch(x)
		w.s.tracef("%s: %s from %s: action %d", w.addr, brief(x), from.GetAddress(), act)
		switch act {
		case workercore.Start:
			w.run(x)
		case workercore.Resend:
			w.s.send(w.addr, w.ref, x.ReplyTo, res)
		case workercore.Refuse:
			w.s.send(w.addr, w.ref, x.ReplyTo, &messages.RunResult{RunId: x.RunId, JobId: x.JobId, Shard: x.Shard, Epoch: x.Epoch,
				Attempt: x.Attempt, DueMs: x.DueMs, Outcome: messages.Outcome_FAILED, WorkerId: w.id,
				Error: fmt.Sprintf("worker %s queue is full", w.id)})
		}
	case *messages.ResultAck:
		w.core.Acked(x.RunId)
	}
}

// run executes d's handler: it takes a drawn time and has a drawn outcome; past the
// dispatch's timeout it ends TIMED_OUT, as the handler's context deadline would.
func (w *worker) run(d *messages.Dispatch) {
	w.s.chk.executed(w, d)
	start := w.now()
	var dur int64
	outcome, errText := messages.Outcome_SUCCEEDED, ""
	switch d.Handler {
	case handlerOK:
		dur = w.s.between(1, 40)
	case handlerFlaky:
		dur = w.s.between(1, 100)
		if w.s.chance(0.35) {
			outcome, errText = messages.Outcome_FAILED, "flaky handler failed"
		}
	case handlerFail:
		dur = w.s.between(1, 20)
		outcome, errText = messages.Outcome_FAILED, "handler always fails"
	case handlerSlow:
		dur = w.s.between(10, max(d.TimeoutMs*3/2, 20))
	default:
		dur = 1
		outcome, errText = messages.Outcome_FAILED, fmt.Sprintf("no handler %q registered on worker %s", d.Handler, w.id)
	}
	if w.slow {
		dur *= 4
	}
	if d.TimeoutMs > 0 && dur > d.TimeoutMs {
		dur = d.TimeoutMs
		outcome, errText = messages.Outcome_TIMED_OUT, "context deadline exceeded"
	}
	inc := w.inc
	w.s.after(dur, func() {
		if !w.up || w.inc != inc {
			return
		}
		res := &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Shard: d.Shard, Epoch: d.Epoch, Attempt: d.Attempt,
			DueMs: d.DueMs, Outcome: outcome, Error: errText, StartMs: start, EndMs: w.now(), WorkerId: w.id, Worker: w.ref}
		next, to := w.core.Finished(w.now(), res) // as actors/worker: to the newest owner, if the shard moved meanwhile
		w.s.tracef("%s: finished %s", w.addr, brief(res))
		w.s.send(w.addr, w.ref, to, res)
		if next != nil {
			w.run(next)
		}
	})
}
