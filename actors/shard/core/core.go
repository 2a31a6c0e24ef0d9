// Package core is the shard actor's pure state machine: the owner of one hash range of an app's jobs.
//
// Core is its pure state machine (no goroutines, no clock, no I/O): the shell in
// shell.go feeds it commands, worker results, timer ticks and journal durability, and
// carries out what it asks through Env. The simulator drives the same Core.
//
// State is event-sourced: every change is a journal record, and live changes are made
// by applying the very record that is journaled (emit → apply), so replay after a
// crash rebuilds exactly the state that was acknowledged. Every message the core sends
// (replies and dispatches alike) waits in an outbox until every record appended
// before it is durable: nothing is acknowledged or dispatched ahead of the journal.
package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/schedule"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
	"github.com/kjob/kjob/wheel"
)

// Limits and defaults. Each bound is named so an error can say which one was hit.
const (
	MaxParamsBytes   = 64 << 10
	MaxHandlerLen    = 128
	MaxRouteKeyLen   = 128 // a policy's route_key: a top-level params field's name
	MaxListLimit     = 1000
	DefaultListLimit = 100
	DefaultTimeoutMs = 60_000
	MaxTimeoutMs     = 24 * 3600_000
	DefaultGraceMs   = 5_000
	DefaultHistory   = 20
	NoWorkerRetryMs  = 500
	RefusedRetryMs   = 20 // a worker refused a dispatch (queue full): try again this soon
	// CreditPerSlot bounds the runs one shard has at a worker at once, per slot of
	// its pool (WorkerInfo.Capacity): the worker queues QueuePerSlot (16) per slot
	// behind the running ones before it refuses, so a shard that keeps within its
	// credit is not refused unless other shards fill the same worker. A run over
	// every worker's credit waits in the shard (held), in order, and goes out when a
	// result frees a place, instead of a refusal round trip and a retry 20 ms later.
	CreditPerSlot = 16
	// HeldRecheckMs is how long a held run waits before the shard counts its runs
	// per worker again from scratch (so a miscount cannot keep it held) and retries.
	HeldRecheckMs          = 1_000
	defaultWorkerCapacity  = 64 // a worker that reports no capacity (the worker's own default)
	MaxAttempts            = 32
	DefaultMaxJobs         = 20_000_000
	FireWindowMs           = 60_000
	MaxFiresPerTick        = 100_000 // bounds one Tick's work; the rest fires on the next
	MaxMisfireFireAll      = schedule.MaxMisfireFires
	DefaultDoneRetentionMs = 3600_000
	expiryRecheckMs        = 60_000 // a DONE job whose runs are not over yet is looked at again this much later
	defaultAttemptsAll     = 5      // 1 + the four rungs of the default ladder
)

// Env is what the core needs from the world.
type Env interface {
	// Append journals entries without waiting; the owner later calls Durable with
	// the LSN that became durable. It returns the last LSN assigned. The entries'
	// payloads are the core's scratch memory, valid until Append returns: an Env
	// that keeps them copies them.
	Append(entries []persistence.Entry) (lastLSN uint64, err error)
	// Send delivers m to the actor named by to, fire and forget.
	Send(to *messages.Ref, m proto.Message)
}

// Ladder is an optional extension of Env. When the Env implements it, a run waiting
// for its next attempt is held by the actor of its ladder level (a child of the
// shard) instead of the core's own timer, the level answers with RetryDue, and each
// new dead letter is announced to the dead-letter actor. The journal stays the
// shard's: the levels hold only timers, rebuilt from the journal after a restart.
type Ladder interface {
	Hold(level int, runID string, dueMs int64)
	Release(level int, runID string)
	DeadLettered(d *messages.DeadLetter)
}

// Recorder is an optional extension of Env: when the Env implements it, each flush
// hands it the records just appended, as the messages they were made from (the
// shell's metrics read them there instead of decoding the journal's bytes again).
// The messages are the core's: read them during the call, keep nothing.
type Recorder interface {
	Recorded(types []messages.RecordType, ms []proto.Message)
}

// Roomy is an optional extension of Env: JournalRoom says why the journal should
// take no new work now (persistence.Journal.Room: out of disk space, with only its
// reserve left), nil when it may. While it says so, a create, an update, a trigger
// and a dead letter's replay are refused with RESOURCE_EXHAUSTED on field
// "journal"; what was accepted before (fires, results, retries) goes on into the
// reserve, and reads, pauses and deletes are answered as ever. Asked once per
// message that could be refused.
type Roomy interface {
	JournalRoom() error
}

// LazyAppender is an optional extension of Env: AppendBy is Append for records
// that may wait for their msync until byMs, on the clock the core is given
// (Config.LazySyncMs); the owner still hears of them through Durable.
type LazyAppender interface {
	AppendBy(entries []persistence.Entry, byMs int64) (lastLSN uint64, err error)
	// SyncNow asks for a sync of everything appended so far, without waiting: a
	// reply that waits behind lazy records, in a step with none of its own.
	SyncNow()
}

type ladderOp struct {
	hold    bool
	level   int
	runID   string
	dueMs   int64
	dead    *messages.DeadLetter
	release bool
}

// Config holds a shard's settings.
type Config struct {
	Shard           route.Shard
	Self            *messages.Ref // this shard actor, for reply_to in dispatches
	DefaultAttempts int
	DefaultLadderMs []int64
	DefaultTimeout  int64
	// AppPolicy is the default policy of this shard's app: what a job leaves unset
	// (0, empty, the _DEFAULT enum values) comes from it, and what it leaves unset
	// from the node's defaults above. nil = none. ValidatePolicy checks it.
	AppPolicy *messages.Policy
	GraceMs   int64
	History   int
	MaxJobs   int
	// DoneRetentionMs is how long a job that will never fire again (a one-shot that
	// ran, a job past its window or run limit) stays readable, with its run history,
	// after its last run; then it is deleted (journaled). Default 1 hour.
	DoneRetentionMs int64
	Seed            uint64 // for random routing; fixed for determinism
	// FullJobs keeps every job as a full record, none compact (compact.go): for
	// tests and the benchmark's baseline.
	FullJobs bool
	// ArmMs arms fires: a job due within ArmMs is fired (its RUN_DISPATCHED journaled)
	// that much ahead, and its dispatch leaves at the due, so the wait for the
	// record's msync is off the fire's path. A command that would change a job with
	// an armed run (update, delete, pause, resume, trigger) waits until that run has
	// gone: it is applied after the fire, as if it had come just after the due. 0 =
	// fires are journaled at the due. See armed.go.
	ArmMs int64
	// LazySyncMs lets records that nothing waits for at once wait up to this long
	// for their msync, riding on the next sync another append asks for: a step
	// whose only messages are results' acknowledgements (a worker resends a result
	// only after seconds), or fires armed ahead of their due, whose records need be
	// durable only by the due less ArmMs-LazySyncMs (the sync's own budget, as
	// before). Fewer msyncs under a steady stream of fires; an Env that is not a
	// LazyAppender, or 0, syncs every step at once. Armed fires wait only when it
	// is below ArmMs. DefaultLazySyncMs is what a node gives its shards.
	LazySyncMs int64
	// Mutations switched on by simulator tests to prove the invariants catch bugs.
	Mutations Mutations
	// CheckCaches: check what the shard keeps to save work (the outbox's earliest
	// armed due) against a recount at every use, panicking on a difference. For
	// the simulator and tests: it costs the work the cache saves.
	CheckCaches bool
}

// Mutations are deliberate bugs, for tests only.
type Mutations struct {
	AckBeforeDurable  bool // send without waiting for the journal
	SkipEpochCheck    bool // accept results of any epoch
	FireEarlyMs       int64
	ForgetRetryRecord bool // schedule a retry without journaling it
	RefuseAllNoRoom   bool // refuse every command while the journal has no room, not only new work
}

func (c *Config) defaults() {
	if c.DefaultAttempts <= 0 {
		c.DefaultAttempts = defaultAttemptsAll
	}
	if len(c.DefaultLadderMs) == 0 {
		c.DefaultLadderMs = schedule.DefaultLadderMs
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = DefaultTimeoutMs
	}
	if c.GraceMs <= 0 {
		c.GraceMs = DefaultGraceMs
	}
	if c.History <= 0 {
		c.History = DefaultHistory
	}
	if c.MaxJobs <= 0 {
		c.MaxJobs = DefaultMaxJobs
	}
	if c.DoneRetentionMs <= 0 {
		c.DoneRetentionMs = DefaultDoneRetentionMs
	}
}

type job struct {
	j       *messages.Job
	sched   *schedule.Compiled
	handle  wheel.Handle
	expiry  wheel.Handle // in Core.expire while DONE
	running int32
	// gen is Core.jobGen when j and history were last made this job's own (ownJob):
	// no snapshot view taken since shares them, and apply may change them in place.
	gen     uint32
	slot    int32                 // its entry in Core.views
	history []*messages.RunRecord // oldest first, bounded by Config.History
}

// ownJob makes j's definition and history its own before apply changes them in
// place: a snapshot view taken since they last were holds the same *messages.Job and
// history slice and encodes them on another goroutine (copy on write; SnapshotView).
// Only apply changes them in place (a fire's runs and due, a finish, the due, the
// DONE state, the history); every JOB_PUT replaces the definition.
func (c *Core) ownJob(j *job) {
	if j.gen != c.jobGen {
		j.j = jobCopy(j.j)
		j.history = slices.Clone(j.history)
		j.gen = c.jobGen
		c.refreshView(j)
	}
}

// refreshView makes j's entry in views its definition and history as they are now:
// every change of j.j or j.history is followed by it.
func (c *Core) refreshView(j *job) { c.views[j.slot] = jobView{j: j.j, hist: j.history} }

// putFull enters full job j as job id (a new one, or a compact or packed one made
// full: its definition and history made just now), with its entry in views.
func (c *Core) putFull(id int64, j *job) {
	c.jobs[id] = j
	j.gen = c.jobGen // its definition and history are new: no view holds them
	j.slot = int32(len(c.views))
	c.views = append(c.views, jobView{j: j.j, hist: j.history})
}

// dropFull removes full job id and its entry in views (the last entry takes its
// place).
func (c *Core) dropFull(id int64) {
	j := c.jobs[id]
	if j == nil {
		return
	}
	delete(c.jobs, id)
	last := len(c.views) - 1
	if int(j.slot) != last {
		moved := c.views[last]
		c.views[j.slot] = moved
		c.jobs[moved.j.Id].slot = j.slot
	}
	c.views[last] = jobView{}
	c.views = c.views[:last]
}

// unfollowed is a failed attempt's run and error, its retry or dead letter to come.
type unfollowed struct {
	st  *messages.RunState
	err string
}

type run struct {
	st     *messages.RunState
	seq    uint64
	handle wheel.Handle // its timer in runTimers: deadline, retry due or no-worker retry
	// sentTo is the worker this attempt went to before it had to wait for a worker
	// list (st.WorkerId is "" while it waits): a shard that takes over a run (recovery,
	// handoff, split) often knows no workers yet, and the run must go back to that
	// worker, which dedupes it, not to another one, which would run it again.
	sentTo string
	held   bool // waiting in a held queue for a worker with credit (credit.go)
	// ownGen is Core.viewGen when st was last made this run's own (ownSt): st is
	// shared with no snapshot view taken since, and may be changed in place. (32
	// bits beside held keep the struct in its size class; it would take 2^32
	// snapshots in one run's life to wrap.)
	ownGen uint32
	slot   int32 // its entry in Core.runViews
}

// addRun enters new run r (its state set) in runs, bySeq and runViews.
func (c *Core) addRun(r *run) {
	c.runs[r.st.RunId] = r
	c.bySeq[r.seq] = r
	r.slot = int32(len(c.runViews))
	c.runViews = append(c.runViews, seqRun{seq: r.seq, st: r.st})
}

// setSt makes st run r's state, in runViews too.
func (c *Core) setSt(r *run, st *messages.RunState) {
	r.st = st
	c.runViews[r.slot].st = st
}

// ownSt makes r.st the run's own before it is changed in place: a snapshot view
// taken since it last was holds the same *messages.RunState and encodes it on
// another goroutine (copy on write; SnapshotView). Only dispatch and hold change a
// run's state in place; every record replaces it.
func (c *Core) ownSt(r *run) {
	if r.ownGen != c.viewGen {
		c.setSt(r, runStateCopyInto(new(messages.RunState), r.st))
		r.ownGen = c.viewGen
	}
}

type outMsg struct {
	lsn  uint64
	to   *messages.Ref
	m    proto.Message
	step bool // waits for the records of the step that queued it
}

// Core is the shard's state machine.
type Core struct {
	cfg    Config
	stream uint64
	epoch  int64

	jobs map[int64]*job // full jobs; the others are in cold
	// views are the full jobs' definitions and histories, densely (job.slot): a
	// snapshot view copies them at once, where a walk of the jobs map cost about
	// 0.2 µs a job in cache misses (40 ms at 200,000 periodic jobs).
	views    []jobView
	spares   viewSpares    // a finished view's buffers, for the next (viewBuf, runBuf)
	cold     coldStore     // compact jobs (compact.go), and the handler names
	packed   packedStore   // DONE one-shots with nothing going on (packed.go)
	packq    []int64       // candidates for packing at the end of the step
	packBuf  []byte        // packing's scratch buffer
	compiled compiledFor   // create → apply (commands.go)
	warmSum  uint32        // what warming the cold index read (commands.go): kept so the reads stay
	loadRuns map[int64]int // while LoadSnapshot puts the jobs in: each job's runs in the snapshot, out or on the ladder (setDue)
	// unfollowed are the failed attempts whose RUN_FINISHED is applied and whose
	// retry or dead letter is not (yet): empty after every step; after a replay,
	// what a crash cut between the two records (Recovered follows them).
	unfollowed map[string]unfollowed

	due   *wheel.Wheel // next fire per job; payload = job id
	runs  map[string]*run
	bySeq map[uint64]*run
	// runViews are the runs' states, densely (run.slot), for a snapshot view to copy
	// at once: a walk of bySeq cost about 0.08 µs a run in cache misses.
	runViews []seqRun
	timers   *wheel.Wheel // per run; payload = run seq
	runSeq   uint64
	viewGen  uint32 // snapshot views taken: a run's state shared with one is copied before it changes (ownSt)
	jobGen   uint32 // snapshot views taken: a full job's definition and history shared with one are copied before they change (ownJob)
	dead     map[string]*messages.DeadLetter
	runsOf   map[int64]int32 // runs (dispatched or waiting for a retry) per job id
	expire   *wheel.Wheel    // when each finished (DONE) job leaves; payload = job id

	workers   []*messages.WorkerInfo
	known     map[string]*messages.WorkerInfo // every live worker of the app, by id
	rr        int
	busy      map[string]int       // in-flight per worker id
	held      heldRuns             // runs waiting for credit at any worker (credit.go)
	heldAt    map[string]*heldRuns // runs waiting for credit at one worker (consistent hash), by worker id
	heldN     int                  // runs with held set
	rng       *rand.Rand
	live      bool          // opened or recovered: until then inputs only build state
	handoff   *messages.Ref // the server this shard is being handed to (frozen meanwhile)
	split     bool          // the handoff is a split into the two halves (at handoff, its own server)
	closed    bool          // handed off: the shard is gone from here
	ladderOps []ladderOp
	pending   []persistence.Entry
	pendBuf   []byte // pending's payloads, marshalled one after another (reused: Env.Append)
	dueJobs   []int64
	dueAt     []int64               // Tick's scratch: the jobs the wheel handed over and their due times
	pendingT  []messages.RecordType // pending's records as messages, for a Recorder
	pendingM  []proto.Message
	name      string // cfg.Shard.String(), once
	appended  uint64
	durable   uint64
	outbox    []outMsg
	obArmed   outboxArmedMin // the earliest due of the outbox's armed dispatches, kept between scans (armed.go)
	armedOut  heldDispatches // armed dispatches, durable, waiting for their due (armed.go)
	waitsNow  bool           // a message queued since the last flush waits for the journal and may not wait lazily (mayWait)
	parked    []parkedCmd    // commands waiting for a job's armed run to go (armed.go)
	unparking bool           // a parked command is being handled (firstDue)
	parkedAt  int64          // and when it came
	seenMs    int64          // the latest now the shard was given (armed: a clock step back does not re-arm)
	armHeld   []int64        // jobs due soon, not armed ahead while a command for them is parked (armed.go)
	failed    error
	frozen    *messages.Error // NOT_OWNER reply while handing off / handed off
	noRoom    *messages.Error // RESOURCE_EXHAUSTED reply for new work, during one Handle (Roomy)

	firesTotal int64
	fireWin    [60]int64 // fires per second bucket, FireWindowMs wide
	fireWinSec [60]int64
	lateSumMs  int64
	now        int64
	trace      uint64

	reqs  reqWindow // request ids applied lately (idempotency; requests.go)
	reqID int64     // the request id of the command being applied (0 outside one)
}

// New makes an empty shard at epoch (recovery then replays into it).
func New(cfg Config, nowMs int64, epoch int64) *Core {
	cfg.defaults()
	return &Core{
		cfg:    cfg,
		stream: cfg.Shard.Stream(),
		epoch:  epoch,
		jobs:   make(map[int64]*job),
		due:    wheel.New(nowMs),
		runs:   make(map[string]*run),
		bySeq:  make(map[uint64]*run),
		timers: wheel.New(nowMs),
		dead:   make(map[string]*messages.DeadLetter),
		runsOf: make(map[int64]int32),
		expire: wheel.New(nowMs),
		reqs:   reqWindow{deferring: true}, // until Open or Recovered (requests.go)
		busy:   make(map[string]int),
		rng:    rand.New(rand.NewPCG(cfg.Seed, uint64(route.HashString(cfg.Shard.String())))),
		name:   cfg.Shard.String(),
		now:    nowMs,
	}
}

// SetSelf tells the core its own actor reference (reply_to of its dispatches).
func (c *Core) SetSelf(r *messages.Ref) { c.cfg.Self = r }

// Self is the core's own actor reference.
func (c *Core) Self() *messages.Ref { return c.cfg.Self }

// Shard returns the shard's identity.
func (c *Core) Shard() route.Shard { return c.cfg.Shard }

// Stream returns the journal stream id.
func (c *Core) Stream() uint64 { return c.stream }

// Epoch returns the ownership epoch.
func (c *Core) Epoch() int64 { return c.epoch }

// Failed reports the fatal journal error, if any.
func (c *Core) Failed() error { return c.failed }

// Pending is the number of jobs with a next fire time.
func (c *Core) Pending() int { return c.due.Len() + len(c.armHeld) }

// Jobs is the number of jobs.
func (c *Core) Jobs() int { return c.jobCount() }

// InFlight is the number of runs dispatched or waiting for a retry.
func (c *Core) InFlight() int { return len(c.runs) }

// DeadLetters is the size of the dead-letter queue.
func (c *Core) DeadLetters() int { return len(c.dead) }

// FiresTotal is the number of runs dispatched since the shard was opened here.
func (c *Core) FiresTotal() int64 { return c.firesTotal }

// FiresWindow is the number of fires in the last FireWindowMs.
func (c *Core) FiresWindow(nowMs int64) int64 {
	var n int64
	sec := nowMs / 1000
	for i := range c.fireWin {
		if sec-c.fireWinSec[i] < FireWindowMs/1000 {
			n += c.fireWin[i]
		}
	}
	return n
}

// Quiescent reports whether everything appended is durable (a snapshot taken now
// covers exactly the durable journal).
func (c *Core) Quiescent() bool { return c.appended == c.durable && len(c.pending) == 0 }

// Snapshottable reports whether a snapshot may be taken now: quiescent, not failed,
// and not frozen — a snapshot holds no handoff, so recovered from one taken after
// SHARD_HANDOFF the shard would be active at its old epoch beside the target (sim
// seed 862, stale-owner-active).
func (c *Core) Snapshottable() bool { return c.Quiescent() && c.failed == nil && c.frozen == nil }

// AppliedLSN is the last LSN whose record is reflected in the state.
func (c *Core) AppliedLSN() uint64 { return c.appended }

// NextDue is the earliest next due time among the jobs in the due wheel; ok is false
// when none is scheduled. Runs already fired and armed (journaled ahead of their due,
// armed.go) are not in it: see HasArmed.
func (c *Core) NextDue() (int64, bool) { return c.due.NextDue() }

// ahead is how long before its due the due wheel hands a job over: ArmMs (armed.go),
// plus the FireEarlyMs mutation's error.
func (c *Core) ahead() int64 { return c.cfg.ArmMs + c.cfg.Mutations.FireEarlyMs }

// setNow is the time of the step the shard is given (its shell's clock).
func (c *Core) setNow(nowMs int64) {
	c.now = nowMs
	c.seenMs = max(c.seenMs, nowMs)
}

// NextWake is when the core next needs Tick; ok is false when it needs none.
func (c *Core) NextWake() (int64, bool) {
	if c.frozen != nil || c.failed != nil {
		// A stopped shard does nothing by itself: its Tick returns at once without
		// advancing the wheels, so a wake-up at their next due would come back at
		// once, and again (a shell spinning on ticks until the actor stops).
		if len(c.parked) > 0 {
			return c.now, true // Tick answers them (Freeze parks nothing new)
		}
		return 0, false
	}
	// A wheel fires nothing before its own clock (the last Advance): after the clock
	// stepped back, an entry due before that waits until the clock is there again —
	// a wake-up at its due would come back at once, and again.
	a, okA := c.due.NextDue()
	a = max(a, c.due.Now())
	b, okB := c.timers.NextDue()
	b = max(b, c.timers.Now())
	if x, ok := c.expire.NextDue(); ok && (!okB || max(x, c.expire.Now()) < b) {
		b, okB = max(x, c.expire.Now()), true
	}
	if x, ok := c.nextArmed(); ok && (!okB || x < b) {
		b, okB = x, true
	}
	for _, id := range c.armHeld { // due at their due while a command waits, else armed as usual
		if j := c.jobs[id]; j != nil && j.handle == 0 && j.j.NextDueMs > 0 {
			at := j.j.NextDueMs
			if !c.hasParked(id) {
				at -= c.ahead()
			}
			if !okB || at < b {
				b, okB = at, true
			}
		}
	}
	switch {
	case okA && okB:
		a -= c.ahead()
		return min(a, b), true
	case okA:
		return a - c.ahead(), true
	case okB:
		return b, true
	}
	return 0, false
}

// ---------------------------------------------------------------- journal plumbing

// Open journals the shard's opening at its epoch (a new owner writes it first).
func (c *Core) Open(env Env) {
	c.live = true
	c.reqs.settle()
	c.emit(messages.RecordType_SHARD_OPENED, &messages.ShardMeta{Shard: c.cfg.Shard.String(), Epoch: c.epoch})
	c.flush(env)
}

// pendBufMaxBytes bounds the payload buffer a shard keeps between steps: a step
// that journaled more (a big import) leaves its buffer to the collector.
const pendBufMaxBytes = 1 << 20

func (c *Core) emit(t messages.RecordType, m proto.Message) {
	// Marshalled into the step's one buffer, not a slice of its own per record
	// (two records a fire, each garbage once appended): a growth leaves the
	// records before it in the old array, which they keep alive until Append.
	n := len(c.pendBuf)
	b := appendFastOr(c.pendBuf, m)
	c.pendBuf = b
	c.pending = append(c.pending, persistence.Entry{Stream: c.stream, Type: uint8(t), Payload: b[n:len(b):len(b)]})
	c.pendingT, c.pendingM = append(c.pendingT, t), append(c.pendingM, m)
	c.apply(t, m)
}

// flush appends the step's records as one batch, then releases what may be sent.
func (c *Core) flush(env Env) {
	c.sendHeld(c.now) // a result, a new worker or a recount may have made room
	if len(c.pending) > 0 && c.failed == nil {
		last, err := c.appendStep(env)
		if err != nil {
			c.fail(err)
		} else {
			c.appended = last
			for i := len(c.outbox) - 1; i >= 0 && c.outbox[i].step; i-- {
				c.outbox[i].lsn, c.outbox[i].step = last, false
			}
			if r, ok := env.(Recorder); ok {
				r.Recorded(c.pendingT, c.pendingM)
			}
		}
	}
	if c.waitsNow && len(c.pending) == 0 && c.appended > c.durable && c.failed == nil {
		if la, ok := env.(LazyAppender); ok {
			la.SyncNow() // a reply queued behind records that were waiting lazily
		}
	}
	c.waitsNow = false
	c.packDue()
	clear(c.pending) // (their payloads: pendBuf's old arrays)
	c.pending = c.pending[:0]
	if c.pendBuf = c.pendBuf[:0]; cap(c.pendBuf) > pendBufMaxBytes {
		c.pendBuf = nil
	}
	clear(c.pendingM)
	c.pendingT, c.pendingM = c.pendingT[:0], c.pendingM[:0]
	c.runLadder(env)
	c.release(env)
	if len(c.parked) > 0 && (c.frozen != nil || c.failed != nil) {
		c.unpark(env) // a handoff, a split or a journal failure stopped the shard: answer them now
	}
}

// appendStep journals the step's records, lazily when the Env can and the step
// may wait (syncBy).
func (c *Core) appendStep(env Env) (uint64, error) {
	if la, ok := env.(LazyAppender); ok && c.cfg.LazySyncMs > 0 && !c.waitsNow {
		if by, ok := c.syncBy(); ok {
			return la.AppendBy(c.pending, by)
		}
	}
	return env.Append(c.pending)
}

// syncBy is when this step's records must be durable by (Config.LazySyncMs), or
// false for at once. It is asked only of a step whose messages may all wait
// (waitsNow false: results' acknowledgements, fires armed ahead of their due): an
// ack LazySyncMs, an armed fire until its due less ArmMs-LazySyncMs (the sync's
// own time before the due, as without). A step that sends nothing (a shard's
// opening, a timeout, an expiry) syncs at once as before, and a frozen shard (a
// handoff, a split) waits for nothing.
func (c *Core) syncBy() (int64, bool) {
	lazy := c.cfg.LazySyncMs
	n := len(c.outbox)
	if c.frozen != nil || n == 0 || !c.outbox[n-1].step {
		return 0, false
	}
	by := c.seenMs + lazy
	for i := n - 1; i >= 0 && c.outbox[i].step; i-- {
		if d, ok := c.outbox[i].m.(*messages.Dispatch); ok {
			budget := c.cfg.ArmMs - lazy
			if budget <= 0 {
				return 0, false
			}
			by = min(by, d.DueMs-budget)
		}
	}
	return by, by > c.seenMs
}

// runLadder hands waiting retries to the ladder actors, or to the core's own timers
// when the Env has no ladder (the simulator, tests).
func (c *Core) runLadder(env Env) {
	l, ok := env.(Ladder)
	for _, op := range c.ladderOps {
		switch {
		case op.dead != nil:
			if ok {
				l.DeadLettered(op.dead)
			}
		case op.release:
			if ok {
				l.Release(op.level, op.runID)
			}
		case op.hold:
			if ok {
				l.Hold(op.level, op.runID, op.dueMs)
			} else if r := c.runs[op.runID]; r != nil && r.st.Level >= 0 {
				c.armRun(r, op.dueMs)
			}
		}
	}
	c.ladderOps = c.ladderOps[:0]
}

func (c *Core) holdRetry(r *run) {
	c.ladderOps = append(c.ladderOps, ladderOp{hold: true, level: int(r.st.Level), runID: r.st.RunId, dueMs: r.st.DeadlineMs})
}

// RetryDue is a ladder level's word that run runID's delay is over.
func (c *Core) RetryDue(nowMs int64, runID string, env Env) {
	c.setNow(nowMs)
	if c.failed != nil || c.frozen != nil {
		return
	}
	if r := c.runs[runID]; r != nil && r.st.Level >= 0 {
		if r.st.DeadlineMs > nowMs+c.cfg.Mutations.FireEarlyMs {
			c.holdRetry(r) // early (a clock step): wait again
		} else {
			c.retryNow(r, nowMs)
		}
	}
	c.flush(env)
}

// retryNow dispatches the next attempt of a run that waited on the ladder.
func (c *Core) retryNow(r *run, nowMs int64) {
	st := proto.Clone(r.st).(*messages.RunState)
	st.Level = -1
	st.DispatchedMs = nowMs
	st.DeadlineMs = nowMs + c.timeout(st.JobId) + c.cfg.GraceMs
	st.WorkerId = ""
	st.Fire = false
	c.emit(messages.RecordType_RUN_DISPATCHED, st)
	c.dispatch(c.runs[st.RunId], nowMs)
}

func (c *Core) fail(err error) {
	if c.failed == nil {
		c.failed = fmt.Errorf("shard %s: journal failed, shard stopped: %w", c.cfg.Shard, err)
	}
	c.outbox = nil
	c.obArmed = outboxArmedMin{}
	c.armedOut = heldDispatches{}
}

// send queues m behind everything journaled so far, including this step's records
// (whose LSNs the shared journal assigns only at flush: stepLSN marks them).
func (c *Core) send(to *messages.Ref, m proto.Message) {
	if to == nil || c.failed != nil {
		return
	}
	o := outMsg{lsn: c.appended, to: to, m: m, step: len(c.pending) > 0}
	c.outbox = append(c.outbox, o)
	c.obArmed.sent(c, o)
	if !c.waitsNow && (o.step || o.lsn > c.durable) && !c.mayWait(o) {
		c.waitsNow = true
	}
}

// mayWait says whether o may wait for a lazy sync (Config.LazySyncMs): a result's
// acknowledgement, or a fire armed ahead of its due.
func (c *Core) mayWait(o outMsg) bool {
	switch o.m.(type) {
	case *messages.ResultAck:
		return true
	case *messages.Dispatch:
		return c.armed(o)
	}
	return false
}

// release sends the held dispatches now due, then what is durable in the outbox, in
// order, but for the dispatches armed ahead of their due, which it holds.
func (c *Core) release(env Env) {
	if c.failed != nil {
		return // fail dropped both; nothing may go from a failed shard
	}
	for len(c.armedOut.q) > 0 && !c.armed(c.armedOut.q[0].o) {
		o := c.armedOut.pop()
		env.Send(o.to, o.m)
	}
	i := 0
	for ; i < len(c.outbox); i++ {
		o := c.outbox[i]
		if o.lsn > c.durable && !c.cfg.Mutations.AckBeforeDurable {
			break
		}
		if c.armed(o) {
			c.armedOut.push(o)
			continue
		}
		env.Send(o.to, o.m)
	}
	if i > 0 {
		c.obArmed.valid = false // (what went may have been the earliest)
	}
	n := copy(c.outbox, c.outbox[i:])
	clear(c.outbox[n:])
	c.outbox = c.outbox[:n]
}

// Durable tells the core that the journal is durable up to lsn, or failed.
func (c *Core) Durable(lsn uint64, err error, env Env) {
	if err != nil {
		c.fail(err)
		c.unpark(env) // refused: the shard has stopped
		return
	}
	if lsn > c.durable {
		c.durable = lsn
	}
	c.release(env)
}

// Replay applies one journal record during recovery (records arrive in LSN order).
func (c *Core) Replay(r persistence.Record) error {
	d := DecodeRecord(messages.RecordType(r.Type), r.Payload)
	return c.ReplayDecoded(r, &d)
}

// Recovered marks the end of recovery at the journal's durable LSN: runs that were
// dispatched and never finished go out again; periodic jobs whose fires were missed
// while the shard was down follow their misfire policy.
func (c *Core) Recovered(nowMs int64, durableLSN uint64, env Env) {
	c.setNow(nowMs)
	c.live = true
	c.reqs.settle()
	c.cold.idx.fit(c.cold.idOf) // what Reserve sized and the replay did not fill
	c.appended, c.durable = durableLSN, durableLSN
	if c.frozen != nil { // a closed (handed-off) shard must not fire (sim seed 3)
		return
	}
	ids := make([]string, 0, len(c.runs))
	for id := range c.runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := c.runs[id]
		if r.st.Level >= 0 {
			c.holdRetry(r)
		} else {
			c.dispatch(r, nowMs)
		}
	}
	// A failed attempt whose RUN_FINISHED reached the disk and whose retry or dead
	// letter did not (the two records of one append, a crash cutting the journal
	// between them): follow it now, or the run is never tried again and never
	// dead-lettered (and a fixed-delay job waiting for it never fires again).
	if len(c.unfollowed) > 0 {
		for _, id := range slices.Sorted(maps.Keys(c.unfollowed)) {
			u := c.unfollowed[id]
			// (A deleted job's runs go with it; a run out again is followed.)
			if j := c.job(u.st.JobId); j != nil && c.runs[id] == nil {
				c.followFailure(u.st, j, u.err, nowMs)
			}
		}
		c.unfollowed = nil
	}
	c.misfires(nowMs)
	c.flush(env)
}

// Decode parses a journal record's payload by its type (the simulator and tools
// read journals with it).
func Decode(t messages.RecordType, b []byte) (proto.Message, error) { return decode(t, b) }

func decode(t messages.RecordType, b []byte) (proto.Message, error) {
	var m proto.Message
	switch t {
	case messages.RecordType_SHARD_OPENED, messages.RecordType_SHARD_CLOSED, messages.RecordType_SHARD_HANDOFF:
		m = &messages.ShardMeta{}
	case messages.RecordType_JOB_PUT:
		if j, ok := decodeJobFast(b); ok {
			return j, nil
		}
		m = &messages.Job{}
	case messages.RecordType_JOB_DELETED, messages.RecordType_DEAD_LETTER_REMOVED:
		m = &messages.JobRef{}
	case messages.RecordType_RUN_DISPATCHED, messages.RecordType_RETRY_SCHEDULED:
		m = &messages.RunState{}
	case messages.RecordType_RUN_FINISHED:
		m = &messages.RunRecord{}
	case messages.RecordType_DEAD_LETTERED:
		m = &messages.DeadLetter{}
	default:
		return nil, fmt.Errorf("unknown record type %d", t)
	}
	return m, proto.Unmarshal(b, m)
}

// apply is the only place state changes. It must be deterministic in the record.
func (c *Core) apply(t messages.RecordType, m proto.Message) {
	switch t {
	case messages.RecordType_SHARD_OPENED:
		if e := m.(*messages.ShardMeta).Epoch; e > c.epoch {
			c.epoch = e
		}
	case messages.RecordType_SHARD_CLOSED:
		c.frozen = kerr.New(messages.Code_NOT_OWNER, "", "shard %s was handed off", c.cfg.Shard)
		c.closed = true
	case messages.RecordType_SHARD_HANDOFF:
		meta := m.(*messages.ShardMeta)
		c.handoff, c.split = meta.Target, meta.Split
		if meta.Split {
			lo, hi := c.cfg.Shard.Children()
			c.frozen = kerr.New(messages.Code_NOT_OWNER, "", "shard %s is splitting into %s and %s", c.cfg.Shard, lo, hi)
		} else {
			e := kerr.New(messages.Code_NOT_OWNER, "", "shard %s is moving to %s", c.cfg.Shard, meta.Target.GetAddress())
			e.Hint, e.HintEpoch = meta.Target, c.epoch+1
			c.frozen = e
		}
	case messages.RecordType_JOB_PUT:
		c.applyPut(m.(*messages.Job))
	case messages.RecordType_JOB_DELETED:
		ref := m.(*messages.JobRef)
		id := ref.Id
		c.reqs.add(ref.RequestId, id, ref.AtMs)
		c.dropCold(id)
		c.dropPacked(id)
		if j := c.jobs[id]; j != nil {
			if j.handle != 0 {
				c.due.Cancel(j.handle)
			}
			if j.expiry != 0 {
				c.expire.Cancel(j.expiry)
			}
			c.dropFull(id)
		}
		if n := c.runsOf[id]; n > 0 { // retries waiting for a deleted job are dropped
			// In run id order, not map order: each drop releases a ladder level's
			// timer (Ladder.Release, or the core's own timer wheel).
			rids := make([]string, 0, n)
			for rid, r := range c.runs {
				if r.st.JobId == id {
					if rids = append(rids, rid); len(rids) == int(n) {
						break
					}
				}
			}
			sort.Strings(rids)
			for _, rid := range rids {
				c.dropRun(rid)
			}
		}
	case messages.RecordType_RUN_DISPATCHED:
		st := m.(*messages.RunState)
		delete(c.unfollowed, st.RunId) // (it goes on: followed, whatever came between)
		r := c.runs[st.RunId]
		if r == nil {
			c.runSeq++
			r = &run{seq: c.runSeq, st: st}
			c.addRun(r)
			c.runsOf[st.JobId]++
		} else {
			c.setSt(r, st)
		}
		r.ownGen = c.viewGen // the record's own, shared with no view
		c.reqs.add(st.RequestId, st.JobId, st.DispatchedMs)
		if j := c.job(st.JobId); j != nil {
			j.running++
			if st.Fire {
				c.ownJob(j)
				j.j.Runs = st.JobRuns
				j.j.LastDueMs = st.DueMs
				c.setDue(j, st.JobNextDueMs)
			}
		}
	case messages.RecordType_RETRY_SCHEDULED:
		st := m.(*messages.RunState)
		delete(c.unfollowed, st.RunId)
		c.runSeq++
		r := &run{st: st, seq: c.runSeq, ownGen: c.viewGen}
		c.addRun(r)
		c.runsOf[st.JobId]++
	case messages.RecordType_RUN_FINISHED:
		rec := m.(*messages.RunRecord)
		if rec.Outcome == messages.Outcome_SKIPPED { // a fire skipped (concurrency forbid): history only
			if j := c.job(rec.JobId); j != nil {
				c.remember(j, rec)
			}
			break
		}
		if r := c.runs[rec.RunId]; r != nil && rec.Outcome != messages.Outcome_SUCCEEDED {
			// A failed attempt: its retry or dead letter is the next record, in
			// the same append. Until that is applied too, the run is unfollowed
			// (a crash may keep this record and lose that one: Recovered).
			if c.unfollowed == nil {
				c.unfollowed = map[string]unfollowed{}
			}
			c.unfollowed[rec.RunId] = unfollowed{st: r.st, err: rec.Error}
		}
		c.dropRun(rec.RunId)
		if j := c.job(rec.JobId); j != nil {
			if j.running > 0 {
				j.running--
			}
			c.remember(j, rec) // (makes j its own)
			j.j.LastFinishMs = rec.EndMs
			if rec.SetsNext {
				c.setDue(j, rec.JobNextDueMs)
			} else {
				c.armExpiry(j)
			}
			c.queuePack(rec.JobId)
		}
	case messages.RecordType_DEAD_LETTERED:
		d := m.(*messages.DeadLetter)
		delete(c.unfollowed, d.RunId)
		c.dropRun(d.RunId)
		c.dead[d.RunId] = d
	case messages.RecordType_DEAD_LETTER_REMOVED:
		ref := m.(*messages.JobRef)
		delete(c.dead, ref.RunId)
		c.reqs.add(ref.RequestId, ref.Id, ref.AtMs)
	}
}

// applyPut is apply of a JOB_PUT.
func (c *Core) applyPut(jm *messages.Job) {
	c.reqs.add(jm.RequestId, jm.Id, jm.UpdatedMs)
	jm.RequestId = 0 // journal only (the window above keeps it)
	// Every job of the shard has its app's name, and handlers are few: one copy
	// of each string serves them all (they were two allocations per job).
	if jm.App == c.cfg.Shard.App {
		jm.App = c.cfg.Shard.App
	}
	_, jm.Handler, _ = c.cold.handler(jm.Handler)
	j := c.jobs[jm.Id]
	if j == nil {
		j = c.unpackJob(jm.Id) // a new version of a packed job keeps its history
	}
	if j == nil {
		c.dropCold(jm.Id) // a version replayed over a compact one
		if c.putCold(jm) {
			c.compiled = compiledFor{}
			return
		}
		j = &job{}
		c.putFull(jm.Id, j)
	}
	c.setJob(j, jm)
}

// setJob makes jm the job j holds, with its schedule and due.
func (c *Core) setJob(j *job, jm *messages.Job) {
	if j.gen != c.jobGen { // jm is the record's own; the history may be a view's
		j.history = slices.Clone(j.history)
		j.gen = c.jobGen
	}
	j.j = jm
	c.refreshView(j)
	sc := c.compiled.take(jm)
	switch jm.Schedule.GetKind() {
	case messages.ScheduleKind_ONCE, messages.ScheduleKind_API_ONLY:
		// Nothing after the first due, which is in NextDueMs: no compiled
		// schedule kept (a resume compiles it again; schedOf).
		j.sched = nil
	default:
		if j.sched = sc; j.sched == nil {
			j.sched, _ = compile(jm, jm.CreatedMs) // validated before it was journaled
		}
	}
	c.setDue(j, jm.NextDueMs)
}

func (c *Core) setDue(j *job, dueMs int64) {
	c.ownJob(j)
	j.j.NextDueMs = dueMs
	if dueMs > 0 && j.j.State == messages.JobState_ACTIVE {
		if j.handle != 0 && c.due.Reschedule(j.handle, dueMs) {
			return
		}
		j.handle = c.due.Add(dueMs, uint64(j.j.Id))
		return
	}
	if j.handle != 0 {
		c.due.Cancel(j.handle)
		j.handle = 0
	}
	// A fixed-delay job's next due comes with its run's finish; a snapshot's job goes
	// in before its runs (LoadSnapshot), which count as well.
	waitsForFinish := j.j.Schedule.GetKind() == messages.ScheduleKind_FIXED_DELAY && (j.running > 0 || c.loadRuns[j.j.Id] > 0)
	if dueMs == 0 && j.j.State == messages.JobState_ACTIVE && j.j.Schedule.GetKind() != messages.ScheduleKind_API_ONLY && !waitsForFinish {
		j.j.State = messages.JobState_DONE
	}
	c.armExpiry(j)
}

// armExpiry keeps a DONE job's expiry in the expire wheel (and only a DONE job's):
// DoneRetentionMs after the latest of its last update, due and finish (expiryAt).
//
// An expiry that is already armed at or before that time stays: when it comes, Tick
// looks again and arms the job for its exact time. A one-shot becomes DONE as it
// fires and its result moves its expiry by the run's length; moving it then meant a
// tombstone and a second element in the expire wheel's hour-ahead bucket for every
// fire, a bucket of hundreds of thousands of elements whose growth stalled the
// shard's goroutine for up to 4 ms at 20,000 fires/s (BENCHMARKS.md, 2026-12-06).
func (c *Core) armExpiry(j *job) {
	if j.j.State != messages.JobState_DONE {
		if j.expiry != 0 {
			c.expire.Cancel(j.expiry)
			j.expiry = 0
		}
		return
	}
	at := c.expiryAt(j)
	if j.expiry != 0 {
		if due, _, ok := c.expire.Get(j.expiry); ok && due <= at {
			return
		}
		if c.expire.Reschedule(j.expiry, at) {
			return
		}
	}
	j.expiry = c.expire.Add(at, uint64(j.j.Id))
}

// expiryAt is when DONE job j is deleted: DoneRetentionMs after the latest of its
// last update, due and finish.
func (c *Core) expiryAt(j *job) int64 {
	return max(j.j.UpdatedMs, j.j.LastDueMs, j.j.LastFinishMs) + c.cfg.DoneRetentionMs
}

// maxInterned bounds the handler names a shard keeps one copy of (and can name
// in a compact job).
const maxInterned = 4096

// schedOf is j's compiled schedule: kept for the periodic kinds, compiled again
// for the others (a one-shot or API-only job keeps none: it was a tenth of a
// pending one-shot's memory).
func (c *Core) schedOf(j *job) *schedule.Compiled {
	if j.sched != nil {
		return j.sched
	}
	sc, _ := compile(j.j, j.j.CreatedMs) // validated before it was journaled
	return sc
}

// remember adds rec to j's run history, keeping the last Config.History.
func (c *Core) remember(j *job, rec *messages.RunRecord) {
	c.ownJob(j)
	j.history = append(j.history, rec)
	if len(j.history) > c.cfg.History {
		j.history = append(j.history[:0], j.history[len(j.history)-c.cfg.History:]...)
	}
	c.refreshView(j)
}

func (c *Core) dropRun(runID string) {
	r := c.runs[runID]
	if r == nil {
		return
	}
	if r.handle != 0 {
		c.timers.Cancel(r.handle)
	}
	if r.st.Level >= 0 {
		c.ladderOps = append(c.ladderOps, ladderOp{release: true, level: int(r.st.Level), runID: runID})
	}
	if r.st.WorkerId != "" && c.busy[r.st.WorkerId] > 0 {
		c.busy[r.st.WorkerId]--
	}
	if r.held {
		r.held = false
		c.heldN--
	}
	delete(c.bySeq, r.seq)
	delete(c.runs, runID)
	last := len(c.runViews) - 1
	if int(r.slot) != last {
		moved := c.runViews[last]
		c.runViews[r.slot] = moved
		c.bySeq[moved.seq].slot = r.slot
	}
	c.runViews[last] = seqRun{}
	c.runViews = c.runViews[:last]
	if c.runsOf[r.st.JobId]--; c.runsOf[r.st.JobId] <= 0 {
		delete(c.runsOf, r.st.JobId)
	}
}

func (c *Core) armRun(r *run, atMs int64) {
	if r.handle != 0 && c.timers.Reschedule(r.handle, atMs) {
		return
	}
	r.handle = c.timers.Add(atMs, r.seq)
}

// ---------------------------------------------------------------- inputs

// SetWorkers replaces the live workers this shard dispatches to, and sends runs that
// were waiting for a worker.
func (c *Core) SetWorkers(nowMs int64, ws []*messages.WorkerInfo, env Env) {
	c.SetWorkersOf(nowMs, ws, ws, env)
}

// SetWorkersOf is SetWorkers for a shard of a split app: group is the shard's own
// workers, all every live worker of the app. New runs go to the group; a run already
// sent to a worker outside it (by the shard's previous owner, before a split) goes
// there again, so that worker answers it instead of another one running it again.
func (c *Core) SetWorkersOf(nowMs int64, group, all []*messages.WorkerInfo, env Env) {
	ws := group
	c.known = make(map[string]*messages.WorkerInfo, len(all))
	for _, w := range all {
		c.known[w.WorkerId] = w
	}
	for _, w := range group {
		c.known[w.WorkerId] = w
	}
	c.setNow(nowMs)
	c.workers = ws
	for id := range c.busy {
		if c.known[id] == nil {
			delete(c.busy, id)
		}
	}
	if len(ws) > 0 && c.frozen == nil && c.live { // a frozen (handed-off) shard must not fire (sim seed 289); before recovery ends, Recovered dispatches
		// Runs waiting for a worker go out now, and so do runs dispatched to a worker
		// that is gone (expired or left): at least once, with the same attempt,
		// rather than waiting out timeout + grace and counting as a lost attempt.
		seqs := make([]uint64, 0)
		for _, r := range c.runs {
			if r.st.Level < 0 && (r.st.WorkerId == "" || c.known[r.st.WorkerId] == nil) {
				seqs = append(seqs, r.seq)
			}
		}
		sort.Slice(seqs, func(a, b int) bool { return seqs[a] < seqs[b] })
		for _, s := range seqs {
			c.dispatch(c.bySeq[s], nowMs)
		}
	}
	c.flush(env)
}

// BeginHandoff journals that the shard is being handed to target (a server actor)
// at epoch+1 and freezes it: from then on it neither fires nor acknowledges, and a
// restart resumes the handoff instead of serving.
func (c *Core) BeginHandoff(target *messages.Ref, env Env) {
	if c.handoff != nil || c.closed || c.failed != nil {
		return
	}
	c.emit(messages.RecordType_SHARD_HANDOFF, &messages.ShardMeta{Shard: c.cfg.Shard.String(), Epoch: c.epoch, Target: target})
	c.flush(env)
}

// Handoff is the target of a handoff in progress (nil when none).
func (c *Core) Handoff() *messages.Ref {
	if c.closed {
		return nil
	}
	return c.handoff
}

// Closed reports whether the shard was handed off.
func (c *Core) Closed() bool { return c.closed }

// BeginSplit journals that the shard splits into the two halves of its hash range on
// its own server (self, the server actor): a handoff whose target imports two
// shards instead of one. It freezes the shard like a handoff.
func (c *Core) BeginSplit(self *messages.Ref, env Env) {
	if c.handoff != nil || c.closed || c.failed != nil || c.cfg.Shard.Level >= route.MaxLevel {
		return
	}
	c.emit(messages.RecordType_SHARD_HANDOFF, &messages.ShardMeta{Shard: c.cfg.Shard.String(), Epoch: c.epoch, Target: self, Split: true})
	c.flush(env)
}

// Splitting reports whether the handoff in progress is a split.
func (c *Core) Splitting() bool { return c.handoff != nil && c.split && !c.closed }

// ImportConfirmed is nil when r, the target's answer to im, confirms that the
// target holds im's shard at im's epoch or a later one (a copy that moved on since
// from the import counts): only then may the copy here close. Anything else — the
// target's refusal, or an answer that names no shard, another shard or an older
// epoch (a server of another version, or not the one asked) — is an error, and the
// handoff is retried: closing on it would leave the shard with no owner.
func ImportConfirmed(im *messages.ImportShard, r *messages.ImportShardReply) *messages.Error {
	switch {
	case r == nil:
		return kerr.New(messages.Code_UNAVAILABLE, "", "import of shard %s at epoch %d: no answer", im.Shard, im.Epoch)
	case r.Error != nil:
		return r.Error
	case r.Shard == nil:
		return kerr.New(messages.Code_INTERNAL, "shard", "import of shard %s at epoch %d: the answer names no shard", im.Shard, im.Epoch)
	case r.Shard.Shard != im.Shard:
		return kerr.New(messages.Code_INTERNAL, "shard.shard", "import of shard %s at epoch %d: the answer names shard %q", im.Shard, im.Epoch, r.Shard.Shard)
	case r.Shard.Epoch < im.Epoch:
		return kerr.New(messages.Code_INTERNAL, "shard.epoch", "import of shard %s at epoch %d: the answer holds it at epoch %d", im.Shard, im.Epoch, r.Shard.Epoch)
	}
	return nil
}

// HandoffImports are what the target must persist and activate for the handoff in
// progress: the whole shard at epoch+1, or for a split each half (its jobs, runs,
// dead letters, request ids and share of the load) as a shard of its own at epoch+1.
// Take them once Quiescent.
func (c *Core) HandoffImports() []*messages.ImportShard {
	if !c.Splitting() {
		return []*messages.ImportShard{{Shard: c.cfg.Shard.String(), Epoch: c.epoch + 1, Snapshot: c.HandoffSnapshot()}}
	}
	lo, hi := c.cfg.Shard.Children()
	var nLo int
	for id := range c.jobs {
		if lo.ContainsJob(id) {
			nLo++
		}
	}
	c.packed.each(func(id int64, _ []byte, _ packedRef) {
		if lo.ContainsJob(id) {
			nLo++
		}
	})
	c.cold.each(func(cj *coldJob) {
		if lo.ContainsJob(cj.id) {
			nLo++
		}
	})
	share := 0.5
	if n := c.jobCount(); n > 0 {
		share = float64(nLo) / float64(n)
	}
	return []*messages.ImportShard{
		{Shard: lo.String(), Epoch: c.epoch + 1, Snapshot: c.snapshotOf(lo, c.epoch+1, lo.ContainsJob, share)},
		{Shard: hi.String(), Epoch: c.epoch + 1, Snapshot: c.snapshotOf(hi, c.epoch+1, hi.ContainsJob, 1-share)},
	}
}

// HandoffSnapshot is the whole shard at epoch+1, for the target to persist. Take it
// only when Quiescent (it then holds everything this owner ever acknowledged).
func (c *Core) HandoffSnapshot() []byte {
	c.epoch++
	defer func() { c.epoch-- }()
	return c.Snapshot()
}

// HandoffDone records that the target holds the shard: this copy is closed for good.
func (c *Core) HandoffDone(env Env) {
	if c.closed {
		return
	}
	c.emit(messages.RecordType_SHARD_CLOSED, &messages.ShardMeta{Shard: c.cfg.Shard.String(), Epoch: c.epoch})
	c.flush(env)
}

// Freeze makes the shard refuse commands with NOT_OWNER (hint: where it goes).
func (c *Core) Freeze(hint *messages.Error) { c.frozen = hint }

// Frozen reports whether the shard refuses commands.
func (c *Core) Frozen() bool { return c.frozen != nil }

// Tick fires what is due at nowMs: job fires, retry attempts, lost-result deadlines.
func (c *Core) Tick(nowMs int64, env Env) {
	c.setNow(nowMs)
	if c.failed != nil || c.frozen != nil {
		c.unpark(env) // answered as the shard now answers
		return
	}
	// Commands whose job's armed runs have gone first, then what is due (armed.go).
	c.unpark(env)
	c.rearmHeld()
	dueJobs, dueAt := c.dueJobs[:0], c.dueAt[:0]
	c.due.Advance(nowMs+c.ahead(), func(dueMs int64, payload uint64) {
		dueJobs = append(dueJobs, int64(payload))
		dueAt = append(dueAt, dueMs)
	})
	c.dueJobs, c.dueAt = dueJobs, dueAt
	for i, id := range dueJobs {
		if j := c.job(id); j != nil {
			j.handle = 0
			if dueAt[i] > nowMs && c.hasParked(id) {
				c.armHeld = append(c.armHeld, id) // not armed ahead while a command waits (armed.go)
				continue
			}
			c.fire(j, dueAt[i], nowMs)
		}
	}
	var expired []int64
	c.expire.Advance(nowMs, func(_ int64, payload uint64) { expired = append(expired, int64(payload)) })
	for _, id := range expired {
		j := c.jobs[id]
		if j == nil {
			j = c.unpackJob(id) // its runs, if any, decide below
		}
		if j == nil {
			continue
		}
		j.expiry = 0
		switch at := c.expiryAt(j); {
		case j.j.State != messages.JobState_DONE:
		case c.runsOf[id] > 0: // a run or retry still going: not yet
			j.expiry = c.expire.Add(nowMs+expiryRecheckMs, uint64(id))
			c.queuePack(id) // packed again once nothing goes on
		case at > nowMs: // armed before its finish moved it (armExpiry)
			j.expiry = c.expire.Add(at, uint64(id))
			c.queuePack(id)
		default:
			c.emit(messages.RecordType_JOB_DELETED, &messages.JobRef{Id: id, AtMs: nowMs})
		}
	}
	var dueRuns []uint64
	c.timers.Advance(nowMs, func(_ int64, payload uint64) { dueRuns = append(dueRuns, payload) })
	recounted := false
	for _, s := range dueRuns {
		r := c.bySeq[s]
		if r == nil {
			continue
		}
		r.handle = 0
		switch {
		case r.held: // held a long while: count again, in case a count went wrong
			if !recounted {
				c.recount()
				recounted = true
			}
			c.armRun(r, nowMs+HeldRecheckMs) // sendHeld below sends it if it can go now
		case r.st.Level >= 0: // a retry whose delay is over
			c.retryNow(r, nowMs)
		case r.st.WorkerId == "": // no worker was live: try again
			c.dispatch(r, nowMs)
		default: // no result by the deadline
			c.finish(r, &messages.RunResult{RunId: r.st.RunId, JobId: r.st.JobId, Attempt: r.st.Attempt,
				Outcome: messages.Outcome_LOST, Error: fmt.Sprintf("no result within %d ms", r.st.DeadlineMs-r.st.DispatchedMs),
				WorkerId: r.st.WorkerId, EndMs: nowMs}, nowMs)
		}
	}
	c.flush(env)
	c.unpark(env)
}

// A job's policy, field by field: the job's own, else its app's (Config.AppPolicy),
// else the node's default.

func (c *Core) timeout(jobID int64) int64 {
	if j := c.job(jobID); j != nil && j.j.Policy.GetTimeoutMs() > 0 {
		return j.j.Policy.GetTimeoutMs()
	}
	if t := c.cfg.AppPolicy.GetTimeoutMs(); t > 0 {
		return t
	}
	return c.cfg.DefaultTimeout
}

func (c *Core) attempts(j *job) int32 {
	if j != nil && j.j.Policy.GetAttempts() > 0 {
		return j.j.Policy.GetAttempts()
	}
	if n := c.cfg.AppPolicy.GetAttempts(); n > 0 {
		return n
	}
	return int32(c.cfg.DefaultAttempts)
}

func (c *Core) ladder(j *job) []int64 {
	if j != nil && len(j.j.Policy.GetLadderMs()) > 0 {
		return j.j.Policy.GetLadderMs()
	}
	if l := c.cfg.AppPolicy.GetLadderMs(); len(l) > 0 {
		return l
	}
	return c.cfg.DefaultLadderMs
}

func (c *Core) misfire(j *job) messages.Misfire {
	if m := j.j.Policy.GetMisfire(); m != messages.Misfire_MISFIRE_DEFAULT {
		return m
	}
	return c.cfg.AppPolicy.GetMisfire() // MISFIRE_DEFAULT: fire once
}

func (c *Core) concurrency(j *job) messages.Concurrency {
	if m := j.j.Policy.GetConcurrency(); m != messages.Concurrency_CONCURRENCY_DEFAULT {
		return m
	}
	return c.cfg.AppPolicy.GetConcurrency() // CONCURRENCY_DEFAULT: allow
}

// routing is the job's routing and its route key: a job that sets a routing uses
// its own key (or, if it has none, the app's); one that does not takes both from
// the app.
func (c *Core) routing(j *job) (messages.Route, string) {
	if j == nil {
		return messages.Route_ROUND_ROBIN, ""
	}
	return c.routingOf(j.j.Policy)
}

func (c *Core) routingOf(p *messages.Policy) (messages.Route, string) {
	if r := p.GetRoute(); r != messages.Route_ROUTE_DEFAULT {
		k := p.GetRouteKey()
		if k == "" {
			k = c.cfg.AppPolicy.GetRouteKey()
		}
		return r, k
	}
	return c.cfg.AppPolicy.GetRoute(), c.cfg.AppPolicy.GetRouteKey() // ROUTE_DEFAULT: round robin
}

// checkRouteKey refuses params that a consistent_hash routing on key cannot hash:
// not a JSON object, or one without that top-level field (every run would hash
// the same empty key and go to one worker).
func (c *Core) checkRouteKey(p *messages.Policy, params []byte) *messages.Error {
	route, key := c.routingOf(p)
	if route != messages.Route_CONSISTENT_HASH {
		return nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(params, &m) != nil || m == nil {
		return kerr.Invalid("params", "consistent_hash routing on %q needs params that are a JSON object with that field", key)
	}
	if _, ok := m[key]; !ok {
		return kerr.Invalid("policy.route_key", "%q is not a top-level field of the params, so consistent_hash has nothing to hash", key)
	}
	return nil
}

// runID names the run of job jobID due at dueMs: "job:due", and "job:due.N" when a
// run of that name is still in flight (a trigger in the same millisecond as a fire, a
// due re-armed by an update while its run goes on), is in the dead-letter queue, or is
// in the job's history (an update re-armed a one-shot whose run already ran: the
// same id would be a second dead letter of one run, and a duplicate a worker drops).
// The due itself never moves: a run is never dispatched before the time it was due.
func (c *Core) runID(jobID, dueMs int64) string {
	var b [41]byte // two int64s and the colon, built in place: one allocation, not three
	base := string(strconv.AppendInt(append(strconv.AppendInt(b[:0], jobID, 10), ':'), dueMs, 10))
	if !c.runTaken(jobID, dueMs, base) {
		return base
	}
	for n := 2; ; n++ {
		if id := base + "." + strconv.Itoa(n); !c.runTaken(jobID, dueMs, id) {
			return id
		}
	}
}

func (c *Core) runTaken(jobID, dueMs int64, id string) bool {
	if c.runs[id] != nil || c.dead[id] != nil {
		return true
	}
	if j := c.jobs[jobID]; j != nil { // (a job whose run is being named is full)
		for _, r := range j.history {
			if r.DueMs == dueMs && r.RunId == id {
				return true
			}
		}
	}
	return false
}

func (c *Core) traceparent() string {
	c.trace++
	hi := c.rng.Uint64()
	lo := c.rng.Uint64() ^ c.trace
	span := c.rng.Uint64() | 1
	// "00-" trace id (32 hex) "-" span id (16 hex) "-01", without fmt (one allocation).
	var b [55]byte
	copy(b[:], "00-")
	hex64(b[3:19], hi)
	hex64(b[19:35], lo)
	b[35] = '-'
	hex64(b[36:52], span)
	copy(b[52:], "-01")
	return string(b[:])
}

func hex64(dst []byte, v uint64) {
	const digits = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		dst[i] = digits[v&0xf]
		v >>= 4
	}
}

// fire starts the run of job j that was due at dueMs.
func (c *Core) fire(j *job, dueMs, nowMs int64) {
	if j.j.State != messages.JobState_ACTIVE {
		return
	}
	if dueMs > nowMs { // armed (Config.ArmMs): the run goes at its due
		nowMs = dueMs
	}
	runs := j.j.Runs + 1
	var next int64
	if j.sched != nil && j.j.Schedule.GetKind() != messages.ScheduleKind_FIXED_DELAY {
		if n, ok := j.sched.Next(dueMs, runs); ok {
			next = n
		}
	}
	if c.concurrency(j) == messages.Concurrency_FORBID && c.runsOf[j.j.Id] > 0 {
		// The previous run is still going, or waits on the ladder for its next
		// attempt: this fire is skipped, the schedule moves on, and the run history
		// says so.
		jj := proto.Clone(j.j).(*messages.Job)
		jj.NextDueMs = next
		jj.RequestId = 0
		c.emit(messages.RecordType_JOB_PUT, jj)
		c.emit(messages.RecordType_RUN_FINISHED, &messages.RunRecord{RunId: c.runID(j.j.Id, dueMs), JobId: j.j.Id, DueMs: dueMs,
			EndMs: nowMs, Outcome: messages.Outcome_SKIPPED, Error: "skipped: concurrency forbid, the previous run has not finished"})
		return
	}
	c.startRun(j, dueMs, nowMs, true, runs, next, nil, false)
}

func (c *Core) startRun(j *job, dueMs, nowMs int64, fire bool, runs, next int64, params []byte, hasParams bool) {
	id := c.runID(j.j.Id, dueMs)
	st := &messages.RunState{
		RunId: id, JobId: j.j.Id, DueMs: dueMs, Attempt: 1, DispatchedMs: nowMs,
		DeadlineMs: nowMs + c.timeout(j.j.Id) + c.cfg.GraceMs, Level: -1,
		Params: params, HasParams: hasParams, TraceId: c.traceparent(), Version: j.j.Version,
		Fire: fire, JobNextDueMs: next, JobRuns: runs, Handler: j.j.Handler, App: j.j.App,
		RequestId: c.reqID,
	}
	c.emit(messages.RecordType_RUN_DISPATCHED, st)
	c.firesTotal++
	sec := nowMs / 1000
	b := sec % int64(len(c.fireWin))
	if c.fireWinSec[b] != sec {
		c.fireWinSec[b], c.fireWin[b] = sec, 0
	}
	c.fireWin[b]++
	c.dispatch(c.runs[id], nowMs)
}

// pickWorkers chooses where a run goes, by the job's routing policy.
func (c *Core) route(r *run) messages.Route {
	pol, _ := c.routing(c.job(r.st.JobId))
	return pol
}

func (c *Core) pickWorkers(r *run) []*messages.WorkerInfo {
	ws := c.workers
	if len(ws) == 0 {
		return nil
	}
	pol, routeKey := c.routing(c.job(r.st.JobId))
	switch pol {
	case messages.Route_RANDOM:
		i := c.rng.IntN(len(ws))
		return ws[i : i+1]
	case messages.Route_LEAST_BUSY:
		best := ws[0]
		for _, w := range ws[1:] {
			if c.busy[w.WorkerId]*int(max(best.Capacity, 1)) < c.busy[best.WorkerId]*int(max(w.Capacity, 1)) {
				best = w
			}
		}
		return []*messages.WorkerInfo{best}
	case messages.Route_CONSISTENT_HASH:
		key := routeKeyValue(c.params(r), routeKey)
		var best *messages.WorkerInfo
		var bestScore uint64
		for _, w := range ws { // rendezvous hashing: stable as workers come and go
			s := route.HashString(key + "\x00" + w.WorkerId)
			if best == nil || s > bestScore {
				best, bestScore = w, s
			}
		}
		return []*messages.WorkerInfo{best}
	case messages.Route_BROADCAST:
		return ws
	default:
		c.rr++
		return []*messages.WorkerInfo{ws[c.rr%len(ws)]}
	}
}

func (c *Core) params(r *run) []byte { return c.paramsOf(r.st) }

// paramsOf is the params run st goes with: its own (a trigger's), else its job's.
func (c *Core) paramsOf(st *messages.RunState) []byte {
	if st.HasParams {
		return st.Params
	}
	if j := c.job(st.JobId); j != nil {
		return j.j.Params
	}
	return st.Params
}

// routeKeyValue extracts the top-level JSON field key from params ("" if absent).
func routeKeyValue(params []byte, key string) string {
	var m map[string]json.RawMessage
	if key == "" || json.Unmarshal(params, &m) != nil {
		return string(params)
	}
	return string(bytes.Trim(m[key], `"`))
}

// dispatch sends run r to a worker; with none live it waits and tries again; when
// every worker it may go to has its credit's worth of this shard's runs, it waits
// in the shard behind the runs that wait already (credit.go).
func (c *Core) dispatch(r *run, nowMs int64) {
	if r == nil || r.held {
		return
	}
	if c.heldN > 0 && c.pinned(r) == nil && c.route(r) != messages.Route_BROADCAST {
		if q := c.heldQueue(c.waitsFor(r)); q.len() > 0 {
			c.hold(r, q, nowMs) // behind the runs that wait already: in order
			return
		}
	}
	if ok, waitFor := c.place(r, nowMs); !ok {
		c.hold(r, c.heldQueue(waitFor), nowMs)
	}
}

// pinned is the worker r must go to again, if any: one it was sent to before
// (recovery, handoff) dedupes it, where another one would run it a second time.
func (c *Core) pinned(r *run) *messages.WorkerInfo {
	prev := r.st.WorkerId
	if prev == "" {
		prev = r.sentTo
	}
	if w := c.known[prev]; w != nil && prev != "" && c.route(r) != messages.Route_BROADCAST {
		return w
	}
	return nil
}

// place sends r to a worker now, or arms its no-worker retry; false when every
// worker it may go to is out of credit (the caller holds it, waiting for waitFor:
// the worker it must go to, or "" for any).
func (c *Core) place(r *run, nowMs int64) (ok bool, waitFor string) {
	ws := c.pickWorkers(r)
	if w := c.pinned(r); w != nil {
		ws = []*messages.WorkerInfo{w} // not held back: its worker has it already, or had it
	} else if len(ws) > 0 && c.route(r) != messages.Route_BROADCAST {
		w := c.withCredit(r, ws[0])
		if w == nil {
			return false, c.waitsForPicked(r, ws[0])
		}
		if w != ws[0] {
			ws = []*messages.WorkerInfo{w} // (not in place: pickWorkers may hand out a slice of c.workers)
		}
	}
	c.ownSt(r)
	if len(ws) == 0 {
		if r.st.WorkerId != "" {
			r.sentTo = r.st.WorkerId
		}
		r.st.WorkerId = ""
		c.armRun(r, nowMs+NoWorkerRetryMs)
		return true, ""
	}
	handler, app := r.st.Handler, r.st.App
	if j := c.job(r.st.JobId); j != nil {
		handler, app = j.j.Handler, j.j.App
	}
	r.st.WorkerId = ws[0].WorkerId
	c.busy[r.st.WorkerId]++
	nowMs = max(nowMs, r.st.DueMs) // an armed run (a worker came, recovery) goes at its due (release)
	r.st.DispatchedMs = nowMs
	r.st.DeadlineMs = nowMs + c.timeout(r.st.JobId) + c.cfg.GraceMs
	for _, w := range ws {
		c.send(w.Ref, &messages.Dispatch{
			RunId: r.st.RunId, JobId: r.st.JobId, App: app, Handler: handler, Params: c.params(r),
			DueMs: r.st.DueMs, Attempt: r.st.Attempt, TimeoutMs: c.timeout(r.st.JobId),
			Shard: c.name, Epoch: c.epoch, ReplyTo: c.cfg.Self,
			Traceparent: r.st.TraceId, DispatchedMs: nowMs,
		})
	}
	c.armRun(r, r.st.DeadlineMs)
	return true, ""
}

// finish records a run's outcome and moves a failure up the retry ladder.
func (c *Core) finish(r *run, res *messages.RunResult, nowMs int64) {
	j := c.job(r.st.JobId)
	workerID := res.WorkerId
	if w := c.known[workerID]; w != nil {
		workerID = w.WorkerId // the shard's copy: the history keeps many records of few workers
	}
	rec := &messages.RunRecord{
		RunId: r.st.RunId, JobId: r.st.JobId, DueMs: r.st.DueMs, DispatchedMs: r.st.DispatchedMs,
		StartMs: res.StartMs, EndMs: res.EndMs, Attempt: r.st.Attempt, WorkerId: workerID,
		Outcome: res.Outcome, Error: res.Error, TraceId: r.st.TraceId,
	}
	if rec.EndMs == 0 {
		rec.EndMs = nowMs
	}
	ok := res.Outcome == messages.Outcome_SUCCEEDED
	last := ok || r.st.Attempt >= c.attempts(j)
	// A fixed-delay job's next due follows the finish of its fire — or of any run
	// when it has none (an update or resume while a run went on leaves it to the
	// finish). A fire armed ahead of its due is one: its own finish sets the next
	// (another run finishing meanwhile made that due again, and it fired twice).
	waits := j != nil && j.j.NextDueMs == 0 && j.j.State == messages.JobState_ACTIVE && j.j.LastDueMs <= c.seenMs
	if j != nil && last && j.j.Schedule.GetKind() == messages.ScheduleKind_FIXED_DELAY && (r.st.Fire || waits) && j.sched != nil {
		rec.SetsNext = true
		// The owner's clock, not the worker's (sim seed 181); but never a due that
		// fired already (a clock that stepped back made the run's own due again).
		n, okN := j.sched.AfterFinish(nowMs, j.j.Runs)
		if fired := max(r.st.DueMs, j.j.LastDueMs); okN && n <= fired {
			n, okN = j.sched.AfterFinish(fired, j.j.Runs)
		}
		if okN {
			rec.JobNextDueMs = n
		}
	}
	st := r.st
	c.emit(messages.RecordType_RUN_FINISHED, rec)
	if ok {
		return
	}
	c.followFailure(st, j, res.Error, nowMs)
}

// followFailure puts a failed attempt of run st (finished by a RUN_FINISHED just
// emitted) on its ladder, or in the dead-letter queue after its last attempt.
func (c *Core) followFailure(st *messages.RunState, j *job, errText string, nowMs int64) {
	if st.Attempt < c.attempts(j) {
		lad := c.ladder(j)
		level := int(st.Attempt - 1)
		if level >= len(lad) {
			level = len(lad) - 1
		}
		next := proto.Clone(st).(*messages.RunState)
		next.Attempt++
		next.Level = int32(level)
		next.DeadlineMs = nowMs + lad[level]
		next.LastError = errText
		next.WorkerId = ""
		if c.cfg.Mutations.ForgetRetryRecord {
			c.apply(messages.RecordType_RETRY_SCHEDULED, next)
		} else {
			c.emit(messages.RecordType_RETRY_SCHEDULED, next)
		}
		c.holdRetry(c.runs[next.RunId])
		return
	}
	d := &messages.DeadLetter{
		RunId: st.RunId, JobId: st.JobId, App: st.App, Handler: st.Handler, Params: c.paramsOf(st),
		DueMs: st.DueMs, Attempts: st.Attempt, LastError: errText, DeadMs: nowMs, Shard: c.cfg.Shard.String(),
	}
	if j != nil {
		d.App, d.Handler = j.j.App, j.j.Handler
	}
	c.emit(messages.RecordType_DEAD_LETTERED, d)
	c.ladderOps = append(c.ladderOps, ladderOp{dead: d})
}

// misfires applies each periodic job's misfire policy to fire times missed while
// the shard was down (its due time is already past at recovery).
func (c *Core) misfires(nowMs int64) {
	ids := make([]int64, 0)
	for id, j := range c.jobs {
		if j.handle != 0 && j.j.NextDueMs < nowMs && j.sched != nil && j.sched.Periodic() {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	for _, id := range ids {
		j := c.jobs[id]
		pol := schedule.FireOnce
		switch c.misfire(j) {
		case messages.Misfire_SKIP:
			pol = schedule.Skip
		case messages.Misfire_FIRE_ALL:
			pol = schedule.FireAll
		}
		// Under FORBID no two runs of the job overlap, and the missed dues would
		// all start now: fire_all fires the oldest only, as fire_once does; and
		// with a run from before the downtime still going, even that one is
		// skipped, as a fire would be, and the history says so.
		missed := j.j.NextDueMs
		busy := false
		if c.concurrency(j) == messages.Concurrency_FORBID {
			if pol == schedule.FireAll {
				pol = schedule.FireOnce
			}
			if busy = c.runsOf[id] > 0; busy {
				pol = schedule.Skip
			}
		}
		fires, next, ok := j.sched.Misfires(missed, nowMs, j.j.Runs, pol, MaxMisfireFireAll)
		if !ok {
			next = 0
		}
		runs := j.j.Runs
		for _, due := range fires {
			runs++
			c.startRun(j, due, nowMs, true, runs, next, nil, false)
		}
		if len(fires) == 0 {
			jj := proto.Clone(j.j).(*messages.Job)
			jj.NextDueMs = next
			jj.RequestId = 0
			c.emit(messages.RecordType_JOB_PUT, jj)
			if busy {
				c.emit(messages.RecordType_RUN_FINISHED, &messages.RunRecord{RunId: c.runID(id, missed), JobId: id, DueMs: missed,
					EndMs: nowMs, Outcome: messages.Outcome_SKIPPED, Error: "skipped: concurrency forbid, the previous run has not finished"})
			}
		}
	}
}
