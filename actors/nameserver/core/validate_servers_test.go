package core

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// An audit of what servers send the NameServer (ServerHeartbeat, ShardOpened): a
// heartbeat's shards and hearsay become routes in every push to every server and
// client, its reference gets the pushes and orders. Each malformed one is refused
// whole with the field and the limit, panics nothing (a ShardOpened without a
// shard, or a nil entry, did), keeps nothing (servers, routes, pending
// assignments), pushes nothing: before, a shard without a reference became a
// route without an owner (a client took it and panicked), a shard named twice
// ("shop/00/0") a second route to one shard, a bad app a route no table could
// marshal, and a NaN or past-the-limit load reached the strategy.

// nsServersCore is nsAuditCore with a second server, b:1, holding cold/0/0.
func nsServersCore(t *testing.T) (*Core, *auditEnv) {
	t.Helper()
	c, e := nsAuditCore(t)
	if err := c.ServerHeartbeat(nsAuditNowMs-100, hb("b:1", load("cold/0/0", 1, 10, "b:1")), e); err != nil {
		t.Fatalf("good heartbeat of b:1: %v", err)
	}
	e.sent = nil
	return c, e
}

// serversState is what the NameServer keeps of servers and routes, printed.
func serversState(c *Core) string {
	var b strings.Builder
	det := proto.MarshalOptions{Deterministic: true}
	for _, id := range slices.Sorted(maps.Keys(c.servers)) {
		s := c.servers[id]
		m, _ := det.Marshal(s.hb)
		fmt.Fprintf(&b, "server %q %v %d %x\n", id, s.alive, s.lastSeen, m)
	}
	for _, n := range slices.Sorted(maps.Keys(c.routes)) {
		m, _ := det.Marshal(c.routes[n])
		fmt.Fprintf(&b, "route %q %x\n", n, m)
	}
	for _, n := range slices.Sorted(maps.Keys(c.pending)) {
		fmt.Fprintf(&b, "pending %q %v\n", n, c.pending[n])
	}
	for _, n := range slices.Sorted(maps.Keys(c.moves)) {
		fmt.Fprintf(&b, "move %q\n", n)
	}
	for _, id := range slices.Sorted(maps.Keys(c.gone)) {
		fmt.Fprintf(&b, "gone %q\n", id)
	}
	fmt.Fprintf(&b, "version %d dirty %v %v\n", c.version, c.dirty, c.workersDirty)
	return b.String()
}

// serversFaults lists what is wrong with the NameServer's routes and pending
// assignments, and with what it sent: a route not whole (ValidRoute) or keyed
// under another name, an order or push to a bad reference, a message that does
// not marshal, a status that does not.
func serversFaults(c *Core, sent []auditSent) []string {
	var out []string
	for n, r := range c.routes {
		if e := ValidRoute(r); e != nil || r.Shard != n {
			out = append(out, fmt.Sprintf("route %q: %v", n, e))
		}
	}
	for n := range c.pending {
		if _, e := ValidShard("pending", n); e != nil {
			out = append(out, fmt.Sprintf("pending %q: %v", n, e))
		}
	}
	if _, err := proto.Marshal(c.Status(nsAuditNowMs)); err != nil {
		out = append(out, "status: "+err.Error())
	}
	for _, s := range sent {
		if validRef("to", s.to) != nil {
			out = append(out, fmt.Sprintf("%T sent to %v", s.m, s.to))
		}
		if _, err := proto.Marshal(s.m.(proto.Message)); err != nil {
			out = append(out, fmt.Sprintf("%T sent does not marshal: %v", s.m, err))
		}
		if t, ok := s.m.(*messages.RouteTable); ok {
			for i, r := range t.Routes {
				if e := Under(fmt.Sprintf("pushed[%d]", i), ValidRoute(r)); e != nil {
					out = append(out, fmt.Sprintf("pushed: %v", e))
				}
			}
		}
	}
	return out
}

// serversBase is a good heartbeat of a new server, h:1: a shard, hearsay of
// shop/0/0 and of a shard handed off (no server id), a shard it is opening.
func serversBase() *messages.ServerHeartbeat {
	h := hb("h:1", load("new/0/0", 1, 10, "h:1"))
	h.Known = []*messages.RouteEntry{
		{Shard: "shop/0/0", App: "shop", Owner: &messages.Ref{Address: "a:1", Id: "shard-shop/0/0"}, ServerId: "a:1-id", Epoch: 1},
		{Shard: "moved/1/1", App: "moved", Level: 1, Index: 1, Owner: &messages.Ref{Address: "h:1", Id: "shard-moved/1/1"}, Epoch: 3},
	}
	h.Opening = []string{"fresh/0/0"}
	h.Incarnation, h.SuccessRate, h.Cpu, h.Mem = 2, 1, 0.25, 0.5
	return h
}

type serversCase struct {
	name  string
	msg   proto.Message
	field string // "" = accepted
	limit string // a substring the message must hold
}

func serversCases() []serversCase {
	mod := func(f func(h *messages.ServerHeartbeat)) *messages.ServerHeartbeat {
		h := serversBase()
		f(h)
		return h
	}
	shard := func(f func(l *messages.ShardLoad)) *messages.ServerHeartbeat {
		return mod(func(h *messages.ServerHeartbeat) { f(h.Shards[0]) })
	}
	known := func(f func(r *messages.RouteEntry)) *messages.ServerHeartbeat {
		return mod(func(h *messages.ServerHeartbeat) { f(h.Known[1]) })
	}
	opened := func(f func(l *messages.ShardLoad)) *messages.ShardOpened {
		l := load("shop/1/0", 2, 0, "a:1")
		f(l)
		return &messages.ShardOpened{ServerId: "a:1-id", Shard: l}
	}
	loads := func(n int) []*messages.ShardLoad {
		out := make([]*messages.ShardLoad, n)
		l := load("many/0/0", 1, 1, "h:1")
		for i := range out {
			out[i] = l
		}
		return out
	}
	idLimit, refLimit, nameLimit, epochLimit := fmt.Sprint(MaxServerIDLen), fmt.Sprint(MaxRefLen), fmt.Sprint(MaxShardNameLen), fmt.Sprint(int64(MaxEpoch))
	countLimit := fmt.Sprint(MaxRoutes)
	return []serversCase{
		{"good", serversBase(), "", ""},
		{"epoch 0 kept", shard(func(l *messages.ShardLoad) { l.Epoch = 0 }), "", ""},
		{"epoch at the limit", shard(func(l *messages.ShardLoad) { l.Epoch = MaxEpoch }), "", ""},
		{"deepest shard", shard(func(l *messages.ShardLoad) { l.Shard = "new/20/1048575" }), "", ""},
		{"app at the limit", shard(func(l *messages.ShardLoad) { l.Shard = strings.Repeat("a", route.MaxAppLen) + "/20/1048575" }), "", ""},
		{"no address kept", mod(func(h *messages.ServerHeartbeat) { h.Address = "" }), "", ""},
		{"journal error of two lines kept", mod(func(h *messages.ServerHeartbeat) { h.JournalError = "sync: a\nsync: b" }), "", ""},
		{"opening a deeper shard kept", mod(func(h *messages.ServerHeartbeat) { h.Opening = []string{"fresh/1/0"} }), "", ""},
		{"idle success rate 0 kept", mod(func(h *messages.ServerHeartbeat) { h.SuccessRate = 0 }), "", ""},

		{"server id empty", mod(func(h *messages.ServerHeartbeat) { h.ServerId = "" }), "server_id", idLimit},
		{"server id 1 MiB", mod(func(h *messages.ServerHeartbeat) { h.ServerId = strings.Repeat("s", 1<<20) }), "server_id", idLimit},
		{"server id invalid UTF-8", mod(func(h *messages.ServerHeartbeat) { h.ServerId = "h\xff" }), "server_id", "UTF-8"},
		{"server id newline", mod(func(h *messages.ServerHeartbeat) { h.ServerId = "h\nERROR forged" }), "server_id", "control"},
		{"server nil", mod(func(h *messages.ServerHeartbeat) { h.Server = nil }), "server", ""},
		{"server empty", mod(func(h *messages.ServerHeartbeat) { h.Server = &messages.Ref{} }), "server.address", refLimit},
		{"server id of the ref too long", mod(func(h *messages.ServerHeartbeat) { h.Server.Id = strings.Repeat("i", MaxRefLen+1) }), "server.id", refLimit},
		{"address too long", mod(func(h *messages.ServerHeartbeat) { h.Address = strings.Repeat("h", MaxRefLen+1) }), "address", refLimit},
		{"address invalid UTF-8", mod(func(h *messages.ServerHeartbeat) { h.Address = "h:1\xff" }), "address", "UTF-8"},

		{"shard nil", mod(func(h *messages.ServerHeartbeat) { h.Shards = append(h.Shards, nil) }), "shards[1]", ""},
		{"shard name empty", shard(func(l *messages.ShardLoad) { l.Shard = "" }), "shards[0].shard", nameLimit},
		{"shard name too long", shard(func(l *messages.ShardLoad) { l.Shard = strings.Repeat("a", 1<<20) + "/0/0" }), "shards[0].shard", nameLimit},
		{"shard name no level", shard(func(l *messages.ShardLoad) { l.Shard = "new" }), "shards[0].shard", "app/level/index"},
		{"shard level past MaxLevel", shard(func(l *messages.ShardLoad) { l.Shard = "new/21/0" }), "shards[0].shard", "20"},
		{"shard index past its level", shard(func(l *messages.ShardLoad) { l.Shard = "new/1/2" }), "shards[0].shard", "index"},
		{"shard level 00", shard(func(l *messages.ShardLoad) { l.Shard = "shop/00/0" }), "shards[0].shard", "canonical"},
		{"shard level +0", shard(func(l *messages.ShardLoad) { l.Shard = "shop/+0/0" }), "shards[0].shard", "canonical"},
		{"shard index -0", shard(func(l *messages.ShardLoad) { l.Shard = "shop/0/-0" }), "shards[0].shard", "canonical"},
		{"shard index 01", shard(func(l *messages.ShardLoad) { l.Shard = "new/1/01" }), "shards[0].shard", "canonical"},
		{"shard app with a slash", shard(func(l *messages.ShardLoad) { l.Shard = "a/b/0/0" }), "shards[0].shard", "'/'"},
		{"shard app with a space", shard(func(l *messages.ShardLoad) { l.Shard = "a b/0/0" }), "shards[0].shard", "' '"},
		{"shard app invalid UTF-8", shard(func(l *messages.ShardLoad) { l.Shard = "a\xff/0/0" }), "shards[0].shard", "app"},
		{"shard app too long", shard(func(l *messages.ShardLoad) { l.Shard = strings.Repeat("a", route.MaxAppLen+1) + "/0/0" }), "shards[0].shard", fmt.Sprint(route.MaxAppLen)},
		{"shard pid nil", shard(func(l *messages.ShardLoad) { l.Pid = nil }), "shards[0].pid", ""},
		{"shard pid empty", shard(func(l *messages.ShardLoad) { l.Pid = &messages.Ref{} }), "shards[0].pid.address", refLimit},
		{"shard pid id invalid UTF-8", shard(func(l *messages.ShardLoad) { l.Pid.Id = "x\xff" }), "shards[0].pid.id", "UTF-8"},
		{"shard epoch -1", shard(func(l *messages.ShardLoad) { l.Epoch = -1 }), "shards[0].epoch", epochLimit},
		{"shard epoch MaxInt64", shard(func(l *messages.ShardLoad) { l.Shard, l.Epoch = "shop/0/0", math.MaxInt64 }), "shards[0].epoch", epochLimit},
		{"shard epoch past the limit", shard(func(l *messages.ShardLoad) { l.Epoch = MaxEpoch + 1 }), "shards[0].epoch", epochLimit},
		{"shard pending -1", shard(func(l *messages.ShardLoad) { l.Pending = -1 }), "shards[0].pending", "0 or more"},
		{"shard fires -1", shard(func(l *messages.ShardLoad) { l.FiresWindow = -1 }), "shards[0].fires_window", fmt.Sprint(int64(MaxFiresWindow))},
		{"shard fires MaxInt64", shard(func(l *messages.ShardLoad) { l.FiresWindow = math.MaxInt64 }), "shards[0].fires_window", fmt.Sprint(int64(MaxFiresWindow))},
		{"shard fires total -1", shard(func(l *messages.ShardLoad) { l.FiresTotal = -1 }), "shards[0].fires_total", "0 or more"},
		{"shards past the limit", mod(func(h *messages.ServerHeartbeat) { h.Shards = loads(MaxRoutes + 1) }), "shards", countLimit},

		{"known nil", mod(func(h *messages.ServerHeartbeat) { h.Known = append(h.Known, nil) }), "known[2]", ""},
		{"known shard empty", known(func(r *messages.RouteEntry) { r.Shard = "" }), "known[1].shard", nameLimit},
		{"known shard no level", known(func(r *messages.RouteEntry) { r.Shard = "moved" }), "known[1].shard", "app/level/index"},
		{"known shard level 01", known(func(r *messages.RouteEntry) { r.Shard = "moved/01/1" }), "known[1].shard", "canonical"},
		{"known app not the shard's", known(func(r *messages.RouteEntry) { r.App = "shop" }), "known[1].app", "moved"},
		{"known app 1 MiB", known(func(r *messages.RouteEntry) { r.App = strings.Repeat("m", 1<<20) }), "known[1].app", "bytes"},
		{"known level not the shard's", known(func(r *messages.RouteEntry) { r.Level = 3 }), "known[1].level", "level 1"},
		{"known level -1", known(func(r *messages.RouteEntry) { r.Level = -1 }), "known[1].level", "level 1"},
		{"known index not the shard's", known(func(r *messages.RouteEntry) { r.Index = 7 }), "known[1].index", "index 1"},
		{"known owner nil", known(func(r *messages.RouteEntry) { r.Owner = nil }), "known[1].owner", ""},
		{"known owner empty", known(func(r *messages.RouteEntry) { r.Owner = &messages.Ref{} }), "known[1].owner.address", refLimit},
		{"known server id too long", known(func(r *messages.RouteEntry) { r.ServerId = strings.Repeat("s", MaxServerIDLen+1) }), "known[1].server_id", idLimit},
		{"known server id invalid UTF-8", known(func(r *messages.RouteEntry) { r.ServerId = "s\xff" }), "known[1].server_id", "UTF-8"},
		{"known epoch -1", known(func(r *messages.RouteEntry) { r.Epoch = -1 }), "known[1].epoch", epochLimit},
		{"known past the limit", mod(func(h *messages.ServerHeartbeat) {
			h.Known = slices.Repeat(h.Known[:1], MaxRoutes+1)
		}), "known", countLimit},

		{"opening empty", mod(func(h *messages.ServerHeartbeat) { h.Opening = []string{""} }), "opening[0]", nameLimit},
		{"opening level 00", mod(func(h *messages.ServerHeartbeat) { h.Opening = []string{"fresh/00/0"} }), "opening[0]", "canonical"},
		{"opening app invalid", mod(func(h *messages.ServerHeartbeat) { h.Opening = []string{"fr esh/0/0"} }), "opening[0]", "' '"},
		{"opening past the limit", mod(func(h *messages.ServerHeartbeat) { h.Opening = slices.Repeat([]string{"fresh/0/0"}, MaxRoutes+1) }), "opening", countLimit},

		{"journal error too long", mod(func(h *messages.ServerHeartbeat) { h.JournalError = strings.Repeat("e", MaxJournalErrorLen+1) }), "journal_error", fmt.Sprint(MaxJournalErrorLen)},
		{"journal error invalid UTF-8", mod(func(h *messages.ServerHeartbeat) { h.JournalError = "open /data/\xff: no space" }), "journal_error", "UTF-8"},
		{"cpu NaN", mod(func(h *messages.ServerHeartbeat) { h.Cpu = math.NaN() }), "cpu", "0 to 1"},
		{"cpu -0.5", mod(func(h *messages.ServerHeartbeat) { h.Cpu = -0.5 }), "cpu", "0 to 1"},
		{"mem +Inf", mod(func(h *messages.ServerHeartbeat) { h.Mem = math.Inf(1) }), "mem", "0 to 1"},
		{"mem 1.5", mod(func(h *messages.ServerHeartbeat) { h.Mem = 1.5 }), "mem", "0 to 1"},
		{"success rate NaN", mod(func(h *messages.ServerHeartbeat) { h.SuccessRate = math.NaN() }), "success_rate", "0 to 1"},
		{"incarnation -1", mod(func(h *messages.ServerHeartbeat) { h.Incarnation = -1 }), "incarnation", "0"},

		// A known server's heartbeat with a bad field must not change its entry.
		{"a:1 with a shard without a reference", func() proto.Message {
			h := hb("a:1", load("shop/0/0", 1, 0, "a:1"), &messages.ShardLoad{Shard: "shop2/0/0", Epoch: 1})
			return h
		}(), "shards[1].pid", ""},

		{"opened good", opened(func(*messages.ShardLoad) {}), "", ""},
		{"opened failed, no shard (ignored)", &messages.ShardOpened{ServerId: "a:1-id", Error: &messages.Error{Code: messages.Code_UNAVAILABLE}}, "", ""},
		{"opened no shard", &messages.ShardOpened{ServerId: "a:1-id"}, "shard", ""},
		{"opened server id empty", &messages.ShardOpened{Shard: load("shop/1/0", 2, 0, "a:1")}, "server_id", idLimit},
		{"opened pid nil", opened(func(l *messages.ShardLoad) { l.Pid = nil }), "shard.pid", ""},
		{"opened shard 1/00", opened(func(l *messages.ShardLoad) { l.Shard = "shop/1/00" }), "shard.shard", "canonical"},
		{"opened epoch -1", opened(func(l *messages.ShardLoad) { l.Epoch = -1 }), "shard.epoch", epochLimit},
	}
}

// serversHandle handles m as the NameServer's shell does and returns its error; a
// panic fails t.
func serversHandle(t *testing.T, c *Core, e *auditEnv, now int64, m proto.Message) (werr *messages.Error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%T panicked: %v", m, p)
		}
	}()
	switch m := m.(type) {
	case *messages.ServerHeartbeat:
		return c.ServerHeartbeat(now, m, e)
	case *messages.ShardOpened:
		if m.Error == nil {
			return c.ShardOpened(now, m.ServerId, m.Shard, e)
		}
		return nil
	}
	t.Fatalf("no handler for %T", m)
	return nil
}

func TestNameServerServerMessagesAudit(t *testing.T) {
	for _, tc := range serversCases() {
		t.Run(tc.name, func(t *testing.T) {
			c, e := nsServersCore(t)
			before := serversState(c)
			werr := serversHandle(t, c, e, nsAuditNowMs, tc.msg)
			gate := Check(tc.msg)
			if tc.field == "" {
				if werr != nil || gate != nil {
					t.Fatalf("refused: %v (check: %v)", werr, gate)
				}
			} else {
				if werr == nil {
					t.Fatalf("accepted, want INVALID_ARGUMENT on %q", tc.field)
				}
				if werr.Code != messages.Code_INVALID_ARGUMENT || werr.Field != tc.field {
					t.Errorf("%v %q: %s, want INVALID_ARGUMENT %q", werr.Code, werr.Field, werr.Message, tc.field)
				}
				if werr.Message == "" || !strings.Contains(werr.Message, tc.limit) || len(werr.Message) > 1024 {
					t.Errorf("message %.300q does not name the limit %q (or is too long)", werr.Message, tc.limit)
				}
				if !proto.Equal(gate, werr) {
					t.Errorf("Check says %v, the NameServer %v", gate, werr)
				}
				if after := serversState(c); after != before {
					t.Errorf("refused, yet the state changed:\nbefore:\n%safter:\n%s", before, after)
				}
				if len(e.sent) != 0 {
					t.Errorf("refused, yet %d messages sent", len(e.sent))
				}
			}
			for i := int64(1); i <= 3; i++ { // whatever it left behind is pushed and acted on
				c.Tick(nsAuditNowMs+i*HeartbeatMs, e)
			}
			for _, f := range serversFaults(c, e.sent) {
				t.Error(f)
			}

			// Good input works after it: a:1 reports a new shard, which is routed and pushed.
			e.sent = nil
			now := int64(nsAuditNowMs + 4*HeartbeatMs)
			if err := c.ServerHeartbeat(now, hb("a:1", load("shop/0/0", 1, 0, "a:1"), load("later/0/0", 1, 0, "a:1")), e); err != nil {
				t.Fatalf("good heartbeat after it: %v", err)
			}
			if c.routes["later/0/0"].GetServerId() != "a:1-id" {
				t.Errorf("good shard after it not routed: %v", c.routes["later/0/0"])
			}
			pushed := false
			for _, s := range e.sent {
				if rt, ok := s.m.(*messages.RouteTable); ok && slices.ContainsFunc(rt.Routes, func(r *messages.RouteEntry) bool { return r.Shard == "later/0/0" }) {
					pushed = true
				}
			}
			if !pushed {
				t.Error("good shard after it not pushed")
			}
		})
	}
}

// TestNameServerTakesItsRoutesBack: what the NameServer pushes comes back to it
// as hearsay in every server's heartbeat, which it must never refuse (the server
// would go unheard): through placements, moves, splits and a handoff's hearsay
// without a server id, every server echoing the last push is heard.
func TestNameServerTakesItsRoutesBack(t *testing.T) {
	e := &auditEnv{}
	c := New(0, nil)
	c.SetSelf(&messages.Ref{Address: "a:1", Id: "nameserver"})
	c.SetSplit(SplitPolicy{Fires: 1000, Workers: -1})
	var last *messages.RouteTable
	beat := func(now int64, h *messages.ServerHeartbeat) {
		t.Helper()
		for _, s := range e.sent {
			if rt, ok := s.m.(*messages.RouteTable); ok {
				last = rt
			}
		}
		h.Known = append(h.Known, last.GetRoutes()...)
		if err := c.ServerHeartbeat(now, h, e); err != nil {
			t.Fatalf("heartbeat of %s echoing the last push: %v", h.ServerId, err)
		}
	}
	beat(0, hb("a:1", load("hot/0/0", 1, 5000, "a:1"), load("cold/0/0", 1, 10, "a:1")))
	beat(0, hb("b:1"))
	now := int64(MoveCooldownMs + 1)
	beat(now, hb("a:1", load("hot/0/0", 1, 5000, "a:1"), load("cold/0/0", 1, 10, "a:1")))
	c.Tick(now, e)
	if len(moves(&sendLog{sent: sentOf(e)})) == 0 {
		t.Fatal("no split ordered (the test's premise)")
	}
	handed := hb("b:1", load("hot/1/1", 2, 2500, "b:1"))
	handed.Known = []*messages.RouteEntry{{Shard: "cold/0/0", App: "cold", Owner: &messages.Ref{Address: "b:1", Id: "shard-cold/0/0"}, Epoch: 2}}
	beat(now+100, hb("a:1", load("hot/1/0", 2, 2500, "a:1")))
	beat(now+200, handed)
	beat(now+300, hb("a:1", load("hot/1/0", 2, 2500, "a:1")))
	beat(now+400, hb("b:1", load("hot/1/1", 2, 2500, "b:1"), load("cold/0/0", 2, 10, "b:1")))
	if len(last.GetRoutes()) < 3 {
		t.Fatalf("pushed routes %v, want the halves and cold", last.GetRoutes())
	}
	for _, f := range serversFaults(c, e.sent) {
		t.Error(f)
	}
}

func sentOf(e *auditEnv) []any {
	out := make([]any, len(e.sent))
	for i, s := range e.sent {
		out[i] = s.m
	}
	return out
}
