package sim

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
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
	futurePrefix  = "future/" // reply address of a request (proto.actor's future process)
	heartbeatMs   = nscore.HeartbeatMs
	pullEveryMs   = 3 * heartbeatMs // a pull repairs a lost push (DESIGN.md, NameServer)
)

// Shard defaults in the simulation: short ladders and timeouts, so a 40 s run sees
// retries, timeouts and dead letters.
var (
	simLadderMs = []int64{200, 1000, 2500}
)

// The NameServer's split thresholds in the simulation, low enough for a 40 s run's
// workload: an app with 2 workers splits its root once; a hot shard splits by its
// fires. (Moves need no tuning: the least-schedule-count strategy moves a shard off
// a server with more than twice the fires of another, the hot app's.)
const (
	simSplitWorkers = 1
	simSplitFires   = 40 // fires per minute of one shard
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
	handedOn      map[string]int64                // shard → highest epoch handed on from here (the target's)
	handedOnFile  map[string]int64                // handedOn as last saved: the HandedOnStore file, kept by crashes
	movingTo      map[string]*messages.Ref        // shard → the server it is being moved to (from MoveShard)
	handedTo      map[string]*messages.RouteEntry // shards handed off from here: where they went (hearsay for the NameServer)
	futures       map[string]func(*messages.ImportShardReply, error)
	futureN       int
	busy          bool     // persisting an import: the server actor handles nothing else (queue)
	queue         []queued // what reached the server actor while busy
	crashOnAppend bool
	snapEvery     int64      // records a shard appends between snapshots (drawn once, Config.Snapshots)
	full          [][2]int64 // spells [from, to) of a full disk (Config.DiskFull)
}

// queued is a message to the server actor that waits for it to be free.
type queued struct {
	from *messages.Ref
	m    any
}

func newServer(s *Sim, i int) *server {
	addr := fmt.Sprintf("s%d", i+1)
	v := &server{s: s, idx: i, addr: addr, ref: &messages.Ref{Address: addr, Id: serverActorID}, disk: &disk{}}
	if s.cfg.DiskFull && s.cfg.Faults&FaultDisk != 0 {
		// A PRNG of their own: the run's draws stay what they were without them.
		r := rand.New(rand.NewPCG(s.cfg.Seed^0xd15cf0115eed, uint64(i)))
		for range r.IntN(3) {
			from := startMs + r.Int64N(max(s.cfg.HealMs-500, 1))
			v.full = append(v.full, [2]int64{from, min(from+100+r.Int64N(2900), startMs+s.cfg.HealMs)})
		}
	}
	return v
}

// diskFull says whether the server's disk is full now (Config.DiskFull): the
// journal down to its reserve, on the simulation's clock (a disk has no skew).
func (v *server) diskFull() bool {
	for _, p := range v.full {
		if v.s.now >= p[0] && v.s.now < p[1] {
			return true
		}
	}
	return false
}

// errDiskFull is a full disk's answer to shardcore.Roomy.
var errDiskFull = errors.New("the simulated disk is full: the journal is down to its reserve")

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
	// handoffBusy: an import request is in flight; handoffWait: one failed and the
	// next waits out handoffRetryMs (the shard shell's flags, actors/shard/handoff.go).
	handoffBusy, handoffWait bool
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
	reportPending    bool // opened on an assignment: ShardOpened is due once durable
	// activeSince is, for a shard imported here, the time on this server's clock
	// when its handoff began (0: not imported). Lateness is measured from it: a due
	// passed on this clock while another server, whose clock was behind, owned the
	// shard is late only by the handoff's own time.
	activeSince int64
	// Snapshots (Config.Snapshots), as the shard shell takes them: sinceSnap
	// records appended since the last, one at a time (snapBusy: frozen, being
	// encoded and written), lastSnap the LSN of the last written.
	sinceSnap int64
	snapBusy  bool
	lastSnap  uint64
}

// reported says whether the server may tell the NameServer it owns the shard.
func (h *shardHost) reported() bool {
	return h.srv.s.cfg.Quirks&QuirkEarlyOpen != 0 || h.durable >= h.openLSN
}

// Append implements shardcore.Env.
func (h *shardHost) Append(entries []persistence.Entry) (uint64, error) {
	return h.appendWithin(entries, 0)
}

// AppendBy implements shardcore.LazyAppender.
func (h *shardHost) AppendBy(entries []persistence.Entry, byMs int64) (uint64, error) {
	return h.appendWithin(entries, byMs-h.srv.now())
}

func (h *shardHost) appendWithin(entries []persistence.Entry, withinMs int64) (uint64, error) {
	if h.gone {
		return 0, fmt.Errorf("shard %s is gone from %s", h.name, h.srv.addr)
	}
	return h.srv.j.appendWithin(h, entries, nil, withinMs)
}

// JournalRoom implements shardcore.Roomy: no room while the server's disk is full.
func (h *shardHost) JournalRoom() error {
	if h.srv.diskFull() {
		return errDiskFull
	}
	return nil
}

// SyncNow implements shardcore.LazyAppender.
func (h *shardHost) SyncNow() {
	if !h.gone {
		h.srv.j.syncNow()
	}
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
		Seed:        v.s.cfg.Seed,
		Mutations:   v.s.cfg.Mutations,
		ArmMs:       v.s.cfg.ArmMs,
		LazySyncMs:  v.s.cfg.LazySyncMs,
		CheckCaches: true,
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
	v.handedOn = map[string]int64{}
	v.movingTo = map[string]*messages.Ref{}
	v.handedTo = map[string]*messages.RouteEntry{}
	v.futures = map[string]func(*messages.ImportShardReply, error){}
	v.busy, v.queue = false, nil
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
	v.s.stats.Recoveries++
	v.s.stats.RecordsReplayed += int64(res.records)
	v.s.stats.SnapshotsLoaded += int64(res.snapshots)
	if res.truncated > 0 {
		v.s.tracef("%s: recovery truncated %d bytes of torn tail", v.addr, res.truncated)
	}
	shadows := replayLog(v, v.disk, now, false)
	// As cluster/node.go recover: a shard closed (handed off) before the crash has
	// its handed-on epoch saved, then its stream dropped; every other one is
	// recovered, and one that is handing off resumes (tryHandoff, from after).
	handed := maps.Clone(v.handedOnFile)
	if handed == nil {
		handed = map[string]int64{}
	}
	changed := false
	var drop []*shardcore.Core
	var keep []uint64
	for _, st := range res.order {
		c := res.cores[st]
		if c.Closed() {
			if name := c.Shard().String(); handed[name] < c.Epoch()+1 {
				handed[name], changed = c.Epoch()+1, true
			}
			drop = append(drop, c)
			continue
		}
		keep = append(keep, st)
	}
	if changed {
		v.handedOnFile = maps.Clone(handed)
	}
	v.handedOn = handed
	for _, c := range drop {
		v.s.tracef("%s: %s@%d was handed off before the crash: its stream is dropped", v.addr, c.Shard(), c.Epoch())
		v.dropStream(c.Stream(), c.Epoch())
	}
	for _, st := range keep {
		c := res.cores[st]
		h := v.host(c)
		h.view = res.views[st]
		h.next = res.nexts[st]
		h.shadow = shadows.cores[st]
		v.s.tracef("%s: recovered %s@%d (%d jobs, %d runs, frozen=%v) at lsn %d", v.addr, h.name, c.Epoch(), c.Jobs(), c.InFlight(), c.Frozen(), res.last)
		c.Recovered(now, res.last, h)
		h.after()
	}
	v.s.chk.recovered(v)
}

// replayed is what a journal holds: a core per stream, in order of appearance.
type replayed struct {
	cores     map[uint64]*shardcore.Core
	views     map[uint64]map[int64]*messages.Job
	nexts     map[uint64]map[int64]int64
	order     []uint64
	last      uint64
	records   int
	snapshots int // streams begun from a snapshot
	truncated int
	err       error
}

// replayLog decodes d and replays it into fresh cores (without Recovered). truncate
// says whether this is a real recovery (the torn tail is cut off) or a check that
// reads the durable prefix of a copy.
func replayLog(v *server, d *disk, now int64, truncate bool) replayed {
	out := replayed{cores: map[uint64]*shardcore.Core{}, views: map[uint64]map[int64]*messages.Job{}, nexts: map[uint64]map[int64]int64{}}
	remove := func(st uint64) {
		delete(out.cores, st)
		delete(out.views, st)
		delete(out.nexts, st)
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
	// As persistence.Journal.Replay: each stream's newest snapshot first, in stream
	// order, then the records after it (compaction removes the ones it covers, or
	// would: skipped here).
	var snapLSN map[uint64]uint64
	for _, st := range slices.Sorted(maps.Keys(d.snaps)) {
		sn := d.snaps[st]
		name, epoch, err := shardcore.ShardNameOfSnapshot(sn.data)
		if err != nil {
			out.err = fmt.Errorf("snapshot of stream %x at lsn %d: %w", st, sn.lsn, err)
			return out
		}
		sh, err := route.Parse(name)
		if err != nil {
			out.err = fmt.Errorf("snapshot of stream %x at lsn %d: %w", st, sn.lsn, err)
			return out
		}
		c := shardcore.New(v.shardConfig(sh), now, epoch)
		if err := c.LoadSnapshot(sn.data, sn.lsn); err != nil {
			out.err = fmt.Errorf("snapshot of stream %x at lsn %d: %w", st, sn.lsn, err)
			return out
		}
		add(st, c)
		viewFromSnapshot(out.views[st], out.nexts[st], sn.data)
		if snapLSN == nil {
			snapLSN = map[uint64]uint64{}
		}
		snapLSN[st] = sn.lsn
		out.snapshots++
	}
	fn := func(r persistence.Record) {
		if out.err != nil || r.LSN <= snapLSN[r.Stream] {
			return
		}
		out.records++
		switch r.Type {
		case uint8(messages.RecordType_SHARD_IMPORTED):
			// A shard handed to this server: the record holds all of it (cluster/node.go).
			name, epoch, err := shardcore.ShardNameOfSnapshot(r.Payload)
			if err != nil {
				out.err = fmt.Errorf("lsn %d: imported shard: %w", r.LSN, err)
				return
			}
			sh, err := route.Parse(name)
			if err != nil {
				out.err = fmt.Errorf("lsn %d: %w", r.LSN, err)
				return
			}
			c := shardcore.New(v.shardConfig(sh), now, epoch)
			if err := c.LoadSnapshot(r.Payload, r.LSN); err != nil {
				out.err = err
				return
			}
			add(r.Stream, c)
			viewFromSnapshot(out.views[r.Stream], out.nexts[r.Stream], r.Payload)
		case recDropped:
			// DropStream: recovery skips every earlier record of the stream.
			remove(r.Stream)
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
			if j := view[st.JobId]; j != nil { // (the checker's copy: the core's fires move it too)
				j.LastDueMs = max(j.LastDueMs, st.DueMs)
			}
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

// after runs after every input to a core, as the shard shell does: re-arm its one
// timer, advance a handoff.
func (h *shardHost) after() {
	if h.gone {
		return
	}
	h.rearm()
	h.tryHandoff()
	h.maybeSnapshot()
}

// checkLoaded checks that c, loaded from data (a snapshot, or an imported shard),
// holds the state data was taken of: encoded again, it is the same bytes.
func (v *server) checkLoaded(shard, what string, data []byte, c *shardcore.Core) {
	if again := c.Snapshot(); !bytes.Equal(again, data) {
		v.s.failf("snapshot-load", "%s on %s: %s (%d bytes) loads into another state (%d bytes encoded again)", shard, v.addr, what, len(data), len(again))
	}
}

// maybeSnapshot is the shard shell's snapshot (actors/shard/shell.go): once enough
// has been appended, and everything applied is durable, the state is frozen
// (SnapshotView) at the applied LSN; the view is encoded and written at once, or
// later, as the shell's goroutine does for a large shard, while the core goes on
// changing the state it shares with the view (copy on write).
func (h *shardHost) maybeSnapshot() {
	v := h.srv
	if !v.s.cfg.Snapshots || h.gone || h.snapBusy {
		return
	}
	if v.snapEvery == 0 {
		v.snapEvery = v.s.between(4, 40)
	}
	c := h.core
	if h.sinceSnap < v.snapEvery || !c.Snapshottable() {
		return
	}
	lsn := c.AppliedLSN()
	if lsn == h.lastSnap {
		return
	}
	view := c.SnapshotView()
	stream, sh, epoch := c.Stream(), c.Shard(), c.Epoch()
	h.sinceSnap = 0
	write := func() {
		data := view.Encode()
		err := v.j.writeSnapshot(stream, lsn, data)
		h.snapBusy = false
		if err != nil {
			v.s.tracef("%s@%s: snapshot at lsn %d failed: %v", h.name, v.addr, lsn, err)
			return
		}
		v.s.stats.Snapshots++
		if lsn > h.lastSnap {
			h.lastSnap = lsn
		}
		v.s.tracef("%s@%s: snapshot at lsn %d (%d bytes)", h.name, v.addr, lsn, len(data))
		// What recovery would load must be the state frozen.
		cp := shardcore.New(v.shardConfig(sh), v.now(), epoch)
		if err := cp.LoadSnapshot(data, lsn); err != nil {
			v.s.failf("snapshot-load", "%s on %s: its snapshot at lsn %d does not load: %v", h.name, v.addr, lsn, err)
			return
		}
		v.checkLoaded(h.name, fmt.Sprintf("its snapshot at lsn %d", lsn), data, cp)
	}
	h.snapBusy = true
	if v.s.chance(0.5) {
		write()
		return
	}
	inc := v.inc
	v.s.after(v.s.between(0, 50), func() {
		if v.up && v.inc == inc { // the goroutine dies with its process
			write()
		}
	})
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
		h.srv.s.chk.updateApplied(from, u.Job.GetId(), h.view[u.Job.GetId()].GetVersion())
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
	case strings.HasPrefix(to.Id, futurePrefix):
		v.answered(to.Id, m)
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
	if v.busy {
		v.queue = append(v.queue, queued{from: from, m: m})
		return
	}
	switch x := m.(type) {
	case *messages.AssignShard:
		v.s.tracef("%s: %s", v.addr, brief(m))
		if v.refused(x, nscore.CheckAssign(x)) {
			return
		}
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
		if v.refused(x, nscore.CheckTable(x)) {
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
	case *messages.MoveShard:
		v.s.tracef("%s: %s", v.addr, brief(m))
		if v.refused(x, nscore.CheckMove(x)) {
			return
		}
		v.moveShard(x, false)
	case *messages.ImportShard:
		v.s.tracef("%s: %s <- %s", v.addr, brief(m), from.GetAddress())
		if v.refused(x, nscore.CheckImport(x)) {
			return
		}
		v.importShard(from, x)
	case *handedOff:
		v.handedOff(x)
	}
}

// refused says whether a server refuses m, as actors/server checks what the
// NameServer and other servers send it (nscore.CheckAssign and the rest): every
// sender here is legitimate, so a refusal breaks refused-legit (a check too strict
// would leave a real cluster unable to place, move or route).
func (v *server) refused(m any, e *messages.Error) bool {
	if e == nil {
		return false
	}
	v.s.chk.failf("refused-legit", "%s refused %s: %s", v.addr, brief(m), kerr.FromWire(e))
	return true
}

// assign opens a shard the NameServer placed here (create if new). As in
// actors/server, an assignment of a shard that has moved on from here since (a
// late or repeated one) opens nothing. The NameServer sends assignments without a
// sender, so the real server confirms a new shard to the NameServer it resolves
// when the shard's record is durable, and an existing one not at all.
func (v *server) assign(from *messages.Ref, m *messages.AssignShard) {
	// As actors/server: only from the NameServer instance this node resolves now.
	if ns := v.s.ns; ns != nil && m.Nameserver != nil && (m.Nameserver.Address != ns.ref.Address || m.Nameserver.Id != ns.ref.Id) {
		v.s.tracef("%s: assignment of %s from name server %s/%s, not the current one: ignored", v.addr, m.Shard, m.Nameserver.Address, m.Nameserver.Id)
		return
	}
	h := v.shards[m.Shard]
	if h != nil {
		v.pushWorkers()
		return
	}
	if l := v.movedOn(m.Shard, m.Epoch); l != nil {
		v.s.tracef("%s: assignment of %s@%d, moved on since (epoch %d): ignored", v.addr, m.Shard, m.Epoch, l.Epoch)
		return
	}
	v.s.chk.assigned(v, m.Shard, m.Epoch)
	sh, err := route.Parse(m.Shard)
	if err != nil {
		return
	}
	c := shardcore.New(v.shardConfig(sh), v.now(), m.Epoch)
	h = v.host(c)
	h.shadow = shardcore.New(v.shardConfig(sh), v.now(), m.Epoch)
	h.openLSN = ^uint64(0)
	c.Open(h)
	if c.Failed() != nil {
		// As actors/server: a journal that refuses the SHARD_OPENED record opens
		// nothing (it answers UNAVAILABLE and spawns no shard), so nothing of it is
		// reported either; the NameServer sends the assignment again.
		h.gone = true
		delete(v.shards, h.name)
		v.s.tracef("%s: cannot open %s@%d: %v", v.addr, h.name, m.Epoch, c.Failed())
		return
	}
	h.openLSN = c.AppliedLSN()
	h.after()
	v.s.tracef("%s: opened %s@%d", v.addr, h.name, c.Epoch())
	v.s.chk.ownersChanged()
	v.pushWorkers()
	h.reportPending = true
	h.reportOpened()
}

// reportOpened confirms a new shard to the NameServer once it may be reported.
func (h *shardHost) reportOpened() {
	if !h.reportPending || !h.reported() || h.core.Failed() != nil {
		return
	}
	v := h.srv
	h.reportPending = false
	if ns := v.s.ns; ns != nil {
		v.s.send(v.addr, v.ref, ns.ref, &messages.ShardOpened{ServerId: v.id, Shard: h.load()})
	}
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
		// A shard whose journal failed is reported all the same, as actors/server
		// does: it still exists here (a restart recovers it), and a NameServer that
		// heard of its app from nowhere else would place it anew (seed 207979).
		if h := v.shards[n]; h.reported() {
			hb.Shards = append(hb.Shards, h.load())
		} else {
			// Opened here, its SHARD_OPENED record not durable yet (or its sync
			// failed): claimed, as actors/server does, so a NameServer that took over
			// since the assignment holds its app for this address.
			hb.Opening = append(hb.Opening, n)
		}
	}
	hb.Known = knownRoutes(v.table, v.handedTo)
	if v.j.failed != nil {
		hb.JournalError = v.j.failed.Error() // as actors/server
	}
	hb.JournalNoRoom = v.diskFull()
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
		group := route.Group(sh, shardsOf[sh.App], byApp[sh.App])
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
	n.core.SetSplit(nscore.SplitPolicy{Workers: simSplitWorkers, Fires: simSplitFires})
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

// Send implements nscore.Env. In the last QuietMs of a run its MoveShard orders
// are dropped, so the end-of-run checks meet no handoff halfway (one begun before
// then is over in milliseconds once faults have stopped).
func (n *nsHost) Send(to *messages.Ref, m any) {
	if _, ok := m.(*messages.MoveShard); ok && n.s.now > n.s.end-QuietMs {
		n.s.tracef("nameserver: %s not sent: the run is ending", brief(m))
		return
	}
	n.s.send(n.srv.addr, n.ref, to, m)
}

func (n *nsHost) handle(from *messages.Ref, m any) {
	now := n.srv.now()
	switch x := m.(type) {
	case *messages.ServerHeartbeat:
		n.refused(x, n.core.ServerHeartbeat(now, x, n))
	case *messages.WorkerHeartbeat:
		n.refused(x, n.core.WorkerHeartbeat(now, x, n))
	case *messages.WorkerLeft:
		n.refused(x, n.core.WorkerLeft(now, x, n))
	case *messages.ShardOpened:
		if x.Error == nil {
			n.refused(x, n.core.ShardOpened(now, x.ServerId, x.Shard, n))
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

// refused breaks refused-legit when the NameServer refused what a server or worker
// sent it (nscore.Check): every sender here is legitimate.
func (n *nsHost) refused(m any, e *messages.Error) {
	if e != nil {
		n.s.chk.failf("refused-legit", "the name server refused %s: %s", brief(m), kerr.FromWire(e))
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
			delete(handed, r.Shard) // the table has caught up: the hearsay is no longer needed
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
