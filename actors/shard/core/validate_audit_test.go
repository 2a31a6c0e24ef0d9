package core

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/schedule"
	"github.com/kjob/kjob/messages"
)

// An audit of the rule "bad input always gets a clear, typed error that names the
// field or the limit; nothing accepted is ever lost", at the shard: every hostile
// request below is answered with its code, the field at fault and, where there is
// one, the limit, and a refused request journals nothing.

const (
	auditNowMs = 1_000_000
	auditReqMs = auditNowMs + 2 // when the audited requests come (after auditCore's own)
)

// auditCore is a shard of app "app" with one worker, w1, holding job 7 (a one-shot
// a minute out), job 8 (API-only, consistent_hash on "tenant", no params of its
// own) and a dead letter (job 9's one attempt failed).
func auditCore(t *testing.T) (*Core, *fakeEnv) {
	t.Helper()
	c, e := policyCore(auditNowMs, Config{}, policyWorker("w1", 4))
	for _, j := range []*messages.Job{
		onceJob(7, 60_000),
		{Id: 8, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_API_ONLY},
			Policy: &messages.Policy{Route: messages.Route_CONSISTENT_HASH, RouteKey: "tenant"}},
		{Id: 9, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE},
			Policy: &messages.Policy{Attempts: 1}},
	} {
		if r := reply(t, c, e, auditNowMs, &messages.CreateJob{Job: j}); r.Error != nil {
			t.Fatalf("create job %d: %v", j.Id, r.Error)
		}
	}
	sds := tick(c, e, auditNowMs)
	if len(sds) != 1 {
		t.Fatalf("job 9's dispatches: %v", sds)
	}
	report(c, e, auditNowMs+1, sds[0], messages.Outcome_FAILED, "boom", auditNowMs)
	if len(c.dead) != 1 {
		t.Fatalf("dead letters %v, want job 9's", c.dead)
	}
	return c, e
}

// answer handles m at now and returns the error of its reply (for a batch, its
// own or its first create's) and how many records handling it journaled; a panic fails t.
func answer(t *testing.T, c *Core, e *fakeEnv, now int64, m proto.Message) (werr *messages.Error, journaled int) {
	t.Helper()
	n := len(e.log)
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("%T panicked: %v", m, p)
			}
		}()
		c.Handle(now, client, m, e)
	}()
	journaled = len(e.log) - n
	c.Durable(e.lsn, nil, e)
	for _, s := range e.take() {
		if s.to != client {
			continue
		}
		switch r := s.m.(type) {
		case *messages.CreateJobsReply:
			if r.Error != nil || len(r.Replies) == 0 {
				return r.Error, journaled
			}
			return r.Replies[0].GetError(), journaled
		case interface{ GetError() *messages.Error }:
			return r.GetError(), journaled
		}
	}
	t.Fatalf("no reply to %T", m)
	return nil, 0
}

// auditJob is a valid one-shot create of job id 100 changed by f.
func auditJob(f func(j *messages.Job)) *messages.Job {
	j := onceJob(100, 1000)
	f(j)
	return j
}

func withSched(s *messages.Schedule) func(*messages.Job) {
	return func(j *messages.Job) { j.Schedule = s }
}

func withPolicy(p *messages.Policy) func(*messages.Job) {
	return func(j *messages.Job) { j.Policy = p }
}

func create(f func(*messages.Job)) proto.Message { return &messages.CreateJob{Job: auditJob(f)} }

// update replaces job 7's definition with a valid one-shot changed by f.
func update(f func(*messages.Job)) proto.Message {
	j := onceJob(7, 30_000)
	f(j)
	return &messages.UpdateJob{Job: j}
}

type auditCase struct {
	name string
	req  proto.Message
	// code is the reply's; OK = accepted (behaviour kept on purpose: see the case's
	// comment).
	code  messages.Code
	field string
	limit string // a substring the message must hold: the limit, when there is one
}

func auditCases() []auditCase {
	const invalid = messages.Code_INVALID_ARGUMENT
	maxTime := fmt.Sprint(int64(schedule.MaxTimeMs))
	every := func(k messages.ScheduleKind, ms int64) *messages.Schedule {
		return &messages.Schedule{Kind: k, EveryMs: ms}
	}
	rate := func(f func(s *messages.Schedule)) *messages.Schedule {
		s := every(messages.ScheduleKind_FIXED_RATE, 1000)
		f(s)
		return s
	}
	cron := func(expr, tz string) *messages.Schedule {
		return &messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: expr, Tz: tz}
	}
	hash := func(params string) func(*messages.Job) {
		return func(j *messages.Job) {
			j.Policy = &messages.Policy{Route: messages.Route_CONSISTENT_HASH, RouteKey: "tenant"}
			j.Params = []byte(params)
		}
	}
	ladder := func(ms ...int64) func(*messages.Job) { return withPolicy(&messages.Policy{LadderMs: ms}) }
	bigParams := make([]byte, MaxParamsBytes+1)
	return []auditCase{
		// The job and its names.
		{"create nil job", &messages.CreateJob{}, invalid, "job", ""},
		{"create id 0", create(func(j *messages.Job) { j.Id = 0 }), invalid, "id", "positive"},
		{"create id negative", create(func(j *messages.Job) { j.Id = -1 }), invalid, "id", "positive"},
		{"create id MinInt64", create(func(j *messages.Job) { j.Id = math.MinInt64 }), invalid, "id", "positive"},
		{"create app empty", create(func(j *messages.Job) { j.App = "" }), invalid, "app", ""},
		{"create app too long", create(func(j *messages.Job) { j.App = strings.Repeat("a", route.MaxAppLen+1) }), invalid, "app", "64"},
		{"create app NUL", create(func(j *messages.Job) { j.App = "ap\x00p" }), invalid, "app", ""},
		{"create app newline", create(func(j *messages.Job) { j.App = "app\n" }), invalid, "app", ""},
		{"create app invalid UTF-8", create(func(j *messages.Job) { j.App = "app\xff" }), invalid, "app", ""},
		{"create app of another shard", create(func(j *messages.Job) { j.App = "other" }), messages.Code_NOT_OWNER, "id", ""},
		{"create handler empty", create(func(j *messages.Job) { j.Handler = "" }), invalid, "handler", "128"},
		{"create handler too long", create(func(j *messages.Job) { j.Handler = strings.Repeat("h", MaxHandlerLen+1) }), invalid, "handler", "128"},
		{"create handler newline", create(func(j *messages.Job) { j.Handler = "a\nb" }), invalid, "handler", ""},
		{"create handler NUL", create(func(j *messages.Job) { j.Handler = "a\x00b" }), invalid, "handler", ""},
		{"create handler DEL", create(func(j *messages.Job) { j.Handler = "a\x7fb" }), invalid, "handler", ""},
		{"create handler C1 control", create(func(j *messages.Job) { j.Handler = "a\u0085b" }), invalid, "handler", ""},
		{"create handler invalid UTF-8", create(func(j *messages.Job) { j.Handler = "a\xffb" }), invalid, "handler", ""},
		{"create handler unicode", create(func(j *messages.Job) { j.Handler = "订单.超时 v2/x:y" }), messages.Code_OK, "", ""},
		{"create params over the limit", create(func(j *messages.Job) { j.Params = bigParams }), invalid, "params", "65536"},
		{"create params at the limit", create(func(j *messages.Job) { j.Params = bigParams[:MaxParamsBytes] }), messages.Code_OK, "", ""},
		// A state other than PAUSED is read as ACTIVE: state is the stored job's (a job
		// read back and created again carries ACTIVE or DONE), only PAUSED is a request.
		{"create state 99 kept", create(func(j *messages.Job) { j.State = 99 }), messages.Code_OK, "", ""},

		// Consistent-hash routing and its key.
		{"create hash params not JSON", create(hash(`tenant=1`)), invalid, "params", "JSON object"},
		{"create hash params array", create(hash(`["tenant"]`)), invalid, "params", "JSON object"},
		{"create hash params null", create(hash(`null`)), invalid, "params", "JSON object"},
		{"create hash params empty", create(hash(``)), invalid, "params", "JSON object"},
		{"create hash params lack the key", create(hash(`{"customer":"c1"}`)), invalid, "policy.route_key", "tenant"},
		{"create hash params nested key", create(hash(`{"x":{"tenant":"t"}}`)), invalid, "policy.route_key", "tenant"},
		{"create hash no route key", create(withPolicy(&messages.Policy{Route: messages.Route_CONSISTENT_HASH})), invalid, "policy.route_key", ""},
		{"create route key invalid UTF-8", create(withPolicy(&messages.Policy{Route: messages.Route_RANDOM, RouteKey: "t\xff"})), invalid, "policy.route_key", ""},
		{"create route key control", create(withPolicy(&messages.Policy{Route: messages.Route_RANDOM, RouteKey: "t\n"})), invalid, "policy.route_key", ""},
		{"create route key too long", create(withPolicy(&messages.Policy{Route: messages.Route_RANDOM, RouteKey: strings.Repeat("k", MaxRouteKeyLen+1)})), invalid, "policy.route_key", "128"},

		// Schedule: kind.
		{"create no schedule", create(withSched(nil)), invalid, "schedule.kind", ""},
		{"create kind unspecified", create(withSched(&messages.Schedule{})), invalid, "schedule.kind", ""},
		{"create kind 99", create(withSched(&messages.Schedule{Kind: 99})), invalid, "schedule.kind", ""},
		{"create kind -1", create(withSched(&messages.Schedule{Kind: -1})), invalid, "schedule.kind", ""},

		// Schedule: once.
		{"create at -1", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: -1})), invalid, "schedule.at", maxTime},
		{"create at MinInt64", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: math.MinInt64})), invalid, "schedule.at", maxTime},
		{"create at MaxInt64", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: math.MaxInt64})), invalid, "schedule.at", maxTime},
		{"create at past the limit", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: schedule.MaxTimeMs + 1})), invalid, "schedule.at", maxTime},
		// A time in the past is accepted and fires at once: the caller named it.
		{"create at in the past kept", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 1})), messages.Code_OK, "", ""},
		{"create at before not_before", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 5000, NotBeforeMs: 6000})), invalid, "schedule.at", "window"},
		{"create at after not_after", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 7000, NotAfterMs: 6000})), invalid, "schedule.at", "window"},
		{"create delay -1", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: -1})), invalid, "schedule.delay", "negative"},
		{"create delay MinInt64", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: math.MinInt64})), invalid, "schedule.delay", "negative"},
		{"create delay MaxInt64 (overflow)", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: math.MaxInt64})), invalid, "schedule.delay", maxTime},
		{"create delay past the limit", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: schedule.MaxTimeMs - auditReqMs + 1})), invalid, "schedule.delay", maxTime},
		{"create delay to the limit", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: schedule.MaxTimeMs - auditReqMs})), messages.Code_OK, "", ""},
		{"create at and delay", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 5_000_000, DelayMs: 1000})), invalid, "schedule.delay", ""},
		{"create once with cron", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 1, Cron: "* * * * *"})), invalid, "schedule.cron", ""},
		{"create once with every", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 1, EveryMs: 1000})), invalid, "schedule.every", ""},
		{"create once with start", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 1, StartMs: 1000})), invalid, "schedule.start", ""},

		// Schedule: fixed rate and fixed delay.
		{"create every 0", create(withSched(every(messages.ScheduleKind_FIXED_RATE, 0))), invalid, "schedule.every", "366 days"},
		{"create every -1", create(withSched(every(messages.ScheduleKind_FIXED_RATE, -1))), invalid, "schedule.every", "366 days"},
		{"create every MinInt64", create(withSched(every(messages.ScheduleKind_FIXED_RATE, math.MinInt64))), invalid, "schedule.every", "366 days"},
		{"create every MaxInt64", create(withSched(every(messages.ScheduleKind_FIXED_RATE, math.MaxInt64))), invalid, "schedule.every", "366 days"},
		{"create every past the limit", create(withSched(every(messages.ScheduleKind_FIXED_RATE, schedule.MaxEveryMs+1))), invalid, "schedule.every", "366 days"},
		{"create fixed delay every 0", create(withSched(every(messages.ScheduleKind_FIXED_DELAY, 0))), invalid, "schedule.every", "366 days"},
		{"create fixed delay every MaxInt64", create(withSched(every(messages.ScheduleKind_FIXED_DELAY, math.MaxInt64))), invalid, "schedule.every", "366 days"},
		{"create start -1", create(withSched(rate(func(s *messages.Schedule) { s.StartMs = -1 }))), invalid, "schedule.start", maxTime},
		{"create start MaxInt64", create(withSched(rate(func(s *messages.Schedule) { s.StartMs = math.MaxInt64 }))), invalid, "schedule.start", maxTime},
		{"create start after not_after", create(withSched(rate(func(s *messages.Schedule) { s.StartMs, s.NotAfterMs = 9000, 8000 }))), invalid, "schedule.start", "not_after"},
		{"create not_before -1", create(withSched(rate(func(s *messages.Schedule) { s.NotBeforeMs = -1 }))), invalid, "schedule.not_before", maxTime},
		{"create not_before MaxInt64", create(withSched(rate(func(s *messages.Schedule) { s.NotBeforeMs = math.MaxInt64 }))), invalid, "schedule.not_before", maxTime},
		{"create not_after -1", create(withSched(rate(func(s *messages.Schedule) { s.NotAfterMs = -1 }))), invalid, "schedule.not_after", maxTime},
		{"create not_after MaxInt64", create(withSched(rate(func(s *messages.Schedule) { s.NotAfterMs = math.MaxInt64 }))), invalid, "schedule.not_after", maxTime},
		{"create not_after before not_before", create(withSched(rate(func(s *messages.Schedule) { s.NotBeforeMs, s.NotAfterMs = 9000, 8000 }))), invalid, "schedule.not_after", "not_before"},
		{"create max_runs -1", create(withSched(rate(func(s *messages.Schedule) { s.MaxRuns = -1 }))), invalid, "schedule.max_runs", "0 = unlimited"},
		{"create max_runs MinInt64", create(withSched(rate(func(s *messages.Schedule) { s.MaxRuns = math.MinInt64 }))), invalid, "schedule.max_runs", "0 = unlimited"},
		{"create fixed rate with at", create(withSched(rate(func(s *messages.Schedule) { s.AtMs = 5000 }))), invalid, "schedule.at", ""},
		{"create fixed rate with delay", create(withSched(rate(func(s *messages.Schedule) { s.DelayMs = 5000 }))), invalid, "schedule.delay", ""},
		{"create fixed rate unknown tz", create(withSched(rate(func(s *messages.Schedule) { s.Tz = "Mars/Olympus_Mons" }))), invalid, "schedule.tz", ""},

		// Schedule: cron and its zone.
		{"create cron empty", create(withSched(cron("", ""))), invalid, "schedule.cron", ""},
		{"create cron blank", create(withSched(cron("   ", ""))), invalid, "schedule.cron", ""},
		{"create cron 4 fields", create(withSched(cron("* * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron 7 fields", create(withSched(cron("0 0 0 * * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron minute 60", create(withSched(cron("60 * * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron hour 24", create(withSched(cron("0 24 * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron day 32", create(withSched(cron("0 0 32 * *", ""))), invalid, "schedule.cron", ""},
		{"create cron day 0", create(withSched(cron("0 0 0 * *", ""))), invalid, "schedule.cron", ""},
		{"create cron month 13", create(withSched(cron("0 0 1 13 *", ""))), invalid, "schedule.cron", ""},
		{"create cron weekday 8", create(withSched(cron("0 0 * * 8", ""))), invalid, "schedule.cron", ""},
		{"create cron second 60", create(withSched(cron("60 0 0 * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron step 0", create(withSched(cron("*/0 * * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron negative", create(withSched(cron("-1 * * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron reversed range", create(withSched(cron("5-1 * * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron huge number", create(withSched(cron("99999999999999999999 * * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron never matches", create(withSched(cron("0 0 30 2 *", ""))), invalid, "schedule.cron", "never"},
		{"create cron @every", create(withSched(cron("@every 1s", ""))), invalid, "schedule.cron", "fixed_rate"},
		{"create cron unknown descriptor", create(withSched(cron("@fortnightly", ""))), invalid, "schedule.cron", ""},
		{"create cron TZ prefix", create(withSched(cron("TZ=UTC 0 * * * *", ""))), invalid, "schedule.cron", "tz"},
		{"create cron too long", create(withSched(cron("0 0 * * "+strings.Repeat("1,", 200)+"1", ""))), invalid, "schedule.cron", "256"},
		{"create cron invalid UTF-8", create(withSched(cron("\xff * * * *", ""))), invalid, "schedule.cron", ""},
		{"create cron with every", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "* * * * *", EveryMs: 1000})), invalid, "schedule.every", ""},
		{"create cron with delay", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_CRON, Cron: "* * * * *", DelayMs: 1000})), invalid, "schedule.delay", ""},
		{"create tz unknown", create(withSched(cron("0 * * * *", "Mars/Olympus_Mons"))), invalid, "schedule.tz", "IANA"},
		{"create tz Local", create(withSched(cron("0 * * * *", "Local"))), invalid, "schedule.tz", "IANA"},
		{"create tz too long", create(withSched(cron("0 * * * *", strings.Repeat("A", schedule.MaxTZBytes+1)))), invalid, "schedule.tz", "64"},
		{"create tz invalid UTF-8", create(withSched(cron("0 * * * *", "Europe/\xff"))), invalid, "schedule.tz", ""},
		{"create tz path", create(withSched(cron("0 * * * *", "../../../etc/passwd"))), invalid, "schedule.tz", ""},
		{"create api-only with every", create(withSched(every(messages.ScheduleKind_API_ONLY, 1000))), invalid, "schedule.every", ""},
		{"create api-only with at", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_API_ONLY, AtMs: 5000})), invalid, "schedule.at", ""},
		{"create api-only with delay", create(withSched(&messages.Schedule{Kind: messages.ScheduleKind_API_ONLY, DelayMs: 5000})), invalid, "schedule.delay", ""},

		// Policy.
		{"create attempts -1", create(withPolicy(&messages.Policy{Attempts: -1})), invalid, "policy.attempts", "32"},
		{"create attempts MinInt32", create(withPolicy(&messages.Policy{Attempts: math.MinInt32})), invalid, "policy.attempts", "32"},
		{"create attempts 33", create(withPolicy(&messages.Policy{Attempts: MaxAttempts + 1})), invalid, "policy.attempts", "32"},
		{"create attempts MaxInt32", create(withPolicy(&messages.Policy{Attempts: math.MaxInt32})), invalid, "policy.attempts", "32"},
		{"create ladder 0", create(ladder(1000, 0)), invalid, "policy.ladder", "positive"},
		{"create ladder negative", create(ladder(-1)), invalid, "policy.ladder", "positive"},
		{"create ladder MinInt64", create(ladder(math.MinInt64)), invalid, "policy.ladder", "positive"},
		{"create ladder MaxInt64", create(ladder(math.MaxInt64)), invalid, "policy.ladder", "7 days"},
		{"create ladder past the limit", create(ladder(schedule.MaxLadderDelayMs + 1)), invalid, "policy.ladder", "7 days"},
		{"create ladder at the limit", create(ladder(schedule.MaxLadderDelayMs)), messages.Code_OK, "", ""},
		{"create ladder too many levels", create(ladder(make([]int64, schedule.MaxLadderLevels+1)...)), invalid, "policy.ladder", "16"},
		{"create timeout -1", create(withPolicy(&messages.Policy{TimeoutMs: -1})), invalid, "policy.timeout", "86400000"},
		{"create timeout MinInt64", create(withPolicy(&messages.Policy{TimeoutMs: math.MinInt64})), invalid, "policy.timeout", "86400000"},
		{"create timeout MaxInt64", create(withPolicy(&messages.Policy{TimeoutMs: math.MaxInt64})), invalid, "policy.timeout", "86400000"},
		{"create misfire 99", create(withPolicy(&messages.Policy{Misfire: 99})), invalid, "policy.misfire", ""},
		{"create misfire -1", create(withPolicy(&messages.Policy{Misfire: -1})), invalid, "policy.misfire", ""},
		{"create concurrency 99", create(withPolicy(&messages.Policy{Concurrency: 99})), invalid, "policy.concurrency", ""},
		{"create route 99", create(withPolicy(&messages.Policy{Route: 99})), invalid, "policy.route", ""},
		{"create route -1", create(withPolicy(&messages.Policy{Route: -1})), invalid, "policy.route", ""},

		// A batch answers each create as if it came alone.
		{"batch nil create", &messages.CreateJobs{Jobs: []*messages.CreateJob{nil}}, invalid, "jobs", ""},
		{"batch bad create", &messages.CreateJobs{Jobs: []*messages.CreateJob{{Job: auditJob(ladder(math.MaxInt64))}}}, invalid, "policy.ladder", "7 days"},
		{"batch packed garbage", &messages.CreateJobs{Packed: []byte{0xff, 0xff, 0xff}}, invalid, "packed", ""},

		// Update of job 7.
		{"update nil job", &messages.UpdateJob{}, invalid, "job", ""},
		{"update id 0", &messages.UpdateJob{Job: auditJob(func(j *messages.Job) { j.Id = 0 })}, invalid, "id", "positive"},
		{"update id negative", &messages.UpdateJob{Job: auditJob(func(j *messages.Job) { j.Id = -7 })}, invalid, "id", "positive"},
		{"update unknown id", &messages.UpdateJob{Job: auditJob(func(*messages.Job) {})}, messages.Code_NOT_FOUND, "id", ""},
		{"update app empty", update(func(j *messages.Job) { j.App = "" }), invalid, "app", ""},
		{"update app invalid UTF-8", update(func(j *messages.Job) { j.App = "app\xff" }), invalid, "app", ""},
		{"update app of another shard", update(func(j *messages.Job) { j.App = "other" }), messages.Code_NOT_OWNER, "app", ""},
		{"update handler control", update(func(j *messages.Job) { j.Handler = "h\r" }), invalid, "handler", ""},
		{"update handler invalid UTF-8", update(func(j *messages.Job) { j.Handler = "h\xc3" }), invalid, "handler", ""},
		{"update params over the limit", update(func(j *messages.Job) { j.Params = bigParams }), invalid, "params", "65536"},
		{"update hash params lack the key", update(hash(`{"x":1}`)), invalid, "policy.route_key", "tenant"},
		{"update every 0", update(withSched(every(messages.ScheduleKind_FIXED_RATE, 0))), invalid, "schedule.every", "366 days"},
		{"update delay MaxInt64 (overflow)", update(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: math.MaxInt64})), invalid, "schedule.delay", maxTime},
		{"update at MaxInt64", update(withSched(&messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: math.MaxInt64})), invalid, "schedule.at", maxTime},
		{"update cron hour 25", update(withSched(cron("0 0 25 * * *", ""))), invalid, "schedule.cron", ""},
		{"update tz unknown", update(withSched(cron("0 * * * *", "Nowhere/Town"))), invalid, "schedule.tz", ""},
		{"update kind 99", update(withSched(&messages.Schedule{Kind: 99})), invalid, "schedule.kind", ""},
		{"update ladder MaxInt64", update(ladder(math.MaxInt64)), invalid, "policy.ladder", "7 days"},
		{"update attempts 33", update(withPolicy(&messages.Policy{Attempts: 33})), invalid, "policy.attempts", "32"},
		{"update timeout MaxInt64", update(withPolicy(&messages.Policy{TimeoutMs: math.MaxInt64})), invalid, "policy.timeout", "86400000"},
		{"update concurrency 99", update(withPolicy(&messages.Policy{Concurrency: 99})), invalid, "policy.concurrency", ""},

		// Trigger of job 7, or of job 8 (consistent_hash on "tenant", no params of its own).
		{"trigger id 0", &messages.TriggerJob{App: "app", Id: 0}, invalid, "id", "positive"},
		{"trigger id negative", &messages.TriggerJob{App: "app", Id: -7}, invalid, "id", "positive"},
		{"trigger unknown id", &messages.TriggerJob{App: "app", Id: 12345}, messages.Code_NOT_FOUND, "id", ""},
		{"trigger app empty", &messages.TriggerJob{App: "", Id: 7}, invalid, "app", ""},
		{"trigger app of another shard", &messages.TriggerJob{App: "other", Id: 7}, messages.Code_NOT_OWNER, "app", ""},
		{"trigger params over the limit", &messages.TriggerJob{App: "app", Id: 7, Params: bigParams, HasParams: true}, invalid, "params", "65536"},
		{"trigger params without has_params", &messages.TriggerJob{App: "app", Id: 7, Params: []byte(`{"a":1}`)}, invalid, "has_params", ""},
		{"trigger hash params not JSON", &messages.TriggerJob{App: "app", Id: 8, Params: []byte(`tenant`), HasParams: true}, invalid, "params", "JSON object"},
		{"trigger hash params lack the key", &messages.TriggerJob{App: "app", Id: 8, Params: []byte(`{"x":1}`), HasParams: true}, invalid, "policy.route_key", "tenant"},
		{"trigger hash no params at all", &messages.TriggerJob{App: "app", Id: 8}, invalid, "params", "JSON object"},
		{"trigger hash with the key", &messages.TriggerJob{App: "app", Id: 8, Params: []byte(`{"tenant":"t"}`), HasParams: true}, messages.Code_OK, "", ""},

		// Get, delete, pause, resume: the same id and app checks.
		{"get id 0", &messages.GetJob{App: "app", Id: 0}, invalid, "id", "positive"},
		{"delete id negative", &messages.DeleteJob{App: "app", Id: -1}, invalid, "id", "positive"},
		{"delete app empty", &messages.DeleteJob{App: "", Id: 7}, invalid, "app", ""},
		{"pause id 0", &messages.PauseJob{App: "app", Id: 0}, invalid, "id", "positive"},
		{"resume app too long", &messages.ResumeJob{App: strings.Repeat("a", 65), Id: 7}, invalid, "app", "64"},

		// Listing jobs.
		{"list app empty", &messages.ListJobs{App: ""}, invalid, "app", ""},
		{"list app of another shard", &messages.ListJobs{App: "other"}, messages.Code_NOT_OWNER, "app", ""},
		{"list limit -1", &messages.ListJobs{App: "app", Limit: -1}, invalid, "limit", "1000"},
		{"list limit MinInt32", &messages.ListJobs{App: "app", Limit: math.MinInt32}, invalid, "limit", "1000"},
		{"list limit 1001", &messages.ListJobs{App: "app", Limit: MaxListLimit + 1}, invalid, "limit", "1000"},
		{"list limit MaxInt32", &messages.ListJobs{App: "app", Limit: math.MaxInt32}, invalid, "limit", "1000"},
		{"list state 99", &messages.ListJobs{App: "app", State: 99}, invalid, "state", ""},
		{"list state -1", &messages.ListJobs{App: "app", State: -1}, invalid, "state", ""},

		// Run history of job 7.
		{"runs id 0", &messages.GetRuns{App: "app", Id: 0}, invalid, "id", "positive"},
		{"runs unknown id", &messages.GetRuns{App: "app", Id: 12345}, messages.Code_NOT_FOUND, "id", ""},
		{"runs app empty", &messages.GetRuns{App: "", Id: 7}, invalid, "app", ""},
		{"runs limit -1", &messages.GetRuns{App: "app", Id: 7, Limit: -1}, invalid, "limit", ""},
		// A limit over the history kept gives all of it: the shard keeps History runs
		// a job (a setting), so there is nothing more to refuse.
		{"runs limit MaxInt32 kept", &messages.GetRuns{App: "app", Id: 7, Limit: math.MaxInt32}, messages.Code_OK, "", ""},

		// Dead letters (the shard holds job 9's).
		{"dlq list app empty", &messages.ListDeadLetters{App: ""}, invalid, "app", ""},
		{"dlq list app of another shard", &messages.ListDeadLetters{App: "other"}, messages.Code_NOT_OWNER, "app", ""},
		{"dlq list limit -1", &messages.ListDeadLetters{App: "app", Limit: -1}, invalid, "limit", "1000"},
		{"dlq list limit MaxInt32", &messages.ListDeadLetters{App: "app", Limit: math.MaxInt32}, invalid, "limit", "1000"},
		{"dlq get app of another shard", &messages.GetDeadLetter{App: "other", RunId: "9:1000000"}, messages.Code_NOT_OWNER, "app", ""},
		// An unknown run id, malformed or not, is one the shard does not hold; the
		// client refuses a malformed one (not job:due) before it is sent.
		{"dlq get run id empty", &messages.GetDeadLetter{App: "app", RunId: ""}, messages.Code_NOT_FOUND, "run_id", ""},
		{"dlq get run id garbage", &messages.GetDeadLetter{App: "app", RunId: "\xff\x00"}, messages.Code_NOT_FOUND, "run_id", ""},
		{"dlq replay app empty", &messages.ReplayDeadLetter{App: "", RunId: "9:1000000"}, invalid, "app", ""},
		{"dlq replay app of another shard", &messages.ReplayDeadLetter{App: "other", RunId: "9:1000000"}, messages.Code_NOT_OWNER, "app", ""},
		{"dlq replay run id empty", &messages.ReplayDeadLetter{App: "app", RunId: ""}, messages.Code_NOT_FOUND, "run_id", ""},
		{"dlq purge all of another app", &messages.PurgeDeadLetters{App: "other"}, messages.Code_NOT_OWNER, "app", ""},
		{"dlq purge all app empty", &messages.PurgeDeadLetters{App: ""}, invalid, "app", ""},
		{"dlq purge unknown run", &messages.PurgeDeadLetters{App: "app", RunId: "9:1"}, messages.Code_NOT_FOUND, "run_id", ""},
	}
}

func TestValidateAudit(t *testing.T) {
	for _, tc := range auditCases() {
		t.Run(tc.name, func(t *testing.T) {
			c, e := auditCore(t)
			werr, journaled := answer(t, c, e, auditReqMs, tc.req)
			if tc.code == messages.Code_OK {
				if werr != nil {
					t.Fatalf("refused: %v", werr)
				}
				return
			}
			if werr == nil {
				t.Fatalf("accepted (%d records journaled), want %v on %q", journaled, tc.code, tc.field)
			}
			if werr.Code != tc.code || werr.Field != tc.field {
				t.Errorf("%v %q: %s, want %v %q", werr.Code, werr.Field, werr.Message, tc.code, tc.field)
			}
			if werr.Message == "" || !strings.Contains(werr.Message, tc.limit) {
				t.Errorf("message %q does not name the limit %q", werr.Message, tc.limit)
			}
			if journaled != 0 {
				t.Errorf("refused, yet %d records journaled", journaled)
			}
		})
	}
}

// TestCreateTimeOverflow: a one-shot's delay is added to the clock; a sum past the
// time limit (or past int64) is refused naming the delay, never wrapped into the
// past, and whatever is accepted is due no earlier than asked.
func TestCreateTimeOverflow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nowMs   int64
		sched   *messages.Schedule
		field   string // "" = accepted
		wantDue int64  // when accepted
	}{
		{"delay MaxInt64", auditNowMs, &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: math.MaxInt64}, "schedule.delay", 0},
		{"delay wraps to now", auditNowMs, &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: math.MaxInt64 - auditNowMs + 1}, "schedule.delay", 0},
		{"delay to the limit", auditNowMs, &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: schedule.MaxTimeMs - auditNowMs}, "", schedule.MaxTimeMs},
		{"delay 1 ms at the limit", schedule.MaxTimeMs, &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 1}, "schedule.delay", 0},
		{"delay at a clock past the limit", math.MaxInt64 - 10, &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 1000}, "schedule.delay", 0},
		{"at the limit", auditNowMs, &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: schedule.MaxTimeMs}, "", schedule.MaxTimeMs},
		{"rate from a start at the limit", auditNowMs, &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: schedule.MaxEveryMs, StartMs: schedule.MaxTimeMs}, "", schedule.MaxTimeMs},
		{"rate from a start in the past", auditNowMs, &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: schedule.MaxEveryMs, StartMs: 1}, "", 1 + schedule.MaxEveryMs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, e := policyCore(min(tc.nowMs, auditNowMs), Config{}, policyWorker("w1", 4))
			n := len(e.log)
			var r *messages.JobReply
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panicked: %v", p)
					}
				}()
				r = reply(t, c, e, tc.nowMs, &messages.CreateJob{Job: &messages.Job{Id: 100, App: "app", Handler: "h", Schedule: tc.sched}})
			}()
			if tc.field != "" {
				if r.Error.GetCode() != messages.Code_INVALID_ARGUMENT || r.Error.GetField() != tc.field {
					t.Fatalf("%v, want INVALID_ARGUMENT on %s", r.Error, tc.field)
				}
				if len(e.log) != n {
					t.Fatalf("refused, yet %d records journaled", len(e.log)-n)
				}
				return
			}
			if r.Error != nil {
				t.Fatalf("refused: %v", r.Error)
			}
			if r.Job.NextDueMs != tc.wantDue || r.Job.NextDueMs < tc.nowMs {
				t.Fatalf("next due %d, want %d (now %d)", r.Job.NextDueMs, tc.wantDue, tc.nowMs)
			}
		})
	}
}
