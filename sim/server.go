package sim

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Actor names on a server node (as in actors/server and actors/nameserver).
const (
	serverActorID = "kjob-server"
	nsActorID     = "nameserver"
	shardPrefix   = "kjob-server/shard-"
	heartbeatMs   = nscore.HeartbeatMs
	pullEveryMs   = 3 * heartbeatMs // a pull repairs a lost push (DESIGN.md, NameServer)
)

// Shard defaults in the simulation: short ladders and timeouts, so a 40 s run sees
// retries, timeouts and dead letters.
var (
	simLadderMs = []int64{200, 1000, 2500}
)

const (
	simAttempts  = 3
	simTimeoutMs = 1500
	simGraceMs   = 500
)

// server is a `kjob server` process: it hosts shard cores over one journal, and the
// NameServer when the cluster places it here. Its message handling mirrors the
// server actor (actors/server), which the simulator cannot import: that shell is
// proto.actor code. Everything it decides itself is small; the cores decide the rest.
type server struct {
	s     *Sim
	idx   int
	addr  string
	ref   *messages.Ref
	up    bool
	inc   int
	id    string // member id: new on every start
	clock clock
	slow  bool

	disk          *disk
	j             *journal
	shards        map[string]*shardHost
	table         *messages.RouteTable
	groups        map[string]string
	incoming      map[string]int64                // handoffs being persisted here: shard → epoch
	droppedEpochs map[uint64]int64                // stream → highest epoch handed on from here (recDropped)
	handedTo      map[string]*messages.RouteEntry // shards handed off from here: where they went (hearsay for the NameServer)
	crashOnAppend bool
}

func newServer(s *Sim, i int) *server {
	addr := fmt.Sprintf("s%d", i+1)
	return &server{s: s, idx: i, addr: addr, ref: &messages.Ref{Address: addr, Id: serverActorID}, disk: &disk{}}
}

func (v *server) address() string  { return v.addr }
func (v *server) alive() bool      { return v.up }
func (v *server) incarnation() int { return v.inc }
func (v *server) clk() *clock      { return &v.clock }
func (v *server) now() int64       { return v.s.local(&v.clock) }

// shardHost is one shard core on a server, with what the shell keeps around it.
// It is the core's Env.
type shardHost struct {
	srv      *server
	name     string
	core     *shardcore.Core
	ref      *messages.Ref
	wakeAt   int64 // local time of the armed tick (0: none)
	wakeGen  uint64
	lastTick int64
	gone     bool // dropped, or its server crashed: ignore late callbacks
	move     *moveOut
	// view is the jobs as this core journaled them (the checker's copy: the policy a
	// retry or dead letter was computed with).
	view     map[int64]*messages.Job
	next     map[int64]int64 // each job's next due as this core last journaled it (jobs absent: see view)
	finished []string        // RUN_FINISHED run ids appended during the current input
	puts     []int64         // JOB_PUT job ids appended during the current input
	// shadow is a second core fed every record this one journals, by Replay: what a
	// restart would rebuild. The checker compares the two when the shard is quiescent.
	shadow *shardcore.Core
	// openLSN is the LSN of the SHARD_OPENED record of a shard opened here (0: it
	// came from the journal or a handoff, so it is durable); durable is the highest
	// LSN this core was told is durable. A shard is reported (ShardOpened,
	// heartbeats) only once durable >= openLSN, unless QuirkEarlyOpen.
	openLSN, durable uint64
	reportTo         *messages.Ref // who assigned it, waiting for ShardOpened
}

// reported says whether the server may tell the NameServer it owns the shard.
func (h *shardHost) reported() bool {
	return h.srv.s.cfg.Quirks&QuirkEarlyOpen != 0 || h.durable >= h.openLSN
}

// Append implements shardcore.Env.
func (h *shardHost) Append(entries []persistence.Entry) (uint64, error) {
	if h.gone {
		return 0, fmt.Errorf("shard %s is gone from %s", h.name, h.srv.addr)
	}
	return h.srv.j.append(h, entries, nil)
}

// Send implements shardcore.Env.
func (h *shardHost) Send(to *messages.Ref, m proto.Message) {
	if h.gone {
		return
	}
	h.srv.s.chk.shardSent(h, to, m)
	h.srv.s.send(h.srv.addr, h.ref, to, m)
}

func (v *server) shardConfig(sh route.Shard) shardcore.Config {
	return shardcore.Config{
		Shard: sh, Self: v.shardRef(sh.String()),
		DefaultAttempts: simAttempts, DefaultLadderMs: simLadderMs, DefaultTimeout: simTimeoutMs, GraceMs: simGraceMs,
		Seed:      v.s.cfg.Seed,
		Mutations: v.s.cfg.Mutations,
	}
}

func (v *server) shardRef(name string) *messages.Ref {
	return &messages.Ref{Address: v.addr, Id: shardPrefix + name}
}

// host wraps a core that has just been made (recovered, opened or handed in).
func (v *server) host(c *shardcore.Core) *shardHost {
	name := c.Shard().String()
	if old := v.shards[name]; old != nil {
		old.gone = true
	}
	h := &shardHost{srv: v, name: name, core: c, ref: v.shardRef(name), view: map[int64]*messages.Job{}, next: map[int64]int64{}}
	c.SetSelf(h.ref)
	v.shards[name] = h
	return h
}

func (v *server) hostNames() []string { return sortedKeys(v.shards) }

// ---------------------------------------------------------------- lifecycle

func (v *server) start() {
	v.up = true
	v.inc++
	v.id = fmt.Sprintf("%s-%d", v.addr, v.inc)
	v.shards = map[string]*shardHost{}
	v.groups = map[string]string{}
	v.incoming = map[string]int64{}
	v.droppedEpochs = map[uint64]int64{}
	v.handedTo = map[string]*messages.RouteEntry{}
	v.table = nil
	v.j = &journal{s: v.s, srv: v, d: v.disk}
	v.s.tracef("%s: start (member %s)", v.addr, v.id)
	v.recover()
	inc := v.inc
	v.s.every(heartbeatMs, 50, func() bool {
		if !v.up || v.inc != inc {
			return false
		}
		v.heartbeat()
		return true
	})
	v.heartbeat()
	if v.s.cfg.Quirks&QuirkNoPull == 0 {
		v.s.every(pullEveryMs, 100, func() bool {
			if !v.up || v.inc != inc {
				return false
			}
			if ns := v.s.ns; ns != nil {
				v.s.send(v.addr, v.ref, ns.ref, &messages.GetRoutes{WithWorkers: true})
			}
			return true
		})
	}
}

func (v *server) restart() {
	if v.up {
		return
	}
	v.start()
	v.s.electNameServer()
	v.s.chk.ownersChanged()
}

func (v *server) crash(why string) {
	if !v.up {
		return
	}
	v.up = false
	v.s.stats.ServerCrashes++
	for _, n := range v.hostNames() {
		v.shards[n].gone = true
	}
	v.shards = nil
	how := v.disk.crash(v.s)
	v.s.tracef("%s: crash (%s): %s", v.addr, why, how)
	v.inc++ // nothing addressed to the old process reaches the new one
	v.s.electNameServer()
}

// recover rebuilds every shard from the journal, as cluster.Node does at start:
// the shard's records are replayed in order into a fresh core, then Recovered.
func (v *server) recover() {
	now := v.now()
	res := replayLog(v, v.disk, now, true)
	if res.err != nil {
		v.s.failf("journal-corrupt", "%s: recovery: %v", v.addr, res.err)
		return
	}
	v.j.last = res.last
	v.droppedEpochs = res.dropped
	v.s.stats.Recoveries++
	v.s.stats.RecordsReplayed += int64(res.records)
	if res.truncated > 0 {
		v.s.tracef("%s: recovery truncated %d bytes of torn tail", v.addr, res.truncated)
	}
	shadows := replayLog(v, v.disk, now, false)
	for _, st := range res.order {
		c := res.cores[st]
		h := v.host(c)
		h.view = res.views[st]
		h.next = res.nexts[st]
		h.shadow = shadows.cores[st]
		v.s.tracef("%s: recovered %s@%d (%d jobs, %d runs, frozen=%v) at lsn %d", v.addr, h.name, c.Epoch(), c.Jobs(), c.InFlight(), c.Frozen(), res.last)
		c.Recovered(now, res.last, h)
		h.after()
		if to, ok := res.intents[st]; ok && c.Frozen() {
			h.resumeMove(to)
		}
	}
	v.s.chk.recovered(v)
}

// replayed is what a journal holds: a core per stream, in order of appearance.
type replayed struct {
	cores     map[uint64]*shardcore.Core
	views     map[uint64]map[int64]*messages.Job
	nexts     map[uint64]map[int64]int64
	intents   map[uint64]string
	dropped   map[uint64]int64
	order     []uint64
	last      uint64
	records   int
	truncated int
	err       error
}

// replayLog decodes d and replays it into fresh cores (without Recovered). truncate
// says whether this is a real recovery (the torn tail is cut off) or a check that
// reads the durable prefix of a copy.
func replayLog(v *server, d *disk, now int64, truncate bool) replayed {
	out := replayed{cores: map[uint64]*shardcore.Core{}, views: map[uint64]map[int64]*messages.Job{}, nexts: map[uint64]map[int64]int64{},
		intents: map[uint64]string{}, dropped: map[uint64]int64{}}
	remove := func(st uint64) {
		delete(out.cores, st)
		delete(out.views, st)
		delete(out.nexts, st)
		delete(out.intents, st)
		for i, x := range out.order {
			if x == st {
				out.order = append(out.order[:i:i], out.order[i+1:]...)
				break
			}
		}
	}
	add := func(st uint64, c *shardcore.Core) {
		if _, ok := out.cores[st]; ok {
			remove(st)
		}
		out.cores[st] = c
		out.views[st] = map[int64]*messages.Job{}
		out.nexts[st] = map[int64]int64{}
		out.order = append(out.order, st)
	}
	fn := func(r persistence.Record) {
		if out.err != nil {
			return
		}
		out.records++
		switch r.Type {
		case recSnapshot:
			epoch, data, err := decodeSnapshotRecord(r.Payload)
			if err != nil {
				out.err = fmt.Errorf("lsn %d: %w", r.LSN, err)
				return
			}
			name, _, err := shardcore.ShardNameOfSnapshot(data)
			if err != nil {
				out.err = fmt.Errorf("lsn %d: snapshot: %w", r.LSN, err)
				return
			}
			sh, err := route.Parse(name)
			if err != nil {
				out.err = fmt.Errorf("lsn %d: %w", r.LSN, err)
				return
			}
			c := shardcore.New(v.shardConfig(sh), now, epoch)
			if err := c.LoadSnapshot(data, r.LSN); err != nil {
				out.err = err
				return
			}
			add(r.Stream, c)
			viewFromSnapshot(out.views[r.Stream], out.nexts[r.Stream], data)
		case recIntent:
			if _, ok := out.cores[r.Stream]; ok {
				out.intents[r.Stream] = string(r.Payload)
			}
		case recDropped:
			if len(r.Payload) != 8 {
				out.err = fmt.Errorf("lsn %d: drop record of %d bytes", r.LSN, len(r.Payload))
				return
			}
			// The drop names the epoch it drops: a newer copy handed in since (its
			// snapshot record is earlier in the journal than this drop) stays.
			e := int64(binary.LittleEndian.Uint64(r.Payload))
			if c := out.cores[r.Stream]; c != nil && c.Epoch() <= e {
				remove(r.Stream)
			}
			out.dropped[r.Stream] = max(out.dropped[r.Stream], e)
		default:
			c := out.cores[r.Stream]
			if c == nil {
				if messages.RecordType(r.Type) != messages.RecordType_SHARD_OPENED {
					out.err = fmt.Errorf("lsn %d of stream %x (type %d) comes before its shard was opened", r.LSN, r.Stream, r.Type)
					return
				}
				meta := &messages.ShardMeta{}
				if err := proto.Unmarshal(r.Payload, meta); err != nil {
					out.err = fmt.Errorf("lsn %d: %w", r.LSN, err)
					return
				}
				sh, err := route.Parse(meta.Shard)
				if err != nil {
					out.err = fmt.Errorf("lsn %d: %w", r.LSN, err)
					return
				}
				c = shardcore.New(v.shardConfig(sh), now, meta.Epoch)
				add(r.Stream, c)
			}
			if err := c.Replay(r); err != nil {
				out.err = err
				return
			}
			applyView(out.views[r.Stream], out.nexts[r.Stream], r)
		}
	}
	if truncate {
		out.last, out.truncated, out.err = d.recover(fn)
		return out
	}
	d.records(fn)
	return out
}

// applyView keeps the checker's copy of a replayed core's jobs (view) and of each
// job's next due as last journaled (next).
func applyView(view map[int64]*messages.Job, next map[int64]int64, r persistence.Record) {
	switch messages.RecordType(r.Type) {
	case messages.RecordType_JOB_PUT:
		j := &messages.Job{}
		if proto.Unmarshal(r.Payload, j) == nil {
			view[j.Id] = j
			next[j.Id] = j.NextDueMs
		}
	case messages.RecordType_RUN_DISPATCHED:
		st := &messages.RunState{}
		if proto.Unmarshal(r.Payload, st) == nil && st.Fire {
			next[st.JobId] = st.JobNextDueMs
		}
	case messages.RecordType_RUN_FINISHED:
		rec := &messages.RunRecord{}
		if proto.Unmarshal(r.Payload, rec) == nil && rec.SetsNext {
			next[rec.JobId] = rec.JobNextDueMs
		}
	case messages.RecordType_JOB_DELETED:
		ref := &messages.JobRef{}
		if proto.Unmarshal(r.Payload, ref) == nil {
			delete(view, ref.Id)
		}
	}
}

func viewFromSnapshot(view map[int64]*messages.Job, next map[int64]int64, data []byte) {
	snap := &messages.ShardSnapshot{}
	if proto.Unmarshal(data, snap) == nil {
		for _, j := range snap.Jobs {
			view[j.Id] = j
			next[j.Id] = j.NextDueMs
		}
	}
}

// ---------------------------------------------------------------- shard inputs

// after runs after every input to a core: re-arm its one timer, advance a handoff.
func (h *shardHost) after() {
	if h.gone {
		return
	}
	h.rearm()
	if h.move != nil {
		h.progressMove()
	}
}

// rearm keeps one tick armed at the core's next wake-up, as the shell's one runtime
// timer. A tick is never set at or before the last one: a core whose wheel is ahead
// of its clock (the clock jumped back) gets at most one tick per millisecond.
func (h *shardHost) rearm() {
	at, ok := h.core.NextWake()
	if !ok || h.core.Frozen() || h.core.Failed() != nil {
		return
	}
	if at <= h.lastTick {
		at = h.lastTick + 1
	}
	if h.wakeAt != 0 && h.wakeAt <= at {
		return
	}
	h.wakeAt = at
	h.wakeGen++
	gen := h.wakeGen
	v := h.srv
	v.s.after(v.s.globalAt(&v.clock, at)-v.s.now, func() {
		if h.gone || h.wakeGen != gen {
			return
		}
		h.wakeAt = 0
		now := v.now()
		h.lastTick = now
		h.core.Tick(now, h)
		h.after()
	})
}

// rearmAll re-arms every shard after the server's clock jumped.
func (v *server) rearmAll() {
	for _, n := range v.hostNames() {
		h := v.shards[n]
		h.wakeAt = 0
		h.wakeGen++
		h.rearm()
	}
}

func (h *shardHost) handle(from *messages.Ref, m proto.Message) {
	now := h.srv.now()
	res, isResult := m.(*messages.RunResult)
	epoch := h.core.Epoch()
	if isResult && res.Epoch != epoch {
		h.srv.s.stats.StaleResults++
	}
	h.finished = h.finished[:0]
	h.puts = h.puts[:0]
	h.core.Handle(now, from, m, h)
	if u, ok := m.(*messages.UpdateJob); ok && slices.Contains(h.puts, u.Job.GetId()) {
		h.srv.s.chk.updateApplied(from, u.Job.GetId())
	}
	if isResult {
		for _, id := range h.finished {
			if id == res.RunId && res.Epoch != epoch {
				h.srv.s.failf("epoch-fencing", "shard %s on %s at epoch %d recorded the result of %s attempt %d sent for epoch %d (a stale owner's dispatch)",
					h.name, h.srv.addr, epoch, res.RunId, res.Attempt, res.Epoch)
			}
		}
	}
	h.after()
}

// ---------------------------------------------------------------- messages

func (v *server) deliver(from, to *messages.Ref, m any) {
	switch {
	case to.Id == serverActorID:
		v.receive(from, m)
	case strings.HasPrefix(to.Id, nsActorID):
		if ns := v.s.ns; ns != nil && ns.srv == v && ns.ref.Id == to.Id {
			ns.handle(from, m)
		} else {
			v.s.tracef("%s: %s for a NameServer that is not here", v.addr, brief(m))
		}
	case strings.HasPrefix(to.Id, shardPrefix):
		name := strings.TrimPrefix(to.Id, shardPrefix)
		h := v.shards[name]
		pm, _ := m.(proto.Message)
		if h == nil {
			switch pm.(type) {
			case *messages.RunResult, *messages.ResultAck, nil:
				v.s.tracef("%s: %s for shard %s, not hosted: dropped", v.addr, brief(m), name)
			default:
				v.s.tracef("%s: %s for shard %s, not hosted: NOT_OWNER", v.addr, brief(m), name)
				v.s.send(v.addr, v.ref, from, &messages.JobReply{Error: kerr.New(messages.Code_NOT_OWNER, "", "shard %s is not on %s", name, v.addr)})
			}
			return
		}
		v.s.tracef("%s: %s <- %s", h.name+"@"+v.addr, brief(m), from.GetAddress())
		h.handle(from, pm)
	default:
		v.s.tracef("%s: %s for unknown actor %s", v.addr, brief(m), to.Id)
	}
}

// receive is the server actor: registry traffic is forwarded to the NameServer
// (keeping the original sender), assignments open shards, pushes update the table.
func (v *server) receive(from *messages.Ref, m any) {
	switch x := m.(type) {
	case *messages.AssignShard:
		v.s.tracef("%s: %s", v.addr, brief(m))
		v.assign(from, x)
	case *messages.RouteTable:
		// As actors/server: versions order the tables of one NameServer instance
		// only; take a table from the NameServer this node resolves now, and never
		// an older table of the same instance.
		ns := v.s.ns
		if ns == nil || x.Nameserver.GetAddress() != ns.ref.Address || x.Nameserver.GetId() != ns.ref.Id {
			return
		}
		if v.table != nil && proto.Equal(v.table.Nameserver, x.Nameserver) && v.table.Version > x.Version {
			return
		}
		if v.table != nil && v.table.Version > x.Version && !proto.Equal(v.table.Nameserver, x.Nameserver) {
			v.s.tracef("%s: takes v%d from the new NameServer %s over v%d of %s", v.addr, x.Version, x.Nameserver.GetId(), v.table.Version, v.table.Nameserver.GetId())
		}
		v.table = x
		v.pushWorkers()
	case *messages.GetRoutes, *messages.WorkerHeartbeat, *messages.WorkerLeft, *messages.LeaseNode:
		ns := v.s.ns
		if ns == nil {
			e := kerr.New(messages.Code_UNAVAILABLE, "", "no name server reachable from %s yet", v.addr)
			switch m.(type) {
			case *messages.GetRoutes:
				v.s.send(v.addr, v.ref, from, &messages.RouteTable{Error: e})
			case *messages.LeaseNode:
				v.s.send(v.addr, v.ref, from, &messages.LeaseNodeReply{Error: e})
			}
			return
		}
		v.s.send(v.addr, from, ns.ref, m)
	case *handoffSnapshot:
		v.handoffIn(from, x)
	case *handoffDone:
		v.handoffDone(x)
	}
}

// assign opens a shard the NameServer placed here (create if new).
func (v *server) assign(from *messages.Ref, m *messages.AssignShard) {
	h := v.shards[m.Shard]
	if h == nil {
		v.s.chk.assigned(v, m.Shard, m.Epoch)
		sh, err := route.Parse(m.Shard)
		if err != nil {
			v.s.send(v.addr, v.ref, from, &messages.ShardOpened{ServerId: v.id, Error: kerr.Invalid("shard", "%v", err)})
			return
		}
		c := shardcore.New(v.shardConfig(sh), v.now(), m.Epoch)
		h = v.host(c)
		h.shadow = shardcore.New(v.shardConfig(sh), v.now(), m.Epoch)
		h.openLSN = ^uint64(0)
		c.Open(h)
		h.openLSN = c.AppliedLSN()
		h.after()
		v.s.tracef("%s: opened %s@%d", v.addr, h.name, c.Epoch())
		v.s.chk.ownersChanged()
	}
	v.pushWorkers()
	h.reportTo = from
	h.reportOpened()
}

// reportOpened answers the assignment once the shard may be reported.
func (h *shardHost) reportOpened() {
	if h.reportTo == nil || !h.reported() || h.core.Failed() != nil {
		return
	}
	v := h.srv
	v.s.send(v.addr, v.ref, h.reportTo, &messages.ShardOpened{ServerId: v.id, Shard: h.load()})
	h.reportTo = nil
}

func (h *shardHost) load() *messages.ShardLoad {
	now := h.srv.now()
	c := h.core
	return &messages.ShardLoad{Shard: h.name, Epoch: c.Epoch(), Pending: int64(c.Pending()), FiresWindow: c.FiresWindow(now),
		FiresTotal: c.FiresTotal(), Pid: h.ref, Frozen: c.Frozen()}
}

func (v *server) heartbeat() {
	ns := v.s.ns
	if ns == nil {
		return
	}
	hb := &messages.ServerHeartbeat{ServerId: v.id, Server: v.ref, SentMs: v.now(), Address: v.addr, SuccessRate: 1, Incarnation: int64(v.inc)}
	for _, n := range v.hostNames() {
		h := v.shards[n]
		if h.core.Failed() == nil && h.reported() {
			hb.Shards = append(hb.Shards, h.load())
		}
	}
	hb.Known = knownRoutes(v.table, v.handedTo)
	v.s.send(v.addr, v.ref, ns.ref, hb)
}

// pushWorkers gives every local shard the workers of its group, when it changed.
// It mirrors server.Group: an app's workers are partitioned among its shards by a
// hash of the worker id; a shard whose group is empty gets all of them.
func (v *server) pushWorkers() {
	t := v.table
	if t == nil {
		return
	}
	byApp := map[string][]*messages.WorkerInfo{}
	for _, aw := range t.Apps {
		byApp[aw.App] = aw.Workers
	}
	shardsOf := map[string][]route.Shard{}
	for _, r := range t.Routes {
		if sh, err := route.Parse(r.Shard); err == nil {
			shardsOf[r.App] = append(shardsOf[r.App], sh)
		}
	}
	for _, name := range v.hostNames() {
		h := v.shards[name]
		sh := h.core.Shard()
		group := workerGroup(sh, shardsOf[sh.App], byApp[sh.App])
		key := ""
		for _, w := range group {
			key += w.WorkerId + "@" + w.Ref.GetAddress() + "/" + w.Ref.GetId() + ";"
		}
		key += "|"
		for _, w := range byApp[sh.App] {
			key += w.WorkerId + ";"
		}
		if v.groups[name] == key {
			continue
		}
		v.groups[name] = key
		v.s.tracef("%s@%s: workers [%s]", name, v.addr, key)
		h.core.SetWorkersOf(v.now(), group, byApp[sh.App], h)
		h.after()
	}
}

func workerGroup(s route.Shard, shards []route.Shard, all []*messages.WorkerInfo) []*messages.WorkerInfo {
	if len(shards) <= 1 {
		return all
	}
	var g []*messages.WorkerInfo
	for _, w := range all {
		h := route.HashString(w.WorkerId)
		var best route.Shard
		found := false
		for _, o := range shards {
			if o.Contains(h) && (!found || o.Level > best.Level) {
				best, found = o, true
			}
		}
		if found && best == s {
			g = append(g, w)
		}
	}
	if len(g) == 0 {
		return all
	}
	return g
}

// ---------------------------------------------------------------- NameServer

// nsHost is the NameServer core on the server the cluster placed it on.
type nsHost struct {
	s    *Sim
	srv  *server
	core *nscore.Core
	ref  *messages.Ref
}

func newNSHost(s *Sim, srv *server) *nsHost {
	s.nsGen++
	n := &nsHost{s: s, srv: srv, core: nscore.New(srv.now(), nil),
		ref: &messages.Ref{Address: srv.addr, Id: fmt.Sprintf("%s#%d", nsActorID, s.nsGen)}} // each activation is a new actor
	n.core.SetSelf(n.ref)
	members := make([]string, 0, len(s.servers))
	for _, v := range s.servers {
		members = append(members, v.addr)
	}
	if s.cfg.Quirks&QuirkNoMembers == 0 {
		n.core.SetMembers(members) // like cluster.StartNode: the configured peers
	}
	s.tracef("nameserver: activated on %s (fresh soft state)", srv.addr)
	inc := srv.inc
	s.every(heartbeatMs/2, 0, func() bool {
		if s.ns != n || !srv.up || srv.inc != inc {
			return false
		}
		n.core.Tick(srv.now(), n)
		return true
	})
	return n
}

// Send implements nscore.Env.
func (n *nsHost) Send(to *messages.Ref, m any) { n.s.send(n.srv.addr, n.ref, to, m) }

func (n *nsHost) handle(from *messages.Ref, m any) {
	now := n.srv.now()
	switch x := m.(type) {
	case *messages.ServerHeartbeat:
		n.core.ServerHeartbeat(now, x, n)
	case *messages.WorkerHeartbeat:
		n.core.WorkerHeartbeat(now, x, n)
	case *messages.WorkerLeft:
		n.core.WorkerLeft(now, x, n)
	case *messages.ShardOpened:
		if x.Error == nil {
			n.core.ShardOpened(now, x.ServerId, x.Shard, n)
		}
	case *messages.GetRoutes:
		t := n.core.GetRoutes(now, x, nil, n)
		n.s.tracef("nameserver: %s -> %s", brief(x), brief(t))
		n.Send(from, t)
	case *messages.LeaseNode:
		r := n.core.Lease(now, x)
		n.s.tracef("nameserver: %s -> %s", brief(x), brief(r))
		n.Send(from, r)
	}
}

// knownRoutes is a server's hearsay for the NameServer, as actors/server sends it: the
// routes of its table, and for each shard it handed off, where it went (newer than the
// table's entry). A fresh NameServer then knows a shard that is between owners (the
// source dropped it, the target has not reported it yet) and does not place it anew.
func knownRoutes(t *messages.RouteTable, handed map[string]*messages.RouteEntry) []*messages.RouteEntry {
	var out []*messages.RouteEntry
	seen := map[string]bool{}
	for _, r := range t.GetRoutes() {
		if h := handed[r.Shard]; h != nil && h.Epoch > r.Epoch {
			out = append(out, h)
		} else {
			out = append(out, r)
		}
		seen[r.Shard] = true
	}
	names := make([]string, 0, len(handed))
	for n := range handed {
		if !seen[n] {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, handed[n])
	}
	return out
}
