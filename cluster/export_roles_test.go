package cluster

import (
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
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
