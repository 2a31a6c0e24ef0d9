package core

import (
	"testing"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// dispatches returns the Dispatch messages among sent.
func dispatches(sent []sentMsg) []*messages.Dispatch {
	var out []*messages.Dispatch
	for _, s := range sent {
		if d, ok := s.m.(*messages.Dispatch); ok {
			out = append(out, d)
		}
	}
	return out
}

func appPolicyCore(now int64, p *messages.Policy, workers ...string) (*Core, *fakeEnv) {
	c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}, AppPolicy: p}, now, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	var ws []*messages.WorkerInfo
	for _, w := range workers {
		ws = append(ws, &messages.WorkerInfo{WorkerId: w, App: "app", Ref: &messages.Ref{Address: "w", Id: w}, Capacity: 4})
	}
	c.SetWorkers(now, ws, e)
	return c, e
}

// TestAppPolicyDefaults: what a job's policy leaves unset comes from its app's
// default policy (attempts, ladder, timeout), and what the job sets wins.
func TestAppPolicyDefaults(t *testing.T) {
	app := &messages.Policy{Attempts: 2, LadderMs: []int64{500}, TimeoutMs: 7000}
	for _, tc := range []struct {
		name       string
		job        *messages.Policy
		wantDead   bool // after two failed attempts
		wantTimout int64
	}{
		{"app defaults", nil, true, 7000},
		{"job's attempts win", &messages.Policy{Attempts: 3}, false, 7000},
		{"job's timeout wins", &messages.Policy{TimeoutMs: 2000}, true, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, e := appPolicyCore(1000, app, "w1")
			c.Handle(1000, client, &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h",
				Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE}, Policy: tc.job}}, e)
			c.Tick(1000, e)
			c.Durable(e.lsn, nil, e)
			ds := dispatches(e.take())
			if len(ds) != 1 || ds[0].Attempt != 1 || ds[0].TimeoutMs != tc.wantTimout {
				t.Fatalf("first dispatch %v, want attempt 1 with timeout %d ms", ds, tc.wantTimout)
			}
			c.Handle(1100, wref, &messages.RunResult{RunId: ds[0].RunId, JobId: 7, Attempt: 1, Epoch: 1, Outcome: messages.Outcome_FAILED, EndMs: 1100}, e)
			c.Durable(e.lsn, nil, e)
			e.take()
			c.Tick(1100+499, e)
			c.Durable(e.lsn, nil, e)
			if ds := dispatches(e.take()); len(ds) != 0 {
				t.Fatalf("attempt 2 before the app's 500 ms ladder delay: %v", ds)
			}
			c.Tick(1100+500, e)
			c.Durable(e.lsn, nil, e)
			ds = dispatches(e.take())
			if len(ds) != 1 || ds[0].Attempt != 2 {
				t.Fatalf("at the app's 500 ms ladder delay: %v, want attempt 2", ds)
			}
			c.Handle(1700, wref, &messages.RunResult{RunId: ds[0].RunId, JobId: 7, Attempt: 2, Epoch: 1, Outcome: messages.Outcome_FAILED, EndMs: 1700}, e)
			c.Durable(e.lsn, nil, e)
			if got := c.DeadLetters() == 1; got != tc.wantDead {
				t.Fatalf("dead letters after 2 failed attempts: %d, want dead=%v", c.DeadLetters(), tc.wantDead)
			}
		})
	}
}

// TestAppPolicyRouting: a job without a routing of its own takes the app's
// (broadcast here: one fire goes to every worker).
func TestAppPolicyRouting(t *testing.T) {
	c, e := appPolicyCore(1000, &messages.Policy{Route: messages.Route_BROADCAST}, "w1", "w2", "w3")
	c.Handle(1000, client, &messages.CreateJob{Job: onceJob(7, 0)}, e)
	c.Tick(1000, e)
	c.Durable(e.lsn, nil, e)
	if ds := dispatches(e.take()); len(ds) != 3 {
		t.Fatalf("%d dispatches of a job of a broadcast app, want 3 (one per worker)", len(ds))
	}
	c.Handle(1000, client, &messages.CreateJob{Job: &messages.Job{Id: 8, App: "app", Handler: "h",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE}, Policy: &messages.Policy{Route: messages.Route_ROUND_ROBIN}}}, e)
	c.Tick(1001, e)
	c.Durable(e.lsn, nil, e)
	if ds := dispatches(e.take()); len(ds) != 1 {
		t.Fatalf("%d dispatches of a round-robin job of a broadcast app, want 1", len(ds))
	}
}

// TestAppPolicyRouteKeyInherited: a consistent_hash job may leave its route key to
// its app; without one anywhere it is refused, naming the field.
func TestAppPolicyRouteKeyInherited(t *testing.T) {
	job := &messages.Job{Id: 7, App: "app", Handler: "h", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE},
		Policy: &messages.Policy{Route: messages.Route_CONSISTENT_HASH}, Params: []byte(`{"customer":"c1"}`)}
	c, e := appPolicyCore(1000, &messages.Policy{RouteKey: "customer"}, "w1")
	if _, err := c.create(job, 1000); err != nil {
		t.Fatalf("consistent_hash with the app's route key: %v", err)
	}
	_ = e
	c2, _ := appPolicyCore(1000, nil, "w1")
	if _, err := c2.create(job, 1000); err == nil || err.Field != "policy.route_key" {
		t.Fatalf("consistent_hash with no route key anywhere: %v, want an error on policy.route_key", err)
	}
}

func TestValidatePolicyNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		p     *messages.Policy
		field string
	}{
		{&messages.Policy{Attempts: -1}, "policy.attempts"},
		{&messages.Policy{Attempts: MaxAttempts + 1}, "policy.attempts"},
		{&messages.Policy{LadderMs: []int64{1000, 0}}, "policy.ladder"},
		{&messages.Policy{TimeoutMs: -5}, "policy.timeout"},
		{&messages.Policy{Route: 99}, "policy.route"},
		{&messages.Policy{Misfire: 99}, "policy.misfire"},
		{&messages.Policy{Concurrency: 99}, "policy.concurrency"},
	} {
		if e := ValidatePolicy(tc.p, ""); e == nil || e.Field != tc.field {
			t.Errorf("%v: %v, want an error on %s", tc.p, e, tc.field)
		}
	}
	if e := ValidatePolicy(&messages.Policy{Attempts: 3, LadderMs: []int64{1000}, Route: messages.Route_LEAST_BUSY}, ""); e != nil {
		t.Errorf("a valid policy: %v", e)
	}
}

// TestConsistentHashNeedsTheKeyInParams: a consistent_hash job whose params do not
// carry the route key (or are not a JSON object) is refused, naming the field; an
// API-only job may leave its params to its triggers, which are checked instead.
func TestConsistentHashNeedsTheKeyInParams(t *testing.T) {
	pol := &messages.Policy{Route: messages.Route_CONSISTENT_HASH, RouteKey: "tenant"}
	once := &messages.Schedule{Kind: messages.ScheduleKind_ONCE}
	api := &messages.Schedule{Kind: messages.ScheduleKind_API_ONLY}
	for _, tc := range []struct {
		name   string
		sched  *messages.Schedule
		params string
		field  string // "" = accepted
	}{
		{"key present", once, `{"tenant":"t1","x":1}`, ""},
		{"key missing", once, `{"customer":"c1"}`, "policy.route_key"},
		{"not an object", once, `hello`, "params"},
		{"no params", once, ``, "params"},
		{"api-only, params left to triggers", api, ``, ""},
		{"api-only, key missing", api, `{"customer":"c1"}`, "policy.route_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := appPolicyCore(1000, nil, "w1")
			_, e := c.create(&messages.Job{Id: 7, App: "app", Handler: "h", Schedule: tc.sched, Policy: pol, Params: []byte(tc.params)}, 1000)
			if got := e.GetField(); got != tc.field || (tc.field == "") != (e == nil) {
				t.Fatalf("create: %v, want field %q", e, tc.field)
			}
		})
	}
	c, e := appPolicyCore(1000, nil, "w1")
	c.Handle(1000, client, &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h", Schedule: api, Policy: pol}}, e)
	c.Durable(e.lsn, nil, e)
	e.take()
	c.Handle(1001, client, &messages.TriggerJob{App: "app", Id: 7, Params: []byte(`{"customer":"c1"}`), HasParams: true}, e)
	c.Durable(e.lsn, nil, e)
	for _, s := range e.take() {
		if r, ok := s.m.(*messages.JobReply); ok {
			if r.Error.GetField() != "policy.route_key" {
				t.Fatalf("trigger without the route key in its params: %v, want an error on policy.route_key", r.Error)
			}
			return
		}
	}
	t.Fatal("no reply to the trigger")
}
