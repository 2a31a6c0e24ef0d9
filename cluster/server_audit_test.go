package cluster_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// TestHostileServerMessages sends a node's NameServer and server actor, over
// proto.actor from another actor system on loopback, what a broken or hostile
// server (or NameServer) could: a ShardOpened without a shard (it panicked the
// NameServer, which restarted with its picture lost), heartbeats whose shards or
// hearsay have no owner or a second name of a shard (they became routes pushed to
// every server and client), an assignment and an import of a shard of a bad app
// or under a second name, a move to a target that is no actor (it froze the shard
// for good: the handoff is journaled), a route table with an entry without an
// owner (kept, and passed back to the NameServer as hearsay). Each is refused with
// the field at fault (in the reply, or in a warning), the NameServer keeps its
// picture, the node's route table holds only whole routes, and the node keeps
// serving: a job of the app whose shard was to move fires on the worker.
func TestHostileServerMessages(t *testing.T) {
	log := newObsLog(slog.LevelWarn)
	n := obsNode(t, slog.New(log))
	var ran atomic.Int64
	obsWorker(t, n, "orders", nil, map[string]cluster.HandlerFunc{
		"echo": func(context.Context, *cluster.Run) error { ran.Add(1); return nil },
	})
	obsReady(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: obsQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	once := func() {
		t.Helper()
		if _, err := c.Create(ctx, &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 10}}); err != nil {
			t.Fatal(err)
		}
	}
	once() // places orders/0/0
	obsWait(t, 10*time.Second, "the first job to run", func() bool { return ran.Load() >= 1 })
	var orders *messages.RouteEntry
	obsWait(t, 10*time.Second, "the node to hear of orders/0/0", func() bool {
		for _, r := range n.Routes().GetRoutes() {
			if r.Shard == "orders/0/0" {
				orders = r
			}
		}
		return orders != nil
	})

	sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return obsQuiet() })))
	rem := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
	rem.Start()
	defer rem.Shutdown(false)
	ns := n.NameServer()
	if ns == nil {
		t.Fatal("no name server")
	}
	nsPID := func() *actor.PID { return actor.NewPID(ns.Address, ns.Id) } // fresh: see TestHostileRegistryMessages
	srvPID := func() *actor.PID { return actor.NewPID(n.Address(), server.Name) }
	status := func() *messages.ClusterStatusReply {
		t.Helper()
		r, err := sys.Root.RequestFuture(nsPID(), &messages.ClusterStatus{}, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("cluster status: %v", err)
		}
		return r.(*messages.ClusterStatusReply)
	}
	st := status()
	if !st.Complete || len(st.Servers) != 1 {
		t.Fatalf("status before: complete %v, %d servers", st.Complete, len(st.Servers))
	}
	serverID := st.Servers[0].ServerId
	warned := func(what, msg, typ, field string) {
		t.Helper()
		obsWait(t, 5*time.Second, what+": a warning naming "+field, func() bool {
			for _, r := range log.find(msg, "type", typ) {
				if strings.Contains(r.attrs["err"], ": "+field+": ") {
					return true
				}
			}
			return false
		})
	}
	const nsRefused, srvRefused = "name server: refused a message from a server", "refused a message from the name server or a server"

	// To the NameServer: no reply; each is dropped with a warning.
	evil := &messages.Ref{Address: sys.Address(), Id: "kjob-server"}
	hostileHB := func(f func(h *messages.ServerHeartbeat)) *messages.ServerHeartbeat {
		h := &messages.ServerHeartbeat{ServerId: "evil-1", Server: evil, Address: sys.Address(), SuccessRate: 1, SentMs: time.Now().UnixMilli()}
		f(h)
		return h
	}
	for _, tc := range []struct {
		name  string
		m     proto.Message
		field string
	}{
		{"opened without a shard", &messages.ShardOpened{ServerId: serverID}, "shard"},
		{"a shard without a reference", hostileHB(func(h *messages.ServerHeartbeat) {
			h.Shards = []*messages.ShardLoad{{Shard: "evil/0/0", Epoch: 1}}
		}), "shards[0].pid"},
		{"a second name of orders' shard", hostileHB(func(h *messages.ServerHeartbeat) {
			h.Shards = []*messages.ShardLoad{{Shard: "orders/00/0", Epoch: orders.Epoch + 1, Pid: &messages.Ref{Address: sys.Address(), Id: "x"}}}
		}), "shards[0].shard"},
		{"hearsay without an owner", hostileHB(func(h *messages.ServerHeartbeat) {
			h.Known = []*messages.RouteEntry{{Shard: "ghost/0/0", App: "ghost", Epoch: 1}}
		}), "known[0].owner"},
	} {
		sys.Root.Send(nsPID(), tc.m)
		// The NameServer's mailbox is in order: its status answers after the message.
		if st := status(); !st.Complete || len(st.Servers) != 1 {
			t.Fatalf("%s: the name server's picture after it: complete %v, %d servers (it restarted, or took the sender for a server)",
				tc.name, st.Complete, len(st.Servers))
		}
		warned(tc.name, nsRefused, string(tc.m.ProtoReflect().Descriptor().Name()), tc.field)
	}

	// To the server: an order with a reply is answered with the field.
	ask := func(m proto.Message) *messages.Error {
		t.Helper()
		r, err := sys.Root.RequestFuture(srvPID(), m, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("%T: no reply: %v", m, err)
		}
		switch r := r.(type) {
		case *messages.ShardOpened:
			return r.Error
		case *messages.ImportShardReply:
			return r.Error
		}
		t.Fatalf("%T: reply %T", m, r)
		return nil
	}
	for _, tc := range []struct {
		name  string
		m     proto.Message
		field string
	}{
		{"assign of a bad app", &messages.AssignShard{Shard: "bad app/0/0", Epoch: 1}, "shard"},
		{"assign of a second name", &messages.AssignShard{Shard: "orders/0/00", Epoch: 1}, "shard"},
		{"assign at epoch 0", &messages.AssignShard{Shard: "zero/0/0", Epoch: 0}, "epoch"},
		{"import of a bad app", &messages.ImportShard{Shard: "bad app/0/0", Epoch: 2, Snapshot: []byte{1}}, "shard"},
		{"import at epoch -1", &messages.ImportShard{Shard: "neg/0/0", Epoch: -1, Snapshot: []byte{1}}, "epoch"},
	} {
		if e := ask(tc.m); e.GetCode() != messages.Code_INVALID_ARGUMENT || e.GetField() != tc.field {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on %s", tc.name, kerr.FromWire(e), tc.field)
		}
	}
	// No reply: dropped with a warning.
	for _, tc := range []struct {
		name  string
		m     proto.Message
		field string
	}{
		{"move to no actor", &messages.MoveShard{Shard: "orders/0/0", Epoch: orders.Epoch, Target: &messages.Ref{}}, "target.address"},
		{"table with an entry without an owner", &messages.RouteTable{Version: n.Routes().GetVersion() + 1000, Nameserver: &messages.Ref{Address: ns.Address, Id: ns.Id},
			Routes: []*messages.RouteEntry{{Shard: "orders/0/0", App: "orders", ServerId: serverID, Epoch: orders.Epoch + 1}},
			Apps:   []*messages.AppWorkers{{App: "forged", Workers: []*messages.WorkerInfo{{WorkerId: "w", App: "forged", Ref: &messages.Ref{Address: "a", Id: "b"}}}}}}, "routes[0].owner"},
	} {
		sys.Root.Send(srvPID(), tc.m)
		warned(tc.name, srvRefused, string(tc.m.ProtoReflect().Descriptor().Name()), tc.field)
	}

	// Let a push go round (a heartbeat of the node, a tick), then look.
	time.Sleep(1500 * time.Millisecond)
	if st := status(); !st.Complete || len(st.Servers) != 1 {
		t.Fatalf("after the hostile messages: complete %v, %d servers", st.Complete, len(st.Servers))
	}
	table := n.Routes()
	// The node's metrics count only the tables it took: not the refused one's version
	// nor its apps.
	fams := obsScrape(t, n)
	if v := obsValue(fams, "kjob_route_table_version", nil); v != float64(table.GetVersion()) {
		t.Errorf("kjob_route_table_version %v, want the version of the table the node holds, %d", v, table.GetVersion())
	}
	if v := obsValue(fams, "kjob_workers", map[string]string{"app": "forged"}); v != 0 {
		t.Errorf("kjob_workers of the refused table's app: %v, want none", v)
	}
	if _, err := proto.Marshal(table); err != nil {
		t.Errorf("the node's route table does not marshal: %v", err)
	}
	for i, r := range table.GetRoutes() {
		if e := nscore.ValidRoute(r); e != nil || r.App != "orders" {
			t.Errorf("the node's route table holds %v (%v)", r, kerr.FromWire(e))
		}
		if i > 0 || r.Epoch != orders.Epoch || r.Owner.GetAddress() != n.Address() {
			t.Errorf("the node's route table holds %v, want orders/0/0 at epoch %d on the node only", r, orders.Epoch)
		}
	}

	// The node keeps serving: orders' shard was not frozen.
	before := ran.Load()
	once()
	obsWait(t, 10*time.Second, "a job to run on the worker after it", func() bool { return ran.Load() > before })
}
