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

// An audit of the rule "bad input always gets a clear, typed error that names the
// field or the limit; nothing accepted is ever lost", at the NameServer: every
// hostile message a worker or client can send it (through a server) is refused
// with its code, the field at fault and, where there is one, the limit; it panics
// nothing, keeps nothing (the worker table, the leases, the subscribers), puts
// nothing into the route tables pushed to servers and subscribers (which must
// still marshal: proto.actor drops one that does not), and good input works after it.

const (
	nsAuditStartMs = 0
	nsAuditNowMs   = LeaseTTLMs + 500 // warm, leases open
)

// auditEnv records every message sent and where to.
type auditEnv struct{ sent []auditSent }

type auditSent struct {
	to *messages.Ref
	m  any
}

func (e *auditEnv) Send(to *messages.Ref, m any) { e.sent = append(e.sent, auditSent{to, m}) }

func goodWorker(id string) *messages.WorkerInfo {
	return &messages.WorkerInfo{WorkerId: id, App: "shop", Ref: &messages.Ref{Address: "127.0.0.1:9000", Id: "kjob-worker"}, Capacity: 8}
}

// nsAuditCore is a warm NameServer with one server (a:1, holding shop's root
// shard), one worker of shop (w1), node 0 leased to client-1 and one subscriber.
func nsAuditCore(t *testing.T) (*Core, *auditEnv) {
	t.Helper()
	e := &auditEnv{}
	c := New(nsAuditStartMs, nil)
	c.SetSelf(&messages.Ref{Address: "a:1", Id: "nameserver"})
	c.ServerHeartbeat(nsAuditNowMs-100, hb("a:1", &messages.ShardLoad{Shard: "shop/0/0", Epoch: 1,
		Pid: &messages.Ref{Address: "a:1", Id: "shard-shop/0/0"}}), e)
	if err := c.WorkerHeartbeat(nsAuditNowMs-50, &messages.WorkerHeartbeat{Worker: goodWorker("w1")}, e); err != nil {
		t.Fatalf("good worker refused: %v", err)
	}
	if r := c.Lease(nsAuditNowMs-50, &messages.LeaseNode{Holder: "client-1", Node: -1}); r.Error != nil || r.Node != 0 {
		t.Fatalf("lease: %v", r)
	}
	if err := c.Subscribe(nsAuditNowMs-50, &messages.Subscribe{Subscriber: &messages.Ref{Address: "c:1", Id: "client"}}, e); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	e.sent = nil
	return c, e
}

// nsHandle handles m as the NameServer's shell does and returns its error (for a
// goodbye or a subscription, which have no reply, the one the shell drops); a
// panic fails t.
func nsHandle(t *testing.T, c *Core, e *auditEnv, now int64, m proto.Message) (werr *messages.Error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%T panicked: %v", m, p)
		}
	}()
	switch m := m.(type) {
	case *messages.WorkerHeartbeat:
		return c.WorkerHeartbeat(now, m, e)
	case *messages.WorkerLeft:
		return c.WorkerLeft(now, m, e)
	case *messages.GetRoutes:
		return c.GetRoutes(now, m, nil, e).Error
	case *messages.Subscribe:
		return c.Subscribe(now, m, e)
	case *messages.LeaseNode:
		return c.Lease(now, m).Error
	case *messages.ClusterStatus:
		return c.Status(now).Error
	}
	t.Fatalf("no handler for %T", m)
	return nil
}

// nsState is what the NameServer keeps of workers and clients, printed.
func nsState(c *Core) string {
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(c.workers)) {
		w := c.workers[id]
		m, _ := proto.MarshalOptions{Deterministic: true}.Marshal(w.info)
		fmt.Fprintf(&b, "worker %q %x %d\n", id, m, w.lastSeen)
	}
	for _, n := range slices.Sorted(maps.Keys(c.leases)) {
		fmt.Fprintf(&b, "lease %d %q %d\n", n, c.leases[n].holder, c.leases[n].expires)
	}
	for _, k := range slices.Sorted(maps.Keys(c.subs)) {
		fmt.Fprintf(&b, "sub %q %d\n", k, c.subs[k])
	}
	return b.String()
}

// checkSent fails t for a message sent to a reference the NameServer should not
// send to, a route table that does not marshal, or one that holds a worker
// not in want (by id); it returns the workers of the last table pushed.
func checkSent(t *testing.T, sent []auditSent, want ...string) []string {
	t.Helper()
	var last []string
	for _, s := range sent {
		if err := validRef("to", s.to); err != nil {
			t.Errorf("%T sent to a bad reference: %v", s.m, err)
		}
		rt, ok := s.m.(*messages.RouteTable)
		if !ok {
			continue
		}
		if _, err := proto.Marshal(rt); err != nil {
			t.Errorf("route table to %v does not marshal: %v", s.to, err)
		}
		if len(rt.Apps) == 0 {
			continue // a subscriber's (no workers)
		}
		last = nil
		for _, a := range rt.Apps {
			for _, w := range a.Workers {
				last = append(last, w.WorkerId)
				if !strings.Contains(" "+strings.Join(want, " ")+" ", " "+w.WorkerId+" ") || ValidWorker(w) != nil || w.App != a.App {
					t.Errorf("route table to %v holds worker %q of app %q", s.to, w.WorkerId, a.App)
				}
			}
		}
	}
	return last
}

type nsAuditCase struct {
	name string
	msg  proto.Message
	// code is the reply's; OK = accepted (behaviour kept on purpose).
	code  messages.Code
	field string
	limit string // a substring the message must hold: the limit, when there is one
	// stateful: refused on what the NameServer holds, so a server's Check lets it
	// through (the NameServer answers it).
	stateful bool
}

func workerHB(f func(w *messages.WorkerInfo)) proto.Message {
	w := goodWorker("w9")
	f(w)
	return &messages.WorkerHeartbeat{Worker: w, SentMs: nsAuditNowMs}
}

func nsAuditCases() []nsAuditCase {
	const invalid = messages.Code_INVALID_ARGUMENT
	idLimit, capLimit, refLimit, holderLimit := fmt.Sprint(MaxWorkerIDLen), fmt.Sprint(MaxWorkerCapacity), fmt.Sprint(MaxRefLen), fmt.Sprint(MaxHolderLen)
	appLimit := fmt.Sprint(route.MaxAppLen)
	sub := func(r *messages.Ref) proto.Message { return &messages.Subscribe{Subscriber: r} }
	return []nsAuditCase{
		// Worker heartbeat: the worker itself.
		{"heartbeat no worker", &messages.WorkerHeartbeat{SentMs: 1}, invalid, "worker", "", false},
		{"heartbeat worker id empty", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = "" }), invalid, "worker.worker_id", idLimit, false},
		{"heartbeat worker id too long", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = strings.Repeat("w", MaxWorkerIDLen+1) }), invalid, "worker.worker_id", idLimit, false},
		{"heartbeat worker id 1 MiB", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = strings.Repeat("w", 1<<20) }), invalid, "worker.worker_id", idLimit, false},
		{"heartbeat worker id invalid UTF-8", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = "w\xff" }), invalid, "worker.worker_id", "UTF-8", false},
		{"heartbeat worker id NUL", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = "w\x00" }), invalid, "worker.worker_id", "control", false},
		{"heartbeat worker id newline", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = "w\nINFO forged" }), invalid, "worker.worker_id", "control", false},
		{"heartbeat worker id DEL", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = "w\x7f" }), invalid, "worker.worker_id", "control", false},
		{"heartbeat worker id C1 control", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = "w\u0085" }), invalid, "worker.worker_id", "control", false},
		{"heartbeat worker id at the limit", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = strings.Repeat("w", MaxWorkerIDLen) }), messages.Code_OK, "", "", false},
		{"heartbeat worker id unicode", workerHB(func(w *messages.WorkerInfo) { w.WorkerId = "工人-1 (eu)" }), messages.Code_OK, "", "", false},
		{"heartbeat app empty", workerHB(func(w *messages.WorkerInfo) { w.App = "" }), invalid, "worker.app", "", false},
		{"heartbeat app too long", workerHB(func(w *messages.WorkerInfo) { w.App = strings.Repeat("a", route.MaxAppLen+1) }), invalid, "worker.app", appLimit, false},
		{"heartbeat app with a slash", workerHB(func(w *messages.WorkerInfo) { w.App = "shop/0/0" }), invalid, "worker.app", "'/'", false},
		{"heartbeat app invalid UTF-8", workerHB(func(w *messages.WorkerInfo) { w.App = "shop\xff" }), invalid, "worker.app", "", false},
		{"heartbeat app newline", workerHB(func(w *messages.WorkerInfo) { w.App = "shop\n" }), invalid, "worker.app", "", false},
		{"heartbeat ref nil", workerHB(func(w *messages.WorkerInfo) { w.Ref = nil }), invalid, "worker.ref", "", false},
		{"heartbeat ref empty", workerHB(func(w *messages.WorkerInfo) { w.Ref = &messages.Ref{} }), invalid, "worker.ref.address", refLimit, false},
		{"heartbeat ref no id", workerHB(func(w *messages.WorkerInfo) { w.Ref.Id = "" }), invalid, "worker.ref.id", refLimit, false},
		{"heartbeat ref address too long", workerHB(func(w *messages.WorkerInfo) { w.Ref.Address = strings.Repeat("h", MaxRefLen+1) }), invalid, "worker.ref.address", refLimit, false},
		{"heartbeat ref id too long", workerHB(func(w *messages.WorkerInfo) { w.Ref.Id = strings.Repeat("i", MaxRefLen+1) }), invalid, "worker.ref.id", refLimit, false},
		{"heartbeat ref address invalid UTF-8", workerHB(func(w *messages.WorkerInfo) { w.Ref.Address = "127.0.0.1:\xff" }), invalid, "worker.ref.address", "UTF-8", false},
		{"heartbeat ref id control", workerHB(func(w *messages.WorkerInfo) { w.Ref.Id = "kjob\tworker" }), invalid, "worker.ref.id", "control", false},
		{"heartbeat capacity -1", workerHB(func(w *messages.WorkerInfo) { w.Capacity = -1 }), invalid, "worker.capacity", capLimit, false},
		{"heartbeat capacity MinInt32", workerHB(func(w *messages.WorkerInfo) { w.Capacity = math.MinInt32 }), invalid, "worker.capacity", capLimit, false},
		{"heartbeat capacity past the limit", workerHB(func(w *messages.WorkerInfo) { w.Capacity = MaxWorkerCapacity + 1 }), invalid, "worker.capacity", capLimit, false},
		{"heartbeat capacity MaxInt32", workerHB(func(w *messages.WorkerInfo) { w.Capacity = math.MaxInt32 }), invalid, "worker.capacity", capLimit, false},
		// 0 is the worker's default (a shard assumes 64).
		{"heartbeat capacity 0 kept", workerHB(func(w *messages.WorkerInfo) { w.Capacity = 0 }), messages.Code_OK, "", "", false},
		{"heartbeat capacity at the limit", workerHB(func(w *messages.WorkerInfo) { w.Capacity = MaxWorkerCapacity }), messages.Code_OK, "", "", false},
		{"heartbeat busy -1", workerHB(func(w *messages.WorkerInfo) { w.Busy = -1 }), invalid, "worker.busy", capLimit, false},
		{"heartbeat busy MaxInt32", workerHB(func(w *messages.WorkerInfo) { w.Busy = math.MaxInt32 }), invalid, "worker.busy", capLimit, false},
		// A known worker's heartbeat with a bad field must not change its entry.
		{"heartbeat of w1 with no ref", &messages.WorkerHeartbeat{Worker: &messages.WorkerInfo{WorkerId: "w1", App: "shop"}}, invalid, "worker.ref", "", false},
		{"heartbeat of w1 with a bad app", &messages.WorkerHeartbeat{Worker: &messages.WorkerInfo{WorkerId: "w1", App: "sh op",
			Ref: &messages.Ref{Address: "127.0.0.1:9000", Id: "kjob-worker"}}}, invalid, "worker.app", "", false},

		// Goodbye.
		{"left worker id empty", &messages.WorkerLeft{App: "shop"}, invalid, "worker_id", idLimit, false},
		{"left worker id too long", &messages.WorkerLeft{WorkerId: strings.Repeat("w", MaxWorkerIDLen+1), App: "shop"}, invalid, "worker_id", idLimit, false},
		{"left worker id invalid UTF-8", &messages.WorkerLeft{WorkerId: "w1\xff", App: "shop"}, invalid, "worker_id", "UTF-8", false},
		{"left app empty", &messages.WorkerLeft{WorkerId: "w1"}, invalid, "app", "", false},
		{"left app invalid", &messages.WorkerLeft{WorkerId: "w1", App: "sh\x00op"}, invalid, "app", "", false},
		{"left app not the worker's", &messages.WorkerLeft{WorkerId: "w1", App: "other"}, invalid, "app", "registered for app shop", true},
		{"left unknown worker kept", &messages.WorkerLeft{WorkerId: "w-unknown", App: "shop"}, messages.Code_OK, "", "", false},

		// Route pulls.
		{"routes app too long", &messages.GetRoutes{App: strings.Repeat("a", route.MaxAppLen+1)}, invalid, "app", appLimit, false},
		{"routes app invalid UTF-8", &messages.GetRoutes{App: "shop\xff", WithWorkers: true}, invalid, "app", "", false},
		{"routes app control", &messages.GetRoutes{App: "shop\r"}, invalid, "app", "", false},
		{"routes ensure app empty", &messages.GetRoutes{Ensure: true}, invalid, "app", "", false},
		{"routes ensure app with a slash", &messages.GetRoutes{App: "a/0/0", Ensure: true}, invalid, "app", "'/'", false},
		{"routes ensure app too long", &messages.GetRoutes{App: strings.Repeat("a", route.MaxAppLen+1), Ensure: true}, invalid, "app", appLimit, false},
		{"routes every app kept", &messages.GetRoutes{WithWorkers: true}, messages.Code_OK, "", "", false},

		// Subscriptions.
		{"subscribe no subscriber", sub(nil), invalid, "subscriber", "", false},
		{"subscribe empty subscriber", sub(&messages.Ref{}), invalid, "subscriber.address", refLimit, false},
		{"subscribe no id", sub(&messages.Ref{Address: "c:2"}), invalid, "subscriber.id", refLimit, false},
		{"subscribe address too long", sub(&messages.Ref{Address: strings.Repeat("c", MaxRefLen+1), Id: "x"}), invalid, "subscriber.address", refLimit, false},
		{"subscribe id invalid UTF-8", sub(&messages.Ref{Address: "c:2", Id: "x\xff"}), invalid, "subscriber.id", "UTF-8", false},

		// Node leases (node 0 is client-1's).
		{"lease holder empty", &messages.LeaseNode{Node: -1}, invalid, "holder", holderLimit, false},
		{"lease holder empty renewing", &messages.LeaseNode{Node: 5}, invalid, "holder", holderLimit, false},
		{"lease holder too long", &messages.LeaseNode{Holder: strings.Repeat("h", MaxHolderLen+1), Node: -1}, invalid, "holder", holderLimit, false},
		{"lease holder invalid UTF-8", &messages.LeaseNode{Holder: "client-1\xff", Node: 0}, invalid, "holder", "UTF-8", false},
		{"lease holder control", &messages.LeaseNode{Holder: "client\x1b[31m", Node: -1}, invalid, "holder", "control", false},
		{"lease node -2", &messages.LeaseNode{Holder: "client-2", Node: -2}, invalid, "node", "1023", false},
		{"lease node MinInt64", &messages.LeaseNode{Holder: "client-2", Node: math.MinInt64}, invalid, "node", "1023", false},
		{"lease node past the limit", &messages.LeaseNode{Holder: "client-2", Node: MaxNodes}, invalid, "node", "1023", false},
		{"lease node MaxInt64", &messages.LeaseNode{Holder: "client-2", Node: math.MaxInt64}, invalid, "node", "1023", false},
		{"lease node of another holder", &messages.LeaseNode{Holder: "client-2", Node: 0}, messages.Code_ALREADY_EXISTS, "node", "held by another client", true},

		// Cluster status has no field.
		{"status", &messages.ClusterStatus{}, messages.Code_OK, "", "", false},
	}
}

func TestNameServerValidateAudit(t *testing.T) {
	for _, tc := range nsAuditCases() {
		t.Run(tc.name, func(t *testing.T) {
			c, e := nsAuditCore(t)
			before := nsState(c)
			werr := nsHandle(t, c, e, nsAuditNowMs, tc.msg)
			c.Tick(nsAuditNowMs+1, e) // whatever it left behind is pushed now
			// A server refuses what Check refuses without forwarding it; the NameServer
			// must give the same answer to one that reaches it by another way.
			gate := Check(tc.msg)
			if tc.code == messages.Code_OK {
				if werr != nil || gate != nil {
					t.Fatalf("refused: %v (server's check: %v)", werr, gate)
				}
				checkSent(t, e.sent, "w1", "w9", "工人-1 (eu)", strings.Repeat("w", MaxWorkerIDLen))
				return
			}
			if werr == nil {
				t.Fatalf("accepted, want %v on %q", tc.code, tc.field)
			}
			if werr.Code != tc.code || werr.Field != tc.field {
				t.Errorf("%v %q: %s, want %v %q", werr.Code, werr.Field, werr.Message, tc.code, tc.field)
			}
			if werr.Message == "" || !strings.Contains(werr.Message, tc.limit) {
				t.Errorf("message %q does not name the limit %q", werr.Message, tc.limit)
			}
			switch {
			case tc.stateful && gate != nil:
				t.Errorf("a server's check refuses it (%v); the NameServer should answer it", gate)
			case !tc.stateful && !proto.Equal(gate, werr):
				t.Errorf("a server's check says %v, the NameServer %v", gate, werr)
			}
			if after := nsState(c); after != before {
				t.Errorf("refused, yet the state changed:\nbefore:\n%safter:\n%s", before, after)
			}
			checkSent(t, e.sent, "w1")

			// Good input works after it: a new worker is registered and pushed, w1 says
			// goodbye, a lease and a subscription are granted.
			e.sent = nil
			if err := nsHandle(t, c, e, nsAuditNowMs+2, &messages.WorkerHeartbeat{Worker: goodWorker("w2")}); err != nil {
				t.Fatalf("good worker after it: %v", err)
			}
			if got := checkSent(t, e.sent, "w1", "w2"); strings.Join(got, ",") != "w1,w2" {
				t.Errorf("pushed workers %v after a good heartbeat, want w1,w2", got)
			}
			e.sent = nil
			if err := nsHandle(t, c, e, nsAuditNowMs+3, &messages.WorkerLeft{WorkerId: "w1", App: "shop"}); err != nil || c.workers["w1"] != nil {
				t.Errorf("good goodbye after it: %v, w1 still there: %v", err, c.workers["w1"] != nil)
			}
			if got := checkSent(t, e.sent, "w2"); strings.Join(got, ",") != "w2" {
				t.Errorf("pushed workers %v after w1's goodbye, want w2", got)
			}
			if r := c.Lease(nsAuditNowMs+3, &messages.LeaseNode{Holder: "client-2", Node: -1}); r.Error != nil || r.Node != 1 {
				t.Errorf("good lease after it: %v", r)
			}
			if err := c.Subscribe(nsAuditNowMs+3, &messages.Subscribe{Subscriber: &messages.Ref{Address: "c:2", Id: "client"}}, e); err != nil || len(c.subs) != 2 {
				t.Errorf("good subscription after it: %v, %d subscribers", err, len(c.subs))
			}
		})
	}
}

// TestNameServerBoundsWorkersAndSubscribers: the worker table and the subscribers
// are bounded (every worker goes into every push; every subscriber gets every
// push); a new one past the bound is refused naming the limit and kept nowhere,
// one already known is still heard, and a place freed is taken again.
func TestNameServerBoundsWorkersAndSubscribers(t *testing.T) {
	c, e := nsAuditCore(t) // w1 and one subscriber
	c.maxWorkers, c.maxSubs = 3, 2
	now := int64(nsAuditNowMs)
	for _, id := range []string{"w2", "w3"} {
		if err := c.WorkerHeartbeat(now, &messages.WorkerHeartbeat{Worker: goodWorker(id)}, e); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	e.sent = nil
	err := c.WorkerHeartbeat(now, &messages.WorkerHeartbeat{Worker: goodWorker("w4")}, e)
	if err.GetCode() != messages.Code_RESOURCE_EXHAUSTED || err.GetField() != "worker.worker_id" || !strings.Contains(err.GetMessage(), "limit is 3") {
		t.Fatalf("4th worker past a limit of 3: %v", err)
	}
	c.Tick(now+1, e)
	if c.workers["w4"] != nil || len(c.workers) != 3 {
		t.Fatalf("refused, yet kept: %d workers", len(c.workers))
	}
	checkSent(t, e.sent, "w1", "w2", "w3")
	if err := c.WorkerHeartbeat(now+2, &messages.WorkerHeartbeat{Worker: goodWorker("w1")}, e); err != nil {
		t.Fatalf("a known worker's heartbeat at the limit: %v", err)
	}
	if err := c.WorkerLeft(now+2, &messages.WorkerLeft{WorkerId: "w3", App: "shop"}, e); err != nil {
		t.Fatal(err)
	}
	if err := c.WorkerHeartbeat(now+3, &messages.WorkerHeartbeat{Worker: goodWorker("w4")}, e); err != nil || c.workers["w4"] == nil {
		t.Fatalf("w4 once w3 left: %v", err)
	}

	if err := c.Subscribe(now, &messages.Subscribe{Subscriber: &messages.Ref{Address: "c:2", Id: "client"}}, e); err != nil {
		t.Fatalf("2nd subscriber: %v", err)
	}
	err = c.Subscribe(now, &messages.Subscribe{Subscriber: &messages.Ref{Address: "c:3", Id: "client"}}, e)
	if err.GetCode() != messages.Code_RESOURCE_EXHAUSTED || err.GetField() != "subscriber" || !strings.Contains(err.GetMessage(), "limit is 2") || len(c.subs) != 2 {
		t.Fatalf("3rd subscriber past a limit of 2: %v, %d subscribers", err, len(c.subs))
	}
	if err := c.Subscribe(now+4, &messages.Subscribe{Subscriber: &messages.Ref{Address: "c:1", Id: "client"}}, e); err != nil {
		t.Fatalf("a known subscriber renewing at the limit: %v", err)
	}
}

// TestSubscribersGetRouteChangesOnly: a subscriber (a client, which routes without
// the workers) is pushed the table when routes change, not when only workers do;
// the servers get both.
func TestSubscribersGetRouteChangesOnly(t *testing.T) {
	c, e := nsAuditCore(t) // server a:1 holding shop/0/0, worker w1, subscriber c:1
	tables := func() (servers, subs int) {
		for _, s := range e.sent {
			if _, ok := s.m.(*messages.RouteTable); ok {
				if s.to.GetAddress() == "c:1" {
					subs++
				} else {
					servers++
				}
			}
		}
		e.sent = nil
		return
	}
	now := int64(nsAuditNowMs)
	if err := c.WorkerHeartbeat(now, &messages.WorkerHeartbeat{Worker: goodWorker("w2")}, e); err != nil {
		t.Fatal(err)
	}
	if srv, subs := tables(); srv != 1 || subs != 0 {
		t.Fatalf("a worker joined: %d tables to servers, %d to subscribers; want 1 and 0", srv, subs)
	}
	c.ServerHeartbeat(now, hb("a:1", &messages.ShardLoad{Shard: "shop/0/0", Epoch: 1, Pid: &messages.Ref{Address: "a:1", Id: "shard-shop/0/0"}},
		&messages.ShardLoad{Shard: "mail/0/0", Epoch: 1, Pid: &messages.Ref{Address: "a:1", Id: "shard-mail/0/0"}}), e)
	if srv, subs := tables(); srv != 1 || subs != 1 {
		t.Fatalf("a shard appeared: %d tables to servers, %d to subscribers; want 1 and 1", srv, subs)
	}
}
