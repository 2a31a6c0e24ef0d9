package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// The invariants, by the name a failure carries:
//
//	acked-job-lost       an acknowledged create (or update) is missing from the shard's
//	                     owner, after recovery or at any checkpoint, or a client's call
//	                     says NOT_FOUND for it
//	resurrected          a job whose delete was acknowledged exists again
//	                     (resurrected-by-late-create: a late create made it again)
//	fire-after-delete    a run of a job is journaled or dispatched after its delete was
//	                     acknowledged
//	fixed-delay-spacing  a fixed-delay job's next due is not every_ms after its run
//	                     finished, on the owner's clock
//	early-fire           a run is sent to a worker before its due time on the owner's
//	                     clock (the latest time that clock ever showed), or a scheduled
//	                     run is journaled as dispatched more than Config.ArmMs before it
//	due-fired-twice      a scheduled fire's run id is taken by a run in flight (its due
//	                     fired before, or a trigger in the same ms): runID moves the
//	                     fire's due and id, possibly ahead of the clock
//	late-fire            once settled, a run is dispatched more than LateBoundMs late
//	due-run-missed       once settled, a due the shard itself promised (a job's next due)
//	                     is never dispatched; a once job's due is never dispatched (one
//	                     that fired and waits for room at a full worker is not missed)
//	duplicate-execution  a live worker (one process) runs the same run attempt twice
//	ladder, ladder-*     a retry is not at the ladder's level and delay, comes early or
//	                     (undisturbed) not exactly on time, exceeds the attempts, or the
//	                     dead letter comes before the last attempt; dead-letter-twice
//	duplicate-placement  the NameServer assigns a shard that another server holds (or
//	                     will recover) at the same or a higher epoch
//	two-owners           two active owners of one shard at one epoch (stale-owner-active:
//	                     at different epochs); stale-owner: a lower epoch dispatches
//	                     while a higher one is active; epoch-fencing: a shard records a
//	                     result carrying another epoch; overlapping-owners: two
//	                     active shards of one app whose hash ranges overlap (a
//	                     split's parent and a half)
//	update-applied-twice one update call (its retries, duplicates) changes a job twice
//	journal-mismatch     the live state of a quiescent shard differs from what replaying
//	                     its journal rebuilds (a transition that was not journaled)
//	snapshot-load        a shard's snapshot, or an imported shard, loaded into a fresh
//	                     core and encoded again, is not the bytes it was taken as
//	                     (Config.Snapshots)
//	periodic-stalled     once settled, an active periodic job has no next due and no
//	                     run whose finish would set it: it never fires again
//	timer-stuck, fire-stuck, slow-op, liveness-*, no-progress
//	                     once faults stop, progress resumes within the bounds
//	balance              (Config.CheckBalance) once settled, a move the NameServer's
//	                     strategy wants stays undone for BalanceBoundMs
type checker struct {
	s       *Sim
	jobs    map[int64]*jobModel
	execs   map[string]int
	retries map[string]retryExp
	// expect is the coverage list once settled: job → the due its shard promised
	// next (-1: a fixed-delay job whose next due is set when its run finishes).
	expect   map[int64]int64
	settleAt int64
	// the balance check's state (balanceTick)
	balNS    *nsHost
	balMoves int64
	balWant  int64 // since when the strategy has wanted a move (0: it wants none)
	acked    int64 // calls acknowledged after settling
	// calls maps a client's reply address to its call, so a shard's input can be
	// tied to the call it belongs to (every attempt has its own address).
	calls map[string]*op
	// began is when (sim time) each shard's last handoff or split began.
	began map[string]int64
}

type jobModel struct {
	id           int64
	app          string
	client       string
	acked        bool // a create was acknowledged
	maybeCreated bool // a create gave up: it may or may not exist
	deleted      bool // a delete was acknowledged
	deletedAt    int64
	maybeDeleted bool // a delete gave up after reaching the network
	deleting     bool // a delete call is in flight
	reapplied    bool // an update was applied twice (known bug): its runs may repeat
	version      int64
	ops          int // calls other than get after the create
	onceDue      int64
	createdMs    int64            // on the shard's clock
	dues         map[int64]bool   // dues dispatched (attempt 1)
	fired        map[int64]string // due → the run id of its fire (journaled, attempt 1)
}

type retryExp struct {
	attempt int32
	due     int64
	host    *shardHost
	inc     int
	jumps   int64
	behind  bool // the clock was behind its maximum when the retry was scheduled
}

func newChecker(s *Sim) *checker {
	return &checker{s: s, jobs: map[int64]*jobModel{}, execs: map[string]int{}, retries: map[string]retryExp{},
		expect: map[int64]int64{}, calls: map[string]*op{}, began: map[string]int64{}}
}

func (k *checker) failf(inv, format string, args ...any) { k.s.failf(inv, format, args...) }

func active(h *shardHost) bool { return !h.gone && !h.core.Frozen() && h.core.Failed() == nil }

// ---------------------------------------------------------------- journal observations

// appended sees every record a shard core journals, as it is appended.
func (k *checker) appended(h *shardHost, r persistence.Record) {
	if h.shadow != nil {
		if err := h.shadow.Replay(r); err != nil {
			k.failf("journal-mismatch", "%s on %s: replaying its own record lsn %d fails: %v", h.name, h.srv.addr, r.LSN, err)
		}
	}
	m, err := decodePayload(r.Type, r.Payload)
	if err != nil {
		k.failf("journal-record", "%s on %s: lsn %d: %v", h.name, h.srv.addr, r.LSN, err)
		return
	}
	now := h.srv.now()
	h.srv.s.tracef("%s@%s: journal lsn %d %s", h.name, h.srv.addr, r.LSN, recordBrief(messages.RecordType(r.Type), m))
	switch x := m.(type) {
	case *messages.Job:
		h.puts = append(h.puts, x.Id)
		h.next[x.Id] = x.NextDueMs
		if jm, ok := k.deletedBefore(x.Id); ok && x.Version == 1 {
			k.failf("resurrected-by-late-create", "%s on %s created job %d again (a CreateJob that arrived late), after its delete was acknowledged at t=%d",
				h.name, h.srv.addr, x.Id, jm.deletedAt-startMs)
		}
		h.view[x.Id] = x
		if _, ok := k.expect[x.Id]; ok || k.s.settled {
			if x.State == messages.JobState_ACTIVE && x.NextDueMs > 0 {
				k.expect[x.Id] = x.NextDueMs
			} else {
				delete(k.expect, x.Id)
			}
		}
	case *messages.JobRef:
		if messages.RecordType(r.Type) == messages.RecordType_JOB_DELETED {
			delete(h.view, x.Id)
			delete(k.expect, x.Id)
		}
	case *messages.RunState:
		if messages.RecordType(r.Type) == messages.RecordType_RUN_DISPATCHED {
			if j := h.view[x.JobId]; j != nil && x.Fire {
				j.LastDueMs = max(j.LastDueMs, x.DueMs) // as the core's apply moves it
			}
			k.dispatched(h, x, now)
		} else {
			k.retryScheduled(h, x, now)
		}
	case *messages.RunRecord:
		h.finished = append(h.finished, x.RunId)
		if x.SetsNext {
			h.next[x.JobId] = x.JobNextDueMs
		}
		if sc := h.view[x.JobId].GetSchedule(); x.SetsNext && x.JobNextDueMs > 0 && sc != nil {
			want := max(now+sc.EveryMs, sc.NotBeforeMs)
			// Never a due that fired already (the run's own, or the job's last): a
			// clock behind it — stepped back, or this server's behind the one that
			// fired it before a handoff (seed 1380661) — counts from that due.
			if fired := max(x.DueMs, h.view[x.JobId].GetLastDueMs()); want <= fired {
				want = max(fired+sc.EveryMs, sc.NotBeforeMs)
			}
			if x.JobNextDueMs != want {
				k.failf("fixed-delay-spacing", "%s on %s: fixed-delay job %d (every %d ms) finished run %s at %d by its clock, but its next due is %d, not %d",
					h.name, h.srv.addr, x.JobId, sc.EveryMs, x.RunId, now, x.JobNextDueMs, want)
			}
		}
		if _, ok := k.expect[x.JobId]; ok && x.SetsNext {
			if x.JobNextDueMs > 0 {
				k.expect[x.JobId] = x.JobNextDueMs
			} else {
				delete(k.expect, x.JobId)
			}
		}
	case *messages.DeadLetter:
		k.deadLettered(h, x)
	}
}

func (k *checker) deletedBefore(jobID int64) (*jobModel, bool) {
	jm := k.jobs[jobID]
	return jm, jm != nil && jm.deleted && jm.deletedAt <= k.s.now
}

func (k *checker) dispatched(h *shardHost, st *messages.RunState, now int64) {
	if jm, ok := k.deletedBefore(st.JobId); ok {
		k.failf("fire-after-delete", "%s on %s journaled run %s (attempt %d) of job %d, whose delete was acknowledged at t=%d",
			h.name, h.srv.addr, st.RunId, st.Attempt, st.JobId, jm.deletedAt-startMs)
	}
	if st.Fire {
		k.s.stats.Fires++
		if other, due := k.collided(h, st); other != "" {
			k.failf("due-fired-twice", "%s on %s fired job %d's due %d while run %s, which holds that due's run id, is in flight; "+
				"runID moved the fire's due (and id) to %d (its clock reads %d)", h.name, h.srv.addr, st.JobId, due, other, st.DueMs, now)
			return
		}
		h.next[st.JobId] = st.JobNextDueMs
		if jm := k.jobs[st.JobId]; jm != nil && st.Attempt == 1 {
			if jm.fired == nil {
				jm.fired = map[int64]string{}
			}
			jm.fired[st.DueMs] = st.RunId
		}
		if seen := h.srv.clock.maxSeen; seen < st.DueMs-k.s.cfg.ArmMs {
			k.failf("early-fire", "%s on %s dispatched %s due at %d when its clock read %d (%d ms early)",
				h.name, h.srv.addr, st.RunId, st.DueMs, seen, st.DueMs-seen)
		}
		if k.s.settled {
			base := st.DueMs
			if j := h.view[st.JobId]; j != nil {
				base = max(base, j.UpdatedMs)
			}
			base = max(base, h.activeSince)
			late := now - base
			k.s.stats.MaxLateMs = max(k.s.stats.MaxLateMs, late)
			if late > LateBoundMs {
				k.failf("late-fire", "%s on %s dispatched %s %d ms late, after faults stopped (bound %d ms)",
					h.name, h.srv.addr, st.RunId, late, LateBoundMs)
			}
		}
		if e, ok := k.expect[st.JobId]; ok && e == st.DueMs {
			switch {
			case h.view[st.JobId].GetSchedule().GetKind() == messages.ScheduleKind_FIXED_DELAY:
				k.expect[st.JobId] = -1
			case st.JobNextDueMs > 0:
				k.expect[st.JobId] = st.JobNextDueMs
			default:
				delete(k.expect, st.JobId)
			}
		}
	}
	if st.Attempt > 1 && !st.Fire {
		if exp, ok := k.retries[st.RunId]; ok && exp.attempt == st.Attempt {
			delete(k.retries, st.RunId)
			v := h.srv
			switch {
			case v.clock.maxSeen < exp.due:
				k.failf("ladder-early", "%s on %s dispatched attempt %d of %s at %d; the ladder put it at %d",
					h.name, v.addr, st.Attempt, st.RunId, now, exp.due)
			case exp.host == h && exp.inc == v.inc && exp.jumps == v.clock.jumps && !exp.behind:
				k.s.stats.RetriesExact++
				if now != exp.due {
					k.failf("ladder-delay", "%s on %s dispatched attempt %d of %s at %d; the ladder put it at %d (%+d ms, nothing disturbed it)",
						h.name, v.addr, st.Attempt, st.RunId, now, exp.due, now-exp.due)
				}
			}
		}
	}
}

// collided reports a fire whose run id collided with a run still in flight: the
// due the shard promised (the job's next due as journaled) is below the fire's due
// by the few milliseconds runID moves a colliding run, and that due's run is live.
func (k *checker) collided(h *shardHost, st *messages.RunState) (string, int64) {
	due, ok := h.next[st.JobId]
	if !ok {
		due = h.view[st.JobId].GetNextDueMs()
	}
	if due <= 0 || st.DueMs <= due || st.DueMs-due > 8 {
		return "", 0
	}
	id := fmt.Sprintf("%d:%d", st.JobId, due)
	for _, r := range state(h).Runs {
		if r.RunId == id {
			return id, due
		}
	}
	return "", 0
}

// policy is the retry policy a core applies to jobID (its defaults if none).
func policy(h *shardHost, jobID int64) (attempts int32, ladder []int64) {
	p := h.view[jobID].GetPolicy()
	attempts, ladder = simAttempts, simLadderMs
	if p.GetAttempts() > 0 {
		attempts = p.GetAttempts()
	}
	if len(p.GetLadderMs()) > 0 {
		ladder = p.GetLadderMs()
	}
	return attempts, ladder
}

func (k *checker) retryScheduled(h *shardHost, st *messages.RunState, now int64) {
	attempts, ladder := policy(h, st.JobId)
	failed := st.Attempt - 1
	level := min(int(failed)-1, len(ladder)-1)
	if level < 0 || int(st.Level) != level || st.DeadlineMs != now+ladder[level] {
		k.failf("ladder", "%s on %s: after attempt %d of %s failed, the retry is at level %d due %d; the ladder %v says level %d due %d",
			h.name, h.srv.addr, failed, st.RunId, st.Level, st.DeadlineMs, ladder, level, now+ladder[max(level, 0)])
		return
	}
	if st.Attempt > attempts {
		k.failf("ladder-attempts", "%s on %s scheduled attempt %d of %s; the job allows %d attempts", h.name, h.srv.addr, st.Attempt, st.RunId, attempts)
	}
	k.s.stats.Retries++
	// A clock that jumped back is behind the core's wheel, which fires nothing before
	// the latest time it was advanced to: the retry is then late, legitimately.
	behind := h.srv.clock.maxSeen > now
	k.retries[st.RunId] = retryExp{attempt: st.Attempt, due: st.DeadlineMs, host: h, inc: h.srv.inc, jumps: h.srv.clock.jumps, behind: behind}
}

func (k *checker) deadLettered(h *shardHost, d *messages.DeadLetter) {
	attempts, _ := policy(h, d.JobId)
	if d.Attempts < attempts {
		k.failf("ladder-dead-letter", "%s on %s dead-lettered %s after %d attempts; the job allows %d", h.name, h.srv.addr, d.RunId, d.Attempts, attempts)
	}
	k.s.stats.DeadLetters++
}

// ---------------------------------------------------------------- messages

// shardSent sees every message a shard core sends.
func (k *checker) shardSent(h *shardHost, to *messages.Ref, m proto.Message) {
	d, ok := m.(*messages.Dispatch)
	if !ok {
		return
	}
	if jm, ok := k.deletedBefore(d.JobId); ok {
		k.failf("fire-after-delete", "%s on %s dispatched %s attempt %d of job %d, whose delete was acknowledged at t=%d",
			h.name, h.srv.addr, d.RunId, d.Attempt, d.JobId, jm.deletedAt-startMs)
	}
	if seen := h.srv.clock.maxSeen; seen < d.DueMs {
		k.failf("early-fire", "%s on %s sent %s (attempt %d) due at %d when its clock read %d (%d ms early)",
			h.name, h.srv.addr, d.RunId, d.Attempt, d.DueMs, seen, d.DueMs-seen)
	}
	for _, v := range k.s.servers {
		if !v.up {
			continue
		}
		for _, n := range v.hostNames() {
			if o := v.shards[n]; o != h && active(o) && overlaps(o.core.Shard(), h.core.Shard()) && o.core.Epoch() > h.core.Epoch() {
				k.failf("stale-owner", "%s@%d on %s dispatched %s while %s holds %s at epoch %d",
					h.name, h.core.Epoch(), h.srv.addr, d.RunId, v.addr, n, o.core.Epoch())
			}
		}
	}
	if jm := k.jobs[d.JobId]; jm != nil && d.Attempt == 1 {
		if jm.dues == nil {
			jm.dues = map[int64]bool{}
		}
		jm.dues[d.DueMs] = true
	}
}

// executed sees every handler execution at a worker.
func (k *checker) executed(w *worker, d *messages.Dispatch) {
	k.s.stats.Executions++
	key := w.id + "|" + d.RunId + "|" + strconv.Itoa(int(d.Attempt))
	k.execs[key]++
	if n := k.execs[key]; n > 1 {
		k.failf("duplicate-execution", "worker %s (alive since its start) executed %s attempt %d %d times", w.id, d.RunId, d.Attempt, n)
	}
}

// ---------------------------------------------------------------- client calls

func (k *checker) opStart(c *client, o *op) {
	jm := k.jobs[o.id]
	if o.kind == opCreate {
		if jm != nil {
			k.failf("id-reused", "client %s generated job id %d, which %s generated before", c.holder, o.id, jm.client)
			return
		}
		k.jobs[o.id] = &jobModel{id: o.id, app: o.app, client: c.holder}
		return
	}
	if o.kind != opGet {
		jm.ops++
		delete(k.expect, o.id)
	}
	if o.kind == opDelete {
		jm.deleting = true
	}
}

// sentAttempt records the reply address of one attempt of a call.
func (k *checker) sentAttempt(o *op, reply *messages.Ref) {
	k.calls[reply.Address+"/"+reply.Id] = o
}

// updateApplied runs when a shard applied an UpdateJob, making the job's version
// version: one update call (all its attempts, and any duplicate of them) must
// change the job once. Applying it again to the same version is not a second
// change: the first application was lost (a crash before its record was durable,
// so it was never acknowledged) and this is the one that counts.
func (k *checker) updateApplied(from *messages.Ref, id, version int64) {
	o := k.calls[from.GetAddress()+"/"+from.GetId()]
	if o == nil {
		return
	}
	if o.applied > 0 && version == o.appliedVersion {
		return
	}
	o.applied++
	o.appliedVersion = version
	if o.applied > 1 {
		k.s.notef("update-applied-twice", "one update call of job %d was applied %d times (attempt %d re-applied it): the version moved twice and a once job fires again",
			id, o.applied, o.tries)
		if jm := k.jobs[id]; jm != nil {
			jm.reapplied = true
		}
	}
}

func (k *checker) opDone(c *client, o *op, rep *messages.JobReply) {
	jm := k.jobs[o.id]
	if o.kind == opDelete {
		jm.deleting = false
	}
	e := rep.Error
	code := e.GetCode()
	if k.s.settled && o.startMs >= k.settleAt && k.s.now-o.startMs > OpBoundMs {
		k.failf("slow-op", "%s %d took %d ms after the cluster settled (bound %d ms)", o.kind, o.id, k.s.now-o.startMs, OpBoundMs)
	}
	if e == nil {
		k.s.stats.OpsAcked++
		if k.s.settled {
			k.acked++
		}
	}
	if code == messages.Code_RESOURCE_EXHAUSTED && e.GetField() == "journal" && k.s.cfg.DiskFull {
		k.refusedOnFullDisk(o, jm, e)
		return
	}
	if code == messages.Code_INVALID_ARGUMENT {
		k.failf("workload", "the workload sent an invalid %s for job %d: %s (field %s)", o.kind, o.id, e.GetMessage(), e.GetField())
		return
	}
	if e == nil && jm.deleted && o.kind != opCreate {
		k.failf("resurrected", "%s of job %d succeeded (%s) after its delete was acknowledged at t=%d", o.kind, o.id, brief(rep), jm.deletedAt-startMs)
		return
	}
	switch o.kind {
	case opCreate:
		if e != nil {
			k.failf("create-refused", "create of new job %d was refused: %s %s", o.id, code, e.GetMessage())
			return
		}
		jm.acked = true
		jm.version = rep.Job.GetVersion()
		jm.createdMs = rep.Job.GetCreatedMs()
		c.jobs = append(c.jobs, o.id)
		k.s.stats.Creates++
		if j := rep.Job; j.GetSchedule().GetKind() == messages.ScheduleKind_ONCE && j.GetState() == messages.JobState_ACTIVE {
			jm.onceDue = j.GetNextDueMs()
		}
	case opDelete:
		switch {
		case e == nil:
			k.markDeleted(c, jm)
		case code == messages.Code_NOT_FOUND:
			// An earlier attempt, or a duplicate of this request, deleted it: the
			// network may answer a call twice and the first answer wins. A job
			// that was really lost is caught by the state checks.
			k.markDeleted(c, jm)
		default:
			k.failf("call-refused", "delete of job %d refused: %s %s", o.id, code, e.GetMessage())
		}
	default:
		switch {
		case e == nil:
			v := rep.Job.GetVersion()
			if v < jm.version || (o.kind == opUpdate && v == jm.version) {
				k.failf("version-regressed", "%s of job %d answered version %d; version %d was acknowledged before", o.kind, o.id, v, jm.version)
			}
			jm.version = max(jm.version, v)
		case code == messages.Code_NOT_FOUND:
			if !jm.deleted && !jm.maybeDeleted {
				k.notFound(jm, o, e)
			}
		default:
			k.failf("call-refused", "%s of job %d refused: %s %s", o.kind, o.id, code, e.GetMessage())
		}
	}
}

// refusedOnFullDisk takes a shard's refusal of new work on a full disk
// (shardcore.Roomy): a create, an update or a trigger may be refused, nothing else.
// This copy of the call changed nothing, but an earlier copy still in the network
// may yet be applied: a refused create may exist after all.
func (k *checker) refusedOnFullDisk(o *op, jm *jobModel, e *messages.Error) {
	k.s.stats.NoRoomRefusals++
	switch o.kind {
	case opCreate:
		jm.maybeCreated = true
	case opUpdate, opTrigger:
	default:
		k.failf("call-refused", "%s of job %d refused on a full disk, where only new work is: %s", o.kind, o.id, e.GetMessage())
	}
}

func (k *checker) markDeleted(c *client, jm *jobModel) {
	if h := k.holder(jm.app, jm.id); h != nil && !jm.deleted && !k.superseded(h) {
		if j := h.view[jm.id]; j != nil && j.Version == 1 {
			k.failf("resurrected-by-late-create", "%s on %s holds job %d again (a CreateJob that arrived late) when its delete is acknowledged",
				h.name, h.srv.addr, jm.id)
		}
	}
	if !jm.deleted {
		jm.deleted = true
		jm.deletedAt = k.s.now
		k.s.stats.Deletes++
	}
	c.forget(jm.id)
}

func (k *checker) notFound(jm *jobModel, o *op, e *messages.Error) {
	k.failf("acked-job-lost", "job %d (create acknowledged, version %d, never deleted) is not found by %s: %s",
		jm.id, jm.version, o.kind, e.GetMessage())
}

func (k *checker) opGaveUp(c *client, o *op, why string) {
	k.s.stats.OpsGaveUp++
	k.s.tracef("%s: %s %d gave up after %d tries: %s", c.addr, o.kind, o.id, o.tries, why)
	if k.s.settled && o.startMs >= k.settleAt && why != "client crashed" {
		k.failf("liveness-op", "%s of job %d, started after the cluster settled, gave up after %d tries: %s", o.kind, o.id, o.tries, why)
	}
	jm := k.jobs[o.id]
	switch o.kind {
	case opCreate:
		jm.maybeCreated = true
	case opDelete:
		jm.deleting = false
		if o.sent {
			jm.maybeDeleted = true
		}
	}
}

// ---------------------------------------------------------------- state checks

// owners returns each shard's active owner, checking that there is only one.
func (k *checker) owners() map[string]*shardHost {
	out := map[string]*shardHost{}
	for _, v := range k.s.servers {
		if !v.up {
			continue
		}
		for _, n := range v.hostNames() {
			h := v.shards[n]
			if !active(h) {
				continue
			}
			o := out[n]
			if o == nil {
				out[n] = h
				continue
			}
			if o.core.Epoch() == h.core.Epoch() {
				k.failf("two-owners", "shard %s is active on %s and on %s, both at epoch %d", n, o.srv.addr, v.addr, h.core.Epoch())
			} else {
				k.failf("stale-owner-active", "shard %s is active on %s at epoch %d and on %s at epoch %d", n, o.srv.addr, o.core.Epoch(), v.addr, h.core.Epoch())
			}
			if h.core.Epoch() > o.core.Epoch() {
				out[n] = h
			}
		}
	}
	names := sortedKeys(out)
	for i, a := range names {
		for _, b := range names[i+1:] {
			if ha, hb := out[a], out[b]; overlaps(ha.core.Shard(), hb.core.Shard()) {
				k.failf("overlapping-owners", "%s@%d on %s and %s@%d on %s are both active: their hash ranges overlap (a split's parent and its half)",
					a, ha.core.Epoch(), ha.srv.addr, b, hb.core.Epoch(), hb.srv.addr)
			}
		}
	}
	return out
}

func (k *checker) ownersChanged() { k.owners() }

// superseded says h is a frozen copy whose handoff a later copy already carries: a
// higher epoch of the same shard, or one of its halves (the target split it since),
// on a server that is up or in a journal a down one will recover. Its jobs are what
// they were when it froze, and the owner that acknowledged a later command is that
// one. (A delete acknowledged by the target of a move, whose server then crashed,
// left holder with the frozen source, which still held the job as created: seeds
// 401959 and 458157; and 1910547, where the target had split the shard and then
// acknowledged the delete in a half.) One replay of each down server's journal.
func (k *checker) superseded(h *shardHost) bool {
	if !h.core.Frozen() {
		return false
	}
	sh, epoch := h.core.Shard(), h.core.Epoch()
	// later: c, on another server or not, holds the shard at a higher epoch or one of
	// its halves. A closed copy counts as the shard at its epoch on a server that is
	// up (its successor lives on), as nothing once recovered (it is dropped).
	later := func(c *shardcore.Core, other, up bool) bool {
		d := c.Shard()
		if d == sh {
			return other && c.Epoch() > epoch && (up || !c.Closed())
		}
		if c.Closed() || d.App != sh.App || d.Level <= sh.Level {
			return false
		}
		for d.Level > sh.Level { // one of sh's halves, at any depth
			d = d.Parent()
		}
		return d == sh
	}
	for _, v := range k.s.servers {
		other := v != h.srv
		if v.up {
			if g := v.shards[h.name]; g != nil && later(g.core, other, true) {
				return true
			}
			for _, n := range v.hostNames() {
				if g := v.shards[n]; !g.gone && later(g.core, other, true) {
					return true
				}
			}
			continue
		}
		res := replayLog(v, v.disk.clone(), k.s.now, true) // what it will recover
		for _, st := range res.order {
			if later(res.cores[st], other, false) {
				return true
			}
		}
	}
	return false
}

// holder is the live copy, frozen or not, of the shard of app that holds job id:
// the deepest shard, then the highest epoch.
func (k *checker) holder(app string, id int64) *shardHost {
	var best *shardHost
	for _, v := range k.s.servers {
		if !v.up {
			continue
		}
		for _, n := range v.hostNames() {
			h := v.shards[n]
			sh := h.core.Shard()
			if h.gone || h.core.Closed() || sh.App != app || !sh.ContainsJob(id) {
				continue
			}
			if best == nil || sh.Level > best.core.Shard().Level ||
				(sh.Level == best.core.Shard().Level && h.core.Epoch() > best.core.Epoch()) {
				best = h
			}
		}
	}
	return best
}

// assigned runs when target is told to open shard at epoch: no other server may hold
// it (live, or in a journal it will recover) at that epoch or a higher one.
func (k *checker) assigned(target *server, shard string, epoch int64) {
	for _, v := range k.s.servers {
		if v == target {
			continue
		}
		if e, ok := k.held(v, shard); ok && e >= epoch {
			state := "holds"
			if !v.up {
				state = "is down and will recover"
			}
			k.failf("duplicate-placement", "the NameServer assigned %s@%d to %s, but %s %s it at epoch %d",
				shard, epoch, target.addr, v.addr, state, e)
			return
		}
	}
}

// held is the epoch at which v holds shard now (up) or will hold it after its
// restart (down: what recovery of its disk would rebuild).
func (k *checker) held(v *server, shard string) (int64, bool) {
	if v.up {
		if h := v.shards[shard]; h != nil {
			return h.core.Epoch(), true
		}
		return 0, false
	}
	cp := v.disk.clone()
	res := replayLog(v, cp, k.s.now, true)
	for _, st := range res.order {
		if c := res.cores[st]; c.Shard().String() == shard && !c.Closed() { // a closed one is dropped at recovery
			return c.Epoch(), true
		}
	}
	return 0, false
}

func state(h *shardHost) *messages.ShardSnapshot {
	snap := &messages.ShardSnapshot{}
	if err := proto.Unmarshal(h.core.Snapshot(), snap); err != nil {
		panic(fmt.Sprintf("sim: a core's own snapshot does not decode: %v", err))
	}
	return snap
}

// checkJobs checks every acknowledged job against the active owner of its shard
// (only the owners on srv, when srv is not nil).
func (k *checker) checkJobs(srv *server) {
	owners := k.owners()
	states := map[string]map[int64]*messages.Job{}
	ids := make([]int64, 0, len(k.jobs))
	for id := range k.jobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		jm := k.jobs[id]
		if !jm.acked {
			continue
		}
		h := ownerOf(owners, jm.app, id)
		if h == nil || (srv != nil && h.srv != srv) {
			continue
		}
		name := h.name
		jobs := states[name]
		if jobs == nil {
			jobs = map[int64]*messages.Job{}
			for _, j := range state(h).Jobs {
				jobs[j.Id] = j
			}
			states[name] = jobs
		}
		j := jobs[id]
		switch {
		case jm.deleted && j != nil:
			k.failf("resurrected", "job %d is in %s@%d on %s again (version %d) after its delete was acknowledged at t=%d",
				id, name, h.core.Epoch(), h.srv.addr, j.Version, jm.deletedAt-startMs)
		case jm.deleting:
		case !jm.deleted && !jm.maybeDeleted && j == nil:
			k.failf("acked-job-lost", "job %d (create acknowledged, version %d) is missing from %s@%d on %s",
				id, jm.version, name, h.core.Epoch(), h.srv.addr)
		case !jm.deleted && !jm.maybeDeleted && j.Version < jm.version:
			k.failf("acked-job-lost", "job %d is at version %d in %s@%d on %s; version %d was acknowledged",
				id, j.Version, name, h.core.Epoch(), h.srv.addr, jm.version)
		}
	}
}

// journalCheck compares each quiescent active shard with the shadow that replays its
// records: what a restart would rebuild must be what the shard holds.
func (k *checker) journalCheck() {
	for _, v := range k.s.servers {
		if !v.up {
			continue
		}
		for _, n := range v.hostNames() {
			h := v.shards[n]
			if !active(h) || h.shadow == nil || !h.core.Quiescent() {
				continue
			}
			if d := diffStates(state(h), shadowState(h)); d != "" {
				k.failf("journal-mismatch", "%s@%d on %s holds state its journal does not: %s (a restart would lose it)",
					n, h.core.Epoch(), v.addr, d)
				return
			}
		}
	}
}

func shadowState(h *shardHost) *messages.ShardSnapshot {
	snap := &messages.ShardSnapshot{}
	_ = proto.Unmarshal(h.shadow.Snapshot(), snap)
	return snap
}

// normRun clears what a run holds only in memory: where and when it was last sent.
func normRun(st *messages.RunState) *messages.RunState {
	c := proto.Clone(st).(*messages.RunState)
	c.WorkerId, c.DispatchedMs, c.Fire = "", 0, false
	if c.Level < 0 {
		c.DeadlineMs = 0
	}
	return c
}

func jobBrief(j *messages.Job) string {
	return fmt.Sprintf("{v%d %s next=%d runs=%d last_due=%d last_finish=%d}", j.Version, j.State, j.NextDueMs, j.Runs, j.LastDueMs, j.LastFinishMs)
}

func runBrief(st *messages.RunState) string {
	return fmt.Sprintf("{attempt %d level %d deadline=%d due=%d}", st.Attempt, st.Level, st.DeadlineMs, st.DueMs)
}

// diffStates describes the first difference between a live state and a replayed one.
func diffStates(live, replayed *messages.ShardSnapshot) string {
	if a, b := live.Meta.GetEpoch(), replayed.Meta.GetEpoch(); a != b {
		return fmt.Sprintf("epoch %d, journal says %d", a, b)
	}
	rj := map[int64]*messages.Job{}
	for _, j := range replayed.Jobs {
		rj[j.Id] = j
	}
	for _, j := range live.Jobs {
		if o := rj[j.Id]; o == nil {
			return fmt.Sprintf("job %d is not in the journal", j.Id)
		} else if !proto.Equal(j, o) {
			return fmt.Sprintf("job %d is %s in memory, %s in the journal", j.Id, jobBrief(j), jobBrief(o))
		}
		delete(rj, j.Id)
	}
	for _, j := range replayed.Jobs {
		if rj[j.Id] != nil {
			return fmt.Sprintf("job %d is in the journal, not in memory", j.Id)
		}
	}
	rr := map[string]*messages.RunState{}
	for _, st := range replayed.Runs {
		rr[st.RunId] = normRun(st)
	}
	for _, st := range live.Runs {
		n := normRun(st)
		if o := rr[st.RunId]; o == nil {
			return fmt.Sprintf("run %s (attempt %d, level %d) is not in the journal", st.RunId, st.Attempt, st.Level)
		} else if !proto.Equal(n, o) {
			return fmt.Sprintf("run %s is %s in memory, %s in the journal", st.RunId, runBrief(n), runBrief(o))
		}
		delete(rr, st.RunId)
	}
	for _, id := range sortedKeys(rr) {
		return fmt.Sprintf("run %s is in the journal, not in memory", id)
	}
	if len(live.Dead) != len(replayed.Dead) {
		return fmt.Sprintf("%d dead letters in memory, %d in the journal", len(live.Dead), len(replayed.Dead))
	}
	for i := range live.Dead {
		if !proto.Equal(live.Dead[i], replayed.Dead[i]) {
			return fmt.Sprintf("dead letter %s differs from the journal's %s", live.Dead[i].RunId, replayed.Dead[i].RunId)
		}
	}
	if len(live.History) != len(replayed.History) {
		return fmt.Sprintf("%d history records in memory, %d in the journal", len(live.History), len(replayed.History))
	}
	for i := range live.History {
		if !proto.Equal(live.History[i], replayed.History[i]) {
			return fmt.Sprintf("history record of %s differs from the journal's", live.History[i].RunId)
		}
	}
	return ""
}

// recovered runs right after a server rebuilt its shards: the moment an
// acknowledged-but-not-durable write would show up missing.
func (k *checker) recovered(v *server) {
	k.checkJobs(v)
}

// checkpoint runs every few seconds.
func (k *checker) checkpoint() {
	if k.s.fail != nil {
		return
	}
	k.s.stats.ChecksRun++
	k.checkJobs(nil)
	k.journalCheck()
}

// settle starts the coverage list: every due the owners have promised.
func (k *checker) settle() {
	k.settleAt = k.s.now
	owners := k.owners()
	for _, n := range sortedKeys(owners) {
		h := owners[n]
		for _, j := range state(h).Jobs {
			if j.State == messages.JobState_ACTIVE && j.NextDueMs > 0 {
				k.expect[j.Id] = j.NextDueMs
			}
		}
	}
}

// final runs the end-of-run checks: state, liveness, dead-letter uniqueness.
func (k *checker) final() {
	k.s.tracef("final checks")
	k.checkpoint()
	if k.s.fail != nil {
		return
	}
	owners := k.owners()
	for _, id := range k.jobIDs() {
		jm := k.jobs[id]
		if jm.acked && !jm.deleted && ownerOf(owners, jm.app, id) == nil {
			k.failf("liveness-owner", "no active owner for job %d of app %s at the end (shards: %v), %d ms after faults stopped",
				id, jm.app, sortedKeys(owners), k.s.now-k.s.heal)
			return
		}
	}
	ids := make([]int64, 0, len(k.expect))
	for id := range k.expect {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		due := k.expect[id]
		h := ownerOf(owners, k.jobs[id].app, id)
		if h == nil || due <= 0 {
			continue
		}
		if j := h.view[id]; j != nil {
			due = max(due, j.UpdatedMs) // a due already past when it was set counts from then
		}
		due = max(due, h.activeSince)
		if now := h.srv.now(); due < now-LateBoundMs {
			k.failf("due-run-missed", "job %d: %s promised a run due at %d; none was dispatched by %d (%d ms later)",
				id, h.name, due, now, now-due)
			return
		}
	}
	ids = ids[:0]
	for id := range k.jobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		jm := k.jobs[id]
		h := ownerOf(owners, jm.app, id)
		if h == nil || !jm.acked || jm.deleted || jm.maybeDeleted || jm.ops > 0 || jm.onceDue == 0 || jm.dues[jm.onceDue] {
			continue
		}
		if rid := jm.fired[jm.onceDue]; rid != "" && h.core.RunHeld(rid) {
			// It fired in time (late-fire checks that) and waits for room at a busy
			// worker: backpressure, not a missed due (seed 1018134: the app's one
			// worker full with a slow handler when the run ended).
			continue
		}
		due := max(jm.onceDue, jm.createdMs)
		if now := h.srv.now(); due < now-LateBoundMs {
			k.failf("due-run-missed", "once job %d was due at %d and was never dispatched (now %d)", id, jm.onceDue, now)
			return
		}
	}
	for _, n := range sortedKeys(owners) {
		h := owners[n]
		now := h.srv.now()
		st := state(h)
		running := map[int64]bool{}
		for _, r := range st.Runs {
			running[r.JobId] = true
			if (r.Level >= 0 || r.WorkerId != "") && r.DeadlineMs < now-LateBoundMs {
				k.failf("timer-stuck", "%s on %s: run %s (attempt %d, level %d) was due at %d; it is %d", n, h.srv.addr, r.RunId, r.Attempt, r.Level, r.DeadlineMs, now)
				return
			}
		}
		for _, j := range st.Jobs {
			// A due already past when the job was last changed (a resume, an
			// update) counts from that change (seed 599: a resume in the run's
			// last millisecond of a job paused over its due).
			if j.State == messages.JobState_ACTIVE && j.NextDueMs > 0 && max(j.NextDueMs, j.UpdatedMs) < now-LateBoundMs {
				k.failf("fire-stuck", "%s on %s: job %d was due at %d; it is %d", n, h.srv.addr, j.Id, j.NextDueMs, now)
				return
			}
			// An active periodic job has a next due, or a run whose finish sets it
			// (fixed delay); with neither it never fires again (seed 86, before
			// recovery followed a failure whose retry record a crash cut).
			if kind := j.Schedule.GetKind(); j.State == messages.JobState_ACTIVE && j.NextDueMs == 0 && !running[j.Id] &&
				kind != messages.ScheduleKind_ONCE && kind != messages.ScheduleKind_API_ONLY {
				k.failf("periodic-stalled", "%s on %s: job %d (%s) is active with no next due and no run", n, h.srv.addr, j.Id, kind)
				return
			}
		}
	}
	dead := map[string]int{}
	reapplied := map[int64]bool{}
	for id, jm := range k.jobs {
		if jm.reapplied {
			reapplied[id] = true
		}
	}
	for _, v := range k.s.servers {
		v.disk.records(func(r persistence.Record) {
			if messages.RecordType(r.Type) == messages.RecordType_DEAD_LETTERED {
				d := &messages.DeadLetter{}
				if proto.Unmarshal(r.Payload, d) == nil && !reapplied[d.JobId] {
					dead[d.RunId]++
				}
			}
		})
	}
	for _, id := range sortedKeys(dead) {
		if dead[id] > 1 {
			k.failf("dead-letter-twice", "run %s was dead-lettered %d times (durably)", id, dead[id])
			return
		}
	}
	for _, c := range k.s.clients {
		if !c.up {
			continue
		}
		for _, o := range c.outstanding() {
			if o.startMs >= k.settleAt && k.s.now-o.startMs > OpBoundMs {
				k.failf("liveness-op", "%s %s of job %d has been outstanding for %d ms after the cluster settled", c.addr, o.kind, o.id, k.s.now-o.startMs)
				return
			}
		}
	}
	if len(k.s.clients) > 0 && k.acked == 0 {
		k.failf("no-progress", "no client call was acknowledged in the %d ms after the cluster settled", k.s.now-k.settleAt)
		return
	}
}

// balanceTick is the balance check (Config.CheckBalance), once a second after
// the cluster settled: a move the NameServer's strategy wants (its bound broken:
// a server above twice the least loaded one, with a shard whose move narrows the
// gap) must not stay wanted for BalanceBoundMs while no move completes. Loads
// keep shifting (splits, the workload), so a wanted move is fine; one left
// undone is not.
func (k *checker) balanceTick() {
	ns := k.s.ns
	if ns == nil || !ns.core.Complete(ns.srv.now()) || k.s.now > k.s.end-QuietMs {
		k.balWant = 0
		return
	}
	if ns != k.balNS || ns.core.MovesDone() != k.balMoves {
		k.balNS, k.balMoves, k.balWant = ns, ns.core.MovesDone(), 0
	}
	mv, ok := ns.core.WantedMove(ns.srv.now())
	if !ok {
		k.balWant = 0
		return
	}
	if k.balWant == 0 {
		k.balWant = k.s.now
		return
	}
	if k.s.now-k.balWant > BalanceBoundMs {
		st := ns.core.Status(ns.srv.now())
		var loads []string
		for _, sv := range st.Servers {
			var f int64
			for _, sh := range sv.Shards {
				f += sh.FiresWindow
			}
			loads = append(loads, fmt.Sprintf("%s=%d", sv.ServerId, f))
		}
		k.failf("balance", "the strategy has wanted a move for %d ms with none done (now %s from %s to %s; fires in window: %s; %d moves done by this NameServer)",
			k.s.now-k.balWant, mv.Shard, mv.From, mv.To, strings.Join(loads, " "), ns.core.MovesDone())
	}
}

func (k *checker) jobIDs() []int64 {
	ids := make([]int64, 0, len(k.jobs))
	for id := range k.jobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// ownerOf is the active owner of the shard of app that holds job id (the deepest
// one whose range holds it: route.Lookup), nil when none.
func ownerOf(owners map[string]*shardHost, app string, id int64) *shardHost {
	var best *shardHost
	for _, h := range owners {
		sh := h.core.Shard()
		if sh.App == app && sh.ContainsJob(id) && (best == nil || sh.Level > best.core.Shard().Level) {
			best = h
		}
	}
	return best
}

// overlaps says whether two shards' hash ranges meet: one holds the other (the
// ranges of a split are nested, never crossed).
func overlaps(a, b route.Shard) bool {
	if a.App != b.App {
		return false
	}
	if a.Level > b.Level {
		a, b = b, a
	}
	return b.Index>>uint(b.Level-a.Level) == a.Index
}
