package cluster

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// RawEndpoint is an actor system on the remote with t, as a client (or, for a
// worker's certificate, a worker) would have, without the client's or worker's
// actors: tests send it whatever a hostile peer with that certificate could.
func RawEndpoint(t *TLS) (*actor.ActorSystem, func(), error) {
	kind := kindClient
	if r, _ := RoleOf(t.Leaf()); r == RoleWorker {
		kind = kindWorker
	}
	sys, rem, err := newSystem(slog.New(slog.DiscardHandler), "127.0.0.1:0", 0, t, kind)
	if err != nil {
		return nil, nil, err
	}
	return sys, func() { rem.Shutdown(false) }, nil
}

// PID is the worker actor's (where servers send dispatches).
func (w *Worker) PID() *actor.PID { return w.pid }

// RawBatch opens proto.actor's stream to addr (with t, or plain), says who it is
// as proto.actor's endpoint writer does, and sends b: the error the endpoint ended
// the stream with, or nil if it was still open after wait.
func RawBatch(addr string, t *TLS, b *remote.MessageBatch, wait time.Duration) error {
	creds := insecure.NewCredentials()
	if t != nil {
		creds = t.dialCreds()
	}
	conn, err := grpc.Dial(addr, grpc.WithTransportCredentials(creds)) // (gRPC 1.60: no NewClient)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := remote.NewRemotingClient(conn).Receive(ctx)
	if err != nil {
		return err
	}
	hello := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "raw", Address: "127.0.0.1:1"}}}}}
	if err := st.Send(hello); err != nil {
		return err
	}
	if err := st.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}); err != nil {
		return err
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if err == nil {
			err = errors.New("stream ended")
		}
		return err
	case <-time.After(wait):
		return nil
	}
}
