package cluster_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
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

// TestHostileRegistryMessages sends a node's server actor, and its NameServer
// directly, what a broken or hostile worker or client could send over proto.actor
// (from another actor system on loopback), and what an in-process sender could
// that the wire would not carry (strings that are not UTF-8). Each is refused with
// a typed error naming the field (in the reply, or for a message without one in a
// warning of the server), the NameServer neither panics nor restarts (its picture
// stays complete, its worker table whole), nothing of the input reaches the route
// table the node was pushed (which still marshals), and the node keeps serving: a
// job fires on the real worker afterwards.
func TestHostileRegistryMessages(t *testing.T) {
	log := newObsLog(slog.LevelWarn)
	n := obsNode(t, slog.New(log))
	var ran atomic.Int64
	w := obsWorker(t, n, "orders", nil, map[string]cluster.HandlerFunc{
		"echo": func(context.Context, *cluster.Run) error { ran.Add(1); return nil },
	})
	obsReady(t, n)

	sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return obsQuiet() })))
	rem := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
	rem.Start()
	defer rem.Shutdown(false)

	srv := actor.NewPID(n.Address(), server.Name)
	status := func() *messages.ClusterStatusReply {
		t.Helper()
		r, err := sys.Root.RequestFuture(actor.NewPID(srv.Address, srv.Id), &messages.ClusterStatus{}, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("cluster status: %v", err)
		}
		return r.(*messages.ClusterStatusReply)
	}
	whole := func() string { // "" when the NameServer is warm and holds just the orders worker
		st := status()
		if !st.Complete {
			return "the name server's picture is not complete (it restarted?)"
		}
		var apps []string
		for _, a := range st.Apps {
			if a.Workers > 0 {
				apps = append(apps, a.App)
				if a.App != "orders" || a.Workers != 1 {
					return "workers: " + a.App
				}
			}
		}
		if len(apps) != 1 {
			return "no worker of orders"
		}
		return ""
	}
	obsWait(t, 15*time.Second, "the name server to be warm and hold the orders worker", func() bool { return whole() == "" })
	ns := n.NameServer()
	if ns == nil {
		t.Fatal("no name server")
	}

	hb := func(f func(w *messages.WorkerInfo)) *messages.WorkerHeartbeat {
		wi := &messages.WorkerInfo{WorkerId: "hostile-1", App: "orders", Ref: &messages.Ref{Address: sys.Address(), Id: "nobody"}, Capacity: 4}
		f(wi)
		return &messages.WorkerHeartbeat{Worker: wi, SentMs: time.Now().UnixMilli()}
	}
	errOf := func(r any) *messages.Error {
		switch r := r.(type) {
		case *messages.Pong:
			return r.Error
		case *messages.RouteTable:
			return r.Error
		case *messages.LeaseNodeReply:
			return r.Error
		}
		t.Fatalf("unexpected reply %T", r)
		return nil
	}
	for _, tc := range []struct {
		name  string
		m     proto.Message
		field string
		local bool // does not marshal: sent from the node's own actor system
	}{
		{"heartbeat no worker", &messages.WorkerHeartbeat{}, "worker", false},
		{"heartbeat no ref", hb(func(w *messages.WorkerInfo) { w.Ref = nil }), "worker.ref", false},
		{"heartbeat empty ref", hb(func(w *messages.WorkerInfo) { w.Ref = &messages.Ref{} }), "worker.ref.address", false},
		{"heartbeat worker id empty", hb(func(w *messages.WorkerInfo) { w.WorkerId = "" }), "worker.worker_id", false},
		{"heartbeat worker id 1 MiB", hb(func(w *messages.WorkerInfo) { w.WorkerId = strings.Repeat("w", 1<<20) }), "worker.worker_id", false},
		{"heartbeat worker id newline", hb(func(w *messages.WorkerInfo) { w.WorkerId = "w\nlevel=ERROR" }), "worker.worker_id", false},
		{"heartbeat app invalid", hb(func(w *messages.WorkerInfo) { w.App = "orders/0/0" }), "worker.app", false},
		{"heartbeat capacity -1", hb(func(w *messages.WorkerInfo) { w.Capacity = -1 }), "worker.capacity", false},
		{"heartbeat capacity MaxInt32", hb(func(w *messages.WorkerInfo) { w.Capacity = math.MaxInt32 }), "worker.capacity", false},
		{"heartbeat worker id invalid UTF-8", hb(func(w *messages.WorkerInfo) { w.WorkerId = "w\xff" }), "worker.worker_id", true},
		{"heartbeat ref invalid UTF-8", hb(func(w *messages.WorkerInfo) { w.Ref.Id = "nobody\xc3" }), "worker.ref.id", true},
		{"routes ensure app too long", &messages.GetRoutes{App: strings.Repeat("a", 65), Ensure: true}, "app", false},
		{"routes app invalid UTF-8", &messages.GetRoutes{App: "orders\xff", WithWorkers: true}, "app", true},
		{"lease no holder", &messages.LeaseNode{Node: -1}, "holder", false},
		{"lease node out of range", &messages.LeaseNode{Holder: "hostile", Node: 1 << 40}, "node", false},
	} {
		for _, to := range []struct {
			name string
			pid  *actor.PID
		}{{"server", srv}, {"name server", ns}} {
			root := sys.Root
			if tc.local {
				root = n.System().Root
			}
			// A fresh PID: one caches the process it was first resolved to, and so
			// would carry the other actor system's sends in-process.
			r, err := root.RequestFuture(actor.NewPID(to.pid.Address, to.pid.Id), tc.m, 5*time.Second).Result()
			if err != nil {
				t.Errorf("%s, to the %s: no reply: %v", tc.name, to.name, err)
				continue
			}
			e := errOf(r)
			if e.GetCode() != messages.Code_INVALID_ARGUMENT || e.GetField() != tc.field {
				t.Errorf("%s, to the %s: %v, want INVALID_ARGUMENT on %s", tc.name, to.name, kerr.FromWire(e), tc.field)
			}
		}
	}

	// No reply to these: the server drops them with a warning naming the field.
	for _, tc := range []struct {
		name  string
		m     proto.Message
		field string
	}{
		{"goodbye no worker id", &messages.WorkerLeft{App: "orders"}, "worker_id"},
		{"goodbye app invalid", &messages.WorkerLeft{WorkerId: w.ID(), App: "or ders"}, "app"},
		{"subscribe no subscriber", &messages.Subscribe{}, "subscriber"},
		{"subscribe empty subscriber", &messages.Subscribe{Subscriber: &messages.Ref{}}, "subscriber.address"},
	} {
		sys.Root.Send(actor.NewPID(srv.Address, srv.Id), tc.m)
		sys.Root.Send(actor.NewPID(ns.Address, ns.Id), tc.m)
		name := string(tc.m.ProtoReflect().Descriptor().Name())
		obsWait(t, 5*time.Second, tc.name+": the server's warning", func() bool {
			for _, r := range log.find("refused a message from a worker or client", "type", name) {
				if strings.Contains(r.attrs["err"], ": "+tc.field+": ") {
					return true
				}
			}
			return false
		})
	}
	// Straight to the NameServer from the node's own actor system (does not
	// marshal): its metrics, labelled by app, must not take the app (Prometheus
	// panics on a label that is not UTF-8, which took the NameServer down with it).
	for _, m := range []proto.Message{
		&messages.WorkerLeft{WorkerId: "hostile-1", App: "orders\xff"},
		&messages.WorkerHeartbeat{Worker: &messages.WorkerInfo{WorkerId: "hostile-1", App: "orders\xff", Ref: &messages.Ref{Address: sys.Address(), Id: "nobody"}}},
	} {
		n.System().Root.Send(actor.NewPID(ns.Address, ns.Id), m)
	}
	// Let a push go round (a heartbeat of the node and of the worker, a tick).
	time.Sleep(1500 * time.Millisecond)
	if why := whole(); why != "" {
		t.Fatalf("after the hostile messages: %s", why)
	}
	table := n.Routes()
	if _, err := proto.Marshal(table); err != nil {
		t.Errorf("the node's route table does not marshal: %v", err)
	}
	for _, a := range table.GetApps() {
		for _, wi := range a.Workers {
			if a.App != "orders" || wi.WorkerId != w.ID() || nscore.ValidWorker(wi) != nil {
				t.Errorf("route table holds worker %q of app %q", wi.WorkerId, a.App)
			}
		}
	}

	// The node keeps serving.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: obsQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Create(ctx, &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 10}}); err != nil {
		t.Fatal(err)
	}
	obsWait(t, 10*time.Second, "the job to run on the worker", func() bool { return ran.Load() >= 1 })
}

// TestNewWorkerRefusesBadConfig: a worker's id and capacity are checked where
// they are set, with the field and the limit, not left to a NameServer that would
// refuse every heartbeat (or, before, take a capacity over int32 wrapped).
func TestNewWorkerRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   func(c *cluster.WorkerConfig)
		field string // "" = accepted
		limit string
	}{
		{"capacity -1", func(c *cluster.WorkerConfig) { c.Capacity = -1 }, "capacity", "10000"},
		{"capacity past the limit", func(c *cluster.WorkerConfig) { c.Capacity = nscore.MaxWorkerCapacity + 1 }, "capacity", "10000"},
		{"capacity over int32", func(c *cluster.WorkerConfig) { c.Capacity = math.MaxInt32 + 1 }, "capacity", "10000"},
		{"capacity 0 is the default", func(c *cluster.WorkerConfig) { c.Capacity = 0 }, "", ""},
		{"capacity at the limit", func(c *cluster.WorkerConfig) { c.Capacity = nscore.MaxWorkerCapacity }, "", ""},
		{"id too long", func(c *cluster.WorkerConfig) { c.ID = strings.Repeat("w", nscore.MaxWorkerIDLen+1) }, "id", "128"},
		{"id at the limit", func(c *cluster.WorkerConfig) { c.ID = strings.Repeat("w", nscore.MaxWorkerIDLen) }, "", ""},
		{"id invalid UTF-8", func(c *cluster.WorkerConfig) { c.ID = "w\xff" }, "id", "UTF-8"},
		{"id control", func(c *cluster.WorkerConfig) { c.ID = "w\x00" }, "id", "control"},
		{"id empty is a fresh one", func(c *cluster.WorkerConfig) { c.ID = "" }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cluster.WorkerConfig{Servers: []string{"127.0.0.1:1"}, App: "orders", Log: obsQuiet()}
			tc.cfg(&cfg)
			_, err := cluster.NewWorker(cfg)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ke *kerr.Error
			if !errors.As(err, &ke) || ke.Code != messages.Code_INVALID_ARGUMENT || ke.Field != tc.field || !strings.Contains(ke.Message, tc.limit) {
				t.Fatalf("%v, want INVALID_ARGUMENT on %s naming %s", err, tc.field, tc.limit)
			}
		})
	}
}
