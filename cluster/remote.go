package cluster

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// MaxMessageBytes is the largest message a kjob endpoint (node, client, worker)
// accepts over proto.actor's remote: gRPC's default is 4 MiB, which a shard's handoff
// import (its whole snapshot), a list of jobs with large params or a batch of
// dispatches can pass. It covers the journal's largest record (64 MiB), since an
// import is persisted as one record.
const MaxMessageBytes = 96 << 20

// endpointQueueSize is the initial capacity of the queue in front of each remote
// endpoint's writer. proto.actor's default is 1,000,000 slots (16 MB per peer,
// resident once traffic has gone round the ring); the queue doubles when full, so a
// small start loses nothing and costs a peer 256 KiB.
const endpointQueueSize = 1 << 14

// recvBuffers is the pool gRPC reads messages into, on both ends of every kjob
// connection: without one it allocates a buffer per message received (0.17 GB in the
// fire scenario, 7 % of what the process allocated). The decoded messages do not
// alias it (protobuf's Unmarshal copies bytes and strings).
var recvBuffers = grpc.NewSharedBufferPool()

// remoteConfig is the remote configuration of every kjob endpoint: with t, mutual
// TLS on its listener and its dials (TLS), else plain connections; g checks what
// peers send it (roles.go).
func remoteConfig(host string, port int, t *TLS, g *roleGuard) *remote.Config {
	serverOpts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.RecvBufferPool(recvBuffers)}
	creds := insecure.NewCredentials()
	serverOpts = append(serverOpts, grpc.StreamInterceptor(g.stream), grpc.UnaryInterceptor(g.unary))
	if t != nil {
		serverOpts = append(serverOpts, grpc.Creds(t.serverCreds()))
		creds = t.dialCreds()
	}
	return remote.Configure(host, port,
		remote.WithEndpointWriterQueueSize(endpointQueueSize),
		remote.WithServerOptions(serverOpts...),
		remote.WithDialOptions(append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
			grpc.WithRecvBufferPool(recvBuffers),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))},
			reconnectOptions()...)...))
}

// reconnectOptions are the dial options that make a connection attempt wait for
// its peer (see connectWait).
func reconnectOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: connectBackoff, MinConnectTimeout: connectWait}),
		grpc.WithStreamInterceptor(awaitReady),
	}
}

// connectWait is how long an endpoint's connection attempt waits for its peer to
// become reachable. proto.actor's endpoint writer makes one attempt, and when it
// fails, sleeps a fixed 2 s before the next (5 attempts, then it drops the
// endpoint and what was queued for it). A peer that restarts (a node recovering
// its journal, a worker redeployed) is back within a second or so, and every
// client and worker that sent it anything while it was down waited out the rest
// of that 2 s sleep: the first due job fired 1.98 s after a recovered node's
// StartNode, which took 0.73 s. Waiting inside the attempt, gRPC retries the
// connection every connectBackoff (at most 250 ms apart), so the endpoint
// connects soon after the peer is up. A peer that stays down costs each attempt
// connectWait more: it is dropped after about 20 s instead of 10.
const connectWait = 2 * time.Second

// connectBackoff is gRPC's reconnection back-off within one attempt: fast
// (loopback and LAN peers refuse or accept at once), capped at 250 ms.
var connectBackoff = backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond}

// awaitReady, a stream interceptor (proto.actor's endpoint writer opens its one
// stream, Remoting/Receive, with a background context and gRPC's default fail-fast
// call), waits up to connectWait for the connection to be ready, connecting it if
// it is idle, then opens the stream. If the peer is not reachable by then, the
// stream fails as it would have at once.
func awaitReady(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	wait, cancel := context.WithTimeout(ctx, connectWait)
	defer cancel()
	for s := cc.GetState(); s != connectivity.Ready && s != connectivity.Shutdown; s = cc.GetState() {
		if s == connectivity.Idle {
			cc.Connect()
		}
		if !cc.WaitForStateChange(wait, s) {
			break
		}
	}
	return streamer(ctx, desc, cc, method, opts...)
}
