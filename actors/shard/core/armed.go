package core

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// Armed fires.
//
// A fire's dispatch may leave only once its RUN_DISPATCHED is durable (at-least-once:
// a crash must not forget a run a worker may be running), and only at its due (never
// early). Done at the due, the msync sits on the fire's path: at 20,000 fires a second
// on 2 cores it was most of the p99 lateness (the wait for the sync that runs, then
// the fire's own). With Config.ArmMs the wheel fires a job up to ArmMs before its due:
// the run is journaled then, with DispatchedMs = its due, and its Dispatch waits,
// durable, until the due (release holds it in armedOut, heldDispatches; NextWake
// wakes the shard for it). Recovery and a handoff's import send a run that is still armed at its due the
// same way, since every Dispatch is held until its DueMs.
//
// Between the arming and the due a command may come that changes the job: a delete
// must not be acknowledged and then followed by the fire, nor an update's new
// parameters be missed by a fire after it was acknowledged. Such a command is parked
// until the job has no armed run left (its dispatch may wait in the outbox, or not
// exist yet when no worker can take it: armedDue), then handled: the fire comes
// first, as if the command had arrived just after the due — except that a due which
// fired is not fired again: an update of a one-shot whose time (or delay, counted
// from when the update came) is not after that due does not fire it a second time,
// and a periodic job moves on past that due (firstDue). The price is that a change
// reaching the shard less than ArmMs before a due no longer stops that fire, and its
// new definition applies from the next run. A shard that stops (handoff, split,
// journal failure) answers the parked commands at once with its refusal. While a
// command for a job is parked, the job is not armed ahead again (rearmHeld): its
// next fire goes at its due, so the command waits for the runs armed before it
// came, never for ever (a job whose period is not longer than ArmMs always had
// one armed ahead). If the clock steps back, a command for a job that fired ahead of
// the new now waits until the clock is past that due again, or the run has gone
// another way (its result, a move).

// DefaultArmMs is the ArmMs a node gives its shards.
const DefaultArmMs = 5

// DefaultLazySyncMs is the LazySyncMs a node gives its shards.
const DefaultLazySyncMs = 2

type parkedCmd struct {
	from *messages.Ref
	m    proto.Message
	atMs int64 // when it came (a one-shot's new delay counts from then)
}

// armed says o is a dispatch whose due is still ahead (the FireEarlyMs mutation
// sends it at once: the simulator must see an early dispatch). A frozen shard's
// armed dispatches never go: the shard's new owner has the run (the handoff's
// snapshot holds it) and sends it at its due; sent from here too they would be a
// stale owner's dispatch (simulator, stale-owner).
//
// Ahead is judged on the latest time the shard was given (seenMs): a dispatch that
// was due is not held again when the clock steps back — a command handled since
// (a delete) would have its reply overtake it.
func (c *Core) armed(o outMsg) bool {
	d, ok := o.m.(*messages.Dispatch)
	return ok && (d.DueMs > c.seenMs || c.frozen != nil) && c.cfg.Mutations.FireEarlyMs == 0
}

// nextArmed is the earliest due of an armed dispatch (durable or not), or of an
// armed run a parked command waits for (one with no dispatch yet: no worker, or
// none with credit).
func (c *Core) nextArmed() (int64, bool) {
	var at int64
	ok := false
	if c.frozen != nil || c.failed != nil {
		return 0, false // they never go (armed)
	}
	if len(c.armedOut.q) > 0 {
		at, ok = c.armedOut.q[0].due, true
	}
	if d, okO := c.obArmed.get(c); okO && (!ok || d < at) { // not durable yet: this step's and the last few's
		at, ok = d, true
	}
	for _, p := range c.parked {
		id := changesJob(p.m)
		d, armed := c.armedDue(id)
		if !armed {
			if c.outboxArmed(id) {
				continue // its dispatch's due is counted above
			}
			d = c.now // its run has gone another way (a result): handle it now
		}
		if !ok || d < at {
			at, ok = d, true
		}
	}
	return at, ok
}

// HasArmed says a run is armed and waits for its due: fired and journaled ahead,
// its dispatch held, or one a parked command waits for. The due wheel runs empty
// ArmMs before the last due of a burst while such runs still wait to go; a shell
// that judged the shard idle by the wheel alone (a snapshot's cadence) would stall
// them.
func (c *Core) HasArmed() bool {
	_, ok := c.nextArmed()
	return ok
}

// hasParked says a command for job id is parked.
func (c *Core) hasParked(id int64) bool {
	for _, p := range c.parked {
		if changesJob(p.m) == id {
			return true
		}
	}
	return false
}

// rearmHeld puts back in the due wheel the jobs Tick did not arm ahead because a
// command for them was parked (Core.armHeld), once none is (or their due has
// come). A job changed since (a new due: in the wheel again; paused, deleted) is
// dropped from the list.
//
// Why: a command waits for its job's armed runs to go, and a job whose period is
// no longer than ArmMs always has one armed ahead of the clock — a command for it
// would wait for ever. So while one waits, the job is fired at its due only.
func (c *Core) rearmHeld() {
	if len(c.armHeld) == 0 {
		return
	}
	kept := c.armHeld[:0]
	for _, id := range c.armHeld {
		j := c.jobs[id]
		if j == nil || j.handle != 0 || j.j.State != messages.JobState_ACTIVE || j.j.NextDueMs == 0 {
			continue
		}
		if j.j.NextDueMs > c.now && c.hasParked(id) {
			kept = append(kept, id)
			continue
		}
		c.setDue(j, j.j.NextDueMs)
	}
	clear(c.armHeld[len(kept):])
	c.armHeld = kept
}

// armedDue is the due of job id's armed run, if it has one: the job fired ahead of
// a due still to come (its LastDueMs), and that run is still there — it cannot have
// gone before its due, with a dispatch waiting (in the outbox, or held) or none yet
// (no worker, or none with credit). A job with a run is a full job (c.jobs).
func (c *Core) armedDue(id int64) (int64, bool) {
	if c.runsOf[id] == 0 || c.cfg.Mutations.FireEarlyMs != 0 {
		return 0, false
	}
	if j := c.jobs[id]; j != nil && j.j.LastDueMs > c.seenMs {
		return j.j.LastDueMs, true
	}
	return 0, false
}

// outboxArmedMin is the earliest due among the outbox's armed dispatches, so that
// NextWake, asked after every message, need not scan the outbox each time: with
// lazy syncs at 20,000 fires a second it holds a hundred or more dispatches and
// acknowledgements, and the scans were about a tenth of the shard's CPU.
//
// The cached value holds while the outbox only grows (send folds each dispatch
// in) and the clock has not passed it: a dispatch stops being armed once seenMs
// reaches its due, and seenMs only grows, so the armed set only loses members
// whose dues are at most seenMs, all before the cached one. release, which takes
// dispatches out, drops it, and the next get scans again. (A frozen shard counts
// every dispatch armed, so sent may fold in a due the clock has passed; get then
// finds the cached due at or before seenMs and scans.)
type outboxArmedMin struct {
	at        int64
	ok, valid bool
}

// sent folds o, just appended to the outbox, into the cached minimum.
func (m *outboxArmedMin) sent(c *Core, o outMsg) {
	d, isD := o.m.(*messages.Dispatch)
	switch {
	case !isD || !m.valid:
	case c.armed(o) && (!m.ok || d.DueMs < m.at):
		m.at, m.ok = d.DueMs, true
	}
}

// get is the earliest due of an armed dispatch in the outbox (false: none), for a
// shard that is not frozen (nextArmed asks nothing of a frozen one).
func (m *outboxArmedMin) get(c *Core) (int64, bool) {
	if !m.valid || (m.ok && m.at <= c.seenMs) {
		m.at, m.ok = c.scanOutboxArmed()
		m.valid = true
	} else if checkArmedMin || c.cfg.CheckCaches {
		if at, ok := c.scanOutboxArmed(); ok != m.ok || (ok && at != m.at) {
			panic(fmt.Sprintf("shard %s: the outbox's earliest armed due is cached as %d (%v), a scan finds %d (%v)",
				c.cfg.Shard, m.at, m.ok, at, ok))
		}
	}
	return m.at, m.ok
}

// scanOutboxArmed is the earliest due of an armed dispatch in the outbox, counted.
func (c *Core) scanOutboxArmed() (at int64, ok bool) {
	for _, o := range c.outbox {
		if c.armed(o) {
			if d := o.m.(*messages.Dispatch).DueMs; !ok || d < at {
				at, ok = d, true
			}
		}
	}
	return at, ok
}

// checkArmedMin: the package's tests (which set it) check every cached minimum
// against a scan of the outbox, as Config.CheckCaches does for the simulator.
var checkArmedMin = false

// jobArmed says job id has an armed run that has not gone: a dispatch held for its
// due (a fire's, or a run handed over or recovered with a due still ahead on this
// clock), or a run armed with no dispatch yet.
func (c *Core) jobArmed(id int64) bool {
	if _, ok := c.armedDue(id); ok {
		return true
	}
	return c.outboxArmed(id)
}

// outboxArmed says an armed dispatch of job id waits in the outbox or among the
// held ones.
func (c *Core) outboxArmed(id int64) bool {
	for _, o := range c.outbox {
		if c.armed(o) && o.m.(*messages.Dispatch).JobId == id {
			return true
		}
	}
	for _, h := range c.armedOut.q {
		if c.armed(h.o) && h.o.m.(*messages.Dispatch).JobId == id {
			return true
		}
	}
	return false
}

// heldDispatches are the dispatches armed ahead of their due whose records are
// durable: a min-heap by due, ties in the order they came, from which release
// sends each once its due has come. They used to stay in the outbox, which every
// step then copied and scanned whole: with fires armed 50 ms ahead at 20,000 a
// second, about a thousand of them, and the shard's lateness doubled.
type heldDispatches struct {
	q   []heldDispatch
	seq uint64
}

type heldDispatch struct {
	due int64
	seq uint64
	o   outMsg
}

func (h *heldDispatches) less(i, j int) bool {
	a, b := &h.q[i], &h.q[j]
	return a.due < b.due || a.due == b.due && a.seq < b.seq
}

func (h *heldDispatches) push(o outMsg) {
	h.seq++
	h.q = append(h.q, heldDispatch{due: o.m.(*messages.Dispatch).DueMs, seq: h.seq, o: o})
	for i := len(h.q) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.q[i], h.q[p] = h.q[p], h.q[i]
		i = p
	}
}

func (h *heldDispatches) pop() outMsg {
	o := h.q[0].o
	n := len(h.q) - 1
	h.q[0] = h.q[n]
	h.q[n] = heldDispatch{}
	h.q = h.q[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(l, m) {
			m = l
		}
		if r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h.q[i], h.q[m] = h.q[m], h.q[i]
		i = m
	}
	if n == 0 && cap(h.q) > 4096 {
		h.q = nil // a burst's worth goes back
	}
	return o
}

// changesJob is the job a command would change (0: none, or not one job).
func changesJob(m proto.Message) int64 {
	switch x := m.(type) {
	case *messages.UpdateJob:
		return x.GetJob().GetId()
	case *messages.DeleteJob:
		return x.Id
	case *messages.PauseJob:
		return x.Id
	case *messages.ResumeJob:
		return x.Id
	case *messages.TriggerJob:
		return x.Id
	}
	return 0
}

// park holds m if the job it changes has an armed run, or a command before it
// waits for that job already (they are handled in the order they came).
func (c *Core) park(from *messages.Ref, m proto.Message) bool {
	id := changesJob(m)
	if id == 0 {
		return false
	}
	if c.hasParked(id) {
		c.parked = append(c.parked, parkedCmd{from, m, c.now})
		return true
	}
	if !c.jobArmed(id) {
		return false
	}
	c.parked = append(c.parked, parkedCmd{from, m, c.now})
	return true
}

// unpark handles the parked commands whose job has no armed run any more, in the
// order they came; a job's later commands wait behind one that still waits.
func (c *Core) unpark(env Env) {
	if len(c.parked) == 0 {
		return
	}
	ps := c.parked
	c.parked = nil
	stopped := c.frozen != nil || c.failed != nil // Handle refuses every command now
	var waiting map[int64]bool
	for _, p := range ps {
		id := changesJob(p.m)
		if !stopped && (waiting[id] || c.jobArmed(id)) {
			if waiting == nil {
				waiting = map[int64]bool{}
			}
			waiting[id] = true
			c.parked = append(c.parked, p)
			continue
		}
		c.unparking, c.parkedAt = !stopped, p.atMs
		c.Handle(c.now, p.from, p.m, env)
		c.unparking = false
	}
}
