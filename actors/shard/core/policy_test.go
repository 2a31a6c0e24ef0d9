package core

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// Tests of the per-job policies of issue 5 in the pure core: the retry ladder and
// its attempts, lost results, concurrency, routing, misfires at recovery, updates
// and the run history. Times are plain milliseconds; the Env is core_test.go's
// fakeEnv (it has no Ladder, so the core's own timers hold waiting retries).

// policyWorker is a live worker whose Ref.Id is its worker id, so a dispatch's
// destination names the worker it went to.
func policyWorker(id string, capacity int32) *messages.WorkerInfo {
	return &messages.WorkerInfo{WorkerId: id, App: "app", Ref: &messages.Ref{Address: id, Id: id}, Capacity: capacity}
}

// policyCore is an opened shard of app "app" with cfg (Shard and Self filled in)
// and ws live.
func policyCore(now int64, cfg Config, ws ...*messages.WorkerInfo) (*Core, *fakeEnv) {
	cfg.Shard = route.Root("app")
	cfg.Self = &messages.Ref{Address: "s", Id: "shard"}
	c := New(cfg, now, 1)
	e := &fakeEnv{}
	c.Open(e)
	c.Durable(e.lsn, nil, e)
	c.SetWorkers(now, ws, e)
	return c, e
}

// sentDispatch is a dispatch and the worker (Ref.Id) it was sent to.
type sentDispatch struct {
	to string
	d  *messages.Dispatch
}

// settle makes everything journaled durable and returns the dispatches that
// released; every other message is dropped.
func settle(c *Core, e *fakeEnv) []sentDispatch {
	c.Durable(e.lsn, nil, e)
	var out []sentDispatch
	for _, s := range e.take() {
		if d, ok := s.m.(*messages.Dispatch); ok {
			out = append(out, sentDispatch{s.to.GetId(), d})
		}
	}
	return out
}

// tick is Tick at now, then settle.
func tick(c *Core, e *fakeEnv, now int64) []sentDispatch {
	c.Tick(now, e)
	return settle(c, e)
}

// records decodes the journal records of type rt appended from index from on.
func records[T proto.Message](t *testing.T, e *fakeEnv, from int, rt messages.RecordType) []T {
	t.Helper()
	var out []T
	for _, r := range e.log[from:] {
		if messages.RecordType(r.Type) != rt {
			continue
		}
		m, err := Decode(rt, r.Payload)
		if err != nil {
			t.Fatalf("lsn %d: %v", r.LSN, err)
		}
		out = append(out, m.(T))
	}
	return out
}

// report hands the worker's result for dispatch sd to the shard at now (the run
// started at startMs and ended at now) and settles.
func report(c *Core, e *fakeEnv, now int64, sd sentDispatch, o messages.Outcome, errText string, startMs int64) {
	d := sd.d
	c.Handle(now, &messages.Ref{Address: sd.to, Id: sd.to}, &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Shard: d.Shard,
		Epoch: d.Epoch, Attempt: d.Attempt, DueMs: d.DueMs, Outcome: o, Error: errText, StartMs: startMs, EndMs: now,
		WorkerId: sd.to}, e)
	settle(c, e)
}

func getJob(t *testing.T, c *Core, e *fakeEnv, now, id int64) *messages.Job {
	t.Helper()
	r := reply(t, c, e, now, &messages.GetJob{App: "app", Id: id})
	if r.Error != nil {
		t.Fatalf("get job %d: %v", id, r.Error)
	}
	return r.Job
}

func fixedRateJob(id, everyMs int64, p *messages.Policy) *messages.Job {
	return &messages.Job{Id: id, App: "app", Handler: "h", Policy: p,
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: everyMs}}
}

// A job with no policy gets the default ladder (1 s, 5 s, 30 s, 2 min after each
// failure, counted from when the shard learns of it) and five attempts; the fifth
// failure is dead-lettered exactly once.
func TestDefaultLadderAndAttempts(t *testing.T) {
	c, e := policyCore(1000, Config{}, policyWorker("w1", 4))
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(7, 0)})
	ds := tick(c, e, 1000)
	steps := []struct {
		attempt int32
		delayMs int64 // until the next attempt; 0: dead-lettered
	}{
		{1, 1000},
		{2, 5000},
		{3, 30000},
		{4, 120000},
		{5, 0},
	}
	for _, s := range steps {
		if len(ds) != 1 || ds[0].d.Attempt != s.attempt || ds[0].d.RunId != "7:1000" || ds[0].d.DueMs != 1000 {
			t.Fatalf("attempt %d: dispatches %v, want one of run 7:1000", s.attempt, ds)
		}
		finish := ds[0].d.DispatchedMs + 250
		mark := len(e.log)
		report(c, e, finish, ds[0], messages.Outcome_FAILED, fmt.Sprintf("boom %d", s.attempt), finish-200)
		retries := records[*messages.RunState](t, e, mark, messages.RecordType_RETRY_SCHEDULED)
		dead := records[*messages.DeadLetter](t, e, mark, messages.RecordType_DEAD_LETTERED)
		if s.delayMs == 0 {
			if len(retries) != 0 || len(dead) != 1 {
				t.Fatalf("after attempt %d: %d retries and %d dead letters journaled, want 0 and 1", s.attempt, len(retries), len(dead))
			}
			if d := dead[0]; d.RunId != "7:1000" || d.Attempts != 5 || d.LastError != "boom 5" || d.DeadMs != finish {
				t.Fatalf("dead letter %v", d)
			}
			break
		}
		if len(retries) != 1 || len(dead) != 0 {
			t.Fatalf("after attempt %d: %d retries and %d dead letters journaled, want 1 and 0", s.attempt, len(retries), len(dead))
		}
		due := finish + s.delayMs
		if r := retries[0]; r.Attempt != s.attempt+1 || r.DeadlineMs != due || r.LastError != fmt.Sprintf("boom %d", s.attempt) {
			t.Fatalf("after attempt %d: retry %v, want attempt %d due %d", s.attempt, r, s.attempt+1, due)
		}
		if at, ok := c.NextWake(); !ok || at != due {
			t.Fatalf("after attempt %d: next wake %d %v, want %d", s.attempt, at, ok, due)
		}
		if early := tick(c, e, due-1); len(early) != 0 {
			t.Fatalf("attempt %d dispatched 1 ms early: %v", s.attempt+1, early)
		}
		ds = tick(c, e, due)
	}
	if c.DeadLetters() != 1 || c.InFlight() != 0 {
		t.Fatalf("%d dead letters, %d in flight; want 1 and 0", c.DeadLetters(), c.InFlight())
	}
	mark := len(e.log)
	if ds := tick(c, e, 10_000_000); len(ds) != 0 {
		t.Fatalf("dispatched after the dead letter: %v", ds)
	}
	if n := len(records[*messages.DeadLetter](t, e, mark, messages.RecordType_DEAD_LETTERED)); n != 0 || c.DeadLetters() != 1 {
		t.Fatalf("%d more dead letters journaled, %d held; want exactly one in all", n, c.DeadLetters())
	}
}

// A dispatched run with no result by timeout + grace (5 s) is recorded as LOST and
// retried on the ladder; the next attempt goes out when its delay is over.
func TestLostResultIsRetried(t *testing.T) {
	tests := []struct {
		name       string
		policy     *messages.Policy
		deadlineMs int64 // dispatched at 1000
	}{
		{"default timeout 60 s", nil, 1000 + 60_000 + 5_000},
		{"timeout 2 s", &messages.Policy{TimeoutMs: 2000}, 1000 + 2_000 + 5_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, e := policyCore(1000, Config{}, policyWorker("w1", 4))
			reply(t, c, e, 1000, &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h", Policy: tt.policy,
				Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE}}})
			if ds := tick(c, e, 1000); len(ds) != 1 {
				t.Fatalf("dispatches %v", ds)
			}
			mark := len(e.log)
			tick(c, e, tt.deadlineMs-1)
			if fin := records[*messages.RunRecord](t, e, mark, messages.RecordType_RUN_FINISHED); len(fin) != 0 {
				t.Fatalf("recorded 1 ms before the deadline: %v", fin)
			}
			if ds := tick(c, e, tt.deadlineMs); len(ds) != 0 {
				t.Fatalf("dispatched at the deadline, before the retry delay: %v", ds)
			}
			fin := records[*messages.RunRecord](t, e, mark, messages.RecordType_RUN_FINISHED)
			if len(fin) != 1 || fin[0].Outcome != messages.Outcome_LOST || fin[0].Attempt != 1 ||
				fin[0].WorkerId != "w1" || fin[0].EndMs != tt.deadlineMs || fin[0].Error == "" {
				t.Fatalf("finished %v, want one LOST attempt 1 on w1 at %d with an error", fin, tt.deadlineMs)
			}
			retry := tt.deadlineMs + 1000
			rs := records[*messages.RunState](t, e, mark, messages.RecordType_RETRY_SCHEDULED)
			if len(rs) != 1 || rs[0].Attempt != 2 || rs[0].DeadlineMs != retry {
				t.Fatalf("retries %v, want attempt 2 due %d", rs, retry)
			}
			if ds := tick(c, e, retry-1); len(ds) != 0 {
				t.Fatalf("attempt 2 dispatched early: %v", ds)
			}
			ds := tick(c, e, retry)
			if len(ds) != 1 || ds[0].d.Attempt != 2 || ds[0].d.RunId != "7:1000" || ds[0].d.DispatchedMs != retry {
				t.Fatalf("at the retry due: %v, want attempt 2 of 7:1000", ds)
			}
		})
	}
}

// Concurrency forbid skips a fire while the previous run is unfinished, and the
// schedule moves on; allow (and the default) starts the second run alongside.
func TestConcurrencyPolicy(t *testing.T) {
	tests := []struct {
		name   string
		conc   messages.Concurrency
		second bool // the fire at 3000 starts a run
	}{
		{"forbid", messages.Concurrency_FORBID, false},
		{"allow", messages.Concurrency_ALLOW, true},
		{"default", messages.Concurrency_CONCURRENCY_DEFAULT, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, e := policyCore(1000, Config{}, policyWorker("w1", 4))
			// Every 1 s from 1000: due 2000, 3000, 4000, ...; a long timeout keeps run 1 in flight.
			reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 1000, &messages.Policy{Concurrency: tt.conc, TimeoutMs: 600_000})})
			first := tick(c, e, 2000)
			if len(first) != 1 || first[0].d.RunId != "7:2000" {
				t.Fatalf("at 2000: %v", first)
			}
			ds := tick(c, e, 3000) // run 7:2000 has no result yet
			if tt.second {
				if len(ds) != 1 || ds[0].d.RunId != "7:3000" {
					t.Fatalf("at 3000 with run 7:2000 unfinished: %v, want run 7:3000", ds)
				}
			} else if len(ds) != 0 {
				t.Fatalf("at 3000 with run 7:2000 unfinished: %v, want the fire skipped", ds)
			}
			if j := getJob(t, c, e, 3000, 7); j.NextDueMs != 4000 {
				t.Fatalf("next due %d after the fire at 3000, want 4000", j.NextDueMs)
			}
			report(c, e, 3500, first[0], messages.Outcome_SUCCEEDED, "", 2001)
			ds = tick(c, e, 4000)
			if len(ds) != 1 || ds[0].d.RunId != "7:4000" {
				t.Fatalf("at 4000, run 7:2000 finished: %v, want run 7:4000", ds)
			}
		})
	}
}

// routeRig is a shard with workers ws (by default three of capacity 1) and one
// API-only job of policy p.
func routeRig(t *testing.T, p *messages.Policy, ws ...*messages.WorkerInfo) (*Core, *fakeEnv) {
	t.Helper()
	if len(ws) == 0 {
		ws = []*messages.WorkerInfo{policyWorker("w1", 1), policyWorker("w2", 1), policyWorker("w3", 1)}
	}
	c, e := policyCore(1000, Config{Seed: 42}, ws...)
	r := reply(t, c, e, 1000, &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h", Policy: p,
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_API_ONLY}}})
	if r.Error != nil {
		t.Fatal(r.Error)
	}
	return c, e
}

// trigger starts a run of job 7 now (with params when given) and returns its dispatches.
func trigger(t *testing.T, c *Core, e *fakeEnv, now int64, params string) []sentDispatch {
	t.Helper()
	c.Handle(now, client, &messages.TriggerJob{App: "app", Id: 7, Params: []byte(params), HasParams: params != ""}, e)
	return settle(c, e)
}

func TestRoutingRoundRobin(t *testing.T) {
	for _, r := range []messages.Route{messages.Route_ROUND_ROBIN, messages.Route_ROUTE_DEFAULT} {
		t.Run(r.String(), func(t *testing.T) {
			c, e := routeRig(t, &messages.Policy{Route: r})
			var to []string
			for i := range 9 {
				ds := trigger(t, c, e, 2000+int64(i), "")
				if len(ds) != 1 {
					t.Fatalf("trigger %d: %v", i, ds)
				}
				to = append(to, ds[0].to)
			}
			for i := range to {
				if i >= 3 && to[i] != to[i-3] {
					t.Fatalf("not a cycle of the three workers: %v", to)
				}
			}
			if seen := map[string]bool{to[0]: true, to[1]: true, to[2]: true}; len(seen) != 3 {
				t.Fatalf("three fires in a row went to %v, want each worker once", to[:3])
			}
		})
	}
}

func TestRoutingRandom(t *testing.T) {
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_RANDOM})
	seen := map[string]int{}
	for i := range 30 {
		ds := trigger(t, c, e, 2000+int64(i), "")
		if len(ds) != 1 {
			t.Fatalf("trigger %d: %v", i, ds)
		}
		seen[ds[0].to]++
	}
	for w := range seen {
		if w != "w1" && w != "w2" && w != "w3" {
			t.Fatalf("routed to %q, not a live worker: %v", w, seen)
		}
	}
	if len(seen) < 2 {
		t.Fatalf("30 random fires all went to one worker: %v", seen)
	}
}

// Least busy counts the runs in flight on each worker (relative to its capacity);
// ties go to the first worker.
func TestRoutingLeastBusy(t *testing.T) {
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_LEAST_BUSY})
	var held []sentDispatch
	for i, want := range []string{"w1", "w2", "w3"} { // no results yet: each goes to an idle worker
		ds := trigger(t, c, e, 2000+int64(i), "")
		if len(ds) != 1 || ds[0].to != want {
			t.Fatalf("trigger %d: %v, want %s", i, ds, want)
		}
		held = append(held, ds...)
	}
	report(c, e, 2100, held[1], messages.Outcome_SUCCEEDED, "", 2050) // w2 is idle again
	for i, want := range []string{"w2", "w1"} {                       // then all have one: the first
		ds := trigger(t, c, e, 2200+int64(i), "")
		if len(ds) != 1 || ds[0].to != want {
			t.Fatalf("trigger %d after w2 finished: %v, want %s", i, ds, want)
		}
	}

	// Busy relative to capacity: w1 with four slots is the least busy until it has
	// more than four times the runs of w2 and w3 with one slot each.
	c, e = routeRig(t, &messages.Policy{Route: messages.Route_LEAST_BUSY},
		policyWorker("w1", 4), policyWorker("w2", 1), policyWorker("w3", 1))
	for i, want := range []string{"w1", "w2", "w3", "w1", "w1", "w1", "w1", "w2"} {
		ds := trigger(t, c, e, 2000+int64(i), "")
		if len(ds) != 1 || ds[0].to != want {
			t.Fatalf("capacity 4/1/1, trigger %d: %v, want %s", i, ds, want)
		}
	}
}

// Consistent hash routes on the value of the route key in the params: the same
// value always goes to the same worker whatever the other fields, and different
// values spread over the workers.
func TestRoutingConsistentHash(t *testing.T) {
	// (Four slots each: none of the 80 runs, which never finish, waits for credit.)
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_CONSISTENT_HASH, RouteKey: "tenant"},
		policyWorker("w1", 4), policyWorker("w2", 4), policyWorker("w3", 4))
	now := int64(2000)
	workerOf := func(params string) string {
		t.Helper()
		now++
		ds := trigger(t, c, e, now, params)
		if len(ds) != 1 {
			t.Fatalf("params %s: %v", params, ds)
		}
		return ds[0].to
	}
	spread := map[string]bool{}
	for k := range 20 {
		tenant := fmt.Sprintf("tenant-%d", k)
		w := workerOf(fmt.Sprintf(`{"tenant":%q,"n":0}`, tenant))
		for n := 1; n <= 3; n++ {
			if again := workerOf(fmt.Sprintf(`{"n":%d,"tenant":%q}`, n, tenant)); again != w {
				t.Fatalf("tenant %s went to %s, then to %s", tenant, w, again)
			}
		}
		spread[w] = true
	}
	if len(spread) < 2 {
		t.Fatalf("20 keys all went to %v", spread)
	}
}

func TestRoutingBroadcast(t *testing.T) {
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_BROADCAST})
	ds := trigger(t, c, e, 2000, "")
	seen := map[string]bool{}
	for _, d := range ds {
		if d.d.RunId != ds[0].d.RunId {
			t.Fatalf("one fire, several runs: %v", ds)
		}
		seen[d.to] = true
	}
	if len(ds) != 3 || !seen["w1"] || !seen["w2"] || !seen["w3"] {
		t.Fatalf("broadcast sent %v, want one dispatch to each of w1 w2 w3", ds)
	}
	if c.InFlight() != 1 {
		t.Fatalf("%d runs in flight, want the one broadcast run", c.InFlight())
	}
}

// A fixed-rate job's dues that passed while its shard was down follow its misfire
// policy at recovery, and its next due is in the future afterwards.
func TestMisfireAtRecovery(t *testing.T) {
	// Every 1 s from 1000: dues 2000, 3000, ...
	tests := []struct {
		name     string
		misfire  messages.Misfire
		nowMs    int64
		wantDues []int64 // dispatched at recovery, in order
		nextMs   int64
	}{
		{"default fires once", messages.Misfire_MISFIRE_DEFAULT, 7500, []int64{2000}, 8000},
		{"fire_once", messages.Misfire_FIRE_ONCE, 7500, []int64{2000}, 8000},
		{"skip", messages.Misfire_SKIP, 7500, nil, 8000},
		{"fire_all", messages.Misfire_FIRE_ALL, 7500, []int64{2000, 3000, 4000, 5000, 6000, 7000}, 8000},
		{"fire_all bounded to 100", messages.Misfire_FIRE_ALL, 2000 + 150*1000 + 500, dueSeries(2000, 1000, 100), 153_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, e := policyCore(1000, Config{}, policyWorker("w1", 1000))
			reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 1000, &messages.Policy{Misfire: tt.misfire})})

			r := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, tt.nowMs, 0)
			for _, rec := range e.log {
				if err := r.Replay(rec); err != nil {
					t.Fatal(err)
				}
			}
			e2 := &fakeEnv{lsn: e.lsn}
			r.SetWorkers(tt.nowMs, []*messages.WorkerInfo{policyWorker("w1", 1000)}, e2)
			r.Recovered(tt.nowMs, e.lsn, e2)
			ds := settle(r, e2)
			if len(ds) != len(tt.wantDues) {
				t.Fatalf("%d dispatches at recovery, want %d", len(ds), len(tt.wantDues))
			}
			for i, d := range ds {
				if d.d.DueMs != tt.wantDues[i] || d.d.RunId != fmt.Sprintf("7:%d", tt.wantDues[i]) {
					t.Fatalf("dispatch %d is %s due %d, want due %d", i, d.d.RunId, d.d.DueMs, tt.wantDues[i])
				}
			}
			if j := getJob(t, r, e2, tt.nowMs, 7); j.NextDueMs != tt.nextMs || j.NextDueMs <= tt.nowMs {
				t.Fatalf("next due %d after recovery at %d, want %d", j.NextDueMs, tt.nowMs, tt.nextMs)
			}
			if ds := tick(r, e2, tt.nowMs); len(ds) != 0 {
				t.Fatalf("a tick at the recovery time fired again: %d dispatches", len(ds))
			}
			ds = tick(r, e2, tt.nextMs)
			if len(ds) != 1 || ds[0].d.DueMs != tt.nextMs {
				t.Fatalf("at the next due %d: %v", tt.nextMs, ds)
			}
		})
	}
}

// Under FORBID the dues missed during downtime cannot all run, since each would
// overlap the one before it: fire_all fires only the oldest; and when a run from
// before the downtime is still going, none fires and the history records the
// skip. Either way the next due is in the future, as without FORBID.
func TestMisfireUnderForbid(t *testing.T) {
	tests := []struct {
		name     string
		misfire  messages.Misfire
		inFlight bool    // run 7:2000 dispatched before the downtime, no result
		wantDues []int64 // new runs dispatched at recovery
	}{
		{"fire_all fires the oldest only", messages.Misfire_FIRE_ALL, false, []int64{2000}},
		{"fire_once", messages.Misfire_FIRE_ONCE, false, []int64{2000}},
		{"fire_all with a run going", messages.Misfire_FIRE_ALL, true, nil},
		{"fire_once with a run going", messages.Misfire_FIRE_ONCE, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const nowMs = 7500
			c, e := policyCore(1000, Config{}, policyWorker("w1", 1000))
			p := &messages.Policy{Misfire: tt.misfire, Concurrency: messages.Concurrency_FORBID, TimeoutMs: 600_000}
			reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 1000, p)})
			missed := int64(2000)
			if tt.inFlight {
				if ds := tick(c, e, 2000); len(ds) != 1 || ds[0].d.RunId != "7:2000" {
					t.Fatalf("at 2000: %v", ds)
				}
				missed = 3000
			}

			r := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, nowMs, 0)
			for _, rec := range e.log {
				if err := r.Replay(rec); err != nil {
					t.Fatal(err)
				}
			}
			e2 := &fakeEnv{lsn: e.lsn}
			r.SetWorkers(nowMs, []*messages.WorkerInfo{policyWorker("w1", 1000)}, e2)
			r.Recovered(nowMs, e.lsn, e2)
			var dues []int64
			for _, d := range settle(r, e2) {
				if d.d.RunId != "7:2000" || !tt.inFlight { // the run going may be sent again
					dues = append(dues, d.d.DueMs)
				}
			}
			if !slices.Equal(dues, tt.wantDues) {
				t.Fatalf("new runs due %v dispatched at recovery, want %v", dues, tt.wantDues)
			}
			if j := getJob(t, r, e2, nowMs, 7); j.NextDueMs != 8000 {
				t.Fatalf("next due %d after recovery at %d, want 8000", j.NextDueMs, nowMs)
			}
			var skipped []int64
			for _, rec := range getRuns(t, r, e2, nowMs, 10).Runs {
				if rec.Outcome == messages.Outcome_SKIPPED {
					skipped = append(skipped, rec.DueMs)
				}
			}
			if tt.inFlight && !slices.Equal(skipped, []int64{missed}) {
				t.Fatalf("skipped fires %v in the history, want the missed due %d", skipped, missed)
			}
			if !tt.inFlight && len(skipped) != 0 {
				t.Fatalf("skipped fires %v in the history, want none", skipped)
			}
		})
	}
}

// dueSeries is n dues every everyMs from firstMs.
func dueSeries(firstMs, everyMs int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = firstMs + int64(i)*everyMs
	}
	return out
}

// An update recomputes the next due from the new schedule.
func TestUpdateRecomputesNextDue(t *testing.T) {
	tests := []struct {
		name   string
		sched  *messages.Schedule
		nextMs int64 // updated at 2000
	}{
		{"shorter interval", &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 3000}, 5000},
		{"longer interval", &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 60_000}, 62_000},
		{"with a start", &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 3000, StartMs: 20_000}, 20_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, e := policyCore(1000, Config{}, policyWorker("w1", 4))
			reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 10_000, nil)})
			if j := getJob(t, c, e, 1000, 7); j.NextDueMs != 11_000 {
				t.Fatalf("next due %d at create, want 11000", j.NextDueMs)
			}
			r := reply(t, c, e, 2000, &messages.UpdateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h", Schedule: tt.sched}})
			if r.Error != nil || r.Job.NextDueMs != tt.nextMs || r.Job.Version != 2 {
				t.Fatalf("update reply %v, want next due %d at version 2", r, tt.nextMs)
			}
			if j := getJob(t, c, e, 2000, 7); j.NextDueMs != tt.nextMs {
				t.Fatalf("next due %d after the update, want %d", j.NextDueMs, tt.nextMs)
			}
			if ds := tick(c, e, tt.nextMs-1); len(ds) != 0 {
				t.Fatalf("fired before the new due: %v", ds)
			}
			if ds := tick(c, e, tt.nextMs); len(ds) != 1 || ds[0].d.DueMs != tt.nextMs {
				t.Fatalf("at the new due %d: %v", tt.nextMs, ds)
			}
		})
	}
}

// An update while a run is in flight leaves the run alone: it is neither sent
// again nor dropped, and its result is recorded.
func TestUpdateLeavesRunInFlight(t *testing.T) {
	c, e := policyCore(1000, Config{}, policyWorker("w1", 4))
	reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 10_000, nil)})
	ds := tick(c, e, 11_000)
	if len(ds) != 1 || ds[0].d.RunId != "7:11000" {
		t.Fatalf("at 11000: %v", ds)
	}
	mark := len(e.log)
	r := reply(t, c, e, 11_500, &messages.UpdateJob{Job: fixedRateJob(7, 3000, nil)})
	if r.Error != nil || r.Job.NextDueMs != 14_500 {
		t.Fatalf("update reply %v, want next due 14500", r)
	}
	if len(e.take()) != 0 || c.InFlight() != 1 {
		t.Fatalf("the update touched the run in flight: %d in flight", c.InFlight())
	}
	if n := len(records[*messages.RunState](t, e, mark, messages.RecordType_RUN_DISPATCHED)); n != 0 {
		t.Fatalf("the update journaled %d dispatches", n)
	}
	mark = len(e.log)
	c.Handle(12_000, &messages.Ref{Address: "w1", Id: "w1"}, &messages.RunResult{RunId: "7:11000", JobId: 7, Epoch: 1, Attempt: 1, DueMs: 11_000,
		Outcome: messages.Outcome_SUCCEEDED, StartMs: 11_001, EndMs: 12_000, WorkerId: "w1"}, e)
	c.Durable(e.lsn, nil, e)
	fin := records[*messages.RunRecord](t, e, mark, messages.RecordType_RUN_FINISHED)
	if len(fin) != 1 || fin[0].RunId != "7:11000" || fin[0].Outcome != messages.Outcome_SUCCEEDED {
		t.Fatalf("the result of the run from before the update: finished %v", fin)
	}
	acked := false
	for _, s := range e.take() {
		if a, ok := s.m.(*messages.ResultAck); ok && a.RunId == "7:11000" {
			acked = true
		}
	}
	if !acked || c.InFlight() != 0 {
		t.Fatalf("acked %v, %d in flight", acked, c.InFlight())
	}
	if j := getJob(t, c, e, 12_000, 7); j.NextDueMs != 14_500 {
		t.Fatalf("next due %d after the old run finished, want 14500", j.NextDueMs)
	}
}

// The run history keeps the last Config.History runs, newest first, each with its
// due time, start, end, attempt, worker, outcome and error text.
func TestRunHistoryBounded(t *testing.T) {
	c, e := policyCore(1000, Config{History: 3}, policyWorker("w1", 4), policyWorker("w2", 4))
	reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 1000, &messages.Policy{Attempts: 1})})
	var want []*messages.RunRecord // oldest first
	for i := range 5 {
		due := 2000 + int64(i)*1000
		ds := tick(c, e, due)
		if len(ds) != 1 {
			t.Fatalf("at %d: %v", due, ds)
		}
		o := []messages.Outcome{messages.Outcome_FAILED, messages.Outcome_TIMED_OUT}[i%2]
		end := due + 100 + int64(i)
		report(c, e, end, ds[0], o, fmt.Sprintf("error %d", i), due+10)
		if n := len(c.jobs[7].history); n != min(i+1, 3) {
			t.Fatalf("after %d finished runs the shard keeps %d, want at most Config.History = 3", i+1, n)
		}
		want = append(want, &messages.RunRecord{RunId: ds[0].d.RunId, DueMs: due, StartMs: due + 10, EndMs: end,
			Attempt: 1, WorkerId: ds[0].to, Outcome: o, Error: fmt.Sprintf("error %d", i)})
	}
	tests := []struct {
		limit int32
		want  int // the newest
	}{
		{0, 3},
		{2, 2},
		{10, 3},
	}
	for _, tt := range tests {
		c.Handle(7000, client, &messages.GetRuns{App: "app", Id: 7, Limit: tt.limit}, e)
		c.Durable(e.lsn, nil, e)
		s := e.take()
		if len(s) != 1 {
			t.Fatalf("limit %d: sent %v", tt.limit, s)
		}
		got := s[0].m.(*messages.RunsReply)
		if got.Error != nil || len(got.Runs) != tt.want {
			t.Fatalf("limit %d: %d runs (%v), want the last %d", tt.limit, len(got.Runs), got.Error, tt.want)
		}
		for i, g := range got.Runs {
			w := want[len(want)-1-i]
			if g.RunId != w.RunId || g.DueMs != w.DueMs || g.StartMs != w.StartMs || g.EndMs != w.EndMs ||
				g.Attempt != w.Attempt || g.WorkerId != w.WorkerId || g.Outcome != w.Outcome || g.Error != w.Error {
				t.Fatalf("limit %d: run %d is %v, want %v", tt.limit, i, g, w)
			}
			if g.DueMs == 0 || g.StartMs == 0 || g.EndMs == 0 || g.WorkerId == "" || g.Error == "" {
				t.Fatalf("limit %d: run %d has a field unset: %v", tt.limit, i, g)
			}
		}
	}
}

// TestForbidCountsARunWaitingForItsRetry: a forbid job whose previous run failed
// and waits on the ladder for its next attempt has not finished: the next fire is
// skipped, and the run history records the skip.
func TestForbidCountsARunWaitingForItsRetry(t *testing.T) {
	c, e := policyCore(1000, Config{}, policyWorker("w1", 4))
	// Every 1 s from 1000; a failure waits 5 s for attempt 2.
	reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 1000, &messages.Policy{Concurrency: messages.Concurrency_FORBID,
		Attempts: 2, LadderMs: []int64{5000}})})
	first := tick(c, e, 2000)
	if len(first) != 1 {
		t.Fatalf("at 2000: %v", first)
	}
	report(c, e, 2100, first[0], messages.Outcome_FAILED, "boom", 2001)
	if ds := tick(c, e, 3000); len(ds) != 0 {
		t.Fatalf("at 3000 with run 7:2000 waiting for attempt 2: %v, want the fire skipped", ds)
	}
	r := getRuns(t, c, e, 3001, 10)
	var skipped []*messages.RunRecord
	for _, rec := range r.Runs {
		if rec.Outcome == messages.Outcome_SKIPPED {
			skipped = append(skipped, rec)
		}
	}
	if len(skipped) != 1 || skipped[0].DueMs != 3000 || skipped[0].Error == "" {
		t.Fatalf("run history %v, want one SKIPPED record of the fire due at 3000", r.Runs)
	}
	if ds := tick(c, e, 7100); len(ds) != 1 || ds[0].d.Attempt != 2 || ds[0].d.RunId != "7:2000" {
		t.Fatalf("at 7100: %v, want attempt 2 of 7:2000", ds)
	}
}

// TestRunsLimitCountsRunsInFlight: GetRuns returns at most its limit, runs still
// in flight included (a fire_all recovery can have a hundred of them).
func TestRunsLimitCountsRunsInFlight(t *testing.T) {
	c, e := policyCore(1000, Config{History: 3}, policyWorker("w1", 16))
	reply(t, c, e, 1000, &messages.CreateJob{Job: fixedRateJob(7, 1000, &messages.Policy{TimeoutMs: 600_000})})
	for now := int64(2000); now <= 6000; now += 1000 {
		tick(c, e, now) // five runs, none finished
	}
	r := getRuns(t, c, e, 6001, 2)
	if len(r.Runs) != 2 || r.Runs[0].DueMs != 6000 || r.Runs[1].DueMs != 5000 {
		t.Fatalf("GetRuns limit 2 with 5 runs in flight: %v, want the newest 2", r.Runs)
	}
}

// getRuns asks for job 7's run history, keeping whatever else was sent.
func getRuns(t *testing.T, c *Core, e *fakeEnv, now int64, limit int32) *messages.RunsReply {
	t.Helper()
	c.Handle(now, client, &messages.GetRuns{App: "app", Id: 7, Limit: limit}, e)
	c.Durable(e.lsn, nil, e)
	for _, s := range e.take() {
		if r, ok := s.m.(*messages.RunsReply); ok {
			return r
		}
		e.sent = append(e.sent, s)
	}
	t.Fatal("no RunsReply")
	return nil
}

// TestRunOfAGoneWorkerIsDispatchedAgain: when the worker a run went to leaves the
// app's worker list, the run goes to another worker at once with the same attempt
// (at least once), instead of waiting out timeout + grace as a lost attempt.
func TestRunOfAGoneWorkerIsDispatchedAgain(t *testing.T) {
	w1, w2 := policyWorker("w1", 4), policyWorker("w2", 4)
	c, e := policyCore(1000, Config{}, w1, w2)
	reply(t, c, e, 1000, &messages.CreateJob{Job: onceJob(7, 1000)})
	ds := tick(c, e, 2000)
	if len(ds) != 1 {
		t.Fatalf("at 2000: %v", ds)
	}
	gone, stays := w1, w2
	if ds[0].d.RunId != "7:2000" || ds[0].to != w1.Ref.Id {
		gone, stays = w2, w1
	}
	from := len(e.log)
	c.SetWorkers(2500, []*messages.WorkerInfo{stays}, e)
	again := settle(c, e)
	if len(again) != 1 || again[0].to != stays.Ref.Id || again[0].d.Attempt != 1 || again[0].d.RunId != "7:2000" {
		t.Fatalf("after %s left: %v, want run 7:2000 attempt 1 sent to %s", gone.WorkerId, again, stays.WorkerId)
	}
	if n := len(records[*messages.RunRecord](t, e, from, messages.RecordType_RUN_FINISHED)); n != 0 {
		t.Fatalf("%d RUN_FINISHED records: the re-dispatch counted as a finished attempt", n)
	}
	report(c, e, 2600, again[0], messages.Outcome_SUCCEEDED, "", 2501)
	if c.InFlight() != 0 || c.DeadLetters() != 0 {
		t.Fatalf("after the result from %s: %d in flight, %d dead letters", stays.WorkerId, c.InFlight(), c.DeadLetters())
	}
	// A worker list that still has the run's worker sends nothing again.
	reply(t, c, e, 2600, &messages.CreateJob{Job: onceJob(8, 400)})
	ds = tick(c, e, 3000)
	c.SetWorkers(3100, []*messages.WorkerInfo{stays, policyWorker("w3", 4)}, e)
	if again := settle(c, e); len(again) != 0 {
		t.Fatalf("a worker joined, the run's worker stayed: sent again %v", again)
	}
	_ = ds
}

// An update re-arms a one-shot whose run already ran (here: was dead-lettered) at
// the same due time. The new run gets a new run id: the old one names a dead
// letter (a second DEAD_LETTERED of one run would replace it) and is in the
// worker's dedupe memory (it would drop the new run as a duplicate). Found by the
// simulator (dead-letter-twice).
func TestUpdateOfRanOneShotGetsNewRunID(t *testing.T) {
	c, e := policyCore(1000, Config{}, policyWorker("w1", 4))
	job := &messages.Job{Id: 7, App: "app", Handler: "h", Policy: &messages.Policy{Attempts: 1},
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 1500}}
	reply(t, c, e, 1000, &messages.CreateJob{Job: job})
	ids := map[string]bool{}
	now := int64(1500)
	for round := range 3 {
		ds := tick(c, e, now)
		if len(ds) != 1 || ds[0].d.DueMs != 1500 || ds[0].d.Attempt != 1 {
			t.Fatalf("round %d: dispatches %v, want one first attempt due at 1500", round, ds)
		}
		id := ds[0].d.RunId
		if ids[id] {
			t.Fatalf("round %d: run id %s was used before (%v)", round, id, ids)
		}
		ids[id] = true
		mark := len(e.log)
		report(c, e, now+10, ds[0], messages.Outcome_FAILED, "boom", now+5)
		dead := records[*messages.DeadLetter](t, e, mark, messages.RecordType_DEAD_LETTERED)
		if len(dead) != 1 || dead[0].RunId != id {
			t.Fatalf("round %d: dead letters %v, want one of run %s", round, dead, id)
		}
		if c.DeadLetters() != round+1 {
			t.Fatalf("round %d: %d dead letters held, want %d", round, c.DeadLetters(), round+1)
		}
		now += 100
		if r := reply(t, c, e, now, &messages.UpdateJob{Job: job}); r.Error != nil || r.Job.NextDueMs != 1500 {
			t.Fatalf("round %d: update: %v", round, r)
		}
	}
}

// ladderEnv is fakeEnv with a Ladder: it records each release, as "level:run".
type ladderEnv struct {
	fakeEnv
	released []string
}

func (e *ladderEnv) Hold(int, string, int64) {}
func (e *ladderEnv) Release(level int, runID string) {
	e.released = append(e.released, fmt.Sprintf("%d:%s", level, runID))
}
func (e *ladderEnv) DeadLettered(*messages.DeadLetter) {}

// Deleting a job drops its runs waiting for a retry, and releases each one's
// ladder timer in run id order, not in the order the map of runs is walked in.
func TestDeleteReleasesRetriesInRunOrder(t *testing.T) {
	var want []string
	for try := 0; try < 32; try++ {
		c := New(Config{Shard: route.Root("app"), Self: &messages.Ref{Address: "s", Id: "shard"}}, 1000, 1)
		e := &ladderEnv{}
		c.Open(e)
		c.Durable(e.lsn, nil, e)
		c.SetWorkers(1000, []*messages.WorkerInfo{policyWorker("w1", 64)}, e)
		c.Handle(1000, client, &messages.CreateJob{Job: fixedRateJob(7, 10, &messages.Policy{Concurrency: messages.Concurrency_ALLOW})}, e)
		c.Durable(e.lsn, nil, e)
		e.take()
		for now := int64(1010); now < 1080; now += 10 { // seven runs, each failed: seven retries wait
			c.Tick(now, e)
			c.Durable(e.lsn, nil, e)
			for _, s := range e.take() {
				d, ok := s.m.(*messages.Dispatch)
				if !ok {
					continue
				}
				c.Handle(now, s.to, &messages.RunResult{RunId: d.RunId, JobId: d.JobId, Shard: d.Shard, Epoch: d.Epoch,
					Attempt: d.Attempt, DueMs: d.DueMs, Outcome: messages.Outcome_FAILED, Error: "boom", StartMs: now, EndMs: now,
					WorkerId: "w1"}, e)
				c.Durable(e.lsn, nil, e)
				e.take()
			}
		}
		c.Handle(1080, client, &messages.DeleteJob{App: "app", Id: 7, RequestId: 99}, e)
		c.Durable(e.lsn, nil, e)
		if try == 0 {
			want = e.released
			if len(want) != 7 || !slices.IsSorted(want) {
				t.Fatalf("released %v: want the seven retries released, in run id order", want)
			}
			continue
		}
		if !slices.Equal(e.released, want) {
			t.Fatalf("try %d: released %v, want %v", try, e.released, want)
		}
	}
}
