// Package core is the pure state machine of kjob's registry and balancer: servers and workers register
// and heartbeat, it keeps the route table shard → owner (epoch, version), pushes it to
// servers on change and answers pulls. Its state is soft: after it moves or restarts
// it rebuilds everything from heartbeats, and it assigns nothing until its picture is
// complete (WarmupMs after it started).
//
// Core is pure (times are passed in); shell.go is the proto.actor actor.
package core

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// Timing, in milliseconds.
const (
	HeartbeatMs     = 1000
	ServerExpiryMs  = 4 * HeartbeatMs
	WorkerExpiryMs  = 4 * HeartbeatMs
	WarmupMs        = 2*HeartbeatMs + 500 // two heartbeat intervals
	LeaseTTLMs      = 3_000
	MaxNodes        = 1024 // snowflake node bits: 10
	SubscriberTTLMs = 30_000
)

// Env is what the core needs from the world.
type Env interface {
	Send(to *messages.Ref, m any)
}

type server struct {
	hb       *messages.ServerHeartbeat
	lastSeen int64
	alive    bool
}

type worker struct {
	info     *messages.WorkerInfo
	lastSeen int64
}

// pendingAssign is a root shard assigned to a server that has not reported it yet.
//
// It is bound to the server's address (its data directory), not to the process:
// the server may have opened the shard, made its record durable and died before
// reporting it, or may still be on its way to it, and a restart at that address
// recovers it from the journal. So the assignment is sent again, every
// ServerExpiryMs, to whichever process now reports from that address, and while
// none does the app waits; it is never placed on another server at the same epoch
// (a second owner, the first one's acknowledged jobs invisible: the simulator's
// seed 206138, an AssignShard that arrived after the NameServer had given up on
// it, on a server that crashed right after journaling it).
type pendingAssign struct {
	atMs    int64  // when it was last sent
	server  string // the server id it was last sent to
	address string // where that server runs
}

type move struct {
	Move
	epoch  int64
	atMs   int64
	split  bool // a split of the shard into its halves on its own server (From == To)
	order  *messages.MoveShard
	sentMs int64 // when order was last sent
}

// Splitting: an app whose live workers exceed Workers per shard, or a shard whose
// fires in the sliding window (a minute) exceed Fires, is split by its owner into
// the two halves of its hash range (each half then dispatches to its own group of
// the app's workers, by a hash of the worker id). One split or move at a time.
const (
	DefaultSplitWorkers = 500
	DefaultSplitFires   = 300_000 // fires per minute of one shard (5,000/s)
)

// SplitPolicy sets the split thresholds; 0 takes the default, a negative value
// switches that trigger off.
type SplitPolicy struct {
	Workers int
	Fires   int64
}

// Rebalancing timing.
const (
	MoveCooldownMs = 10_000 // after a move completes, before the next decision
	MoveTimeoutMs  = 60_000 // a move not confirmed by then is forgotten (its source keeps trying)
	// MoveResendMs is how long after sending a move order the NameServer waits
	// before it sends the order again, if its source still shows no sign of it.
	MoveResendMs = 3 * HeartbeatMs
	// SplitCooldownMs is the pause after a split settles. Splits cannot flap (a
	// split is never undone), so it only lets the halves report first.
	SplitCooldownMs = 2 * HeartbeatMs
)

type lease struct {
	holder  string
	expires int64
}

// Core is the NameServer's state machine.
type Core struct {
	started      int64
	strategy     Strategy
	servers      map[string]*server
	gone         map[string]int64 // member id → when a newer incarnation at its address superseded it
	workers      map[string]*worker
	routes       map[string]*messages.RouteEntry
	version      int64
	leases       map[int64]*lease
	nextNode     int64
	subs         map[string]int64 // client subscribers: ref key → expiry
	subRefs      map[string]*messages.Ref
	pending      map[string]pendingAssign // shard → assignment sent, not yet reported
	self         *messages.Ref            // this NameServer instance, stamped on every table
	moves        map[string]*move
	lastMoveMs   int64
	movesDone    int64
	dirty        bool
	workersDirty bool
	members      []string // the configured servers' addresses (nil = not known)
	split        SplitPolicy
	splitsDone   int64
	lastSplitWhy string
	lastSplitMs  int64
	lastWasSplit bool // the last order was a split: a wanted move goes next
	maxWorkers   int  // MaxWorkers (tests lower it)
	maxSubs      int  // MaxSubscribers (tests lower it)
	maxRoutes    int  // MaxRoutes (tests lower it)
}

// New starts an empty NameServer at nowMs.
func New(nowMs int64, s Strategy) *Core {
	if s == nil {
		s = LeastScheduleCount{}
	}
	return &Core{started: nowMs, strategy: s, servers: map[string]*server{}, gone: map[string]int64{}, workers: map[string]*worker{},
		routes: map[string]*messages.RouteEntry{}, leases: map[int64]*lease{}, subs: map[string]int64{},
		subRefs: map[string]*messages.Ref{}, pending: map[string]pendingAssign{}, moves: map[string]*move{}, version: nowMs,
		split: SplitPolicy{Workers: DefaultSplitWorkers, Fires: DefaultSplitFires}, maxWorkers: MaxWorkers, maxSubs: MaxSubscribers, maxRoutes: MaxRoutes}
}

// SetSelf names this NameServer instance (stamped on its tables, so a server can
// tell the current NameServer's pushes from a stale instance's).
func (c *Core) SetSelf(r *messages.Ref) { c.self = r }

// SetSplit sets the split thresholds.
func (c *Core) SetSplit(p SplitPolicy) {
	if p.Workers == 0 {
		p.Workers = DefaultSplitWorkers
	}
	if p.Fires == 0 {
		p.Fires = DefaultSplitFires
	}
	c.split = p
}

// SplitsDone is the number of shard splits completed under this NameServer.
func (c *Core) SplitsDone() int64 { return c.splitsDone }

// SetMembers tells the core the address of every server configured in the cluster.
// A new app's root shard is then placed only while every one of them reports: the
// NameServer's state is soft, so an app it has no route for may live on a server that
// is down or cut off, and placing it again would make a second owner at epoch 1 (the
// first one's acknowledged jobs invisible). Existing apps are unaffected.
func (c *Core) SetMembers(addrs []string) {
	c.members = append([]string(nil), addrs...)
	sort.Strings(c.members)
}

// missing lists the configured servers that do not report now.
func (c *Core) missing() []string {
	var out []string
	for _, a := range c.members {
		found := false
		for _, s := range c.servers {
			if s.alive && s.hb.GetAddress() == a {
				found = true
				break
			}
		}
		if !found {
			out = append(out, a)
		}
	}
	return out
}

// reportedShard finds a shard of app that a live server reports, frozen (handing
// off) ones included: the app exists, so it must not be placed anew.
func (c *Core) reportedShard(app string) (shard, serverID string) {
	ids := make([]string, 0, len(c.servers))
	for id := range c.servers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		s := c.servers[id]
		if !s.alive {
			continue
		}
		for _, l := range s.hb.GetShards() {
			if sh, err := route.Parse(l.Shard); err == nil && sh.App == app {
				return l.Shard, id
			}
		}
	}
	return "", ""
}

// Complete reports whether the picture is complete (warm-up over).
func (c *Core) Complete(nowMs int64) bool { return nowMs-c.started >= WarmupMs }

func refKey(r *messages.Ref) string { return r.GetAddress() + "/" + r.GetId() }

// ServerHeartbeat records a server's report and adopts the shards it owns.
//
// A heartbeat that fails Check is refused with the error and changes nothing (nor
// does it count as a sign of life): its shards and hearsay would become routes in
// every push (one without an owner takes a client down; one under a second name
// of a shard is a second route to it), its reference would get the orders.
func (c *Core) ServerHeartbeat(nowMs int64, hb *messages.ServerHeartbeat, env Env) *messages.Error {
	if e := Check(hb); e != nil {
		return e
	}
	if _, ok := c.gone[hb.ServerId]; ok {
		return nil // a late heartbeat of a process restarted since
	}
	s := c.servers[hb.ServerId]
	if s == nil {
		if c.superseded(nowMs, hb) {
			return nil
		}
		s = &server{}
		c.servers[hb.ServerId] = s
		c.dirty, c.workersDirty = true, true // a new server needs the whole table and the workers
	}
	s.hb, s.lastSeen, s.alive = hb, nowMs, true
	for _, l := range hb.Shards {
		sh, err := route.Parse(l.Shard)
		if err != nil {
			continue
		}
		delete(c.pending, l.Shard)
		cur := c.routes[l.Shard]
		if l.Frozen && cur != nil {
			continue // moving: its target reports it next; the route stays until then
		}
		if cur == nil || l.Epoch > cur.Epoch || (l.Epoch == cur.Epoch && !c.alive(cur.ServerId)) ||
			(l.Epoch == cur.Epoch && cur.ServerId == hb.ServerId && refKey(cur.Owner) != refKey(l.Pid)) {
			c.routes[l.Shard] = &messages.RouteEntry{Shard: l.Shard, App: sh.App, Level: int32(sh.Level), Index: sh.Index,
				Owner: l.Pid, ServerId: hb.ServerId, Epoch: l.Epoch}
			c.dirty = true
			if mv := c.moves[l.Shard]; mv != nil && l.Epoch > mv.epoch {
				delete(c.moves, l.Shard)
				c.lastMoveMs, c.movesDone = nowMs, c.movesDone+1
			}
		}
	}
	for _, k := range hb.Known { // hearsay: what the server last heard, for a fresh NameServer
		if cur := c.routes[k.Shard]; cur == nil {
			c.routes[k.Shard] = k
			c.dirty = true
		}
	}
	c.adoptOpenings(nowMs, hb)
	c.splitsSettled(nowMs)
	c.prune()
	c.flushPush(nowMs, env)
	return nil
}

// adoptOpenings binds each root shard the server says it is opening (its
// SHARD_OPENED record appended, not known durable: see ServerHeartbeat.opening)
// to the server's address, as if this NameServer had sent the assignment: the
// app waits for that address and goes nowhere else at epoch 1. A NameServer that
// took over after the assignment was sent knows of it only so; a server whose
// sync failed may hold the record all the same, and a restart would recover it.
// It is sent again like any other (resendAssignments): to an open in flight that
// only adds a waiter, a failed journal refuses it, and a shard whose actor did not
// start gets another try.
func (c *Core) adoptOpenings(nowMs int64, hb *messages.ServerHeartbeat) {
	for _, name := range hb.Opening {
		sh, err := route.Parse(name)
		if err != nil || sh.Level != 0 || c.exists(sh) {
			continue // only a new app's root shard is ever assigned; a routed one exists
		}
		if _, ok := c.pending[name]; ok {
			continue // known already (sent from here, to this address or another: that one decides)
		}
		c.pending[name] = pendingAssign{atMs: nowMs, server: hb.ServerId, address: hb.GetAddress()}
	}
}

// splitsSettled ends each split whose two halves both report at a newer epoch.
func (c *Core) splitsSettled(nowMs int64) {
	for name, mv := range c.moves {
		if !mv.split {
			continue
		}
		sh, err := route.Parse(name)
		if err != nil {
			continue
		}
		lo, hi := sh.Children()
		rl, rh := c.routes[lo.String()], c.routes[hi.String()]
		if rl != nil && rh != nil && rl.Epoch > mv.epoch && rh.Epoch > mv.epoch {
			delete(c.moves, name)
			c.lastSplitMs, c.splitsDone = nowMs, c.splitsDone+1
		}
	}
}

// prune drops the route of a shard whose range is covered by routed descendants:
// it was split (perhaps more than once since), and lookups go to the pieces (a
// stale copy of it, adopted from hearsay, too). Whether a shard is covered does not
// depend on which other routes are dropped here, so the outcome does not depend on
// the map's order.
func (c *Core) prune() {
	var drop []string
	for name := range c.routes {
		if sh, err := route.Parse(name); err == nil && c.covered(sh) {
			drop = append(drop, name)
		}
	}
	for _, name := range drop {
		delete(c.routes, name)
		c.dirty = true
	}
}

// exists reports whether sh is routed, or its range is covered by routed pieces.
func (c *Core) exists(sh route.Shard) bool { return c.routes[sh.String()] != nil || c.covered(sh) }

// covered reports whether both halves of sh are routed or, in turn, covered.
func (c *Core) covered(sh route.Shard) bool {
	if sh.Level >= route.MaxLevel {
		return false
	}
	lo, hi := sh.Children()
	for _, h := range [2]route.Shard{lo, hi} {
		if c.routes[h.String()] == nil && !c.covered(h) {
			return false
		}
	}
	return true
}

// superseded settles two member ids at one address: one process serves an
// address, so the one with the lower incarnation is a process restarted since, gone
// for good. Left alive until its expiry, the old id would keep its shards' routes
// (the restarted process reports them at the same epoch) and look like the busiest
// server next to an empty new one: the strategy would move a shard from the old id
// to the new — one process, which would hand the shard to itself. The old id's
// moves end here and its routes pass to whoever reports them next; assignments
// sent to it stay pending, bound to its address (pendingAssign), and go again to
// the process now there. The old id is remembered (gone) for a while, so its
// heartbeats still on their way are not taken for a server. It says whether hb
// itself is the old one (and is to be ignored).
// Without incarnations on both sides nothing is decided: the old id expires.
// The newest incarnation at the address is found first, and every other one is
// gone: the outcome does not depend on the order the map is walked in.
func (c *Core) superseded(nowMs int64, hb *messages.ServerHeartbeat) bool {
	addr := hb.GetServer().GetAddress()
	if addr == "" || hb.Incarnation == 0 {
		return false
	}
	same := func(id string, s *server) bool {
		return id != hb.ServerId && s.hb.GetServer().GetAddress() == addr && s.hb.Incarnation != 0
	}
	newest := hb.Incarnation
	for id, s := range c.servers {
		if same(id, s) {
			newest = max(newest, s.hb.Incarnation)
		}
	}
	for id, s := range c.servers {
		if !same(id, s) || (s.hb.Incarnation == newest && newest > hb.Incarnation) {
			continue
		}
		delete(c.servers, id)
		c.gone[id] = nowMs
		for sh, mv := range c.moves {
			if mv.From == id || mv.To == id {
				delete(c.moves, sh)
			}
		}
		c.dirty = true
	}
	if newest > hb.Incarnation {
		c.gone[hb.ServerId] = nowMs
		return true
	}
	return false
}

// current drops, from a server's last heartbeat, the shards that have moved on
// since it was sent: a copy below its route's epoch (handed off; the old owner's
// next heartbeat will not list it), or a parent whose range routed descendants cover (split).
// Counted, a shard just moved would weigh on both servers for up to a heartbeat:
// the strategy would see a load that is not there, and the status two owners.
func (c *Core) current(ls []*messages.ShardLoad) []*messages.ShardLoad {
	stale := func(l *messages.ShardLoad) bool {
		if rt := c.routes[l.Shard]; rt != nil {
			return l.Epoch < rt.Epoch
		}
		sh, err := route.Parse(l.Shard)
		return err == nil && c.covered(sh)
	}
	n := 0
	for _, l := range ls {
		if stale(l) {
			n++
		}
	}
	if n == 0 {
		return ls
	}
	out := make([]*messages.ShardLoad, 0, len(ls)-n)
	for _, l := range ls {
		if !stale(l) {
			out = append(out, l)
		}
	}
	return out
}

func (c *Core) alive(serverID string) bool {
	s := c.servers[serverID]
	return s != nil && s.alive
}

// WorkerHeartbeat records a worker.
//
// A heartbeat that fails Check is refused with the error and changes nothing:
// what is kept of a worker goes to every shard of its app (a worker without a
// reference would take their dispatches nowhere) and into every route push (one
// that does not marshal would reach no server).
func (c *Core) WorkerHeartbeat(nowMs int64, hb *messages.WorkerHeartbeat, env Env) *messages.Error {
	if e := Check(hb); e != nil {
		return e
	}
	w := c.workers[hb.Worker.WorkerId]
	if w == nil && len(c.workers) >= c.maxWorkers {
		return errWorkersFull(len(c.workers), c.maxWorkers)
	}
	if w == nil || refKey(w.info.Ref) != refKey(hb.Worker.Ref) {
		c.workersDirty = true
	}
	if w == nil {
		w = &worker{}
		c.workers[hb.Worker.WorkerId] = w
	}
	w.info, w.lastSeen = hb.Worker, nowMs
	c.flushPush(nowMs, env)
	return nil
}

// WorkerLeft removes a worker that said goodbye. A goodbye that fails Check, or
// names the worker with another app than it is registered for (not the goodbye of
// that worker), removes nothing and is answered with the error.
func (c *Core) WorkerLeft(nowMs int64, m *messages.WorkerLeft, env Env) *messages.Error {
	if e := Check(m); e != nil {
		return e
	}
	if w, ok := c.workers[m.WorkerId]; ok {
		if w.info.App != m.App {
			return kerr.Invalid("app", "worker %s is registered for app %s, not %s", m.WorkerId, w.info.App, m.App)
		}
		delete(c.workers, m.WorkerId)
		c.workersDirty = true
	}
	c.flushPush(nowMs, env)
	return nil
}

// Tick expires silent servers and workers, and re-pushes on change.
func (c *Core) Tick(nowMs int64, env Env) {
	for _, s := range c.servers {
		if s.alive && nowMs-s.lastSeen > ServerExpiryMs {
			s.alive = false
			c.dirty = true
		}
	}
	for id, s := range c.servers {
		if !s.alive && nowMs-s.lastSeen > 10*ServerExpiryMs {
			delete(c.servers, id) // its routes stay: the shards are unavailable, not gone
		}
	}
	for id, at := range c.gone {
		if nowMs-at > 10*ServerExpiryMs {
			delete(c.gone, id)
		}
	}
	for id, w := range c.workers {
		if nowMs-w.lastSeen > WorkerExpiryMs {
			delete(c.workers, id)
			c.workersDirty = true
		}
	}
	for k, exp := range c.subs {
		if nowMs > exp {
			delete(c.subs, k)
			delete(c.subRefs, k)
		}
	}
	c.resendAssignments(nowMs, env)
	for sh, mv := range c.moves {
		// A move whose source or target expired is forgotten at once: a restart
		// comes back as a new server id (it resumes a handoff from its journal by
		// itself), and waiting out MoveTimeoutMs would hold every other move back.
		from, to := c.servers[mv.From], c.servers[mv.To]
		if nowMs-mv.atMs > MoveTimeoutMs || from == nil || !from.alive || to == nil || !to.alive {
			delete(c.moves, sh)
		}
	}
	c.resendLostOrders(nowMs, env)
	c.rebalance(nowMs, env)
	c.flushPush(nowMs, env)
}

// resendAssignments sends each assignment not reported within ServerExpiryMs
// again, to the live server at its address (see pendingAssign), in shard order.
func (c *Core) resendAssignments(nowMs int64, env Env) {
	for _, sh := range slices.Sorted(maps.Keys(c.pending)) {
		p := c.pending[sh]
		if root, err := route.Parse(sh); c.routes[sh] != nil || (err == nil && c.exists(root)) {
			// Routed all the same (hearsay, or a report that did not list this
			// assignment's shard by name): the app exists, and an order sent now to a
			// server that does not hold it would open a second copy.
			delete(c.pending, sh)
			continue
		}
		if nowMs-p.atMs <= ServerExpiryMs {
			continue
		}
		id := c.liveAt(p.address, p.server)
		if id == "" {
			continue // nothing reports from there: the app waits for it
		}
		c.pending[sh] = pendingAssign{atMs: nowMs, server: id, address: p.address}
		env.Send(c.servers[id].hb.Server, &messages.AssignShard{Shard: sh, Epoch: 1, Nameserver: c.self})
	}
}

// liveAt is the live server at address: prefer if it is one, else the one that
// reported last (a restart's).
func (c *Core) liveAt(address, prefer string) string {
	if s := c.servers[prefer]; s != nil && s.alive {
		return prefer
	}
	best := ""
	if address == "" {
		return best // a server that gave no address: only itself will do
	}
	for id, s := range c.servers {
		if !s.alive || s.hb.GetAddress() != address {
			continue
		}
		if b := c.servers[best]; best == "" || s.lastSeen > b.lastSeen || (s.lastSeen == b.lastSeen && id < best) {
			best = id
		}
	}
	return best
}

// resendLostOrders sends a move or split order again when its source, in a
// heartbeat sent well after the order could have arrived, still reports the
// shard active and not frozen at the order's epoch: the order was lost (a
// partition, a dropped message). Without it one lost order would hold every
// move and split back until MoveTimeoutMs (the simulator's balance check found
// that). A server ignores an order it is already carrying out, as it must for
// a duplicated one.
func (c *Core) resendLostOrders(nowMs int64, env Env) {
	for _, sh := range slices.Sorted(maps.Keys(c.moves)) {
		mv := c.moves[sh]
		src := c.servers[mv.From]
		if mv.order == nil || src == nil || !src.alive || nowMs-mv.sentMs < MoveResendMs || src.lastSeen < mv.sentMs+2*HeartbeatMs {
			continue
		}
		for _, l := range src.hb.GetShards() {
			if l.Shard == sh && l.Epoch == mv.epoch && !l.Frozen {
				mv.sentMs = nowMs
				env.Send(src.hb.Server, mv.order)
				break
			}
		}
	}
}

// sameProcess says whether two server entries are one process: one that restarted
// under a new server id, its old id not expired yet. A move between them would
// hand a shard to the server it is on, which servers ignore (the order would only
// be sent again and again until MoveTimeoutMs, holding every other move back).
func sameProcess(a, b *server) bool {
	ra, rb := a.hb.GetServer(), b.hb.GetServer()
	return ra.GetAddress() == rb.GetAddress() && ra.GetId() == rb.GetId()
}

// MovesDone is the number of shard moves completed under this NameServer.
func (c *Core) MovesDone() int64 { return c.movesDone }

// rebalance splits a shard past a split threshold, or else asks the strategy for a
// move, once the picture is complete, no move or split is
// in flight and the last one settled (hysteresis: one move at a time, a cooldown
// after it, and the strategy's own rule that a move must improve the balance).
func (c *Core) rebalance(nowMs int64, env Env) {
	if !c.Complete(nowMs) || len(c.moves) > 0 || nowMs-c.lastSplitMs < SplitCooldownMs {
		return
	}
	r, canMove := c.strategy.(Rebalancer)
	canMove = canMove && nowMs-c.lastMoveMs >= MoveCooldownMs
	var mv Move
	var rt *messages.RouteEntry
	var from, to *server
	if canMove {
		mv, canMove = r.Rebalance(c.loads(nowMs), nil)
		rt, from, to = c.routes[mv.Shard], c.servers[mv.From], c.servers[mv.To]
		canMove = canMove && rt != nil && from != nil && to != nil && rt.ServerId == mv.From && !sameProcess(from, to)
	}
	// Splits come first, but a wanted move goes between two splits: an app that
	// keeps splitting (a split every SplitCooldownMs) must not keep the balance
	// from ever being restored (the simulator's balance check found that).
	if sp, why, ok := c.splitCandidate(nowMs); ok && !(canMove && c.lastWasSplit) {
		c.lastWasSplit = true
		rt := c.routes[sp]
		owner := c.servers[rt.ServerId]
		order := &messages.MoveShard{Shard: sp, Target: owner.hb.Server, Epoch: rt.Epoch, Split: true}
		c.moves[sp] = &move{Move: Move{Shard: sp, From: rt.ServerId, To: rt.ServerId}, epoch: rt.Epoch, atMs: nowMs, split: true, order: order, sentMs: nowMs}
		c.lastSplitWhy = why
		env.Send(owner.hb.Server, order)
		return
	}
	if !canMove {
		return
	}
	c.lastWasSplit = false
	order := &messages.MoveShard{Shard: mv.Shard, Target: to.hb.Server, Epoch: rt.Epoch}
	c.moves[mv.Shard] = &move{Move: mv, epoch: rt.Epoch, atMs: nowMs, order: order, sentMs: nowMs}
	env.Send(from.hb.Server, order)
}

// WantedMove is the move the strategy would order now on the NameServer's
// picture, ignoring moves in flight and the cooldown: ok is false when the
// balance is within the strategy's bound (or the strategy never moves, or the
// picture is not complete yet). The simulator checks it once faults stop.
func (c *Core) WantedMove(nowMs int64) (Move, bool) {
	r, ok := c.strategy.(Rebalancer)
	if !ok || !c.Complete(nowMs) {
		return Move{}, false
	}
	return r.Rebalance(c.loads(nowMs), nil)
}

// LastSplitReason says why the last split was decided ("" before the first).
func (c *Core) LastSplitReason() string { return c.lastSplitWhy }

// splitCandidate picks a shard to split: of an app with more live workers than
// Workers per shard, its widest shard (the one with the most of the hash range);
// else the shard with the most fires in the window above Fires. The shard's owner
// must be alive and report it active (not frozen) at the route's epoch.
func (c *Core) splitCandidate(nowMs int64) (shard, why string, ok bool) {
	if c.routesPlanned() >= c.maxRoutes {
		return "", "", false // a split routes one shard more (see GetRoutes)
	}
	active := map[string]*messages.ShardLoad{}
	for id, s := range c.servers {
		if !s.alive {
			continue
		}
		for _, l := range s.hb.GetShards() {
			if rt := c.routes[l.Shard]; rt != nil && rt.ServerId == id && rt.Epoch == l.Epoch && !l.Frozen {
				active[l.Shard] = l
			}
		}
	}
	names := make([]string, 0, len(c.routes))
	for n := range c.routes {
		names = append(names, n)
	}
	sort.Strings(names)
	if c.split.Workers > 0 {
		workers := map[string]int{}
		for _, w := range c.workers {
			workers[w.info.App]++
		}
		shards := map[string]int{}
		for _, n := range names {
			shards[c.routes[n].App]++
		}
		best := ""
		for _, n := range names {
			rt := c.routes[n]
			if active[n] == nil || int(rt.Level) >= route.MaxLevel || workers[rt.App] <= c.split.Workers*shards[rt.App] {
				continue
			}
			if best == "" || rt.Level < c.routes[best].Level {
				best = n
			}
		}
		if best != "" {
			rt := c.routes[best]
			return best, fmt.Sprintf("app %s has %d live workers, over %d per shard across %d shards", rt.App, workers[rt.App], c.split.Workers, shards[rt.App]), true
		}
	}
	if c.split.Fires > 0 {
		best := ""
		for _, n := range names {
			l := active[n]
			if l == nil || int(c.routes[n].Level) >= route.MaxLevel || l.FiresWindow <= c.split.Fires {
				continue
			}
			if best == "" || l.FiresWindow > active[best].FiresWindow {
				best = n
			}
		}
		if best != "" {
			return best, fmt.Sprintf("shard %s fired %d runs in the last minute, over %d", best, active[best].FiresWindow, c.split.Fires), true
		}
	}
	return "", "", false
}

// routesPlanned is the shards routed, or about to be: the routes, the new apps'
// shards assigned and not yet reported, and one more for each move in flight (a
// split's halves replace one shard with two).
func (c *Core) routesPlanned() int { return len(c.routes) + len(c.pending) + len(c.moves) }

// Table returns the route table (for app, or all when app is ""), optionally with workers.
func (c *Core) Table(app string, withWorkers bool) *messages.RouteTable {
	t := &messages.RouteTable{Version: c.version, Nameserver: c.self}
	names := make([]string, 0, len(c.routes))
	for n, r := range c.routes {
		if app == "" || r.App == app {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		t.Routes = append(t.Routes, c.routes[n])
	}
	if withWorkers {
		byApp := map[string]*messages.AppWorkers{}
		ids := make([]string, 0, len(c.workers))
		for id := range c.workers {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			w := c.workers[id].info
			if app != "" && w.App != app {
				continue
			}
			a := byApp[w.App]
			if a == nil {
				a = &messages.AppWorkers{App: w.App}
				byApp[w.App] = a
				t.Apps = append(t.Apps, a)
			}
			a.Workers = append(a.Workers, w)
		}
	}
	return t
}

// GetRoutes answers a pull; with ensure it places the root shard of a new app.
//
// A request that fails Check, or a new subscription (from) past MaxSubscribers, is
// answered with the error and an empty table, and keeps nothing.
func (c *Core) GetRoutes(nowMs int64, m *messages.GetRoutes, from *messages.Ref, env Env) *messages.RouteTable {
	if e := Check(m); e != nil {
		return &messages.RouteTable{Version: c.version, Nameserver: c.self, Complete: c.Complete(nowMs), Error: e}
	}
	if from != nil && m.App == "" { // from Subscribe, which checked it
		k := refKey(from)
		if _, ok := c.subs[k]; !ok && len(c.subs) >= c.maxSubs {
			return &messages.RouteTable{Version: c.version, Nameserver: c.self, Complete: c.Complete(nowMs), Error: errSubscribersFull(len(c.subs), c.maxSubs)}
		}
		c.subs[k], c.subRefs[k] = nowMs+SubscriberTTLMs, from
	}
	t := c.Table(m.App, m.WithWorkers)
	t.Complete = c.Complete(nowMs)
	if m.Ensure && len(t.Routes) == 0 {
		if !t.Complete {
			t.Error = kerr.New(messages.Code_UNAVAILABLE, "", "name server is warming up")
			return t
		}
		if miss := c.missing(); len(miss) > 0 {
			t.Error = kerr.New(messages.Code_UNAVAILABLE, "", "cannot place new app %q while configured server(s) %s do not report "+
				"(an app the name server has no route for may live there; it is placed only when every server reports)",
				m.App, strings.Join(miss, ", "))
			return t
		}
		if sh, srv := c.reportedShard(m.App); sh != "" {
			t.Error = kerr.New(messages.Code_UNAVAILABLE, "", "app %q has no active route: its shard %s on %s is being handed off", m.App, sh, srv)
			return t
		}
		if n := c.routesPlanned(); n >= c.maxRoutes {
			// Every shard is in every route table and in its server's heartbeat,
			// which carry at most MaxRoutes: one more would break them.
			t.Error = kerr.New(messages.Code_RESOURCE_EXHAUSTED, "app", "cannot place app %q: the cluster routes %d shards, "+
				"the limit is %d (an app's shards stay routed for as long as a server holds them)", m.App, n, c.maxRoutes)
			return t
		}
		root := route.Root(m.App).String()
		if p, sent := c.pending[root]; sent {
			t.Error = kerr.New(messages.Code_UNAVAILABLE, "", "placing app %q: its shard %s was assigned to the server at %s, "+
				"which has not reported it yet", m.App, root, p.address)
			return t
		}
		target := c.strategy.Place(c.loads(nowMs))
		if target == "" {
			t.Error = kerr.New(messages.Code_UNAVAILABLE, "", "no live server to place app %q", m.App)
			return t
		}
		c.pending[root] = pendingAssign{atMs: nowMs, server: target, address: c.servers[target].hb.GetAddress()}
		env.Send(c.servers[target].hb.Server, &messages.AssignShard{Shard: root, Epoch: 1, Nameserver: c.self})
		t.Error = kerr.New(messages.Code_UNAVAILABLE, "", "placing app %q", m.App)
	}
	return t
}

// Subscribe makes m.Subscriber a subscriber to the route table's pushes (without
// workers) for SubscriberTTLMs; it has no reply. One that fails Check, or a new one
// past MaxSubscribers, is refused with the error and keeps nothing.
func (c *Core) Subscribe(nowMs int64, m *messages.Subscribe, env Env) *messages.Error {
	if e := Check(m); e != nil {
		return e
	}
	return c.GetRoutes(nowMs, &messages.GetRoutes{}, m.Subscriber, env).Error
}

// ShardOpened is a server's confirmation that it opened a shard. One that fails
// Check (no shard: it panicked the NameServer, which lost its picture) is refused
// with the error and changes nothing.
func (c *Core) ShardOpened(nowMs int64, serverID string, l *messages.ShardLoad, env Env) *messages.Error {
	if e := Check(&messages.ShardOpened{ServerId: serverID, Shard: l}); e != nil {
		return e
	}
	s := c.servers[serverID]
	if s == nil {
		return nil
	}
	// The server's last heartbeat with the new shard: every field kept, but the
	// hearsay, which that heartbeat already brought.
	hb := proto.Clone(s.hb).(*messages.ServerHeartbeat)
	hb.ServerId, hb.Known = serverID, nil
	hb.Shards = append(hb.Shards, l)
	hb.Opening = slices.DeleteFunc(hb.Opening, func(n string) bool { return n == l.GetShard() }) // open now
	return c.ServerHeartbeat(nowMs, hb, env)
}

// Lease grants or renews a snowflake node id. New ids are granted only after a full
// TTL since start, so no id held by a live client (which renews) is ever re-granted.
// A request that fails Check (no holder, a node out of range) is refused.
func (c *Core) Lease(nowMs int64, m *messages.LeaseNode) *messages.LeaseNodeReply {
	if e := Check(m); e != nil {
		return &messages.LeaseNodeReply{Error: e}
	}
	for n, l := range c.leases {
		if nowMs > l.expires {
			delete(c.leases, n)
		}
	}
	if m.Node >= 0 && m.Node < MaxNodes {
		l := c.leases[m.Node]
		if l == nil || l.holder == m.Holder {
			c.leases[m.Node] = &lease{holder: m.Holder, expires: nowMs + LeaseTTLMs}
			return &messages.LeaseNodeReply{Node: m.Node, TtlMs: LeaseTTLMs}
		}
		return &messages.LeaseNodeReply{Error: kerr.New(messages.Code_ALREADY_EXISTS, "node", "node %d is held by another client", m.Node)}
	}
	if nowMs-c.started < LeaseTTLMs {
		return &messages.LeaseNodeReply{Error: kerr.New(messages.Code_UNAVAILABLE, "", "name server is warming up; leases open in %d ms", LeaseTTLMs-(nowMs-c.started))}
	}
	for i := int64(0); i < MaxNodes; i++ {
		n := (c.nextNode + i) % MaxNodes
		if c.leases[n] == nil {
			c.nextNode = n + 1
			c.leases[n] = &lease{holder: m.Holder, expires: nowMs + LeaseTTLMs}
			return &messages.LeaseNodeReply{Node: n, TtlMs: LeaseTTLMs}
		}
	}
	return &messages.LeaseNodeReply{Error: kerr.New(messages.Code_RESOURCE_EXHAUSTED, "node", "all %d node ids are leased", MaxNodes)}
}

func (c *Core) loads(nowMs int64) []ServerLoad {
	ids := make([]string, 0, len(c.servers))
	for id, s := range c.servers {
		// A server whose journal failed can neither open a shard nor hand one on
		// until it restarts: it is no place for a new app (which would wait there,
		// pendingAssign) nor either end of a move. One out of disk space
		// (journal_no_room) refuses new work until it has room again: no place for
		// a new app or an import either, and its shards stay where they are.
		if s.alive && s.hb.GetJournalError() == "" && !s.hb.GetJournalNoRoom() {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	pending := slices.Sorted(maps.Keys(c.pending)) // the strategy sees them in shard order, not map order
	out := make([]ServerLoad, 0, len(ids))
	for _, id := range ids {
		hb := c.servers[id].hb
		l := ServerLoad{ID: id, CPU: hb.Cpu, Mem: hb.Mem, SuccessRate: hb.SuccessRate}
		for _, sl := range c.current(hb.Shards) {
			l.Fires += sl.FiresWindow
			l.Shards = append(l.Shards, sl)
		}
		for _, sh := range pending { // placements in flight count, so a burst spreads
			if c.pending[sh].server == id {
				l.Shards = append(l.Shards, &messages.ShardLoad{Shard: sh})
			}
		}
		out = append(out, l)
	}
	return out
}

// Status reports the cluster for `kjob cluster status`.
func (c *Core) Status(nowMs int64) *messages.ClusterStatusReply {
	out := &messages.ClusterStatusReply{RouteVersion: c.version, Complete: c.Complete(nowMs)}
	ids := make([]string, 0, len(c.servers))
	for id := range c.servers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		s := c.servers[id]
		if !s.alive {
			continue
		}
		out.Servers = append(out.Servers, &messages.ServerStatus{ServerId: id, Address: s.hb.Address, Shards: c.current(s.hb.Shards),
			Cpu: s.hb.Cpu, Mem: s.hb.Mem, LastSeenMs: s.lastSeen, JournalError: s.hb.JournalError, Opening: s.hb.Opening,
			JournalNoRoom: s.hb.JournalNoRoom})
	}
	apps := map[string]*messages.AppStatus{}
	var names []string
	get := func(app string) *messages.AppStatus {
		a := apps[app]
		if a == nil {
			a = &messages.AppStatus{App: app}
			apps[app] = a
			names = append(names, app)
		}
		return a
	}
	for _, w := range c.workers {
		get(w.info.App).Workers++
	}
	for n, r := range c.routes {
		a := get(r.App)
		a.Shards = append(a.Shards, n)
	}
	sort.Strings(names)
	for _, n := range names {
		sort.Strings(apps[n].Shards)
		out.Apps = append(out.Apps, apps[n])
	}
	mvs := make([]string, 0, len(c.moves))
	for sh := range c.moves {
		mvs = append(mvs, sh)
	}
	sort.Strings(mvs)
	for _, sh := range mvs {
		mv := c.moves[sh]
		out.Moves = append(out.Moves, &messages.MoveStatus{Shard: sh, From: mv.From, To: mv.To, StartedMs: mv.atMs, Split: mv.split})
	}
	return out
}

// flushPush bumps the version and pushes the table when something changed.
func (c *Core) flushPush(nowMs int64, env Env) {
	if !c.dirty && !c.workersDirty {
		return
	}
	c.version++
	routesChanged := c.dirty
	c.dirty, c.workersDirty = false, false
	full := c.Table("", true)
	full.Complete = c.Complete(nowMs)
	ids := make([]string, 0, len(c.servers))
	for id, s := range c.servers {
		if s.alive {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		env.Send(c.servers[id].hb.Server, full)
	}
	keys := make([]string, 0, len(c.subs))
	for k := range c.subs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Subscribers (clients) get the routes without the workers: a change of
	// workers alone (a worker joined, left or moved) has nothing new for them, and
	// in a rolling deploy of an app's workers it would push them the whole table
	// twice a worker.
	if len(keys) > 0 && routesChanged {
		lite := c.Table("", false)
		lite.Complete = full.Complete
		for _, k := range keys {
			env.Send(c.subRefs[k], lite)
		}
	}
}
