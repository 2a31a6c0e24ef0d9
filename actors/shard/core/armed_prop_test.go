package core

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// armedPropSeeds are the seeds TestArmedFiresRandomized runs, each at every ArmMs
// of armedPropArms: 1 to 400 but those in armedPropKnownBugs. To replay a failure,
// set these two lists to its seed and ArmMs (the report names them, with the step
// and the clock), and lengthen the trace (note) if its last steps are not enough.
var armedPropSeeds = func() []uint64 {
	var s []uint64
	for seed := uint64(1); seed <= 400; seed++ {
		if !slices.Contains(armedPropKnownBugs, seed) {
			s = append(s, seed)
		}
	}
	return s
}()

// armedPropKnownBugs are seeds left out because they find bugs not fixed yet (put
// them back once they are). Found by this test and fixed in Core.finish: 318 (a
// fixed-delay job's next fire armed, another run's finish made its due again: two
// fires for one due), 201 and 210 (a fixed-delay run finishing on a clock that
// stepped back got a next due not after its own, ArmMs 0 too).
var armedPropKnownBugs = []uint64{}

var armedPropArms = []int64{5, 20, 100}

// The driver's bounds (virtual ms).
const (
	propStart    = 1000 // the clock's origin
	propCmdMs    = 600  // commands are sent for this long
	propMaxStep  = 3    // the clock moves 0..propMaxStep ms a step
	propLateTick = 5    // a tick may come up to this late after NextWake
	propLateSync = 3    // the journal may be durable up to this many steps late
	propBack     = 10   // a clock step back is at most this (some seeds)
	propIdle     = 50   // ticks in a row at one time that change nothing: a spin
)

// TestArmedFiresRandomized drives a shard with armed fires (Config.ArmMs) the way
// its shell does — a tick whenever NextWake has come (sometimes late), the journal
// durable sometimes late, results some time after their dispatch, workers that
// leave and come back, workers with little credit (runs held), on some seeds a
// clock that steps back a little — while random commands (update, delete, pause,
// resume, trigger, create) reach it; and checks after every step:
//
//  1. never early: no Dispatch has a DueMs after the latest time the shard was
//     given (the latest, as armed.go judges it: after a step back a dispatch that
//     was due stays due);
//  2. no fire's RUN_DISPATCHED is journaled more than ArmMs before its due, judged
//     on the time of the call that journaled it, even a step back's (the stricter
//     reading: the due wheel does not fire behind its own clock);
//  3. never twice: no two fire dispatches (attempt 1) of a job for one due — unless
//     an update or resume of the job was sent after the first fire was journaled
//     and once its due had come (then firing that due again is what the command
//     asked for: a one-shot updated to its time again; one parked behind the fire
//     must not fire it again, see firstDue);
//  4. after a delete's reply (or NOT_FOUND), nothing of the job is journaled or
//     dispatched; after a pause's reply, no fire of the job is journaled until a
//     resume is sent (a resume parked behind the pause, and sent before its reply,
//     counts: the fire it allows may come before that reply); a run started before
//     the pause goes on, and may be retried;
//  5. every command is answered, without error (NOT_FOUND aside: the job was
//     deleted), within a bound: a command waits at most for the runs armed before
//     it came (due at most ArmMs after it), then for a tick and the journal (see
//     propDeadline);
//  6. the shard does not spin: at most propIdle ticks in a row at one time that
//     change nothing, and a bounded number in all (see tick);
//  7. at the end, after the commands stop and the clock runs on, no command is
//     parked and every command was answered.
func TestArmedFiresRandomized(t *testing.T) {
	start := time.Now()
	var sum armedPropStats
	for _, seed := range armedPropSeeds {
		for _, arm := range armedPropArms {
			p := newArmedProp(t, seed, arm)
			if err := p.run(); err != nil {
				t.Errorf("seed %d, ArmMs %d: %v", seed, arm, err)
			}
			sum.add(p.stats)
		}
	}
	t.Logf("%d cases in %v: %+v", len(armedPropSeeds)*len(armedPropArms), time.Since(start).Round(time.Millisecond), sum)
}

type armedPropStats struct {
	Steps, Ticks, Commands, Parked, ArmHeld, Held, NoWorker, Fires, Refires, Retries, StepsBack int
}

func (s *armedPropStats) add(o armedPropStats) {
	s.Steps += o.Steps
	s.Ticks += o.Ticks
	s.Commands += o.Commands
	s.Parked += o.Parked
	s.ArmHeld += o.ArmHeld
	s.Held += o.Held
	s.NoWorker += o.NoWorker
	s.Fires += o.Fires
	s.Refires += o.Refires
	s.Retries += o.Retries
	s.StepsBack += o.StepsBack
}

type propCmd struct {
	kind     string
	job      int64
	seq      int   // the order commands were sent in
	sentMax  int64 // the latest time the shard was given when it was sent
	deadline int64 // answered by then (on that clock)
	answered bool
}

type propResult struct {
	at int64
	m  *messages.RunResult
}

type propFire struct {
	runID string
	rec   int // the record's index in the journal
}

type armedProp struct {
	t    *testing.T
	seed uint64
	arm  int64
	rng  *rand.Rand
	c    *Core
	e    *fakeEnv

	now, maxNow int64
	step        int
	stepBack    bool // this seed's clock sometimes steps back
	backNext    bool // a command was just sent: a step back is likelier
	capacity    int32
	workerUp    bool
	resultMax   int64
	hot         bool // half the commands go to job 1 (commands queue behind one another)
	burstJob    int64
	burstAt     int64 // when the next command for burstJob goes (0: none)

	defs    map[int64]*messages.Job // the definition last sent for each job
	ids     []int64                 // every job created, in order
	nextJob int64
	reqN    int
	cmds    map[string]*propCmd // by the Ref Id it was sent from
	open    []*propCmd          // not yet answered

	results  []propResult
	syncAt   int // the step the journal is next made durable at (0: nothing to sync)
	logSeen  int
	fireOf   map[string]bool       // run id -> its attempt 1 was a fire
	recOf    map[string]int        // run id -> the index of its attempt 1's record
	fired    map[[2]int64]propFire // (job, due) -> its fire dispatch
	lastFire map[int64]int64       // job -> the due of its latest fire record
	redefs   map[int64][][2]int64  // job -> (records journaled, maxNow) when each update or resume was sent
	deleted  map[int64]bool        // the reply to a delete of the job was seen
	paused   map[int64]bool        // the reply to a pause was seen, no resume sent since
	resumeAt map[int64]int         // job -> seq of the latest resume sent

	wakeSince  int64 // when NextWake was first seen due (-1: not due)
	lateBy     int64
	idleAt     int64 // the time of the idle ticks counted
	idle       int
	ticksAt    int      // ticks at idleAt, idle or not
	trace      []string // the last steps, for a failure's report
	err        error
	stats      armedPropStats
	parkedSeen int
}

func newArmedProp(t *testing.T, seed uint64, arm int64) *armedProp {
	p := &armedProp{t: t, seed: seed, arm: arm, rng: rand.New(rand.NewPCG(seed, uint64(arm))),
		defs: map[int64]*messages.Job{}, cmds: map[string]*propCmd{}, fireOf: map[string]bool{}, recOf: map[string]int{},
		fired: map[[2]int64]propFire{}, lastFire: map[int64]int64{}, redefs: map[int64][][2]int64{},
		deleted: map[int64]bool{}, paused: map[int64]bool{}, resumeAt: map[int64]int{},
		wakeSince: -1, nextJob: 1}
	p.stepBack = seed%3 == 0
	p.capacity = []int32{1, 1, 2, 4, 64}[p.rng.IntN(5)] // credit is 16 runs per slot: 1 holds runs
	p.resultMax = []int64{3, 30, 120}[p.rng.IntN(3)]
	p.hot = p.rng.IntN(3) == 0
	p.c, p.e = newArmedCore(propStart, arm)
	p.now, p.maxNow = propStart, propStart
	p.setWorkers(true)
	return p
}

func (p *armedProp) failf(format string, args ...any) {
	if p.err != nil {
		return
	}
	p.err = fmt.Errorf("step %d, now %d (latest %d): %s\nlast steps:\n  %s", p.step, p.now, p.maxNow,
		fmt.Sprintf(format, args...), strings.Join(p.trace, "\n  "))
}

func (p *armedProp) note(format string, args ...any) {
	if len(p.trace) == 12 {
		p.trace = append(p.trace[:0], p.trace[1:]...)
	}
	p.trace = append(p.trace, fmt.Sprintf("step %d now %d: ", p.step, p.now)+fmt.Sprintf(format, args...))
}

func (p *armedProp) run() error {
	for range 6 {
		p.create()
	}
	end := int64(propStart + propCmdMs + 2*p.arm + 300)
	for p.err == nil && p.now < end {
		p.step++
		p.stats.Steps++
		p.advance()
		if p.syncAt != 0 && p.step >= p.syncAt {
			p.syncAt = 0
			p.note("durable %d", p.e.lsn)
			p.c.Durable(p.e.lsn, nil, p.e)
			p.after()
		}
		p.deliverResults()
		if p.now < propStart+propCmdMs {
			if p.burstAt != 0 && p.now >= p.burstAt {
				p.burstAt = 0
				p.command(p.burstJob)
			} else if p.rng.IntN(8) == 0 {
				p.command(0)
			}
			if p.workerUp && p.rng.IntN(300) == 0 || !p.workerUp && p.rng.IntN(25) == 0 {
				p.setWorkers(!p.workerUp || p.rng.IntN(3) == 0) // down, back, or a new capacity
			}
		} else if !p.workerUp {
			p.setWorkers(true)
		}
		p.tick()
		if len(p.c.armHeld) > 0 {
			p.stats.ArmHeld++
		}
		if p.c.Held() > 0 {
			p.stats.Held++
		}
		p.checkDeadlines()
	}
	if p.err != nil {
		return p.err
	}
	if n := len(p.c.parked); n > 0 {
		p.failf("at the end, %d commands still parked (first: %T for job %d)", n, p.c.parked[0].m, changesJob(p.c.parked[0].m))
	}
	for _, c := range p.open {
		p.failf("at the end, %s of job %d sent at %d never answered", c.kind, c.job, c.sentMax)
	}
	return p.err
}

// advance moves the clock 0..propMaxStep ms, or on a step-back seed sometimes back.
//
// A step back comes at random, and more often just after a command: the command's
// records are then made durable, and its reply released, on a clock behind the
// dues the shard had reached (the fourth review's delete reply that overtook a
// dispatch held again).
func (p *armedProp) advance() {
	if p.stepBack && (p.rng.IntN(60) == 0 || p.backNext && p.rng.IntN(3) == 0) {
		p.backNext = false
		p.now -= 1 + p.rng.Int64N(propBack)
		p.stats.StepsBack++
		p.note("clock back to %d", p.now)
		return
	}
	p.backNext = false
	p.now += p.rng.Int64N(propMaxStep + 1)
	p.maxNow = max(p.maxNow, p.now)
}

// propDeadline is when a command sent now must have been answered. A command waits
// for the armed runs of its job that were armed before it came (due at most ArmMs
// after the latest time the shard was given; no run of it is armed ahead while it
// waits), then for the tick at that due — which this driver gives at most
// propLateTick late, and on a clock that moves up to propMaxStep a step — and then
// for its record to be durable (at most propLateSync steps late). The slack covers the
// steps' overshoot and a clock step back. A command not parked waits only for the
// journal.
func (p *armedProp) propDeadline() int64 {
	return p.maxNow + p.arm + propLateTick + (propLateSync+4)*propMaxStep + propBack + 5
}

func (p *armedProp) checkDeadlines() {
	for _, c := range p.open {
		if p.maxNow > c.deadline {
			parked := 0
			for _, x := range p.c.parked {
				if changesJob(x.m) == c.job {
					parked++
				}
			}
			d, armed := p.c.armedDue(c.job)
			p.failf("%s of job %d (sent at %d) not answered by %d; %d parked for the job, armed due %d %v, next wake %v",
				c.kind, c.job, c.sentMax, c.deadline, parked, d, armed, fmt.Sprint(p.c.NextWake()))
			return
		}
	}
}

// tick ticks the shard while NextWake has come, as the shell's timer does, but
// sometimes late (propLateTick). A tick that changes nothing (no record, no
// message, no command handled) while NextWake stays at or before now is a spin:
// more than propIdle in a row at one time fail. A tick that does something is not
// counted: a job whose period is shorter than ArmMs is armed one due per tick
// (the due wheel fires an entry added at or before its clock at the next Advance),
// which at ArmMs 100 and a 1 ms period is 100 ticks at one time, all of them work.
func (p *armedProp) tick() {
	for p.err == nil {
		at, ok := p.c.NextWake()
		if !ok || at > p.now {
			p.wakeSince = -1
			return
		}
		if p.wakeSince < 0 {
			p.wakeSince = p.now
			p.lateBy = 0
			if p.rng.IntN(4) == 0 {
				p.lateBy = 1 + p.rng.Int64N(propLateTick)
			}
		}
		if p.now-p.wakeSince < p.lateBy {
			return // the timer is late
		}
		lsn, parked := p.e.lsn, len(p.c.parked)
		p.note("tick (wake %d)", at)
		p.c.Tick(p.now, p.e)
		p.stats.Ticks++
		sent := len(p.e.sent)
		p.after()
		if p.idleAt != p.now {
			p.idleAt, p.idle, p.ticksAt = p.now, 0, 0
		}
		if p.ticksAt++; p.ticksAt > int(20*p.arm)+1000 {
			p.failf("the shard spins: %d ticks at %d", p.ticksAt, p.now)
		}
		if p.e.lsn != lsn || sent > 0 || len(p.c.parked) != parked {
			p.idle = 0
			continue
		}
		if p.idle++; p.idle > propIdle {
			at, _ := p.c.NextWake()
			p.failf("the shard spins: %d ticks at %d changed nothing, next wake %d", p.idle, p.now, at)
		}
	}
}

// after checks what the last call to the core journaled and sent.
func (p *armedProp) after() {
	for i := p.logSeen; i < len(p.e.log); i++ {
		r := p.e.log[i]
		if messages.RecordType(r.Type) != messages.RecordType_RUN_DISPATCHED {
			continue
		}
		st := decodeRunState(p.t, r)
		if p.deleted[st.JobId] {
			p.failf("run %s (attempt %d) of job %d journaled after the reply to its delete", st.RunId, st.Attempt, st.JobId)
		}
		if st.Attempt == 1 {
			p.fireOf[st.RunId], p.recOf[st.RunId] = st.Fire, i
		} else {
			p.stats.Retries++
		}
		if !st.Fire {
			continue
		}
		if st.DueMs-p.arm > p.now {
			p.failf("fire %s journaled at %d, more than ArmMs %d before its due %d", st.RunId, p.now, p.arm, st.DueMs)
		}
		if p.paused[st.JobId] {
			p.failf("fire %s of job %d journaled after the reply to its pause", st.RunId, st.JobId)
		}
		p.lastFire[st.JobId] = st.DueMs
		p.stats.Fires++
	}
	p.logSeen = len(p.e.log)
	if len(p.c.parked) > p.parkedSeen {
		p.stats.Parked += len(p.c.parked) - p.parkedSeen
	}
	p.parkedSeen = len(p.c.parked)
	for _, s := range p.e.take() {
		switch m := s.m.(type) {
		case *messages.Dispatch:
			p.dispatched(m)
		case *messages.JobReply:
			p.replied(s.to, m)
		case *messages.ResultAck:
		default:
			p.failf("unexpected %T to %v", s.m, s.to)
		}
	}
	if p.e.lsn > p.c.durable && p.syncAt == 0 {
		switch p.rng.IntN(3) {
		case 0:
			p.c.Durable(p.e.lsn, nil, p.e) // synced at once
			p.after()
		default:
			p.syncAt = p.step + 1 + p.rng.IntN(propLateSync)
		}
	}
}

func (p *armedProp) dispatched(d *messages.Dispatch) {
	if d.DueMs > p.maxNow {
		p.failf("dispatch %s (due %d) sent early: the shard was given %d at the latest", d.RunId, d.DueMs, p.maxNow)
	}
	if p.deleted[d.JobId] {
		p.failf("dispatch %s of job %d sent after the reply to its delete", d.RunId, d.JobId)
	}
	fire, ok := p.fireOf[d.RunId]
	if !ok {
		p.failf("dispatch of run %s, never journaled", d.RunId)
	}
	if fire && d.Attempt == 1 {
		k := [2]int64{d.JobId, d.DueMs}
		if f, twice := p.fired[k]; twice {
			// Fired again for that due: only an update or resume that came after the
			// first fire was journaled and once its due had come asks for that (a
			// one-shot updated to its time again); one parked behind the fire must not.
			asked := false
			for _, r := range p.redefs[d.JobId] {
				if r[0] > int64(f.rec) && r[1] >= d.DueMs {
					asked = true
				}
			}
			if !asked {
				p.failf("job %d fired twice for due %d: %s, then %s", d.JobId, d.DueMs, f.runID, d.RunId)
			}
			p.stats.Refires++
		}
		p.fired[k] = propFire{d.RunId, p.recOf[d.RunId]}
	}
	outcome := messages.Outcome_SUCCEEDED
	if p.rng.IntN(4) == 0 {
		outcome = messages.Outcome_FAILED
	}
	p.results = append(p.results, propResult{p.now + p.rng.Int64N(p.resultMax+1), &messages.RunResult{
		RunId: d.RunId, JobId: d.JobId, Attempt: d.Attempt, Epoch: 1, Outcome: outcome, WorkerId: "w1", Worker: wref}})
}

func (p *armedProp) replied(to *messages.Ref, r *messages.JobReply) {
	c := p.cmds[to.GetId()]
	if c == nil {
		p.failf("a reply to %v, which sent nothing: %v", to, r)
		return
	}
	if c.answered {
		p.failf("%s of job %d answered twice", c.kind, c.job)
	}
	c.answered = true
	for i, x := range p.open {
		if x == c {
			p.open = append(p.open[:i], p.open[i+1:]...)
			break
		}
	}
	if p.maxNow > c.deadline {
		p.failf("%s of job %d (sent at %d) answered at %d, after %d", c.kind, c.job, c.sentMax, p.maxNow, c.deadline)
	}
	switch c.kind {
	case "delete":
		if r.Error == nil || r.Error.Code == messages.Code_NOT_FOUND {
			p.deleted[c.job] = true
		}
	case "pause":
		if r.Error == nil && r.Job.GetState() == messages.JobState_PAUSED && p.resumeAt[c.job] < c.seq {
			p.paused[c.job] = true
		}
	}
	if r.Error != nil && r.Error.Code != messages.Code_NOT_FOUND {
		p.failf("%s of job %d: %v", c.kind, c.job, r.Error)
	}
}

func (p *armedProp) deliverResults() {
	for p.err == nil {
		i := -1
		for k, r := range p.results {
			if r.at <= p.now && (i < 0 || r.at < p.results[i].at) {
				i = k
			}
		}
		if i < 0 {
			return
		}
		r := p.results[i]
		p.results = append(p.results[:i], p.results[i+1:]...)
		p.note("result %s attempt %d %v", r.m.RunId, r.m.Attempt, r.m.Outcome)
		p.c.Handle(p.now, wref, r.m, p.e)
		p.after()
	}
}

func (p *armedProp) setWorkers(up bool) {
	p.workerUp = up
	var ws []*messages.WorkerInfo
	if up {
		if p.rng.IntN(4) == 0 {
			p.capacity = []int32{1, 2, 64}[p.rng.IntN(3)]
		}
		ws = []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: wref, Capacity: p.capacity}}
	} else {
		p.stats.NoWorker++
	}
	p.note("workers up %v capacity %d", up, p.capacity)
	p.c.SetWorkers(p.now, ws, p.e)
	p.after()
}

func (p *armedProp) schedule(job int64) *messages.Schedule {
	switch p.rng.IntN(6) {
	case 0:
		at := p.maxNow + p.rng.Int64N(150) - 10
		if d, ok := p.lastFire[job]; ok && p.rng.IntN(2) == 0 {
			at = d + p.rng.Int64N(5) - 2 // about a due it fired (or armed): firstDue's case
		}
		return &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: at}
	case 1:
		return &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: p.rng.Int64N(150)}
	case 2, 3:
		return &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 1 + p.rng.Int64N(100)}
	default:
		return &messages.Schedule{Kind: messages.ScheduleKind_FIXED_DELAY, EveryMs: 1 + p.rng.Int64N(50)}
	}
}

func (p *armedProp) policy() *messages.Policy {
	var pol *messages.Policy
	if p.rng.IntN(3) == 0 {
		pol = &messages.Policy{Concurrency: messages.Concurrency_FORBID}
	}
	if p.rng.IntN(2) == 0 {
		if pol == nil {
			pol = &messages.Policy{}
		}
		pol.Attempts = 1 + p.rng.Int32N(3)
		pol.LadderMs = []int64{1 + p.rng.Int64N(30)}
	}
	return pol
}

// send hands m to the shard from a Ref of its own, by which its reply is known.
func (p *armedProp) send(kind string, job int64, m proto.Message) {
	p.reqN++
	from := &messages.Ref{Address: "c", Id: fmt.Sprint("req-", p.reqN)}
	c := &propCmd{kind: kind, job: job, seq: p.reqN, sentMax: p.maxNow, deadline: p.propDeadline()}
	p.cmds[from.Id] = c
	p.open = append(p.open, c)
	p.stats.Commands++
	switch kind {
	case "update", "resume":
		p.redefs[job] = append(p.redefs[job], [2]int64{int64(p.logSeen), p.maxNow})
	}
	switch kind {
	case "resume":
		p.resumeAt[job] = p.reqN
		p.paused[job] = false // a fire may follow once it is handled (it may be parked)
	}
	p.note("%s job %d (req-%d): %v", kind, job, p.reqN, m)
	p.c.Handle(p.now, from, m, p.e)
	p.backNext = true
	p.after()
}

func (p *armedProp) create() {
	id := p.nextJob
	p.nextJob++
	j := &messages.Job{Id: id, App: "app", Handler: "h", Params: []byte(fmt.Sprint("p", id)),
		Schedule: p.schedule(id), Policy: p.policy()}
	p.defs[id] = j
	p.ids = append(p.ids, id)
	p.send("create", id, &messages.CreateJob{Job: j, RequestId: int64(100_000 + p.reqN + 1)})
}

// command sends a random command for job id (0: a random job, or a new one). A
// third of them is followed within propMaxStep ms by another for the same job.
func (p *armedProp) command(id int64) {
	if id == 0 && p.rng.IntN(12) == 0 && len(p.ids) < 12 {
		p.create()
		return
	}
	if id == 0 {
		id = p.ids[p.rng.IntN(len(p.ids))]
		if p.hot && p.rng.IntN(2) == 0 {
			id = p.ids[0]
		}
	}
	if p.rng.IntN(3) == 0 {
		p.burstJob, p.burstAt = id, p.now+p.rng.Int64N(propMaxStep+1)
	}
	rq := int64(100_000 + p.reqN + 1) // a fresh request id per command
	switch k := p.rng.IntN(20); {
	case k < 7:
		u := proto.Clone(p.defs[id]).(*messages.Job)
		switch p.rng.IntN(3) {
		case 0:
			u.Params = []byte(fmt.Sprint("p", id, ".", p.reqN))
		case 1:
			u.Schedule = p.schedule(id)
		default:
			u.Schedule, u.Policy = p.schedule(id), p.policy()
		}
		p.defs[id] = u
		p.send("update", id, &messages.UpdateJob{Job: u, RequestId: rq})
	case k < 9:
		p.send("delete", id, &messages.DeleteJob{App: "app", Id: id, RequestId: rq})
	case k < 13:
		p.send("pause", id, &messages.PauseJob{App: "app", Id: id, RequestId: rq})
	case k < 17:
		p.send("resume", id, &messages.ResumeJob{App: "app", Id: id, RequestId: rq})
	default:
		p.send("trigger", id, &messages.TriggerJob{App: "app", Id: id, RequestId: rq})
	}
}
