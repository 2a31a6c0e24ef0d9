package cluster

import (
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
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

// remoteConfig is the remote configuration of every kjob endpoint.
func remoteConfig(host string, port int) *remote.Config {
	return remote.Configure(host, port,
		remote.WithEndpointWriterQueueSize(endpointQueueSize),
		remote.WithServerOptions(grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.RecvBufferPool(recvBuffers)),
		remote.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithRecvBufferPool(recvBuffers),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))))
}
