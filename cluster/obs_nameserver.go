package cluster

import (
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/messages"
)

// maxTrackedWorkers bounds the heartbeat bookkeeping of the NameServer observer; a
// worker beyond it is counted but its gaps are not.
const maxTrackedWorkers = 1 << 16

// nsObserver derives the NameServer's figures from its mailbox (receiver middleware)
// and from what it sends (sender middleware), so its core stays untouched. Only the
// node currently hosting the NameServer reports them (kjob_nameserver_active = 1):
// sum over nodes in queries.
//
//   - heartbeats: counted as they arrive; a gap of n heartbeat intervals between two
//     heartbeats of one worker counts n-1 missed; a worker that expires counts the
//     intervals since its last heartbeat as missed, and one expiry.
//   - expiry: a worker that vanishes from a route table push without having said
//     goodbye (WorkerLeft) was expired by the NameServer's tick.
//   - moves and splits: diffs between successive pushes (owner server changed; a new
//     shard at level > 0, counted once per pair).
type nsObserver struct {
	mu        sync.Mutex
	active    prometheus.Gauge
	decisions *prometheus.CounterVec
	pushes    prometheus.Counter
	moves     prometheus.Counter
	splits    prometheus.Counter
	serverHB  prometheus.Counter
	workerHB  *prometheus.CounterVec
	missed    *prometheus.CounterVec
	expired   *prometheus.CounterVec
	left      *prometheus.CounterVec

	seen     map[string]seenWorker // worker id → last heartbeat
	gone     map[string]bool       // workers that said goodbye since the last push
	version  int64
	routes   map[string]string // shard → server id, as of the last push
	inTable  map[string]string // worker id → app, as of the last push
	havePush bool
}

type seenWorker struct {
	app string
	at  time.Time
}

func newNSObserver(f factory) *nsObserver {
	return &nsObserver{
		active: f.gauge("kjob_nameserver_active", "1 on the node currently hosting the NameServer."),
		decisions: f.counterVec("kjob_nameserver_decisions_total",
			"Decisions of the NameServer: place = a shard assigned to a server.", "decision"),
		pushes:   f.counter("kjob_nameserver_route_pushes_total", "Route table versions the NameServer pushed to servers."),
		moves:    f.counter("kjob_shard_moves_total", "Shards whose owner server changed, as seen in the NameServer's pushes."),
		splits:   f.counter("kjob_shard_splits_total", "Shards split into two, as seen in the NameServer's pushes."),
		serverHB: f.counter("kjob_server_heartbeats_total", "Server heartbeats received by the NameServer."),
		workerHB: f.counterVec("kjob_worker_heartbeats_total", "Worker heartbeats received by the NameServer.", "app"),
		missed: f.counterVec("kjob_worker_heartbeats_missed_total",
			"Worker heartbeat intervals that passed without a heartbeat (gaps and expiries).", "app"),
		expired: f.counterVec("kjob_workers_expired_total", "Workers the NameServer dropped for silence.", "app"),
		left:    f.counterVec("kjob_workers_left_total", "Workers that said goodbye.", "app"),
		seen:    map[string]seenWorker{}, gone: map[string]bool{}, routes: map[string]string{}, inTable: map[string]string{},
	}
}

// props adds the observer to the NameServer's props.
func (o *nsObserver) props(p *actor.Props) *actor.Props {
	return p.Configure(actor.WithReceiverMiddleware(o.receive), actor.WithSenderMiddleware(o.send))
}

func (o *nsObserver) receive(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		o.mu.Lock()
		switch x := env.Message.(type) {
		case *actor.Started: // a fresh NameServer rebuilds from heartbeats, and so do we
			o.active.Set(1)
			o.seen, o.gone, o.routes, o.inTable = map[string]seenWorker{}, map[string]bool{}, map[string]string{}, map[string]string{}
			o.version, o.havePush = 0, false
		case *actor.Stopping, *actor.Stopped:
			o.active.Set(0)
		case *messages.ServerHeartbeat:
			o.serverHB.Inc()
		case *messages.WorkerHeartbeat:
			if nscore.Check(x) == nil { // what the NameServer refuses is not counted (nor its app a label)
				o.heartbeat(x.Worker.GetWorkerId(), x.Worker.GetApp(), time.Now())
			}
		case *messages.WorkerLeft:
			if nscore.Check(x) != nil {
				break
			}
			o.left.WithLabelValues(x.App).Inc()
			delete(o.seen, x.WorkerId)
			o.gone[x.WorkerId] = true
		}
		o.mu.Unlock()
		next(c, env)
	}
}

func (o *nsObserver) heartbeat(id, app string, now time.Time) {
	o.workerHB.WithLabelValues(app).Inc()
	hb := time.Duration(nscore.HeartbeatMs) * time.Millisecond
	if s, ok := o.seen[id]; ok {
		if n := int((now.Sub(s.at) + hb/2) / hb); n > 1 {
			o.missed.WithLabelValues(app).Add(float64(n - 1))
		}
	}
	if _, ok := o.seen[id]; ok || len(o.seen) < maxTrackedWorkers {
		o.seen[id] = seenWorker{app: app, at: now}
	}
	delete(o.gone, id)
}

func (o *nsObserver) send(next actor.SenderFunc) actor.SenderFunc {
	return func(c actor.SenderContext, target *actor.PID, env *actor.MessageEnvelope) {
		switch x := env.Message.(type) {
		case *messages.AssignShard:
			o.decisions.WithLabelValues("place").Inc()
		case *messages.MoveShard:
			if x.Split {
				o.decisions.WithLabelValues("split").Inc()
			} else {
				o.decisions.WithLabelValues("move").Inc()
			}
		case *messages.RouteTable:
			// A push goes to server actors while handling a heartbeat, a goodbye or a
			// tick; replies to pulls (GetRoutes, Subscribe) are not pushes.
			switch c.Message().(type) {
			case *messages.GetRoutes, *messages.Subscribe:
			default:
				if target != nil && target.Id == server.Name {
					o.push(x, time.Now())
				}
			}
		}
		next(c, target, env)
	}
}

// push diffs a full route table against the previous one (once per version).
func (o *nsObserver) push(t *messages.RouteTable, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if t.Version <= o.version {
		return
	}
	o.version = t.Version
	o.pushes.Inc()
	routes := make(map[string]string, len(t.Routes))
	for _, r := range t.Routes {
		routes[r.Shard] = r.ServerId
		prev, ok := o.routes[r.Shard]
		switch {
		case ok && prev != r.ServerId && o.havePush:
			o.moves.Inc()
		case !ok && o.havePush && r.Level > 0 && r.Index%2 == 0:
			if _, parent := o.routes[route.Shard{App: r.App, Level: int(r.Level) - 1, Index: r.Index / 2}.String()]; parent {
				o.splits.Inc()
			}
		}
	}
	workers := map[string]string{}
	for _, a := range t.Apps {
		for _, w := range a.Workers {
			workers[w.WorkerId] = a.App
		}
	}
	hb := time.Duration(nscore.HeartbeatMs) * time.Millisecond
	for id, app := range o.inTable {
		if _, still := workers[id]; still || o.gone[id] {
			continue
		}
		o.expired.WithLabelValues(app).Inc()
		if s, ok := o.seen[id]; ok {
			if n := int(now.Sub(s.at) / hb); n > 0 {
				o.missed.WithLabelValues(app).Add(float64(n))
			}
		}
		delete(o.seen, id)
	}
	o.routes, o.inTable, o.havePush = routes, workers, true
	clear(o.gone)
}
