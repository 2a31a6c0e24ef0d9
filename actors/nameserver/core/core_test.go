package core

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kjob/kjob/messages"
)

type sendLog struct{ sent []any }

func (s *sendLog) Send(_ *messages.Ref, m any) { s.sent = append(s.sent, m) }

func (s *sendLog) assigns() int {
	n := 0
	for _, m := range s.sent {
		if _, ok := m.(*messages.AssignShard); ok {
			n++
		}
	}
	return n
}

func hb(addr string, shards ...*messages.ShardLoad) *messages.ServerHeartbeat {
	return &messages.ServerHeartbeat{ServerId: addr + "-id", Address: addr,
		Server: &messages.Ref{Address: addr, Id: "kjob-server"}, Shards: shards}
}

// A new app is placed only while every configured server reports: the app may live
// on the one that does not (its owner is down; the NameServer's state is soft).
func TestNewAppWaitsForEveryMember(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetMembers([]string{"a:1", "b:1"})
	c.ServerHeartbeat(100, hb("a:1"), env)
	now := int64(WarmupMs + 1)
	t1 := c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	if t1.Error.GetCode() != messages.Code_UNAVAILABLE || !strings.Contains(t1.Error.GetMessage(), "b:1") || env.assigns() != 0 {
		t.Fatalf("placed with b:1 silent: %v, %d assigns", t1.Error, env.assigns())
	}
	c.ServerHeartbeat(now, hb("b:1"), env)
	c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	if env.assigns() != 1 {
		t.Fatalf("every member reports: %d assigns, want 1", env.assigns())
	}
}

// A shard that is being handed off is reported frozen; a fresh NameServer must take
// it as existing (route to it) rather than place the app again.
func TestFrozenShardIsNotPlacedAgain(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetMembers([]string{"a:1"})
	c.ServerHeartbeat(100, hb("a:1", &messages.ShardLoad{Shard: "app/0/0", Epoch: 3, Frozen: true,
		Pid: &messages.Ref{Address: "a:1", Id: "shard-app/0/0"}}), env)
	tb := c.GetRoutes(WarmupMs+1, &messages.GetRoutes{App: "app", Ensure: true}, nil, env)
	if env.assigns() != 0 || len(tb.Routes) != 1 || tb.Routes[0].Epoch != 3 {
		t.Fatalf("frozen shard: %d assigns, routes %v", env.assigns(), tb.Routes)
	}
}

func load(shard string, epoch, fires int64, addr string) *messages.ShardLoad {
	return &messages.ShardLoad{Shard: shard, Epoch: epoch, FiresWindow: fires, Pid: &messages.Ref{Address: addr, Id: "shard-" + shard}}
}

func moves(env *sendLog) []*messages.MoveShard {
	var out []*messages.MoveShard
	for _, m := range env.sent {
		if mv, ok := m.(*messages.MoveShard); ok {
			out = append(out, mv)
		}
	}
	return out
}

// A shard over the fire threshold is split by its owner; once both halves report,
// the parent's route goes, lookups go to the halves, and the split is done.
func TestSplitByFires(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetSplit(SplitPolicy{Fires: 1000, Workers: -1})
	c.ServerHeartbeat(0, hb("a:1", load("hot/0/0", 1, 5000, "a:1"), load("cold/0/0", 1, 10, "a:1")), env)
	now := int64(MoveCooldownMs + 1)
	c.ServerHeartbeat(now, hb("a:1", load("hot/0/0", 1, 5000, "a:1"), load("cold/0/0", 1, 10, "a:1")), env)
	c.Tick(now, env)
	mv := moves(env)
	if len(mv) != 1 || !mv[0].Split || mv[0].Shard != "hot/0/0" || mv[0].Target.GetAddress() != "a:1" {
		t.Fatalf("moves %v, want one split of hot/0/0 at its owner", mv)
	}
	c.Tick(now+1, env) // one at a time
	if len(moves(env)) != 1 {
		t.Fatal("a second decision while the split is in flight")
	}
	if st := c.Status(now); len(st.Moves) != 1 || !st.Moves[0].Split {
		t.Fatalf("status moves %v", st.Moves)
	}
	// One half reports: the parent stays routed (the other half's jobs still go there).
	c.ServerHeartbeat(now+100, hb("a:1", load("hot/1/0", 2, 2500, "a:1"), load("cold/0/0", 1, 10, "a:1")), env)
	if c.routes["hot/0/0"] == nil {
		t.Fatal("parent route dropped with one half reported")
	}
	c.ServerHeartbeat(now+200, hb("a:1", load("hot/1/0", 2, 2500, "a:1"), load("hot/1/1", 2, 2500, "a:1"), load("cold/0/0", 1, 10, "a:1")), env)
	if c.routes["hot/0/0"] != nil || c.routes["hot/1/0"] == nil || c.routes["hot/1/1"] == nil {
		t.Fatalf("routes after both halves: %v", c.Table("hot", false).Routes)
	}
	if c.SplitsDone() != 1 || len(c.moves) != 0 {
		t.Fatalf("splits done %d, in flight %d", c.SplitsDone(), len(c.moves))
	}
	// Each half is over the threshold too: after the cooldown they split on.
	later := now + 200 + SplitCooldownMs
	c.ServerHeartbeat(later, hb("a:1", load("hot/1/0", 2, 2500, "a:1"), load("hot/1/1", 2, 2500, "a:1"), load("cold/0/0", 1, 10, "a:1")), env)
	c.Tick(later, env)
	if mv := moves(env); len(mv) != 2 || mv[1].Shard != "hot/1/0" {
		t.Fatalf("moves %v, want the next split of hot/1/0", mv)
	}
}

// An app with more live workers than the threshold per shard splits its widest shard.
func TestSplitByWorkers(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetSplit(SplitPolicy{Workers: 3, Fires: -1})
	now := int64(MoveCooldownMs + 1)
	c.ServerHeartbeat(now, hb("a:1", load("app/0/0", 1, 0, "a:1")), env)
	for i := 0; i < 3; i++ {
		c.WorkerHeartbeat(now, &messages.WorkerHeartbeat{Worker: &messages.WorkerInfo{WorkerId: string(rune('a' + i)), App: "app", Ref: &messages.Ref{Address: "w", Id: string(rune('a' + i))}}}, env)
	}
	c.Tick(now, env)
	if len(moves(env)) != 0 {
		t.Fatal("split at the threshold (3 workers, 3 per shard)")
	}
	c.WorkerHeartbeat(now, &messages.WorkerHeartbeat{Worker: &messages.WorkerInfo{WorkerId: "d", App: "app", Ref: &messages.Ref{Address: "w", Id: "d"}}}, env)
	c.ServerHeartbeat(now, hb("a:1", load("app/0/0", 1, 0, "a:1")), env)
	c.Tick(now+1, env)
	if mv := moves(env); len(mv) != 1 || !mv[0].Split || mv[0].Shard != "app/0/0" {
		t.Fatalf("moves %v, want a split of app/0/0", mv)
	}
	if !strings.Contains(c.LastSplitReason(), "4 live workers") {
		t.Fatalf("reason %q", c.LastSplitReason())
	}
}

// A server restarted on its address registers under a new id and reports its shards
// at the same epoch, with its fire window empty. The old id must go at once: left
// alive until its expiry, it looks like the busiest server next to an empty one,
// and the strategy moves a shard from it to the new id — the same process, which
// would hand the shard to itself and stay frozen.
func TestRestartAtSameAddressSupersedesOldID(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetMembers([]string{"a:1", "b:1"})
	old := func() *messages.ServerHeartbeat {
		h := hb("a:1", load("hot/0/0", 1, 100, "a:1"))
		h.Incarnation = 1
		return h
	}
	c.ServerHeartbeat(0, old(), env)
	c.ServerHeartbeat(0, hb("b:1", load("cold/0/0", 1, 60, "b:1")), env)
	now := int64(MoveCooldownMs + 1)
	c.ServerHeartbeat(now, old(), env)
	c.ServerHeartbeat(now, hb("b:1", load("cold/0/0", 1, 60, "b:1")), env)
	c.Tick(now, env)
	if mv := moves(env); len(mv) != 0 {
		t.Fatalf("moves %v before the restart (100 <= 2*60)", mv)
	}
	// a:1 restarts: a new id, the same address, the shard at the same epoch.
	restarted := hb("a:1", load("hot/0/0", 1, 0, "a:1"))
	restarted.ServerId, restarted.Incarnation = "a:1-id2", 2
	c.ServerHeartbeat(now+300, restarted, env)
	c.ServerHeartbeat(now+300, hb("b:1", load("cold/0/0", 1, 60, "b:1")), env)
	c.Tick(now+300, env)
	for _, mv := range moves(env) {
		if mv.Shard == "hot/0/0" {
			t.Fatalf("move %v: hot/0/0 handed from a:1 to a:1", mv)
		}
	}
	if rt := c.routes["hot/0/0"]; rt == nil || rt.ServerId != "a:1-id2" {
		t.Fatalf("route of hot/0/0 %v, want it on the new id", rt)
	}
	st := c.Status(now + 300)
	for _, s := range st.Servers {
		if s.GetServerId() == "a:1-id" {
			t.Fatalf("status still lists the old id: %v", st.Servers)
		}
	}
	if len(st.Servers) != 2 {
		t.Fatalf("status servers %v, want a:1 (new id) and b:1", st.Servers)
	}
}

// A heartbeat of the old process still on its way after the restart's first one
// is not taken for a server, whether the NameServer knew the old id before or
// (fresh after a move of its own) hears of it only now.
func TestLateHeartbeatOfSupersededID(t *testing.T) {
	mk := func(id string, inc int64, fires int64) *messages.ServerHeartbeat {
		h := hb("a:1", load("hot/0/0", 1, fires, "a:1"))
		h.ServerId, h.Incarnation = id, inc
		return h
	}
	for _, order := range [][]int64{{1, 2, 1}, {2, 1, 1}} {
		env := &sendLog{}
		c := New(0, nil)
		for i, inc := range order {
			c.ServerHeartbeat(int64(300*i), mk(fmt.Sprintf("a:1-id%d", inc), inc, 100/inc), env)
		}
		if rt := c.routes["hot/0/0"]; rt == nil || rt.ServerId != "a:1-id2" {
			t.Fatalf("order %v: route of hot/0/0 %v, want the new id", order, rt)
		}
		if st := c.Status(600); len(st.Servers) != 1 || st.Servers[0].ServerId != "a:1-id2" {
			t.Fatalf("order %v: status servers %v, want only the new id", order, st.Servers)
		}
	}
}

// Just after a move the old owner's last heartbeat still lists the shard at the
// old epoch: neither the status nor the strategy's loads may count it there.
func TestStaleCopyInALastHeartbeatIsNotCounted(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.ServerHeartbeat(0, hb("a:1", load("cold/0/0", 1, 120, "a:1"), load("hot/1/0", 2, 600, "a:1")), env)
	c.ServerHeartbeat(0, hb("b:1", load("cold/0/0", 2, 0, "b:1")), env) // imported at epoch 2
	st := c.Status(10)
	for _, s := range st.Servers {
		for _, l := range s.Shards {
			if l.Shard == "cold/0/0" && s.Address != "b:1" {
				t.Fatalf("status lists cold/0/0@%d on %s too, after it moved to b:1 at epoch 2", l.Epoch, s.Address)
			}
		}
	}
	for _, l := range c.loads(10) {
		if l.ID == "a:1-id" && l.Fires != 600 {
			t.Fatalf("a:1's load %d, want 600 (cold/0/0's 120 fires are b:1's now)", l.Fires)
		}
	}
	// A split parent in a last heartbeat, with both halves routed, is not counted either.
	c.ServerHeartbeat(20, hb("c:1", load("hot/1/1", 2, 500, "c:1"), load("hot/0/0", 1, 900, "c:1")), env)
	for _, l := range c.loads(20) {
		if l.ID == "c:1-id" && l.Fires != 500 {
			t.Fatalf("c:1's load %d, want 500 (hot/0/0 split into halves routed)", l.Fires)
		}
	}
}

// A split order that never arrived (its source goes on reporting the shard active
// and unfrozen at the order's epoch) is sent again after MoveResendMs, not left to
// hold every move and split back for MoveTimeoutMs; once the source shows the
// shard frozen the order is not sent again.
func TestLostMoveOrderIsSentAgain(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetSplit(SplitPolicy{Fires: 1000, Workers: -1})
	beat := func(now int64, frozen bool) {
		l := load("hot/0/0", 1, 5000, "a:1")
		l.Frozen = frozen
		c.ServerHeartbeat(now, hb("a:1", l), env)
	}
	now := int64(MoveCooldownMs + 1)
	beat(0, false)
	beat(now, false)
	c.Tick(now, env)
	if mv := moves(env); len(mv) != 1 || !mv[0].Split {
		t.Fatalf("moves %v, want one split", mv)
	}
	// Heartbeats keep saying the shard is active: the order was lost.
	for at := now + HeartbeatMs; at < now+MoveResendMs; at += HeartbeatMs {
		beat(at, false)
		c.Tick(at, env)
	}
	if n := len(moves(env)); n != 1 {
		t.Fatalf("%d orders before MoveResendMs, want 1", n)
	}
	at := now + MoveResendMs
	beat(at, false)
	c.Tick(at, env)
	mv := moves(env)
	if len(mv) != 2 || mv[1].Shard != "hot/0/0" || !mv[1].Split || mv[1].Epoch != 1 {
		t.Fatalf("orders %v, want the split sent again", mv)
	}
	// The source now carries it out (frozen): no more resends.
	for at := at + HeartbeatMs; at < now+4*MoveResendMs; at += HeartbeatMs {
		beat(at, true)
		c.Tick(at, env)
	}
	if n := len(moves(env)); n != 2 {
		t.Fatalf("%d orders while the shard is frozen, want 2", n)
	}
}

// A process that restarted under a new server id has, until its old id expires,
// two entries with the same actor reference. A move between them would be a move
// of a shard to the server it is on, which the server ignores: it is never
// ordered, however unbalanced the two entries look.
func TestNoMoveBetweenTwoIdsOfOneProcess(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetSplit(SplitPolicy{Fires: 1 << 40, Workers: -1})
	beat := func(now int64) {
		old := hb("a:1", load("hot/0/0", 1, 5000, "a:1"), load("warm/0/0", 1, 3000, "a:1"))
		old.ServerId = "a:1-old"
		c.ServerHeartbeat(now, old, env)
		c.ServerHeartbeat(now, hb("a:1"), env) // the same process, restarted: no shards yet
	}
	for now := int64(0); now <= 3*MoveCooldownMs; now += HeartbeatMs {
		beat(now)
		c.Tick(now, env)
	}
	for _, mv := range moves(env) {
		if !mv.Split {
			t.Fatalf("ordered %v: a move of a shard to the process it is on", mv)
		}
	}
}

// A shard split twice (x/0/0 into x/1/0 and x/1/1, then x/1/0 into x/2/0 and
// x/2/1) is covered by routed pieces, whichever order the map is walked in: a fresh
// NameServer that hears all five at once keeps only the three pieces, every time,
// and does not count the covered ones' load.
func TestTwiceSplitParentIsPrunedInAnyOrder(t *testing.T) {
	for i := 0; i < 64; i++ {
		env := &sendLog{}
		c := New(0, nil)
		c.ServerHeartbeat(0, hb("a:1", load("x/0/0", 1, 900, "a:1"), load("x/1/0", 2, 700, "a:1"),
			load("x/1/1", 2, 100, "a:1"), load("x/2/0", 3, 10, "a:1"), load("x/2/1", 3, 20, "a:1")), env)
		var got []string
		for _, r := range c.Table("x", false).Routes {
			got = append(got, r.Shard)
		}
		if strings.Join(got, " ") != "x/1/1 x/2/0 x/2/1" {
			t.Fatalf("try %d: routes %v, want x/1/1 x/2/0 x/2/1", i, got)
		}
		for _, l := range c.loads(0) {
			if l.Fires != 130 {
				t.Fatalf("try %d: load %d, want 130 (the covered x/0/0 and x/1/0 not counted)", i, l.Fires)
			}
		}
	}
}

// Two entries at one address, both with an incarnation (which heartbeats alone do
// not make), and a heartbeat of a third one between them: the newest incarnation
// wins and both others are gone, whichever order the map is walked in. Walking the
// older entry first used to drop it, the newer one first to keep it.
func TestSupersededDecidesApartFromMapOrder(t *testing.T) {
	mk := func(inc int64) *messages.ServerHeartbeat {
		h := hb("a:1")
		h.ServerId, h.Incarnation = fmt.Sprintf("a:1-id%d", inc), inc
		return h
	}
	for i := 0; i < 64; i++ {
		env := &sendLog{}
		c := New(0, nil)
		for _, inc := range []int64{3, 5} {
			c.servers[mk(inc).ServerId] = &server{hb: mk(inc), alive: true}
		}
		c.ServerHeartbeat(100, mk(4), env)
		var ids []string
		for _, s := range c.Status(100).Servers {
			ids = append(ids, s.ServerId)
		}
		if strings.Join(ids, " ") != "a:1-id5" {
			t.Fatalf("try %d: servers %v, want only a:1-id5", i, ids)
		}
		if _, ok := c.gone["a:1-id3"]; !ok {
			t.Fatalf("try %d: a:1-id3 not gone: %v", i, c.gone)
		}
		if _, ok := c.gone["a:1-id4"]; !ok {
			t.Fatalf("try %d: a:1-id4 not gone: %v", i, c.gone)
		}
	}
}

// Placements in flight count in a server's load as shards of their own; the
// strategy sees them in shard order, not in the order the map is walked in.
func TestLoadsListPendingPlacementsInOrder(t *testing.T) {
	for i := 0; i < 32; i++ {
		env := &sendLog{}
		c := New(0, nil)
		c.ServerHeartbeat(0, hb("a:1"), env)
		now := int64(WarmupMs + 1)
		c.ServerHeartbeat(now, hb("a:1"), env)
		for _, app := range []string{"h", "c", "f", "a", "e", "b", "g", "d"} {
			c.GetRoutes(now, &messages.GetRoutes{App: app, Ensure: true}, nil, env)
		}
		if env.assigns() != 8 {
			t.Fatalf("try %d: %d assigns, want 8", i, env.assigns())
		}
		var got []string
		for _, l := range c.loads(now)[0].Shards {
			got = append(got, l.Shard)
		}
		if want := "a/0/0 b/0/0 c/0/0 d/0/0 e/0/0 f/0/0 g/0/0 h/0/0"; strings.Join(got, " ") != want {
			t.Fatalf("try %d: shards %v, want %s", i, got, want)
		}
	}
}

// routedLog records each AssignShard as shard@epoch->address, in order.
type routedLog struct{ sent []string }

func (r *routedLog) Send(to *messages.Ref, m any) {
	if a, ok := m.(*messages.AssignShard); ok {
		r.sent = append(r.sent, fmt.Sprintf("%s@%d->%s", a.Shard, a.Epoch, to.GetAddress()))
	}
}

// An assignment that is never reported is sent again to the server at the same
// address — its process, or the one that restarted there, which recovers the shard
// if the first had journaled it — and never to another server at the same epoch,
// however long the app waits (sim seed 206138: placed anew once the NameServer gave
// up on the first assignment, while its server, which had journaled it, was down).
func TestUnreportedAssignmentStaysWithItsAddress(t *testing.T) {
	env := &routedLog{}
	c := New(0, nil)
	c.SetMembers([]string{"a:1", "b:1"})
	beat := func(now int64, addr, id string, inc int64, shards ...*messages.ShardLoad) {
		h := hb(addr, shards...)
		h.ServerId, h.Incarnation = id, inc
		c.ServerHeartbeat(now, h, env)
	}
	beat(0, "a:1", "a-1", 1)
	beat(0, "b:1", "b-1", 1, load("busy/0/0", 1, 100, "b:1")) // the strategy picks a:1
	now := int64(WarmupMs + 1)
	placing := func(now int64) *messages.RouteTable {
		return c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	}
	placing(now)
	if want := []string{"new/0/0@1->a:1"}; fmt.Sprint(env.sent) != fmt.Sprint(want) {
		t.Fatalf("first placement %v, want %v", env.sent, want)
	}
	// a:1 keeps beating without the shard (the order is lost, or still on its way):
	// after ServerExpiryMs it is sent again, to a:1 only.
	for t0 := now + 500; t0 <= now+2*ServerExpiryMs+1000; t0 += 500 {
		beat(t0, "a:1", "a-1", 1)
		beat(t0, "b:1", "b-1", 1, load("busy/0/0", 1, 100, "b:1"))
		c.Tick(t0, env)
		tb := placing(t0)
		if tb.Error.GetCode() != messages.Code_UNAVAILABLE || !strings.Contains(tb.Error.GetMessage(), "a:1") {
			t.Fatalf("at %d: %v, want UNAVAILABLE naming a:1", t0, tb.Error)
		}
	}
	if want := []string{"new/0/0@1->a:1", "new/0/0@1->a:1", "new/0/0@1->a:1"}; fmt.Sprint(env.sent) != fmt.Sprint(want) {
		t.Fatalf("orders %v, want %v", env.sent, want)
	}
	// a:1 takes on load and dies; its last heartbeat comes after the last order, so
	// the next one falls due while it still counts as alive, and b:1, now the
	// least loaded, is where a placement anew would go. The order goes to a:1 once
	// more, and once a:1 has expired the app waits; nothing goes to b:1.
	down := now + 2*ServerExpiryMs + 1000
	for t0 := down + 500; t0 <= down+3*ServerExpiryMs; t0 += 500 {
		if t0 <= down+2000 {
			beat(t0, "a:1", "a-1", 1, load("other/0/0", 1, 100, "a:1"))
		}
		beat(t0, "b:1", "b-1", 1)
		c.Tick(t0, env)
		placing(t0)
	}
	if want := "new/0/0@1->a:1"; len(env.sent) != 4 || env.sent[3] != want {
		t.Fatalf("orders while a:1 died: %v, want one more %s", env.sent[3:], want)
	}
	// a:1 restarts (a new id at the address) without the shard: the order goes to it.
	back := down + 3*ServerExpiryMs + 500
	beat(back, "a:1", "a-2", 2)
	c.Tick(back, env)
	if want := "new/0/0@1->a:1"; len(env.sent) != 5 || env.sent[4] != want {
		t.Fatalf("after the restart: %v, want a fifth order %s", env.sent, want)
	}
	// It reports the shard: the route is there and no order follows.
	beat(back+100, "a:1", "a-2", 2, load("new/0/0", 1, 0, "a:1"))
	c.Tick(back+2*ServerExpiryMs, env)
	tb := placing(back + 2*ServerExpiryMs)
	if tb.Error != nil || len(tb.Routes) != 1 || tb.Routes[0].ServerId != "a-2" || len(env.sent) != 5 {
		t.Fatalf("reported: %v, routes %v, orders %v", tb.Error, tb.Routes, env.sent)
	}
}

// Without configured members (missing() guards nothing), an assignment still stays
// with its address: once its server has died, nothing goes to the other one.
func TestUnreportedAssignmentWaitsWithoutMembers(t *testing.T) {
	env := &routedLog{}
	c := New(0, nil)
	c.ServerHeartbeat(0, hb("a:1"), env)
	c.ServerHeartbeat(0, hb("b:1", load("busy/0/0", 1, 100, "b:1")), env)
	now := int64(WarmupMs + 1)
	c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	// a:1 dies at once; b:1 goes on, and is now the least loaded.
	for t0 := now + 500; t0 <= now+4*ServerExpiryMs; t0 += 500 {
		c.ServerHeartbeat(t0, hb("b:1"), env)
		c.Tick(t0, env)
		if tb := c.GetRoutes(t0, &messages.GetRoutes{App: "new", Ensure: true}, nil, env); tb.Error.GetCode() != messages.Code_UNAVAILABLE {
			t.Fatalf("at %d: %v, want UNAVAILABLE", t0, tb.Error)
		}
	}
	for _, o := range env.sent {
		if !strings.HasSuffix(o, "->a:1") {
			t.Fatalf("orders %v: one went to another address than a:1's", env.sent)
		}
	}
}

// A route learned otherwise than by a report of the assigned shard (hearsay from a
// server's Known routes) ends the pending assignment: the app exists, and an order
// sent again to a server that does not hold it would open a second copy.
func TestRouteFromHearsayEndsThePendingAssignment(t *testing.T) {
	env := &routedLog{}
	c := New(0, nil)
	c.SetMembers([]string{"a:1", "b:1"})
	c.ServerHeartbeat(0, hb("a:1"), env)
	c.ServerHeartbeat(0, hb("b:1", load("busy/0/0", 1, 100, "b:1")), env)
	now := int64(WarmupMs + 1)
	c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	h := hb("b:1", load("busy/0/0", 1, 100, "b:1"))
	h.Known = []*messages.RouteEntry{{Shard: "new/0/0", App: "new", Owner: &messages.Ref{Address: "b:1", Id: "shard-new/0/0"}, ServerId: "b:1-id", Epoch: 1}}
	c.ServerHeartbeat(now+100, h, env)
	for t0 := now + 500; t0 <= now+3*ServerExpiryMs; t0 += 500 {
		c.ServerHeartbeat(t0, hb("a:1"), env)
		c.ServerHeartbeat(t0, hb("b:1", load("busy/0/0", 1, 100, "b:1")), env)
		c.Tick(t0, env)
	}
	if len(env.sent) != 1 || len(c.pending) != 0 {
		t.Fatalf("orders %v, pending %v: want the first order only, and nothing pending", env.sent, c.pending)
	}
}

// A server whose journal failed (its heartbeat says so) is no place for a new app —
// it refuses to open one, and the app would wait there for a restart — and neither
// end of a move; nor is one whose journal is out of disk space (journal_no_room),
// which refuses new work until it has room again.
func TestServerWithAFailedJournalTakesNoShard(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  func(*messages.ServerHeartbeat)
	}{
		{"failed", func(h *messages.ServerHeartbeat) { h.JournalError = "msync: input/output error" }},
		{"no room", func(h *messages.ServerHeartbeat) { h.JournalNoRoom = true }},
	} {
		env := &routedLog{}
		c := New(0, nil)
		c.SetMembers([]string{"a:1", "b:1"})
		bad := hb("a:1")
		tc.bad(bad)
		c.ServerHeartbeat(0, bad, env)
		c.ServerHeartbeat(0, hb("b:1", load("busy/0/0", 1, 100, "b:1")), env)
		now := int64(WarmupMs + 1)
		c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
		if want := []string{"new/0/0@1->b:1"}; fmt.Sprint(env.sent) != fmt.Sprint(want) {
			t.Fatalf("%s: orders %v, want %v (a:1's journal is %s)", tc.name, env.sent, want, tc.name)
		}
		for _, l := range c.loads(now) {
			if l.ID == "a:1-id" {
				t.Fatalf("%s: loads list a:1: %v", tc.name, c.loads(now))
			}
		}
		if st := c.Status(now); len(st.Servers) != 2 || (st.Servers[0].JournalError != "") != (tc.name == "failed") || st.Servers[0].JournalNoRoom != (tc.name == "no room") {
			t.Fatalf("%s: status %v", tc.name, st.Servers)
		}
		// Only a:1 left, and its journal is bad: nothing is placed.
		c2 := New(0, nil)
		c2.ServerHeartbeat(0, bad, env)
		if tb := c2.GetRoutes(now, &messages.GetRoutes{App: "other", Ensure: true}, nil, env); tb.Error.GetCode() != messages.Code_UNAVAILABLE || len(env.sent) != 1 {
			t.Fatalf("%s: a lone server with a bad journal: %v, orders %v", tc.name, tb.Error, env.sent)
		}
	}
}

// A fresh NameServer (one that took over after the assignment was sent) knows of an
// assignment in hand only from its server's heartbeat: the shard it says it is
// opening — its SHARD_OPENED record appended, its sync in flight or failed, so a
// restart there may recover it — holds the app for that address. It is placed on no
// other server at epoch 1, and once a restart there does not report the shard the
// assignment goes to the process at that address. Meanwhile it is sent again there
// like any assignment (a shard whose actor did not start gets another try; a failed
// journal refuses it).
func TestOpeningShardHoldsItsAppForAFreshNameServer(t *testing.T) {
	env := &routedLog{}
	c := New(0, nil) // no configured members: missing() guards nothing
	opening := func(now int64, id string, inc int64, journalErr string, names ...string) {
		h := hb("a:1")
		h.ServerId, h.Incarnation, h.JournalError, h.Opening = id, inc, journalErr, names
		c.ServerHeartbeat(now, h, env)
	}
	// a:1 had the order from the NameServer before; its sync failed.
	opening(0, "a-1", 1, "msync: input/output error", "new/0/0")
	c.ServerHeartbeat(0, hb("b:1"), env)
	placing := func(now int64) *messages.RouteTable {
		return c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	}
	for t0 := int64(WarmupMs + 1); t0 <= WarmupMs+3*ServerExpiryMs; t0 += 500 {
		opening(t0, "a-1", 1, "msync: input/output error", "new/0/0")
		c.ServerHeartbeat(t0, hb("b:1"), env)
		c.Tick(t0, env)
		if tb := placing(t0); tb.Error.GetCode() != messages.Code_UNAVAILABLE || !strings.Contains(tb.Error.GetMessage(), "a:1") {
			t.Fatalf("at %d: %v, want UNAVAILABLE naming a:1", t0, tb.Error)
		}
	}
	if want := []string{"new/0/0@1->a:1", "new/0/0@1->a:1", "new/0/0@1->a:1"}; fmt.Sprint(env.sent) != fmt.Sprint(want) {
		t.Fatalf("orders %v while a:1 says it is opening the shard: want %v (sent again there every ServerExpiryMs)", env.sent, want)
	}
	env.sent = nil
	// a:1 restarts without the record (it had not reached the disk): after
	// ServerExpiryMs the order goes to the new process there, and nowhere else.
	back := int64(WarmupMs + 3*ServerExpiryMs + 500)
	for t0 := back; t0 <= back+ServerExpiryMs+500; t0 += 500 {
		opening(t0, "a-2", 2, "")
		c.ServerHeartbeat(t0, hb("b:1"), env)
		c.Tick(t0, env)
	}
	if want := []string{"new/0/0@1->a:1"}; fmt.Sprint(env.sent) != fmt.Sprint(want) {
		t.Fatalf("orders after the restart %v, want %v", env.sent, want)
	}
	// A claim of a shard that is not a root, or of an app already routed, binds nothing.
	c.ServerHeartbeat(back+2*ServerExpiryMs, hb("b:1", load("old/0/0", 1, 0, "b:1")), env)
	opening(back+2*ServerExpiryMs, "a-2", 2, "", "new/1/0", "old/0/0")
	if _, ok := c.pending["new/1/0"]; ok {
		t.Fatalf("a claim of a split half is pending: %v", c.pending)
	}
	if _, ok := c.pending["old/0/0"]; ok {
		t.Fatalf("a claim of a routed app's shard is pending: %v", c.pending)
	}
	if st := c.Status(back + 2*ServerExpiryMs); fmt.Sprint(st.Servers[0].Opening) != "[new/1/0 old/0/0]" {
		t.Fatalf("status of a:1 lists opening %v", st.Servers[0].Opening)
	}
	// Once a:1 confirms the shard open, it is listed as open, and no longer as opening.
	at := back + 2*ServerExpiryMs + 100
	opening(at, "a-2", 2, "", "new/0/0")
	c.ShardOpened(at+1, "a-2", load("new/0/0", 1, 0, "a:1"), env)
	if st := c.Status(at + 1); len(st.Servers[0].Opening) != 0 || len(st.Servers[0].Shards) != 1 || len(c.pending) != 0 {
		t.Fatalf("after ShardOpened: status of a:1 %v, pending %v", st.Servers[0], c.pending)
	}
}

// TestRoutesBounded: the NameServer routes at most maxRoutes shards (MaxRoutes:
// every route is in every table and in its server's heartbeat, which carry at most
// that many). A new app past it is refused, RESOURCE_EXHAUSTED naming app and the
// limit, with nothing assigned; a shard over the split thresholds is not split
// (two halves for one); below the limit both go on.
func TestRoutesBounded(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.maxRoutes = 3
	c.SetSplit(SplitPolicy{Fires: 1000, Workers: -1})
	c.ServerHeartbeat(0, hb("a:1", load("hot/0/0", 1, 5000, "a:1")), env)
	now := int64(MoveCooldownMs + WarmupMs + 1)
	if tb := c.GetRoutes(now, &messages.GetRoutes{App: "a2", Ensure: true}, nil, env); env.assigns() != 1 || tb.Error.GetCode() != messages.Code_UNAVAILABLE {
		t.Fatalf("a 2nd app under the limit: %v, %d assigns", tb.Error, env.assigns())
	}
	// Reported: two routes, and one move in flight would make three.
	c.ServerHeartbeat(now, hb("a:1", load("hot/0/0", 1, 5000, "a:1"), load("a2/0/0", 1, 0, "a:1")), env)
	if tb := c.GetRoutes(now, &messages.GetRoutes{App: "a3", Ensure: true}, nil, env); env.assigns() != 2 {
		t.Fatalf("a 3rd app at the limit's edge: %v, %d assigns", tb.Error, env.assigns())
	}
	tb := c.GetRoutes(now, &messages.GetRoutes{App: "a4", Ensure: true}, nil, env)
	if e := tb.Error; e.GetCode() != messages.Code_RESOURCE_EXHAUSTED || e.GetField() != "app" || !strings.Contains(e.GetMessage(), "limit is 3") || env.assigns() != 2 {
		t.Fatalf("a 4th app past a limit of 3: %v, %d assigns", e, env.assigns())
	}
	c.Tick(now, env)
	if mv := moves(env); len(mv) != 0 {
		t.Fatalf("a split at the limit: %v", mv)
	}
	c.maxRoutes = 4
	c.Tick(now+1, env)
	if mv := moves(env); len(mv) != 1 || !mv[0].Split || mv[0].Shard != "hot/0/0" {
		t.Fatalf("under the limit again: moves %v, want the split of hot/0/0", mv)
	}
}
