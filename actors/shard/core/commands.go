package core

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/schedule"
	"github.com/kjob/kjob/messages"
)

// Handle applies one message from from (a client request or a worker's result) and
// queues its reply behind the journal.
func (c *Core) Handle(nowMs int64, from *messages.Ref, m proto.Message, env Env) {
	c.setNow(nowMs)
	if p, ok := m.(*messages.CreateJobs); ok && len(p.Packed) > 0 {
		b, err := p.Unpacked()
		if err != nil { // none of it applied: the client tries each create alone
			if from != nil {
				env.Send(from, &messages.CreateJobsReply{Error: kerr.Invalid("packed", "%v", err)})
			}
			return
		}
		m = b // handled as the CreateJobs it stands for
	}
	switch x := m.(type) {
	case *messages.RunResult:
		c.result(x, from, nowMs)
		c.flush(env)
		return
	case *messages.RunResults: // a worker's results that were ready at once
		for _, res := range x.Results {
			if res != nil {
				c.result(res, from, nowMs)
			}
		}
		c.flush(env)
		return
	}
	if c.failed != nil {
		if from != nil {
			env.Send(from, errorReply(m, kerr.New(messages.Code_UNAVAILABLE, "", "%v", c.failed)))
		}
		return
	}
	if c.frozen != nil {
		c.send(from, errorReply(m, c.frozen))
		c.flush(env)
		return
	}
	if c.park(from, m) {
		return // handled once the job's armed run has gone (armed.go)
	}
	c.noRoom = roomFor(m, env, c.cfg.Mutations.RefuseAllNoRoom)
	defer c.clearRoom()
	if b, ok := m.(*messages.CreateJobs); ok {
		// Each create as if it came alone; one reply, behind all their records.
		out := &messages.CreateJobsReply{Replies: make([]*messages.JobReply, len(b.Jobs))}
		c.warmSum += c.cold.idx.warm(len(b.Jobs), func(i int) int64 { return b.Jobs[i].GetJob().GetId() })
		rs := make([]messages.JobReply, len(b.Jobs)) // the replies in one allocation: most go no further than Lean
		for i, x := range b.Jobs {
			if x == nil {
				out.Replies[i] = &messages.JobReply{Error: kerr.Invalid("jobs", "create %d of the batch is empty", i)}
				continue
			}
			out.Replies[i] = c.commandInto(x, nowMs, &rs[i]).(*messages.JobReply)
		}
		if b.LeanReplies {
			out = messages.Lean(b.Jobs, out.Replies)
		}
		out.TakesPacked = true
		c.send(from, out)
		c.flush(env)
		return
	}
	c.send(from, c.command(m, nowMs))
	c.flush(env)
}

// roomFor is the refusal of new work while env's journal is out of disk (Roomy),
// for the messages that bring new work (any, mutated); nil for the rest.
func roomFor(m proto.Message, env Env, mutated bool) *messages.Error {
	switch m.(type) {
	case *messages.CreateJob, *messages.CreateJobs, *messages.UpdateJob, *messages.TriggerJob, *messages.ReplayDeadLetter:
	default:
		if !mutated {
			return nil
		}
	}
	r, ok := env.(Roomy)
	if !ok {
		return nil
	}
	if err := r.JournalRoom(); err != nil {
		return kerr.New(messages.Code_RESOURCE_EXHAUSTED, "journal", "no new work is taken: %v", err)
	}
	return nil
}

func (c *Core) clearRoom() { c.noRoom = nil }

func errorReply(m proto.Message, e *messages.Error) proto.Message {
	switch x := m.(type) {
	case *messages.CreateJobs:
		out := &messages.CreateJobsReply{Replies: make([]*messages.JobReply, len(x.Jobs)), TakesPacked: true}
		for i := range out.Replies {
			out.Replies[i] = &messages.JobReply{Error: e}
		}
		return out
	case *messages.ListJobs:
		return &messages.ListJobsReply{Error: e}
	case *messages.GetRuns:
		return &messages.RunsReply{Error: e}
	case *messages.ListDeadLetters:
		return &messages.DeadLettersReply{Error: e}
	case *messages.GetDeadLetter, *messages.ReplayDeadLetter, *messages.PurgeDeadLetters:
		return &messages.DeadLetterReply{Error: e}
	default:
		return &messages.JobReply{Error: e}
	}
}

func (c *Core) command(m proto.Message, nowMs int64) proto.Message {
	return c.commandInto(m, nowMs, nil)
}

// commandInto is command, a create's reply written to r when r is not nil (a
// batch's, allocated together).
func (c *Core) commandInto(m proto.Message, nowMs int64, r *messages.JobReply) proto.Message {
	c.reqID = requestID(m)
	defer func() { c.reqID = 0 }()
	if s, ok := c.reqs.has(c.reqID); c.reqID != 0 && ok {
		return c.duplicate(m, s)
	}
	if c.noRoom != nil && c.cfg.Mutations.RefuseAllNoRoom {
		return errorReply(m, c.noRoom)
	}
	switch x := m.(type) {
	case *messages.CreateJob:
		if r == nil {
			r = &messages.JobReply{}
		}
		r.Job, r.Error = c.create(x.Job, nowMs)
		return r
	case *messages.UpdateJob:
		j, e := c.update(x.Job, nowMs)
		return &messages.JobReply{Error: e, Job: j}
	case *messages.GetJob:
		if e := c.holds(x.App, x.Id); e != nil {
			return &messages.JobReply{Error: e}
		}
		return &messages.JobReply{Job: c.reply(x.Id)}
	case *messages.DeleteJob:
		if e := c.holds(x.App, x.Id); e != nil {
			return &messages.JobReply{Error: e}
		}
		j := c.reply(x.Id)
		c.emit(messages.RecordType_JOB_DELETED, &messages.JobRef{Id: x.Id, RequestId: c.reqID, AtMs: nowMs})
		return &messages.JobReply{Job: j}
	case *messages.PauseJob, *messages.ResumeJob:
		return c.pauseResume(x, nowMs)
	case *messages.TriggerJob:
		j, e := c.lookup(x.App, x.Id)
		if e != nil {
			return &messages.JobReply{Error: e}
		}
		if c.noRoom != nil {
			return &messages.JobReply{Error: c.noRoom}
		}
		if len(x.Params) > MaxParamsBytes {
			return &messages.JobReply{Error: kerr.Invalid("params", "%d bytes exceeds the limit of %d bytes", len(x.Params), MaxParamsBytes)}
		}
		if len(x.Params) > 0 && !x.HasParams { // the run would take the job's own params, dropping these
			return &messages.JobReply{Error: kerr.Invalid("has_params", "is false, yet %d bytes of params are given; set it to run with them", len(x.Params))}
		}
		params := j.j.Params // the run's: an API-only job may have left them to its triggers
		if x.HasParams {
			params = x.Params
		}
		if e := c.checkRouteKey(j.j.Policy, params); e != nil {
			return &messages.JobReply{Error: e}
		}
		c.startRun(j, nowMs, nowMs, false, j.j.Runs, 0, x.Params, x.HasParams)
		return &messages.JobReply{Job: jobCopy(j.j)}
	case *messages.ListJobs:
		return c.list(x)
	case *messages.GetRuns:
		return c.history(x)
	case *messages.ListDeadLetters, *messages.GetDeadLetter, *messages.ReplayDeadLetter, *messages.PurgeDeadLetters:
		return c.deadLetters(x, nowMs)
	}
	return &messages.JobReply{Error: kerr.New(messages.Code_INVALID_ARGUMENT, "", "unknown request %T", m)}
}

// lookup is job id of app, as a full job (see Core.job), for a command that may
// change it.
func (c *Core) lookup(app string, id int64) (*job, *messages.Error) {
	if e := c.holds(app, id); e != nil {
		return nil, e
	}
	return c.job(id), nil
}

// holds says why the shard cannot answer for job id of app, if it cannot.
func (c *Core) holds(app string, id int64) *messages.Error {
	if e := c.owns(app); e != nil {
		return e
	}
	if id <= 0 {
		return kerr.Invalid("id", "must be a positive snowflake id, got %d", id)
	}
	if !c.has(id) {
		return kerr.New(messages.Code_NOT_FOUND, "id", "job %d not found in app %q", id, app)
	}
	return nil
}

// owns says why the shard cannot answer for app, if it cannot: a name no app can
// have is bad input; another app's is a routing miss (NOT_OWNER, which the client
// retries after refreshing its routes).
func (c *Core) owns(app string) *messages.Error {
	if app == c.cfg.Shard.App {
		return nil
	}
	if why := route.ValidApp(app); why != "" {
		return kerr.Invalid("app", "%s", why)
	}
	return kerr.New(messages.Code_NOT_OWNER, "app", "shard %s does not hold app %q", c.cfg.Shard, app)
}

// reply is job id as it is now, for a reply (nil if the shard does not hold it).
func (c *Core) reply(id int64) *messages.Job {
	if j := c.jobs[id]; j != nil {
		return jobCopy(j.j)
	}
	return c.peek(id) // a fresh message already
}

// compile turns a job's schedule into its next-fire calculator; createdMs resolves
// a one-shot delay.
func compile(j *messages.Job, createdMs int64) (*schedule.Compiled, error) {
	s := j.Schedule
	if s == nil {
		return nil, &schedule.Error{Field: "kind", Reason: "a schedule is required"}
	}
	spec := schedule.Spec{TZ: s.Tz, Cron: s.Cron, EveryMs: s.EveryMs, StartMs: s.StartMs,
		NotBeforeMs: s.NotBeforeMs, NotAfterMs: s.NotAfterMs, MaxRuns: s.MaxRuns, AtMs: s.AtMs}
	switch s.Kind {
	case messages.ScheduleKind_ONCE:
		spec.Kind = schedule.Once
		if s.AtMs == 0 {
			if s.DelayMs < 0 {
				return nil, &schedule.Error{Field: "delay", Reason: fmt.Sprintf("must not be negative, got %d ms", s.DelayMs)}
			}
			if createdMs > schedule.MaxTimeMs-s.DelayMs { // createdMs+DelayMs past the limit, or past int64
				return nil, &schedule.Error{Field: "delay", Reason: fmt.Sprintf("%d ms from %d is past the limit of %d (Unix ms)", s.DelayMs, createdMs, int64(schedule.MaxTimeMs))}
			}
			spec.AtMs = createdMs + s.DelayMs
		}
	case messages.ScheduleKind_CRON:
		spec.Kind = schedule.Cron
	case messages.ScheduleKind_FIXED_RATE:
		spec.Kind = schedule.FixedRate
	case messages.ScheduleKind_FIXED_DELAY:
		spec.Kind = schedule.FixedDelay
	case messages.ScheduleKind_API_ONLY:
		spec.Kind = schedule.APIOnly
	default:
		return nil, &schedule.Error{Field: "kind", Reason: "one of once, cron, fixed_rate, fixed_delay, api_only is required"}
	}
	return schedule.Compile(spec)
}

func schedErr(err error) *messages.Error {
	var se *schedule.Error
	if errors.As(err, &se) {
		return kerr.Invalid("schedule."+se.Field, "%s", se.Reason)
	}
	return kerr.Invalid("schedule", "%v", err)
}

// validate checks a job definition and returns its compiled schedule.
func (c *Core) validate(j *messages.Job, createdMs int64) (*schedule.Compiled, *messages.Error) {
	if j == nil {
		return nil, kerr.Invalid("job", "is required")
	}
	if j.Id <= 0 {
		return nil, kerr.Invalid("id", "must be a positive snowflake id, got %d", j.Id)
	}
	if why := route.ValidApp(j.App); why != "" {
		return nil, kerr.Invalid("app", "%s", why)
	}
	if j.App != c.cfg.Shard.App || !c.cfg.Shard.ContainsJob(j.Id) {
		return nil, kerr.New(messages.Code_NOT_OWNER, "id", "job %d of app %q is not in shard %s", j.Id, j.App, c.cfg.Shard)
	}
	if j.Handler == "" || len(j.Handler) > MaxHandlerLen {
		return nil, kerr.Invalid("handler", "must be 1 to %d characters, got %d", MaxHandlerLen, len(j.Handler))
	}
	if why := route.TextFault(j.Handler); why != "" {
		return nil, kerr.Invalid("handler", "%s", why)
	}
	if len(j.Params) > MaxParamsBytes {
		return nil, kerr.Invalid("params", "%d bytes exceeds the limit of %d bytes", len(j.Params), MaxParamsBytes)
	}
	if e := ValidatePolicy(j.Policy, c.cfg.AppPolicy.GetRouteKey()); e != nil {
		return nil, e
	}
	// An API-only job may leave its params to each trigger (checked there).
	if len(j.Params) > 0 || j.Schedule.GetKind() != messages.ScheduleKind_API_ONLY {
		if e := c.checkRouteKey(j.Policy, j.Params); e != nil {
			return nil, e
		}
	}
	sc, err := compile(j, createdMs)
	if err != nil {
		return nil, schedErr(err)
	}
	// compile reads a delay only for a one-shot without a time; anywhere else it
	// would be dropped. Checked here, not in compile, which also compiles the jobs
	// journaled before this check.
	if s := j.Schedule; s.DelayMs != 0 {
		if s.Kind != messages.ScheduleKind_ONCE {
			return nil, kerr.Invalid("schedule.delay", "only a kind once job has a delay; this is %s", strings.ToLower(s.Kind.String()))
		}
		if s.AtMs != 0 {
			return nil, kerr.Invalid("schedule.delay", "a one-shot has a time (at %d) or a delay (%d ms), not both", s.AtMs, s.DelayMs)
		}
	}
	return sc, nil
}

// ValidatePolicy checks a job's policy, or an app's default policy; the error
// names the field ("policy.attempts", ...) and the limit. A consistent_hash routing
// needs a route key of its own unless inheritedKey (the app's) is set.
func ValidatePolicy(p *messages.Policy, inheritedKey string) *messages.Error {
	if p == nil {
		return nil
	}
	if p.Attempts < 0 || p.Attempts > MaxAttempts {
		return kerr.Invalid("policy.attempts", "must be 0 (default) to %d, got %d", MaxAttempts, p.Attempts)
	}
	if len(p.LadderMs) > schedule.MaxLadderLevels {
		return kerr.Invalid("policy.ladder", "has %d levels, the limit is %d", len(p.LadderMs), schedule.MaxLadderLevels)
	}
	for i, d := range p.LadderMs {
		if d <= 0 {
			return kerr.Invalid("policy.ladder", "level %d is %d ms; each delay must be positive", i, d)
		}
		if d > schedule.MaxLadderDelayMs {
			return kerr.Invalid("policy.ladder", "level %d is %d ms, over the limit of %d ms (7 days)", i, d, int64(schedule.MaxLadderDelayMs))
		}
	}
	if p.TimeoutMs < 0 || p.TimeoutMs > MaxTimeoutMs {
		return kerr.Invalid("policy.timeout", "must be 0 (default) to %d ms, got %d", int64(MaxTimeoutMs), p.TimeoutMs)
	}
	if _, ok := messages.Route_name[int32(p.Route)]; !ok {
		return kerr.Invalid("policy.route", "unknown routing %d", p.Route)
	}
	if p.Route == messages.Route_CONSISTENT_HASH && p.RouteKey == "" && inheritedKey == "" {
		return kerr.Invalid("policy.route_key", "consistent_hash routing needs a route key (a top-level params field)")
	}
	if len(p.RouteKey) > MaxRouteKeyLen {
		return kerr.Invalid("policy.route_key", "is %d bytes, the limit is %d", len(p.RouteKey), MaxRouteKeyLen)
	}
	if why := route.TextFault(p.RouteKey); why != "" {
		return kerr.Invalid("policy.route_key", "%s", why)
	}
	if _, ok := messages.Misfire_name[int32(p.Misfire)]; !ok {
		return kerr.Invalid("policy.misfire", "unknown misfire policy %d", p.Misfire)
	}
	if _, ok := messages.Concurrency_name[int32(p.Concurrency)]; !ok {
		return kerr.Invalid("policy.concurrency", "unknown concurrency policy %d", p.Concurrency)
	}
	return nil
}

func sameDefinition(a, b *messages.Job) bool {
	return a.App == b.App && a.Handler == b.Handler && string(a.Params) == string(b.Params) &&
		proto.Equal(a.Schedule, b.Schedule) && proto.Equal(a.Policy, b.Policy)
}

func (c *Core) create(in *messages.Job, nowMs int64) (*messages.Job, *messages.Error) {
	sc, e := c.validate(in, nowMs)
	if e != nil {
		return nil, e
	}
	if old := c.peek(in.Id); old != nil {
		if sameDefinition(old, in) { // a retried create: idempotent
			return c.reply(in.Id), nil
		}
		return nil, kerr.New(messages.Code_ALREADY_EXISTS, "id", "job %d exists with a different definition", in.Id)
	}
	if c.noRoom != nil {
		return nil, c.noRoom
	}
	if c.jobCount() >= c.cfg.MaxJobs {
		return nil, kerr.New(messages.Code_RESOURCE_EXHAUSTED, "", "shard %s holds %d jobs, the limit", c.cfg.Shard, c.cfg.MaxJobs)
	}
	j := &messages.Job{Id: in.Id, App: in.App, Handler: in.Handler, Params: in.Params, Schedule: in.Schedule,
		Policy: in.Policy, State: messages.JobState_ACTIVE, Version: 1, CreatedMs: nowMs, UpdatedMs: nowMs, RequestId: c.reqID}
	if in.State == messages.JobState_PAUSED {
		j.State = messages.JobState_PAUSED
	}
	if d, ok := sc.First(nowMs, 0); ok {
		j.NextDueMs = d
	}
	c.compiled = compiledFor{sched: j.Schedule, createdMs: nowMs, sc: sc} // apply takes it instead of compiling again
	c.emit(messages.RecordType_JOB_PUT, j)
	if c.jobs[in.Id] == nil { // kept compact: j is the reply's own
		return j, nil
	}
	return c.reply(in.Id), nil
}

func (c *Core) update(in *messages.Job, nowMs int64) (*messages.Job, *messages.Error) {
	if in == nil {
		return nil, kerr.Invalid("job", "is required")
	}
	old, e := c.lookup(in.App, in.Id)
	if e != nil {
		if e.Code == messages.Code_NOT_FOUND {
			e.Message += " (deleted or never created); update needs an existing job"
		}
		return nil, e
	}
	sc, e := c.validate(in, old.j.CreatedMs)
	if e != nil {
		return nil, e
	}
	from := nowMs
	if c.unparking {
		from = c.parkedAt // it came before an armed fire: as a shard that does not arm
	}
	if in.Schedule.GetKind() == messages.ScheduleKind_ONCE && in.Schedule.GetAtMs() == 0 {
		sc, e = c.validate(in, from) // a new delay counts from the update
		if e != nil {
			return nil, e
		}
	}
	if c.noRoom != nil {
		return nil, c.noRoom
	}
	j := proto.Clone(old.j).(*messages.Job)
	j.Handler, j.Params, j.Schedule, j.Policy = in.Handler, in.Params, in.Schedule, in.Policy
	j.Version++
	j.UpdatedMs = nowMs
	j.RequestId = c.reqID
	if j.State == messages.JobState_DONE {
		j.State = messages.JobState_ACTIVE
	}
	j.NextDueMs = 0
	if d, ok := c.firstDue(sc, j, nowMs); ok && !waitsForFinish(j, old) {
		j.NextDueMs = d
	}
	if j.Schedule.GetKind() == messages.ScheduleKind_ONCE && j.Schedule.GetAtMs() == 0 {
		j.CreatedMs = from // the delay was resolved against then
	}
	c.emit(messages.RecordType_JOB_PUT, j)
	return c.reply(j.Id), nil
}

// firstDue is the first due of job j (its new definition, sc compiled) after an
// update or resume at nowMs. A due it has fired already is not fired again: a
// periodic job moves past its last due (at once only when updated in the very
// millisecond of a fire, or when the command was parked behind an armed fire,
// which it follows at the due); and a one-shot whose command was parked behind its
// armed fire, with a time not after that fire's due, is not fired a second time —
// the command came before the due, so the fire that went is its one fire (the
// change to the definition applies after it: see armed.go).
func (c *Core) firstDue(sc *schedule.Compiled, j *messages.Job, nowMs int64) (int64, bool) {
	if j.Schedule.GetKind() != messages.ScheduleKind_ONCE {
		if j.LastDueMs >= nowMs {
			nowMs = j.LastDueMs + 1
		}
		return sc.First(nowMs, j.Runs)
	}
	d, ok := sc.First(nowMs, j.Runs)
	if ok && c.unparking && j.LastDueMs > 0 && d <= j.LastDueMs {
		return 0, false
	}
	return d, ok
}

// waitsForFinish reports whether job j (the new definition of old) is fixed-delay
// with a run in flight: its next due then comes from that run's finish, not now.
func waitsForFinish(j *messages.Job, old *job) bool {
	return j.Schedule.GetKind() == messages.ScheduleKind_FIXED_DELAY && old.running > 0
}

func (c *Core) pauseResume(m proto.Message, nowMs int64) proto.Message {
	var app string
	var id int64
	pause := false
	switch x := m.(type) {
	case *messages.PauseJob:
		app, id, pause = x.App, x.Id, true
	case *messages.ResumeJob:
		app, id = x.App, x.Id
	}
	old, e := c.lookup(app, id)
	if e != nil {
		return &messages.JobReply{Error: e}
	}
	j := proto.Clone(old.j).(*messages.Job)
	switch {
	case pause && j.State == messages.JobState_ACTIVE:
		j.State = messages.JobState_PAUSED
	case !pause && j.State == messages.JobState_PAUSED:
		j.State = messages.JobState_ACTIVE
		j.NextDueMs = 0
		if d, ok := c.firstDue(c.schedOf(old), j, nowMs); ok && !waitsForFinish(j, old) {
			j.NextDueMs = d
		}
	default:
		return &messages.JobReply{Job: j} // already in that state
	}
	j.Version++
	j.UpdatedMs = nowMs
	j.RequestId = c.reqID
	c.emit(messages.RecordType_JOB_PUT, j)
	return &messages.JobReply{Job: c.reply(id)}
}

func (c *Core) list(x *messages.ListJobs) proto.Message {
	if e := c.owns(x.App); e != nil {
		return &messages.ListJobsReply{Error: e}
	}
	limit, e := listLimit(x.Limit)
	if e != nil {
		return &messages.ListJobsReply{Error: e}
	}
	if _, ok := messages.JobState_name[int32(x.State)]; !ok {
		return &messages.ListJobsReply{Error: kerr.Invalid("state", "unknown job state %d (want active, paused, done or unspecified for any)", x.State)}
	}
	ids := make([]int64, 0)
	for id, j := range c.jobs {
		if id <= x.AfterId {
			continue
		}
		if x.State != messages.JobState_JOB_STATE_UNSPECIFIED && j.j.State != x.State {
			continue
		}
		if x.Handler != "" && j.j.Handler != x.Handler {
			continue
		}
		ids = append(ids, id)
	}
	if x.State == messages.JobState_JOB_STATE_UNSPECIFIED || x.State == messages.JobState_DONE { // every packed job is DONE
		c.packed.each(func(id int64, blob []byte, r packedRef) {
			if id <= x.AfterId {
				return
			}
			if x.Handler != "" {
				h := ""
				if r.named {
					h = c.cold.handlers[r.handler]
				} else {
					jm, _ := unpack(blob)
					h = jm.Handler
				}
				if h != x.Handler {
					return
				}
			}
			ids = append(ids, id)
		})
	}
	if x.State == messages.JobState_JOB_STATE_UNSPECIFIED || x.State == messages.JobState_ACTIVE { // every compact job is ACTIVE
		c.cold.each(func(cj *coldJob) {
			if cj.id > x.AfterId && (x.Handler == "" || c.cold.handlers[cj.handler] == x.Handler) {
				ids = append(ids, cj.id)
			}
		})
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	out := &messages.ListJobsReply{}
	for i, id := range ids {
		if i == limit {
			out.NextAfterId = ids[i-1]
			break
		}
		out.Jobs = append(out.Jobs, c.reply(id))
	}
	return out
}

// listLimit is the page size a list asks for: 0 is the default.
func listLimit(n int32) (int, *messages.Error) {
	if n < 0 || n > MaxListLimit {
		return 0, kerr.Invalid("limit", "must be 0 (default %d) to %d, got %d", DefaultListLimit, MaxListLimit, n)
	}
	if n == 0 {
		return DefaultListLimit, nil
	}
	return int(n), nil
}

func (c *Core) history(x *messages.GetRuns) proto.Message {
	if e := c.holds(x.App, x.Id); e != nil {
		return &messages.RunsReply{Error: e}
	}
	if x.Limit < 0 {
		return &messages.RunsReply{Error: kerr.Invalid("limit", "must not be negative (0 = every run kept, at most %d), got %d", c.cfg.History, x.Limit)}
	}
	var hist []*messages.RunRecord // a compact job has none
	if j := c.jobs[x.Id]; j != nil {
		hist = j.history
	} else if _, h, ok := c.peekPacked(x.Id); ok {
		hist = h
	}
	limit := int(x.Limit)
	if limit == 0 || limit > c.cfg.History { // a job keeps History runs: more is all of them
		limit = c.cfg.History
	}
	out := &messages.RunsReply{}
	ids := make([]string, 0)
	for id, r := range c.runs {
		if r.st.JobId == x.Id {
			ids = append(ids, id)
		}
	}
	// Runs still going or waiting for a retry come first, newest first, then the
	// finished ones, newest first: limit in all.
	sort.Slice(ids, func(a, b int) bool {
		da, db := c.runs[ids[a]].st.DueMs, c.runs[ids[b]].st.DueMs
		return da > db || (da == db && ids[a] > ids[b])
	})
	for _, id := range ids {
		if len(out.Runs) == limit {
			break
		}
		st := c.runs[id].st
		out.Runs = append(out.Runs, &messages.RunRecord{RunId: st.RunId, JobId: st.JobId, DueMs: st.DueMs,
			DispatchedMs: st.DispatchedMs, Attempt: st.Attempt, WorkerId: st.WorkerId, Error: st.LastError, TraceId: st.TraceId})
	}
	for i := len(hist) - 1; i >= 0 && len(out.Runs) < limit; i-- {
		out.Runs = append(out.Runs, hist[i])
	}
	return out
}

func (c *Core) deadLetters(m proto.Message, nowMs int64) proto.Message {
	if e := c.owns(m.(interface{ GetApp() string }).GetApp()); e != nil {
		return errorReply(m, e)
	}
	switch x := m.(type) {
	case *messages.ListDeadLetters:
		limit, e := listLimit(x.Limit)
		if e != nil {
			return &messages.DeadLettersReply{Error: e}
		}
		ids := make([]string, 0, len(c.dead))
		for id := range c.dead {
			if id > x.AfterRunId {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		out := &messages.DeadLettersReply{}
		for i, id := range ids {
			if i == limit {
				out.NextAfterRunId = ids[i-1]
				break
			}
			out.Letters = append(out.Letters, c.dead[id])
		}
		return out
	case *messages.GetDeadLetter:
		d := c.dead[x.RunId]
		if d == nil {
			return &messages.DeadLetterReply{Error: kerr.New(messages.Code_NOT_FOUND, "run_id", "no dead letter %q in shard %s", x.RunId, c.cfg.Shard)}
		}
		return &messages.DeadLetterReply{Letter: d}
	case *messages.ReplayDeadLetter:
		d := c.dead[x.RunId]
		if d == nil {
			return &messages.DeadLetterReply{Error: kerr.New(messages.Code_NOT_FOUND, "run_id", "no dead letter %q in shard %s (replayed or purged already?)", x.RunId, c.cfg.Shard)}
		}
		if c.noRoom != nil {
			return &messages.DeadLetterReply{Error: c.noRoom}
		}
		c.emit(messages.RecordType_DEAD_LETTER_REMOVED, &messages.JobRef{Id: d.JobId, RunId: d.RunId, RequestId: c.reqID, AtMs: nowMs})
		id, due := c.runID(d.JobId, nowMs), nowMs
		st := &messages.RunState{RunId: id, JobId: d.JobId, DueMs: due, Attempt: 1, DispatchedMs: nowMs,
			DeadlineMs: nowMs + c.timeout(d.JobId) + c.cfg.GraceMs, Level: -1, Params: d.Params, HasParams: true,
			TraceId: c.traceparent(), Handler: d.Handler, App: d.App, RequestId: c.reqID}
		c.emit(messages.RecordType_RUN_DISPATCHED, st)
		c.dispatch(c.runs[id], nowMs)
		return &messages.DeadLetterReply{Letter: d}
	case *messages.PurgeDeadLetters:
		n := int32(0)
		ids := make([]string, 0)
		for id := range c.dead {
			if x.RunId == "" || id == x.RunId {
				ids = append(ids, id)
			}
		}
		if x.RunId != "" && len(ids) == 0 {
			return &messages.DeadLetterReply{Error: kerr.New(messages.Code_NOT_FOUND, "run_id", "no dead letter %q in shard %s", x.RunId, c.cfg.Shard)}
		}
		sort.Strings(ids)
		for _, id := range ids {
			c.emit(messages.RecordType_DEAD_LETTER_REMOVED, &messages.JobRef{RunId: id, RequestId: c.reqID, AtMs: nowMs})
			n++
		}
		return &messages.DeadLetterReply{Purged: n}
	}
	return nil
}

// result records a worker's report on a run.
func (c *Core) result(res *messages.RunResult, from *messages.Ref, nowMs int64) {
	ack := &messages.ResultAck{RunId: res.RunId}
	if from == nil {
		// A worker sends its results without a sender (proto.actor's Send): the ack
		// goes to the worker the result names, or it would be sent again and again.
		from = res.Worker
	}
	if res.Epoch != c.epoch && !c.cfg.Mutations.SkipEpochCheck {
		return // a result for another owner's dispatch: the current owner re-dispatches
	}
	r := c.runs[res.RunId]
	if r == nil || r.st.Level >= 0 || r.st.Attempt != res.Attempt {
		c.send(from, ack) // already recorded: let the worker forget it
		return
	}
	if c.frozen != nil || c.failed != nil {
		return
	}
	if res.Outcome == messages.Outcome_REFUSED {
		// Back-pressure, not a failure: the run was not attempted. Send it again
		// shortly (to the next worker in turn) without using up an attempt.
		if r.st.WorkerId != "" && c.busy[r.st.WorkerId] > 0 {
			c.busy[r.st.WorkerId]--
		}
		c.ownSt(r)                       // a snapshot view may share the state
		r.st.WorkerId, r.sentTo = "", "" // not attempted there: the next worker in turn
		c.armRun(r, nowMs+RefusedRetryMs)
		return
	}
	c.finish(r, res, nowMs)
	c.send(from, ack)
}

// jobCopy is a copy of a stored job for a reply, which leaves the shard's
// goroutine (it is marshalled later by the remote writer, or read by an in-process
// caller) while the shard goes on changing the stored job's fields in place. Only
// the top-level fields are copied: the shard never changes a stored job's
// Schedule, Policy or Params in place (an update or trigger replaces them whole),
// so sharing them is safe, and a create's reply costs one allocation instead of a
// reflective deep proto.Clone (TestJobCopyCopiesEveryField keeps it complete).
func jobCopy(j *messages.Job) *messages.Job {
	c := &messages.Job{Id: j.Id, App: j.App, Handler: j.Handler, Params: j.Params, Schedule: j.Schedule,
		Policy: j.Policy, State: j.State, Version: j.Version, CreatedMs: j.CreatedMs, UpdatedMs: j.UpdatedMs,
		NextDueMs: j.NextDueMs, Runs: j.Runs, LastDueMs: j.LastDueMs, LastFinishMs: j.LastFinishMs, RequestId: j.RequestId}
	// Fields of a newer version's record this build does not know go on with the job
	// (ownJob copies a job's definition before apply changes it in place).
	if u := j.ProtoReflect().GetUnknown(); len(u) > 0 {
		c.ProtoReflect().SetUnknown(u)
	}
	return c
}

// compiledFor is a schedule compiled by validate, handed to the apply of the
// record just emitted so a create compiles its schedule once, not twice.
type compiledFor struct {
	sched     *messages.Schedule
	createdMs int64
	sc        *schedule.Compiled
}

// take returns the compiled schedule of jm when it is the one handed over, and
// forgets it either way.
func (f *compiledFor) take(jm *messages.Job) *schedule.Compiled {
	sc := f.sc
	ok := sc != nil && f.sched == jm.Schedule && f.createdMs == jm.CreatedMs
	*f = compiledFor{}
	if ok {
		return sc
	}
	return nil
}
