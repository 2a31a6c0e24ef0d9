package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kjob/kjob/actors/dispatch"
	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/actors/worker"
	workercore "github.com/kjob/kjob/actors/worker/core"
	"github.com/kjob/kjob/messages"
)

// Run is what a handler receives (see worker.Run).
type Run = worker.Run

// HandlerFunc handles one run.
type HandlerFunc = worker.HandlerFunc

// Traceparent returns the W3C traceparent of the run a handler's context belongs to.
func Traceparent(ctx context.Context) string { return worker.Traceparent(ctx) }

// WorkerConfig configures a worker.
type WorkerConfig struct {
	Servers  []string
	App      string
	ID       string // default: a fresh unique id; at most nscore.MaxWorkerIDLen bytes of UTF-8, no control character
	Capacity int    // handler pool size; 0 = the default, 64; at most nscore.MaxWorkerCapacity
	Listen   string // default 127.0.0.1:0
	Log      *slog.Logger
	// ActorLogLevel is the level from which proto.actor's own logs pass (default WARN).
	ActorLogLevel slog.Level
	// OnRun, if set, is called after each executed run with its result.
	OnRun func(r *Run, res *messages.RunResult)
	// TLS, if set, is the cluster's mutual TLS (LoadTLS): required when the
	// servers run with it.
	TLS *TLS
}

// Worker runs handlers for one app. Register handlers with HandleFunc, then Start.
type Worker struct {
	cfg      WorkerConfig
	handlers map[string]HandlerFunc
	system   *actor.ActorSystem
	rem      *remote.Remote
	pid      *actor.PID
	shell    *worker.Actor
	stop     chan struct{}
	wg       sync.WaitGroup
	next     int
	started  bool
	// cancelProbe ends a TLS probe of the heartbeat loop (Start) at Stop.
	cancelProbe context.CancelFunc
}

// NewWorker makes a worker for cfg.App.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	if len(cfg.Servers) == 0 {
		return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "servers", Message: "at least one server address is required"}
	}
	if why := route.ValidApp(cfg.App); why != "" {
		return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "app", Message: why}
	}
	if err := checkWorkerApp(cfg.TLS, cfg.App, cfg.ID); err != nil {
		return nil, err
	}
	// The NameServer refuses a heartbeat out of these limits (nscore.ValidWorker):
	// say so here, rather than start a worker no shard would ever hear of.
	if cfg.Capacity < 0 || cfg.Capacity > nscore.MaxWorkerCapacity {
		return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "capacity",
			Message: fmt.Sprintf("must be 0 (the default, %d) to %d, got %d", workercore.DefaultCapacity, nscore.MaxWorkerCapacity, cfg.Capacity)}
	}
	if cfg.ID != "" { // "" = a fresh one, of the app's name and the actor system's id
		if why := nscore.ValidWorkerID(cfg.ID); why != "" {
			return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "id", Message: why}
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return &Worker{cfg: cfg, handlers: map[string]HandlerFunc{}, stop: make(chan struct{})}, nil
}

// HandleFunc registers the handler for name, like http.HandleFunc. Register all
// handlers before Start.
func (w *Worker) HandleFunc(name string, h HandlerFunc) {
	if w.started {
		panic("kjob: HandleFunc after Start")
	}
	w.handlers[name] = h
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Start connects the worker and begins heartbeating; dispatches arrive from then on.
func (w *Worker) Start() error {
	sys, rem, err := newSystem(w.cfg.Log, w.cfg.Listen, w.cfg.ActorLogLevel, w.cfg.TLS, kindWorker)
	if err != nil {
		return err
	}
	w.system, w.rem = sys, rem
	if w.cfg.ID == "" {
		w.cfg.ID = fmt.Sprintf("%s-%s", w.cfg.App, sys.ID)
	}
	w.shell = worker.NewActor(w.cfg.ID, w.cfg.Capacity, w.handlers, w.cfg.Log, w.cfg.OnRun)
	w.pid, err = sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return w.shell }, actor.WithDispatcher(dispatch.Shared), actor.WithMailbox(dispatch.Mailbox)), "kjob-worker")
	if err != nil {
		return err
	}
	w.started = true
	registered := w.heartbeat()
	w.wg.Add(1)
	ctx, cancel := context.WithCancel(context.Background()) // the TLS probes'
	w.cancelProbe = cancel
	go func() {
		defer w.wg.Done()
		// A worker that cannot register may have a TLS setting that differs
		// from the servers': it looks (once a server is reachable) and says so,
		// loudly, once.
		probed := false
		probe := func() {
			if registered || probed {
				return
			}
			var err error
			if err, probed = probeTLS(ctx, w.cfg.Servers, w.cfg.TLS); err != nil {
				w.cfg.Log.Error("kjob worker: cannot register: TLS differs from the server's; this worker gets no dispatches", "worker", w.cfg.ID, "err", err)
			}
		}
		probe()
		expiry := &expiryWarner{t: w.cfg.TLS, log: w.cfg.Log, what: "worker " + w.cfg.ID}
		expiry.check(time.Now())
		every := nscore.HeartbeatMs * time.Millisecond
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			if !registered {
				// Not registered (no server up, or none with a NameServer yet, as
				// after a restart): try again soon, so the shards learn of this
				// worker as soon as a NameServer does, not a heartbeat later.
				t.Reset(heartbeatRetry)
			} else {
				t.Reset(every)
			}
			select {
			case <-w.stop:
				return
			case now := <-t.C:
				registered = w.heartbeat()
				probe()
				expiry.check(now)
			}
		}
	}()
	return nil
}

// WorkerStats is what a worker has in hand (see Worker.Stats).
type WorkerStats = worker.Stats

// Stats reports the worker's handlers running, dispatches queued and results not
// yet acknowledged by their shards.
func (w *Worker) Stats(timeout time.Duration) (WorkerStats, error) {
	if !w.started {
		return WorkerStats{}, &kerr.Error{Code: messages.Code_UNAVAILABLE, Message: "worker not started"}
	}
	r, err := w.system.Root.RequestFuture(w.pid, &worker.StatsRequest{}, timeout).Result()
	if err != nil {
		return WorkerStats{}, err
	}
	return r.(WorkerStats), nil
}

// heartbeatRetry is how soon a worker heartbeats again when its last heartbeat
// reached no NameServer.
const heartbeatRetry = 100 * time.Millisecond

// heartbeat registers with the NameServer through one of the servers, moving on to
// the next address when one does not answer. It says whether a NameServer
// acknowledged it.
func (w *Worker) heartbeat() bool {
	hb := &messages.WorkerHeartbeat{SentMs: time.Now().UnixMilli(), Worker: &messages.WorkerInfo{
		WorkerId: w.cfg.ID, App: w.cfg.App, Ref: &messages.Ref{Address: w.pid.Address, Id: w.pid.Id},
		Capacity: int32(w.shell.Core().Capacity())}}
	for range w.cfg.Servers {
		addr := w.cfg.Servers[w.next%len(w.cfg.Servers)]
		// The server forwards to the NameServer, which answers; a server without
		// one yet answers an empty Pong.
		pid := actor.NewPID(addr, server.Name)
		r, err := w.system.Root.RequestFuture(pid, hb, 500*time.Millisecond).Result()
		if err == nil {
			p, _ := r.(*messages.Pong)
			if e := kerr.FromWire(p.GetError()); e != nil {
				// Refused (NewWorker checks the same limits, so only a server of
				// another version would): asking again sooner would not help.
				w.cfg.Log.Warn("kjob worker: heartbeat refused; this worker gets no dispatches", "worker", w.cfg.ID, "err", e)
			}
			return p.GetServerId() != ""
		}
		w.next++
	}
	return false
}

// Stop says goodbye to the NameServer and stops the worker; running handlers are
// not waited for (their runs are re-dispatched by the shard after the timeout).
func (w *Worker) Stop() {
	if !w.started {
		return
	}
	select {
	case <-w.stop:
		return
	default:
		close(w.stop)
	}
	w.cancelProbe()
	w.wg.Wait()
	addr := w.cfg.Servers[w.next%len(w.cfg.Servers)]
	w.system.Root.Send(actor.NewPID(addr, server.Name), &messages.WorkerLeft{WorkerId: w.cfg.ID, App: w.cfg.App})
	time.Sleep(50 * time.Millisecond)
	w.rem.Shutdown(false)
	w.system.Shutdown()
}
