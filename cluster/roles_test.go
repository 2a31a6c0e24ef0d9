package cluster_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// issueRole makes an endpoint's TLS under ca with role.
func issueRole(t *testing.T, ca *cluster.CA, name string, role cluster.Role) *cluster.TLS {
	t.Helper()
	cert, key, err := ca.Issue(name, []string{"127.0.0.1", "localhost"}, time.Hour, role)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := cluster.NewTLS(ca.CertPEM(), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := cluster.RoleOf(tl.Leaf()); !ok || r != role {
		t.Fatalf("issued with role %q, the certificate has %q (%v)", role, r, ok)
	}
	return tl
}

// tlsNode starts a node with a server's certificate under ca and the admin API,
// closed when the test ends.
func tlsNode(t *testing.T, ca *cluster.CA) *cluster.Node {
	t.Helper()
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog(),
		HTTP: "127.0.0.1:0", TLS: issueRole(t, ca, "node", cluster.RoleServer)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestTLSRoles: a client's certificate does everything a client does, a worker's
// everything a worker does, and neither more. An endpoint started with a
// certificate that does not fit it is refused on tls-cert; a peer that sends
// what its role does not allow anyway (a worker's certificate sending a command,
// a client's registering as a worker or dispatching to a worker) is cut off and
// counted (kjob_tls_refused_total) with nothing done; the admin API refuses a
// worker's certificate.
func TestTLSRoles(t *testing.T) {
	ca, err := cluster.NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	n := tlsNode(t, ca)
	workerTLS, clientTLS := issueRole(t, ca, "worker", cluster.RoleWorker), issueRole(t, ca, "client", cluster.RoleClient)
	rec := newRecorder()
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "orders", Log: quietLog(),
		OnRun: rec.onRun, TLS: workerTLS})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { return nil })
	w.HandleFunc("fail", func(ctx context.Context, r *cluster.Run) error { return errors.New("boom") })
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog(), TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Everything a client does, through a client's certificate, and the runs'
	// results through the worker's.
	j, err := c.Create(ctx, once(50))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the job to fire at the worker", func() bool { return rec.n.Load() == 1 })
	waitFor(t, 10*time.Second, "the run's result to be recorded", func() bool {
		runs, err := c.Runs(ctx, "orders", j.Id, 10)
		return err == nil && len(runs) == 1 && runs[0].Outcome == messages.Outcome_SUCCEEDED
	})
	p := &messages.Job{App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 3_600_000}}
	if p, err = c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"get", func() error { _, err := c.Get(ctx, "orders", j.Id); return err }},
		{"list", func() error { _, _, err := c.List(ctx, "orders", cluster.ListOptions{}); return err }},
		{"pause", func() error { _, err := c.Pause(ctx, "orders", p.Id); return err }},
		{"resume", func() error { _, err := c.Resume(ctx, "orders", p.Id); return err }},
		{"update", func() error {
			u := &messages.Job{Id: p.Id, App: "orders", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: 7_200_000}}
			_, err := c.Update(ctx, u)
			return err
		}},
		{"trigger", func() error { _, err := c.Trigger(ctx, "orders", p.Id, nil); return err }},
		{"dead letters", func() error { _, _, err := c.DeadLetters(ctx, "orders", "", 10); return err }},
		{"status", func() error { _, err := c.Status(ctx); return err }},
		{"delete", func() error { return c.Delete(ctx, "orders", p.Id) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s with a client's certificate: %v", s.what, err)
		}
	}
	f, err := c.Create(ctx, &messages.Job{App: "orders", Handler: "fail", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 10},
		Policy: &messages.Policy{Attempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var dead []*messages.DeadLetter
	waitFor(t, 20*time.Second, "the failing job's dead letter", func() bool {
		dead, _, err = c.DeadLetters(ctx, "orders", "", 10)
		return err == nil && len(dead) == 1 && dead[0].JobId == f.Id
	})
	if _, err := c.DeadLetter(ctx, "orders", dead[0].RunId); err != nil {
		t.Fatalf("a dead letter with a client's certificate: %v", err)
	}
	if _, err := c.Purge(ctx, "orders", dead[0].RunId); err != nil {
		t.Fatalf("purge with a client's certificate: %v", err)
	}

	// A certificate that does not fit the endpoint: refused at the start.
	for _, tc := range []struct {
		what string
		try  func() error
	}{
		{"a client with a worker's certificate", func() error {
			rc, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog(), TLS: workerTLS})
			if err == nil {
				rc.Close()
			}
			return err
		}},
		{"a worker with a client's certificate", func() error {
			rw, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "orders", Log: quietLog(), TLS: clientTLS})
			if err != nil {
				return err
			}
			err = rw.Start()
			if err == nil {
				rw.Stop()
			}
			return err
		}},
		{"a server with a client's certificate", func() error {
			rn, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog(), TLS: clientTLS})
			if err == nil {
				rn.Close()
			}
			return err
		}},
	} {
		var ke *kerr.Error
		if err := tc.try(); !errors.As(err, &ke) || ke.Field != "tls-cert" || ke.Code != messages.Code_INVALID_ARGUMENT {
			t.Fatalf("%s: %v; want INVALID_ARGUMENT on tls-cert", tc.what, err)
		}
	}

	// Peers that send what their role does not allow: a worker's certificate
	// creating a job, a client's registering as a worker. Each is cut off before
	// the server's actors see it: no reply, nothing done, and counted.
	metricsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS.HTTPClientConfig()}, Timeout: 10 * time.Second}
	refused := func() float64 {
		resp, err := metricsClient.Get("https://" + n.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "kjob_tls_refused_total "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		t.Fatal("/metrics has no kjob_tls_refused_total")
		return 0
	}
	if got := refused(); got != 0 {
		t.Fatalf("kjob_tls_refused_total %v before any refusal", got)
	}
	// A PID caches the process that sends to it, so each system gets its own (one
	// shared would take the first system's connection for both).
	serverPID := func() *actor.PID { return actor.NewPID(n.Address(), server.Name) }
	wsys, wstop, err := cluster.RawEndpoint(workerTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer wstop()
	csys, cstop, err := cluster.RawEndpoint(clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer cstop()
	hb := func(id string) *messages.WorkerHeartbeat {
		return &messages.WorkerHeartbeat{SentMs: time.Now().UnixMilli(), Worker: &messages.WorkerInfo{WorkerId: id, App: "orders",
			Ref: &messages.Ref{Address: "127.0.0.1:1", Id: "kjob-worker"}, Capacity: 4}}
	}
	// The raw worker endpoint is heard when it heartbeats, as a worker may.
	if r, err := wsys.Root.RequestFuture(serverPID(), hb("raw-worker"), 5*time.Second).Result(); err != nil {
		t.Fatalf("a heartbeat with a worker's certificate: %v", err)
	} else if pong, _ := r.(*messages.Pong); pong == nil || pong.Error != nil {
		t.Fatalf("a heartbeat with a worker's certificate: %v", r)
	}
	before, _, err := c.List(ctx, "orders", cluster.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		sys  *actor.ActorSystem
		m    any
	}{
		{"a job created with a worker's certificate", wsys, &messages.CreateJob{Job: &messages.Job{App: "orders", Handler: "echo",
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 10}}}},
		{"a client's certificate registering as a worker", csys, hb("intruder")},
		{"a client's certificate reporting a result", csys, &messages.RunResult{RunId: "x", Shard: "orders/0/0", Outcome: messages.Outcome_SUCCEEDED}},
	} {
		was := refused()
		if r, err := tc.sys.Root.RequestFuture(serverPID(), tc.m, time.Second).Result(); err == nil {
			t.Fatalf("%s: answered %v", tc.what, r)
		}
		waitFor(t, 5*time.Second, tc.what+" to be counted", func() bool { return refused() > was })
	}
	after, _, err := c.List(ctx, "orders", cluster.ListOptions{})
	if err != nil || len(after) != len(before) {
		t.Fatalf("jobs before the refused create: %d, after: %d (%v)", len(before), len(after), err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.Apps {
		if a.App == "orders" && a.Workers != 2 {
			t.Fatalf("orders has %d workers registered, want 2 (the worker and the raw one; not the client's)", a.Workers)
		}
	}

	// Clients and workers hear from servers only: a client's certificate cannot
	// dispatch to a worker.
	was := rec.n.Load()
	csys.Root.Send(actor.NewPID(w.PID().Address, w.PID().Id), &messages.Dispatch{RunId: "forged", JobId: 1, App: "orders", Handler: "echo", DueMs: time.Now().UnixMilli(),
		Attempt: 1, Shard: "orders/0/0", ReplyTo: &messages.Ref{Address: "127.0.0.1:1", Id: "nobody"}})
	time.Sleep(500 * time.Millisecond)
	if rec.n.Load() != was {
		t.Fatal("a dispatch sent with a client's certificate ran at the worker")
	}

	// The admin API: a client's certificate may use it, a worker's not.
	for _, tc := range []struct {
		tls  *cluster.TLS
		code int
	}{{clientTLS, http.StatusOK}, {workerTLS, http.StatusForbidden}} {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc.tls.HTTPClientConfig()}, Timeout: 10 * time.Second}
		resp, err := hc.Get("https://" + n.HTTPAddr() + "/v1/jobs/orders/" + strconv.FormatInt(j.Id, 10))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if r, _ := cluster.RoleOf(tc.tls.Leaf()); resp.StatusCode != tc.code || (tc.code == http.StatusForbidden && !strings.Contains(string(b), "PERMISSION_DENIED")) {
			t.Fatalf("the admin API with a %s certificate: %d %s, want %d", r, resp.StatusCode, b, tc.code)
		}
	}
}

// Roles parse, and a certificate with an unknown role or two has none a peer takes.
func TestRoleOf(t *testing.T) {
	if _, err := cluster.ParseRole("admin"); err == nil {
		t.Fatal("ParseRole took admin")
	}
	ca, err := cluster.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.Issue("x", nil, time.Hour, cluster.Role("root")); err == nil {
		t.Fatal("Issue took the role root")
	}
	for _, r := range []cluster.Role{cluster.RoleAny, cluster.RoleServer, cluster.RoleClient, cluster.RoleWorker} {
		issueRole(t, ca, "e-"+string(r), r)
	}
}

// TestWorkerCertificateBoundToApps: a worker's certificate bound to an app runs
// that app's jobs and nothing of another's: a worker of another app with it is
// refused at the start, and a heartbeat, a goodbye or a result for another app
// sent with it anyway is cut off, counted, and done nothing of.
func TestWorkerCertificateBoundToApps(t *testing.T) {
	ca, err := cluster.NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		role cluster.Role
		apps []string
	}{{cluster.RoleClient, []string{"orders"}}, {cluster.RoleAny, []string{"orders"}}, {cluster.RoleWorker, []string{"no/slash"}}} {
		var ke *kerr.Error
		if _, _, err := ca.Issue("x", nil, time.Hour, bad.role, bad.apps...); !errors.As(err, &ke) || ke.Field != "app" {
			t.Fatalf("a %q certificate bound to %v: %v, want an error on app", bad.role, bad.apps, err)
		}
	}
	n := tlsNode(t, ca)
	cert, key, err := ca.Issue("orders-worker", nil, time.Hour, cluster.RoleWorker, "orders")
	if err != nil {
		t.Fatal(err)
	}
	ordersTLS, err := cluster.NewTLS(ca.CertPEM(), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if apps, ok := cluster.AppsOf(ordersTLS.Leaf()); !ok || len(apps) != 1 || apps[0] != "orders" {
		t.Fatalf("AppsOf: %v %v", apps, ok)
	}
	var ke *kerr.Error
	if _, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "billing", Log: quietLog(), TLS: ordersTLS}); !errors.As(err, &ke) || ke.Field != "tls-cert" {
		t.Fatalf("a billing worker with an orders worker's certificate: %v, want an error on tls-cert", err)
	}
	if _, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "orders", ID: "billing-1", Log: quietLog(), TLS: ordersTLS}); !errors.As(err, &ke) || ke.Field != "id" {
		t.Fatalf("a bound orders worker with the id billing-1: %v, want an error on id", err)
	}
	rec := newRecorder()
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "orders", Log: quietLog(), OnRun: rec.onRun, TLS: ordersTLS})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { return nil })
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clientTLS := issueRole(t, ca, "client", cluster.RoleClient)
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog(), TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	j, err := c.Create(ctx, once(50))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the orders job to run at the bound worker", func() bool {
		runs, err := c.Runs(ctx, "orders", j.Id, 10)
		return err == nil && len(runs) == 1 && runs[0].Outcome == messages.Outcome_SUCCEEDED
	})
	b, err := c.Create(ctx, &messages.Job{App: "billing", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 3_600_000}})
	if err != nil {
		t.Fatal(err)
	}

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS.HTTPClientConfig()}, Timeout: 10 * time.Second}
	sys, stop, err := cluster.RawEndpoint(ordersTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	hb := &messages.WorkerHeartbeat{SentMs: time.Now().UnixMilli(), Worker: &messages.WorkerInfo{WorkerId: "thief", App: "billing",
		Ref: &messages.Ref{Address: sys.Address(), Id: "kjob-worker"}, Capacity: 4}}
	for _, tc := range []struct {
		what string
		m    any
	}{
		{"a heartbeat for billing", hb},
		{"a goodbye for billing", &messages.WorkerLeft{WorkerId: "billing-1", App: "billing"}},
		// Under an orders app, with billing's worker's id: the NameServer keeps
		// workers by id, so it would replace (and a goodbye then remove) billing-1.
		{"a heartbeat with billing's worker's id", &messages.WorkerHeartbeat{SentMs: time.Now().UnixMilli(), Worker: &messages.WorkerInfo{
			WorkerId: "billing-1", App: "orders", Ref: &messages.Ref{Address: sys.Address(), Id: "kjob-worker"}, Capacity: 4}}},
		{"a goodbye with billing's worker's id", &messages.WorkerLeft{WorkerId: "billing-1", App: "orders"}},
		{"a result for billing's shard", &messages.RunResults{Results: []*messages.RunResult{
			{RunId: "a", Shard: "orders/0/0"}, {RunId: strconv.FormatInt(b.Id, 10) + ":1", JobId: b.Id, Shard: "billing/0/0", Outcome: messages.Outcome_SUCCEEDED}}}},
		// A result that names an orders shard, sent to billing's shard actor.
		{"a result sent to billing's shard actor", &messages.RunResult{RunId: strconv.FormatInt(b.Id, 10) + ":1", JobId: b.Id,
			Shard: "orders/0/0", Outcome: messages.Outcome_SUCCEEDED}},
	} {
		was := scrape(t, n, hc, "https", "kjob_tls_refused_total")
		to := actor.NewPID(n.Address(), server.Name)
		if strings.HasSuffix(tc.what, "shard actor") {
			to = actor.NewPID(n.Address(), server.Name+"/"+server.ShardName("billing/0/0"))
		}
		if r, err := sys.Root.RequestFuture(to, tc.m, time.Second).Result(); err == nil {
			t.Fatalf("%s with an orders worker's certificate: answered %v", tc.what, r)
		}
		waitFor(t, 5*time.Second, tc.what+" to be counted", func() bool { return scrape(t, n, hc, "https", "kjob_tls_refused_total") > was })
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.Apps {
		if a.App == "billing" && a.Workers != 0 {
			t.Fatalf("billing has %d workers registered, want none", a.Workers)
		}
	}
	// Its own app's heartbeat, from the same endpoint, is heard.
	hb.Worker.App, hb.Worker.WorkerId = "orders", "orders-2"
	if r, err := sys.Root.RequestFuture(actor.NewPID(n.Address(), server.Name), hb, 5*time.Second).Result(); err != nil {
		t.Fatalf("an orders heartbeat with an orders worker's certificate: %v", err)
	} else if pong, _ := r.(*messages.Pong); pong == nil || pong.Error != nil {
		t.Fatalf("an orders heartbeat with an orders worker's certificate: %v", r)
	}
}
