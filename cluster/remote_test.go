package cluster

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestStreamWaitsForPeer opens a stream, the way proto.actor's endpoint writer
// does (a background context, a fail-fast call), to an address where nothing
// listens yet, and starts the server a moment later: with awaitReady the stream
// opens once the server is up, instead of failing at once, which made
// proto.actor sleep 2 s before its next attempt. It fails without awaitReady.
func TestStreamWaitsForPeer(t *testing.T) {
	addr := freedAddr(t) // nothing listens there now

	conn := dialFreed(t, addr)

	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	defer srv.Stop()
	started := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // well inside connectWait
		l, err := net.Listen("tcp", addr)
		started <- err
		if err == nil {
			srv.Serve(l)
		}
	}()

	stream, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		if lerr := <-started; lerr != nil {
			t.Skipf("the port was taken meanwhile: %v", lerr)
		}
		t.Fatalf("stream to a peer that came up within connectWait: %v", err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("Recv: %v", err)
	}
}

// TestStreamToAbsentPeerFails checks that the wait is bounded: with nothing ever
// listening, the stream fails (after connectWait), as proto.actor expects.
func TestStreamToAbsentPeerFails(t *testing.T) {
	addr := freedAddr(t)
	conn := dialFreed(t, addr)
	done := make(chan error, 1)
	go func() {
		_, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a stream to an address nobody listens on opened")
		}
	case <-time.After(time.Minute):
		t.Fatal("the stream to an absent peer did not fail within a minute")
	}
}

// freedAddr is a loopback address nothing listens on (a port just given back).
func freedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// dialFreed dials addr with kjob's reconnect options, as an endpoint writer does.
func dialFreed(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.Dial(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		reconnectOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
