package sim

import (
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// Client timing, as cluster.Client.
const (
	requestTimeoutMs = 3_000
	backoffMinMs     = 20
	backoffMaxMs     = 1_000
	opDeadlineMs     = 30_000
	leaseRenewMs     = 1_000
	maxJobsPerClient = 10
	batchShare       = 0.3           // creates that start a batch (Config.Batches)
	maxBatch         = 6             // creates in a batch
	hotAppShare      = 0.5           // creates that go to app1 whatever the draw
	snowflakeEpochMs = 1288834974657 // bwmarrin/snowflake's default epoch
)

type opKind int

const (
	opCreate opKind = iota
	opUpdate
	opDelete
	opPause
	opResume
	opTrigger
	opGet
	opBatch // a CreateJobs of several creates: their first try (Config.Batches)
)

var opNames = [...]string{"create", "update", "delete", "pause", "resume", "trigger", "get", "batch"}

func (k opKind) String() string { return opNames[k] }

// op is one client call in progress: it is retried (route refresh, back-off) until
// it gets a reply that is not NOT_OWNER/UNAVAILABLE, or its deadline passes.
type op struct {
	kind           opKind
	app            string
	id             int64
	req            proto.Message
	job            *messages.Job // the definition sent (create, update)
	startMs        int64         // sim time
	deadline       int64
	tries          int
	sent           bool // a request reached the network at least once (its effect is uncertain)
	backoff        int64
	cur            string // reply address of the current attempt; older replies are stale
	stage          int    // 0: pulling routes, 1: waiting for the shard
	applied        int    // times a shard applied this call (updates)
	appliedVersion int64  // the job version the last application made

	// opBatch: the creates it carries (each an opCreate of its own, started with
	// the batch), the batch as sent in its plain form, and whether it went packed.
	batch  []*op
	plain  *messages.CreateJobs
	packed bool
}

// client is an application using the Go client: it leases a snowflake node id,
// issues one call at a time on its own jobs, and treats a call as done only on the
// shard's reply, as cluster.Client does.
type client struct {
	s      *Sim
	idx    int
	addr   string
	ref    *messages.Ref
	up     bool
	inc    int
	clock  clock
	slow   bool
	holder string
	node   int64
	until  int64 // local time the lease is good until
	leaseQ string
	routes map[string][]*messages.RouteEntry
	op     *op
	alone  []*op // creates whose batch failed, each to be tried alone, in order
	reqN   int
	lastMs int64
	seq    int64
	next   int
	jobs   []int64 // live jobs (acked, not deleted), oldest first
	gone   []int64 // deleted jobs, to poke at now and then
}

func newClient(s *Sim, i int) *client {
	addr := fmt.Sprintf("c%d", i+1)
	return &client{s: s, idx: i, addr: addr, ref: &messages.Ref{Address: addr, Id: "client"}, next: s.rng.IntN(8)}
}

func (c *client) address() string  { return c.addr }
func (c *client) alive() bool      { return c.up }
func (c *client) incarnation() int { return c.inc }
func (c *client) clk() *clock      { return &c.clock }
func (c *client) now() int64       { return c.s.local(&c.clock) }

func (c *client) start() {
	if c.up {
		return
	}
	c.up = true
	c.inc++
	c.holder = fmt.Sprintf("%s#%d", c.addr, c.inc)
	c.node = -1
	c.routes = map[string][]*messages.RouteEntry{}
	c.op = nil
	c.alone = nil
	c.s.tracef("%s: client %s starts", c.addr, c.holder)
	inc := c.inc
	c.lease()
	c.s.every(leaseRenewMs, 0, func() bool {
		if !c.up || c.inc != inc {
			return false
		}
		c.lease()
		return true
	})
	c.s.after(c.s.between(100, 1000), c.nextOp)
}

func (c *client) crash() {
	c.up = false
	c.inc++
	c.s.stats.ClientCrashes++
	c.s.tracef("%s: client %s crashes", c.addr, c.holder)
	for _, o := range c.outstanding() {
		c.s.chk.opGaveUp(c, o, "client crashed")
	}
	c.op, c.alone = nil, nil
}

// outstanding lists the calls the client has started and not finished: the
// current one (a batch's creates) and those waiting to be tried alone.
func (c *client) outstanding() []*op {
	var out []*op
	if o := c.op; o != nil && o.kind == opBatch {
		out = append(out, o.batch...)
	} else if o != nil {
		out = append(out, o)
	}
	return append(out, c.alone...)
}

func (c *client) server() *messages.Ref {
	srv := c.s.servers[c.next%len(c.s.servers)]
	c.next++
	return srv.ref
}

func (c *client) replyRef(prefix string) *messages.Ref {
	c.reqN++
	return &messages.Ref{Address: c.addr, Id: prefix + strconv.Itoa(c.reqN)}
}

func (c *client) lease() {
	r := c.replyRef("lease-")
	c.leaseQ = r.Id
	c.s.send(c.addr, r, c.server(), &messages.LeaseNode{Holder: c.holder, Node: c.node})
}

func (c *client) leased() bool { return c.node >= 0 && c.now() < c.until }

// newID makes a snowflake id: milliseconds since the snowflake epoch, node, sequence.
func (c *client) newID() (int64, bool) {
	if !c.leased() {
		return 0, false
	}
	ms := c.now()
	if ms < c.lastMs {
		ms = c.lastMs // a clock that went back: keep the ids increasing, as snowflake does by waiting
	}
	if ms == c.lastMs {
		c.seq++
		if c.seq >= 4096 {
			return 0, false
		}
	} else {
		c.lastMs, c.seq = ms, 0
	}
	return (ms-snowflakeEpochMs)<<22 | c.node<<12 | c.seq, true
}

func (c *client) deliver(from, to *messages.Ref, m any) {
	switch x := m.(type) {
	case *messages.LeaseNodeReply:
		if to.Id != c.leaseQ {
			return
		}
		if x.Error == nil {
			c.node = x.Node
			c.until = c.now() + x.TtlMs - 2*leaseRenewMs // renewals are a second apart: keep a margin
		} else if x.Error.Code == messages.Code_ALREADY_EXISTS {
			c.node = -1
		}
		return
	}
	o := c.op
	if o == nil || to.Id != o.cur {
		c.s.tracef("%s: stale reply %s", c.addr, brief(m))
		return
	}
	o.cur = ""
	if o.kind == opBatch {
		c.batchReply(o, m)
		return
	}
	switch x := m.(type) {
	case *messages.RouteTable:
		var rs []*messages.RouteEntry
		for _, r := range x.Routes {
			if r.App == o.app {
				rs = append(rs, r)
			}
		}
		if len(rs) > 0 {
			c.routes[o.app] = rs
			c.attempt()
			return
		}
		c.retryLater()
	case *messages.JobReply:
		if e := x.Error; e != nil && (e.Code == messages.Code_NOT_OWNER || e.Code == messages.Code_UNAVAILABLE) {
			delete(c.routes, o.app)
			c.retryLater()
			return
		}
		c.s.tracef("%s: %s %d done after %d tries: %s", c.addr, o.kind, o.id, o.tries, brief(x))
		c.s.chk.opDone(c, o, x)
		c.finished()
	}
}

// finished ends the current call; the next starts after the client's think time,
// or at once when creates of a failed batch wait to be tried alone (cluster.Client
// tries them at once, side by side).
func (c *client) finished() {
	c.op = nil
	if len(c.alone) > 0 {
		c.s.after(0, c.nextOp)
		return
	}
	c.s.after(c.think(), c.nextOp)
}

func (c *client) think() int64 { return c.s.between(20, 600) }

// nextOp chooses the next call, weighted toward creates while there are few jobs.
func (c *client) nextOp() {
	if !c.up || c.op != nil {
		return
	}
	if len(c.alone) > 0 {
		o := c.alone[0]
		c.alone = c.alone[1:]
		c.op = o
		c.s.tracef("%s: %s %d alone, after its batch", c.addr, o.kind, o.id)
		c.attempt()
		return
	}
	app := c.s.apps[c.s.rng.IntN(len(c.s.apps))]
	if c.s.chance(hotAppShare) {
		app = c.s.apps[0] // skewed load: one hot app, so the balancer has work
	}
	r := c.s.rng.IntN(100)
	var o *op
	switch {
	case len(c.jobs) == 0 || (r < 30 && len(c.jobs) < maxJobsPerClient):
		if room := maxJobsPerClient - len(c.jobs); c.s.cfg.Batches && room >= 2 && c.s.chance(batchShare) {
			c.startBatch(app, int(c.s.between(2, int64(min(room, maxBatch)))))
			return
		}
		id, ok := c.newID()
		if !ok {
			c.s.after(200, c.nextOp)
			return
		}
		j := c.s.newJob(id, app, c.now())
		o = &op{kind: opCreate, app: app, id: id, job: j, req: &messages.CreateJob{Job: j}}
	default:
		var id int64
		if len(c.gone) > 0 && c.s.chance(0.05) {
			id = c.gone[c.s.rng.IntN(len(c.gone))]
		} else {
			id = c.jobs[c.s.rng.IntN(len(c.jobs))]
		}
		app = c.s.chk.jobs[id].app
		kinds := []opKind{opUpdate, opDelete, opDelete, opPause, opResume, opResume, opTrigger, opGet, opGet}
		o = &op{kind: kinds[c.s.rng.IntN(len(kinds))], app: app, id: id}
		switch o.kind {
		case opUpdate:
			o.job = c.s.newJob(id, app, c.now())
			o.req = &messages.UpdateJob{Job: o.job}
		case opDelete:
			o.req = &messages.DeleteJob{App: app, Id: id}
		case opPause:
			o.req = &messages.PauseJob{App: app, Id: id}
		case opResume:
			o.req = &messages.ResumeJob{App: app, Id: id}
		case opTrigger:
			o.req = &messages.TriggerJob{App: app, Id: id}
			if c.s.chance(0.3) {
				o.req = &messages.TriggerJob{App: app, Id: id, Params: []byte(`{"k":"trigger"}`), HasParams: true}
			}
		case opGet:
			o.req = &messages.GetJob{App: app, Id: id}
		}
	}
	if o.kind != opGet { // like the Go client: one request id per call, kept across its retries
		rid, ok := c.newID()
		if !ok {
			c.s.after(200, c.nextOp)
			return
		}
		if c.s.cfg.Quirks&QuirkNoRequestIDs == 0 {
			setRequestID(o.req, rid)
		}
	}
	o.startMs = c.s.now
	o.deadline = c.s.now + opDeadlineMs
	o.backoff = backoffMinMs
	c.op = o
	c.s.stats.Ops++
	c.s.chk.opStart(c, o)
	c.s.tracef("%s: %s %d (%s)", c.addr, o.kind, o.id, app)
	c.attempt()
}

// attempt sends the current op, pulling the route first when it has none.
func (c *client) attempt() {
	o := c.op
	if c.s.now > o.deadline {
		c.s.chk.opGaveUp(c, o, "deadline")
		c.finished()
		return
	}
	entry := c.routeFor(o.app, o.id)
	reply := c.replyRef("r")
	o.cur = reply.Id
	if entry == nil {
		o.stage = 0
		c.s.send(c.addr, reply, c.server(), &messages.GetRoutes{App: o.app, Ensure: true})
	} else {
		o.stage = 1
		o.tries++
		o.sent = true
		c.s.chk.sentAttempt(o, reply)
		c.s.send(c.addr, reply, entry.Owner, o.req)
	}
	inc, cur := c.inc, o.cur
	c.s.after(requestTimeoutMs, func() {
		if c.up && c.inc == inc && c.op == o && o.cur == cur {
			c.s.tracef("%s: %s %d: request timed out", c.addr, o.kind, o.id)
			o.cur = ""
			delete(c.routes, o.app)
			c.retryLater()
		}
	})
}

// routeFor is the cached route of job id of app, or nil.
func (c *client) routeFor(app string, id int64) *messages.RouteEntry {
	rs := c.routes[app]
	if len(rs) == 0 {
		return nil
	}
	shards := make([]route.Shard, len(rs))
	for i, r := range rs {
		shards[i] = route.Shard{App: r.App, Level: int(r.Level), Index: r.Index}
	}
	sh, ok := route.Lookup(shards, id)
	if !ok {
		return nil
	}
	var entry *messages.RouteEntry
	for _, r := range rs {
		if r.Shard == sh.String() {
			entry = r
		}
	}
	return entry
}

// ---------------------------------------------------------------- create batches

// startBatch starts n creates of app as one call's first try, as cluster.Client
// batches concurrent creates: one CreateJobs to the shard of the first, carrying
// those that route there. A batch is never retried as a batch: a create whose
// batch was lost, refused as a whole or not understood, or whose own reply says
// NOT_OWNER or UNAVAILABLE, is tried alone, under the same request id. A create
// without a cached route goes alone at once.
func (c *client) startBatch(app string, n int) {
	b := &op{kind: opBatch, app: app, startMs: c.s.now}
	for range n {
		id, ok := c.newID()
		if !ok {
			break
		}
		rid, ok := c.newID()
		if !ok {
			break
		}
		j := c.s.newJob(id, app, c.now())
		o := &op{kind: opCreate, app: app, id: id, job: j, req: &messages.CreateJob{Job: j},
			startMs: c.s.now, deadline: c.s.now + opDeadlineMs, backoff: backoffMinMs}
		if c.s.cfg.Quirks&QuirkNoRequestIDs == 0 {
			setRequestID(o.req, rid)
		}
		c.s.stats.Ops++
		c.s.chk.opStart(c, o)
		b.batch = append(b.batch, o)
	}
	if len(b.batch) == 0 {
		c.s.after(200, c.nextOp)
		return
	}
	b.id = b.batch[0].id
	entry := c.routeFor(app, b.id)
	if entry == nil {
		c.s.tracef("%s: %d creates (%s), no route yet: each alone", c.addr, len(b.batch), app)
		c.alone = append(c.alone, b.batch...)
		c.s.after(0, c.nextOp)
		return
	}
	var here []*op
	for _, o := range b.batch {
		if e := c.routeFor(app, o.id); e != nil && e.Shard == entry.Shard {
			here = append(here, o)
		} else {
			c.alone = append(c.alone, o) // another shard's: alone, after the batch
		}
	}
	b.batch = here
	b.plain = &messages.CreateJobs{LeanReplies: c.s.chance(0.7)}
	for _, o := range here {
		b.plain.Jobs = append(b.plain.Jobs, o.req.(*messages.CreateJob))
		o.tries++
		o.sent = true
	}
	var msg proto.Message = b.plain
	if c.s.chance(0.5) {
		if p := messages.PackCreateJobs(b.plain); p != nil {
			msg, b.packed = p, true
		}
	}
	c.op = b
	c.s.stats.Batches++
	c.s.stats.BatchedCreates += int64(len(here))
	reply := c.replyRef("b")
	b.cur = reply.Id
	c.s.tracef("%s: batch of %d creates (%s) to %s, packed=%v lean=%v", c.addr, len(here), app, entry.Shard, b.packed, b.plain.LeanReplies)
	c.s.send(c.addr, reply, entry.Owner, msg)
	inc, cur := c.inc, b.cur
	c.s.after(requestTimeoutMs, func() {
		if c.up && c.inc == inc && c.op == b && b.cur == cur {
			b.cur = ""
			c.batchFailed(b, "timed out")
		}
	})
}

// batchReply takes a batch's reply: each create's own answer, or a failure of the
// whole batch.
func (c *client) batchReply(b *op, m any) {
	rep, ok := m.(*messages.CreateJobsReply)
	var replies []*messages.JobReply
	switch {
	case !ok:
		c.batchFailed(b, "answered "+brief(m))
		return
	case rep.Error != nil:
		c.batchFailed(b, "refused as a whole: "+rep.Error.GetMessage())
		return
	case b.packed && !rep.TakesPacked:
		c.batchFailed(b, "packed and not read")
		return
	default:
		var err error
		if replies, err = rep.Expand(b.plain.Jobs); err != nil {
			c.batchFailed(b, err.Error())
			return
		}
	}
	c.op = nil
	for i, o := range b.batch {
		if e := replies[i].GetError(); e != nil && (e.Code == messages.Code_NOT_OWNER || e.Code == messages.Code_UNAVAILABLE) {
			c.s.tracef("%s: create %d of the batch: %s, alone next", c.addr, o.id, e.Code)
			c.s.stats.BatchFallbacks++
			c.alone = append(c.alone, o)
			continue
		}
		c.s.tracef("%s: create %d done in a batch: %s", c.addr, o.id, brief(replies[i]))
		c.s.chk.opDone(c, o, replies[i])
	}
	c.finished()
}

// batchFailed sends a failed batch's creates alone, after a route refresh, as
// cluster.Client does.
func (c *client) batchFailed(b *op, why string) {
	c.s.tracef("%s: batch of %d failed (%s): each alone", c.addr, len(b.batch), why)
	c.s.stats.BatchFallbacks += int64(len(b.batch))
	delete(c.routes, b.app)
	c.alone = append(b.batch, c.alone...)
	c.finished()
}

func (c *client) retryLater() {
	o := c.op
	d := o.backoff
	o.backoff = min(o.backoff*2, backoffMaxMs)
	inc := c.inc
	c.s.after(d, func() {
		if c.up && c.inc == inc && c.op == o {
			c.attempt()
		}
	})
}

func (c *client) forget(id int64) {
	for i, x := range c.jobs {
		if x == id {
			c.jobs = append(c.jobs[:i:i], c.jobs[i+1:]...)
			c.gone = append(c.gone, id)
			return
		}
	}
}

// ---------------------------------------------------------------- workload

var (
	cronSpecs = []string{"*/2 * * * * *", "*/5 * * * * *", "0/3 * * * * *", "15,45 * * * * *", "*/7 * * * * *", "* * * * * *"}
	zones     = []string{"", "UTC", "Asia/Shanghai", "America/New_York", "Australia/Lord_Howe"}
)

// newJob draws a job definition: every schedule kind, every policy knob.
func (s *Sim) newJob(id int64, app string, nowMs int64) *messages.Job {
	j := &messages.Job{Id: id, App: app, Params: []byte(fmt.Sprintf(`{"k":"v%d"}`, s.rng.IntN(5)))}
	switch r := s.rng.IntN(100); {
	case r < 40:
		j.Handler = handlerOK
	case r < 70:
		j.Handler = handlerFlaky
	case r < 85:
		j.Handler = handlerFail
	default:
		j.Handler = handlerSlow
	}
	sc := &messages.Schedule{}
	switch r := s.rng.IntN(100); {
	case r < 30:
		sc.Kind = messages.ScheduleKind_ONCE
		if s.chance(0.5) {
			sc.DelayMs = s.between(0, 12_000)
		} else {
			sc.AtMs = nowMs + s.between(-2_000, 12_000)
		}
	case r < 55:
		sc.Kind = messages.ScheduleKind_FIXED_RATE
		sc.EveryMs = s.between(300, 4_000)
		if s.chance(0.3) {
			sc.StartMs = nowMs + s.between(0, 3_000)
		}
		if s.chance(0.2) {
			sc.MaxRuns = s.between(1, 8)
		}
		if s.chance(0.15) {
			sc.NotAfterMs = nowMs + s.between(3_000, 20_000)
		}
	case r < 70:
		sc.Kind = messages.ScheduleKind_FIXED_DELAY
		sc.EveryMs = s.between(300, 3_000)
		if s.chance(0.2) {
			sc.MaxRuns = s.between(1, 8)
		}
	case r < 85:
		sc.Kind = messages.ScheduleKind_CRON
		sc.Cron = cronSpecs[s.rng.IntN(len(cronSpecs))]
		sc.Tz = zones[s.rng.IntN(len(zones))]
	default:
		sc.Kind = messages.ScheduleKind_API_ONLY
	}
	j.Schedule = sc
	if s.chance(0.8) {
		p := &messages.Policy{}
		if s.chance(0.7) {
			p.Attempts = int32(s.between(1, 4))
		}
		if s.chance(0.6) {
			for range s.between(1, 3) {
				p.LadderMs = append(p.LadderMs, s.between(50, 1_500))
			}
		}
		if s.chance(0.6) {
			p.TimeoutMs = s.between(100, 2_000)
		}
		p.Misfire = messages.Misfire(s.rng.IntN(4))
		p.Concurrency = messages.Concurrency(s.rng.IntN(3))
		switch r := s.rng.IntN(100); {
		case r < 40:
			p.Route = messages.Route_ROUND_ROBIN
		case r < 60:
			p.Route = messages.Route_RANDOM
		case r < 80:
			p.Route = messages.Route_LEAST_BUSY
		case r < 95:
			p.Route, p.RouteKey = messages.Route_CONSISTENT_HASH, "k"
		default:
			p.Route = messages.Route_BROADCAST
		}
		j.Policy = p
	}
	return j
}

// setRequestID stamps a command with its idempotency key.
func setRequestID(m any, id int64) {
	switch x := m.(type) {
	case *messages.CreateJob:
		x.RequestId = id
	case *messages.UpdateJob:
		x.RequestId = id
	case *messages.DeleteJob:
		x.RequestId = id
	case *messages.PauseJob:
		x.RequestId = id
	case *messages.ResumeJob:
		x.RequestId = id
	case *messages.TriggerJob:
		x.RequestId = id
	}
}
