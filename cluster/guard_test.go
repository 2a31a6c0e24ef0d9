package cluster_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// scrape is a counter of the node's /metrics (plain HTTP).
func scrape(t *testing.T, n *cluster.Node, hc *http.Client, scheme, name string) float64 {
	t.Helper()
	resp, err := hc.Get(scheme + "://" + n.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// TestMalformedBatchesDoNotStopTheNode: proto.actor's endpoint reader indexes a
// batch's targets, senders and serializers unchecked, decodes an unknown type name
// through a nil lookup, and its diagnostic calls panic, all on goroutines nothing
// recovers: each stopped the whole node. A batch it cannot take now ends only its
// own stream (counted), a message of an unknown type is dropped and the rest of its
// batch delivered, and the diagnostic calls are refused; the node serves on.
func TestMalformedBatchesDoNotStopTheNode(t *testing.T) {
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog(), HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ping, _ := proto.Marshal(&messages.Ping{})
	self := []*actor.PID{{Address: n.Address(), Id: server.Name}}
	for _, tc := range []struct {
		what string
		b    *remote.MessageBatch
	}{
		{"a target out of range", &remote.MessageBatch{TypeNames: []string{"kjob.v1.Ping"}, Targets: self,
			Envelopes: []*remote.MessageEnvelope{{TypeId: 0, MessageData: ping, Target: 3}}}},
		{"a sender out of range", &remote.MessageBatch{TypeNames: []string{"kjob.v1.Ping"}, Targets: self,
			Envelopes: []*remote.MessageEnvelope{{TypeId: 0, MessageData: ping, Sender: 2}}}},
		{"a type out of range", &remote.MessageBatch{TypeNames: []string{"kjob.v1.Ping"}, Targets: self,
			Envelopes: []*remote.MessageEnvelope{{TypeId: 1, MessageData: ping}}}},
		{"a serializer out of range", &remote.MessageBatch{TypeNames: []string{"kjob.v1.Ping"}, Targets: self,
			Envelopes: []*remote.MessageEnvelope{{TypeId: 0, MessageData: ping, SerializerId: 7}}}},
	} {
		was := scrape(t, n, http.DefaultClient, "http", "kjob_remote_malformed_batches_total")
		if err := cluster.RawBatch(n.Address(), nil, tc.b, 2*time.Second); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: the stream ended with %v, want InvalidArgument", tc.what, err)
		}
		if got := scrape(t, n, http.DefaultClient, "http", "kjob_remote_malformed_batches_total"); got != was+1 {
			t.Fatalf("%s: kjob_remote_malformed_batches_total %v, want %v", tc.what, got, was+1)
		}
	}

	// An unknown type beside a known one: the known one is delivered (a create
	// through the server actor, whose job then exists), the unknown one dropped.
	create, _ := proto.Marshal(&messages.CreateJob{Job: &messages.Job{Id: 4242, App: "orders", Handler: "echo",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 3_600_000}}, RequestId: 77})
	route, err := c.Create(ctx, once(3_600_000)) // the app's shard exists and is routed
	if err != nil {
		t.Fatal(err)
	}
	shardPID := actor.NewPID(n.Address(), server.Name+"/"+server.ShardName("orders/0/0"))
	was := scrape(t, n, http.DefaultClient, "http", "kjob_remote_unknown_messages_total")
	if err := cluster.RawBatch(n.Address(), nil, &remote.MessageBatch{TypeNames: []string{"kjob.v9.FromTheFuture", "kjob.v1.CreateJob"},
		Targets: []*actor.PID{shardPID}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, MessageData: []byte{8, 1}}, {TypeId: 1, MessageData: create}}},
		time.Second); err != nil {
		t.Fatalf("a batch with an unknown type: the stream ended with %v", err)
	}
	if got := scrape(t, n, http.DefaultClient, "http", "kjob_remote_unknown_messages_total"); got != was+1 {
		t.Fatalf("kjob_remote_unknown_messages_total %v, want %v", got, was+1)
	}
	waitFor(t, 10*time.Second, "the batch's create to be applied", func() bool {
		after, _, err := c.List(ctx, "orders", cluster.ListOptions{})
		return err == nil && len(after) == 2
	})

	// proto.actor's diagnostic calls panicked ("implement me").
	conn, err := grpc.Dial(n.Address(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := remote.NewRemotingClient(conn).ListProcesses(ctx, &remote.ListProcessesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListProcesses: %v, want Unimplemented", err)
	}
	if _, err := remote.NewRemotingClient(conn).GetProcessDiagnostics(ctx, &remote.GetProcessDiagnosticsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("GetProcessDiagnostics: %v, want Unimplemented", err)
	}
	if _, err := c.Get(ctx, "orders", route.Id); err != nil {
		t.Fatalf("the node after all that: %v", err)
	}
}

// TestRestrictedPeerCannotRelay: a target at another address is sent on by
// proto.actor with the node's own certificate; a client's certificate may not use
// the node so, to reach a worker (which hears from servers only) or anywhere else.
func TestRestrictedPeerCannotRelay(t *testing.T) {
	ca, err := cluster.NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	n := tlsNode(t, ca)
	clientTLS := issueRole(t, ca, "client", cluster.RoleClient)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS.HTTPClientConfig()}, Timeout: 10 * time.Second}
	ping, _ := proto.Marshal(&messages.Ping{})
	was := scrape(t, n, hc, "https", "kjob_tls_refused_total")
	err = cluster.RawBatch(n.Address(), clientTLS, &remote.MessageBatch{TypeNames: []string{"kjob.v1.Ping"},
		Targets: []*actor.PID{{Address: "127.0.0.1:9", Id: "kjob-worker"}}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, MessageData: ping}}}, 2*time.Second)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a relay with a client's certificate: the stream ended with %v, want PermissionDenied", err)
	}
	if got := scrape(t, n, hc, "https", "kjob_tls_refused_total"); got != was+1 {
		t.Fatalf("kjob_tls_refused_total %v, want %v", got, was+1)
	}
	// The same batch to the node itself is taken.
	if err := cluster.RawBatch(n.Address(), clientTLS, &remote.MessageBatch{TypeNames: []string{"kjob.v1.Ping"},
		Targets: []*actor.PID{{Address: n.Address(), Id: server.Name}}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, MessageData: ping}}}, time.Second); err != nil {
		t.Fatalf("a ping of the node with a client's certificate: the stream ended with %v", err)
	}
}

// A role spelled otherwise than kjob tls issue spells it is no role a peer takes,
// not none (which would be any).
func TestRoleOfOddSpellings(t *testing.T) {
	ca, err := cluster.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := func(ous ...string) *x509.Certificate {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "x", OrganizationalUnit: ous},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, ca.Cert.PublicKey, ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		ous  []string
		role cluster.Role
		ok   bool
	}{
		{nil, cluster.RoleAny, true},
		{[]string{"ops"}, cluster.RoleAny, true},
		{[]string{"kjob-role=worker"}, cluster.RoleWorker, true},
		{[]string{"ops", "kjob-role=client"}, cluster.RoleClient, true},
		{[]string{"kjob-role="}, "", false},
		{[]string{"kjob-role=client", "kjob-role=client"}, "", false},
		{[]string{"kjob-role=client", "kjob-role=worker"}, "", false},
		{[]string{"kjob-role=Client"}, "", false},
		{[]string{"kjob-role= worker"}, "", false},
		{[]string{"KJOB-ROLE=client"}, "", false},
		{[]string{" kjob-role=worker"}, "", false},
		{[]string{"kjob-role=root"}, "", false},
	} {
		if r, ok := cluster.RoleOf(cert(tc.ous...)); r != tc.role || ok != tc.ok {
			t.Errorf("OUs %q: role %q %v, want %q %v", tc.ous, r, ok, tc.role, tc.ok)
		}
	}
}
