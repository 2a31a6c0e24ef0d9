package shard

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// Gauges are a shard's current figures. The shard's actor publishes them after every
// message it handles, so a scrape from another goroutine never touches the core.
//
// Backlog is kept by the shell from the records the core journals (a run journaled as
// dispatched and not yet sent). A run the core re-dispatches at recovery is not
// journaled again, so one waiting then for a worker is not counted until its next
// attempt; a core accessor for waiting runs would make the figure exact.
type Gauges struct {
	Jobs        int64 // jobs held
	Pending     int64 // jobs with a next fire time
	Backlog     int64 // runs due and journaled but not yet sent to a worker (none live, or waiting for the journal)
	InFlight    int64 // runs dispatched or waiting on the retry ladder
	Held        int64 // runs due and waiting for a worker with credit (every worker has CreditPerSlot per slot of this shard's runs)
	DeadLetters int64 // size of the dead-letter queue
	Failed      bool  // the journal failed: the shard stopped serving
	// HandoffSinceMs is when this process saw the shard frozen for a handoff or a
	// split (unix ms; 0: it is not). A frozen shard fires nothing until its target
	// confirms the import: one whose target never comes back stays frozen.
	HandoffSinceMs int64
}

// Sink receives what a shard shell observes; package cluster implements it with
// Prometheus. Methods are called from shard actors, concurrently across shards, and
// must not block. A nil Sink turns observation off.
type Sink interface {
	// ShardStarted registers the gauge reader of a shard; the returned func
	// unregisters it when the shard's actor stops.
	ShardStarted(app, shard string, read func() Gauges) (stop func())
	// Dispatched is called for each run attempt as its Dispatch leaves the shard
	// (after its record is durable; a broadcast's copies once), at sentMs on the
	// shard's clock.
	Dispatched(app string, d *messages.Dispatch, sentMs int64)
	// Finished is called for every run outcome the shard journals (results reported
	// by workers and runs declared lost alike).
	Finished(app string, rec *messages.RunRecord)
	// RetryScheduled is called when a failed run is put on ladder level (0-based).
	RetryScheduled(app string, level int32)
	// DeadLettered is called when a run lands in the dead-letter queue.
	DeadLettered(app string)
}

// observer is the shell's side of observation: it reads the records the core
// journals and the messages it sends, keeps the backlog, and publishes Gauges.
// It runs on the shard actor's goroutine only (except gauges, which are atomic).
type observer struct {
	sink    Sink
	stop    func()
	waiting map[string]int64 // run id → job id: journaled as dispatched, not yet sent
	byJob   map[int64]int    // job id → its runs in waiting, so a delete skips the scan
	// The last dispatch reported: a broadcast's copies leave one after another and
	// are reported once.
	lastRun     string
	lastAttempt int32
	g           struct {
		jobs, pending, backlog, inFlight, held, dead atomic.Int64
		failed                                       atomic.Bool
		handoffSince                                 atomic.Int64
	}
}

// SetSink makes the shard report to s. Call it before the actor is spawned.
func (a *Actor) SetSink(s Sink) { a.obs.sink = s }

func (o *observer) read() Gauges {
	return Gauges{Jobs: o.g.jobs.Load(), Pending: o.g.pending.Load(), Backlog: o.g.backlog.Load(),
		InFlight: o.g.inFlight.Load(), Held: o.g.held.Load(), DeadLetters: o.g.dead.Load(), Failed: o.g.failed.Load(),
		HandoffSinceMs: o.g.handoffSince.Load()}
}

// started registers the shard's gauges (on the actor's Started).
func (o *observer) started(a *Actor) {
	if o.sink == nil {
		return
	}
	if o.waiting == nil {
		o.waiting, o.byJob = map[string]int64{}, map[int64]int{}
	}
	o.stopped() // a restarted actor registers again
	o.publish(a)
	sh := a.core.Shard()
	o.stop = o.sink.ShardStarted(sh.App, sh.String(), o.read)
}

// stopped unregisters the gauges (on the actor's Stopping).
func (o *observer) stopped() {
	if o.stop != nil {
		o.stop()
		o.stop = nil
	}
}

// publish stores the core's figures for the next scrape.
func (o *observer) publish(a *Actor) {
	if o.sink == nil {
		return
	}
	c := a.core
	o.g.jobs.Store(int64(c.Jobs()))
	o.g.pending.Store(int64(c.Pending()))
	o.g.backlog.Store(int64(len(o.waiting)))
	o.g.inFlight.Store(int64(c.InFlight()))
	o.g.held.Store(int64(c.Held()))
	o.g.dead.Store(int64(c.DeadLetters()))
	o.g.failed.Store(c.Failed() != nil)
	if handing := c.Handoff() != nil; handing != (o.g.handoffSince.Load() != 0) {
		var since int64
		if handing {
			since = time.Now().UnixMilli()
		}
		o.g.handoffSince.Store(since)
	}
}

// recorded reads the records the core just journaled, as the messages they were
// made from (core.Recorder): only run records, and only when someone listens.
func (o *observer) recorded(a *Actor, types []messages.RecordType, ms []proto.Message) {
	debug := a.log.Enabled(context.Background(), slog.LevelDebug)
	if o.sink == nil && !debug {
		return
	}
	app := a.core.Shard().App
	for i, t := range types {
		if o.sink == nil && t != messages.RecordType_RUN_FINISHED {
			continue // only the debug line is wanted
		}
		switch t {
		case messages.RecordType_RUN_DISPATCHED:
			if st, ok := ms[i].(*messages.RunState); ok {
				o.wait(st.RunId, st.JobId)
			}
		case messages.RecordType_RETRY_SCHEDULED:
			if st, ok := ms[i].(*messages.RunState); ok {
				o.done(st.RunId)
				o.sink.RetryScheduled(app, st.Level)
			}
		case messages.RecordType_RUN_FINISHED:
			rec, ok := ms[i].(*messages.RunRecord)
			if !ok {
				continue
			}
			if o.sink != nil {
				o.done(rec.RunId)
				o.sink.Finished(app, rec)
			}
			if debug {
				a.log.Debug("run recorded", "shard", a.core.Shard().String(), "run", rec.RunId, "attempt", rec.Attempt,
					"outcome", rec.Outcome.String(), "worker", rec.WorkerId, "traceparent", rec.TraceId)
			}
		case messages.RecordType_DEAD_LETTERED:
			if d, ok := ms[i].(*messages.DeadLetter); ok {
				o.done(d.RunId)
				o.sink.DeadLettered(app)
			}
		case messages.RecordType_JOB_DELETED:
			if ref, ok := ms[i].(*messages.JobRef); ok && o.byJob[ref.Id] > 0 {
				for run, job := range o.waiting { // the core drops a deleted job's runs
					if job == ref.Id {
						o.done(run)
					}
				}
			}
		}
	}
}

func (o *observer) wait(run string, job int64) {
	if o.waiting == nil {
		return
	}
	if _, ok := o.waiting[run]; !ok {
		o.waiting[run] = job
		o.byJob[job]++
	}
}

func (o *observer) done(run string) {
	job, ok := o.waiting[run]
	if !ok {
		return
	}
	delete(o.waiting, run)
	if o.byJob[job]--; o.byJob[job] <= 0 {
		delete(o.byJob, job)
	}
}

// sent sees every message as the shell sends it: a Dispatch leaves the backlog.
func (o *observer) sent(a *Actor, to *messages.Ref, m proto.Message) {
	d, ok := m.(*messages.Dispatch)
	if !ok {
		return
	}
	now := time.Now().UnixMilli()
	if o.sink != nil && (d.RunId != o.lastRun || d.Attempt != o.lastAttempt) {
		o.lastRun, o.lastAttempt = d.RunId, d.Attempt
		o.done(d.RunId)
		o.sink.Dispatched(a.core.Shard().App, d, now)
	}
	if a.log.Enabled(context.Background(), slog.LevelDebug) {
		a.log.Debug("dispatch", "shard", d.Shard, "run", d.RunId, "attempt", d.Attempt, "handler", d.Handler,
			"to", to.GetAddress()+"/"+to.GetId(), "late_ms", now-d.DueMs, "traceparent", d.Traceparent)
	}
}
