// Package cluster starts kjob nodes and connects clients and workers to them. It is
// the public Go API of kjob: Node (a `kjob server`), Client and Worker.
//
// A node is a proto.actor cluster member (remote over gRPC, membership from a static
// peer list polled over the remote itself, so no external service is needed). It
// hosts the server actor and its shards, and may host the NameServer, a cluster kind
// with one fixed identity placed by the cluster's rendezvous hash: when its member is
// lost another member activates it, and it rebuilds from heartbeats.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/nameserver"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/actors/shard"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// ClusterName is the proto.actor cluster name every kjob member uses.
const ClusterName = "kjob"

// NodeConfig configures a node.
type NodeConfig struct {
	Listen  string   // host:port of the proto.actor remote; default 127.0.0.1:7070
	Peers   []string // remote addresses of every server in the cluster (self included); empty = single node
	DataDir string   // journal directory; default ./kjob-data
	Sync    persistence.SyncPolicy
	// SegmentSizeBytes of the journal (0 = the journal's default).
	SegmentSizeBytes int64
	Log              *slog.Logger
	// ActorLogLevel is the level at which proto.actor's own logs are let through (default WARN).
	ActorLogLevel slog.Level
	Shard         shardcore.Config // defaults for new shards (Shard and Self are filled in)
	// AlertHooks are called for each new dead letter (e.g. shard.Webhook).
	AlertHooks []shard.AlertHook
	// HTTP is the address of the admin API and /metrics ("" = none).
	HTTP string
	// Split sets when the NameServer (while on this node) splits a shard: more live
	// workers per shard of an app than Workers, or more fires a minute than Fires
	// (zero: the defaults, 500 and 300,000; negative: never).
	Split nscore.SplitPolicy
}

// Node is a running kjob server.
type Node struct {
	cfg     NodeConfig
	system  *actor.ActorSystem
	cl      *pcluster.Cluster
	journal *persistence.Journal
	server  *actor.PID
	actor   *server.Actor
	ns      atomic.Pointer[actor.PID]
	stop    chan struct{}
	wg      sync.WaitGroup
	log     *slog.Logger
	closed  atomic.Bool
	report  persistence.RecoveryReport
	started time.Time
	metrics *nodeMetrics // metrics.go
	admin   *admin       // admin.go; nil without NodeConfig.HTTP
}

// actorLogger routes proto.actor's slog output into ours at or above level.
func actorLogger(log *slog.Logger, level slog.Level) func(*actor.ActorSystem) *slog.Logger {
	return func(*actor.ActorSystem) *slog.Logger {
		return slog.New(levelHandler{level: level, h: log.Handler()}).With("component", "protoactor")
	}
}

type levelHandler struct {
	level slog.Level
	h     slog.Handler
}

func (l levelHandler) Enabled(_ context.Context, lv slog.Level) bool { return lv >= l.level }
func (l levelHandler) Handle(ctx context.Context, r slog.Record) error {
	return l.h.Handle(ctx, r)
}
func (l levelHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return levelHandler{l.level, l.h.WithAttrs(a)}
}
func (l levelHandler) WithGroup(n string) slog.Handler {
	return levelHandler{l.level, l.h.WithGroup(n)}
}

func splitHostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: %w", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: bad port", addr)
	}
	return h, n, nil
}

// StartNode opens the journal, recovers every shard it holds, and joins the cluster.
func StartNode(cfg NodeConfig) (*Node, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:7070"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "kjob-data"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if cfg.ActorLogLevel == 0 {
		cfg.ActorLogLevel = slog.LevelWarn
	}
	host, port, err := splitHostPort(cfg.Listen)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, stop: make(chan struct{}), log: cfg.Log, started: time.Now()}
	n.metrics = newMetrics(n)
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	n.journal, err = persistence.Open(persistence.Options{Dir: cfg.DataDir, Sync: cfg.Sync,
		SegmentSizeBytes: cfg.SegmentSizeBytes, Logger: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("open journal in %s: %w", cfg.DataDir, err)
	}
	n.report = n.journal.Report()
	recovered, err := n.recover()
	if err != nil {
		_ = n.journal.Close()
		return nil, err
	}

	n.system = actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(actorLogger(cfg.Log, cfg.ActorLogLevel))))
	rcfg := remoteConfig(host, port)
	peers := cfg.Peers
	if len(peers) == 0 {
		peers = []string{cfg.Listen}
	}
	self := cfg.Listen
	n.actor = server.New(server.Deps{
		ServerID: n.system.ID, Journal: n.metrics.journal(n.journal), Log: cfg.Log, Metrics: n.metrics,
		NameServer: func() *actor.PID { return n.ns.Load() },
		NewCore:    n.newCore,
		Alerts:     cfg.AlertHooks,
	}, recovered)
	// The NameServer places a new app only while every configured peer reports (see
	// nameserver/core SetMembers); a single node (no peers) is its own only member.
	provider := newPeerProvider(self, peers, cfg.Log)
	ccfg := pcluster.Configure(ClusterName, provider, disthash.New(), rcfg,
		pcluster.WithKinds(pcluster.NewKind(nameserver.Kind, n.metrics.ns.props(nameserver.Props(nil, cfg.Peers, cfg.Split)))))
	n.cl = pcluster.New(n.system, ccfg)
	var startErr error
	func() {
		defer func() {
			if p := recover(); p != nil {
				startErr = fmt.Errorf("start cluster member on %s: %v", cfg.Listen, p)
			}
		}()
		n.cl.StartMember()
		// Spawned after the remote started, so its PIDs (and its shards') carry the
		// real address rather than "nonhost".
		n.server, err = n.system.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return n.actor },
			actor.WithReceiverMiddleware(n.metrics.serverMiddleware)), server.Name)
		if err != nil {
			startErr = err
		}
	}()
	if startErr != nil {
		_ = n.journal.Close()
		return nil, startErr
	}
	if cfg.HTTP != "" {
		if err := n.startHTTP(cfg.HTTP); err != nil {
			_ = n.Close()
			return nil, fmt.Errorf("admin http on %s: %w", cfg.HTTP, err)
		}
	}
	n.wg.Add(1)
	go n.loop()
	n.log.Info("kjob server started", "listen", n.system.Address(), "member", n.system.ID, "data", cfg.DataDir,
		"shards", len(recovered), "records", n.report.Records, "truncated_bytes", n.report.TruncatedBytes)
	return n, nil
}

func (n *Node) newCore(s route.Shard, epoch int64) *shardcore.Core {
	cfg := n.cfg.Shard
	cfg.Shard = s
	return shardcore.New(cfg, time.Now().UnixMilli(), epoch)
}

// recover rebuilds every shard of the journal: snapshot first, then its records.
func (n *Node) recover() ([]server.Recovered, error) {
	cores := map[uint64]*shardcore.Core{}
	var order []uint64
	err := n.journal.Replay(func(stream, lsn uint64, data []byte) error {
		name, epoch, err := shardcore.ShardNameOfSnapshot(data)
		if err != nil {
			return fmt.Errorf("snapshot of stream %d: %w", stream, err)
		}
		s, err := route.Parse(name)
		if err != nil {
			return err
		}
		c := n.newCore(s, epoch)
		if err := c.LoadSnapshot(data, lsn); err != nil {
			return err
		}
		cores[stream] = c
		order = append(order, stream)
		return nil
	}, func(r persistence.Record) error {
		if messages.RecordType(r.Type) == messages.RecordType_SHARD_IMPORTED {
			// A shard handed to this node: the record holds all of it.
			name, epoch, err := shardcore.ShardNameOfSnapshot(r.Payload)
			if err != nil {
				return fmt.Errorf("journal: lsn %d: imported shard: %w", r.LSN, err)
			}
			s, err := route.Parse(name)
			if err != nil {
				return err
			}
			c := n.newCore(s, epoch)
			if err := c.LoadSnapshot(r.Payload, r.LSN); err != nil {
				return err
			}
			if cores[r.Stream] == nil {
				order = append(order, r.Stream)
			}
			cores[r.Stream] = c
			return nil
		}
		c := cores[r.Stream]
		if c == nil {
			if messages.RecordType(r.Type) != messages.RecordType_SHARD_OPENED {
				return fmt.Errorf("journal: lsn %d of stream %d comes before its shard was opened", r.LSN, r.Stream)
			}
			meta := &messages.ShardMeta{}
			if err := proto.Unmarshal(r.Payload, meta); err != nil {
				return fmt.Errorf("journal: lsn %d: %w", r.LSN, err)
			}
			s, err := route.Parse(meta.Shard)
			if err != nil {
				return err
			}
			c = n.newCore(s, meta.Epoch)
			cores[r.Stream] = c
			order = append(order, r.Stream)
		}
		return c.Replay(r)
	})
	if err != nil {
		return nil, fmt.Errorf("recover journal in %s: %w", n.cfg.DataDir, err)
	}
	durable := n.journal.DurableLSN()
	out := make([]server.Recovered, 0, len(order))
	for _, st := range order {
		if cores[st].Closed() { // handed off before the crash: finish dropping it
			if err := n.journal.DropStream(st); err != nil {
				return nil, fmt.Errorf("drop handed-off stream %d: %w", st, err)
			}
			continue
		}
		out = append(out, server.Recovered{Core: cores[st], DurableLSN: durable})
	}
	return out, nil
}

// loop resolves the NameServer, sends heartbeats and compacts the journal.
func (n *Node) loop() {
	defer n.wg.Done()
	hb := time.NewTicker(nscore.HeartbeatMs * time.Millisecond)
	defer hb.Stop()
	compact := time.NewTicker(30 * time.Second)
	defer compact.Stop()
	n.resolve()
	n.system.Root.Send(n.server, &server.HeartbeatTick{})
	for {
		select {
		case <-n.stop:
			return
		case <-hb.C:
			n.resolve()
			n.system.Root.Send(n.server, &server.HeartbeatTick{})
		case <-compact.C:
			rep, err := n.journal.Compact()
			if err != nil {
				n.log.Warn("journal compaction", "err", err)
				continue
			}
			for _, st := range rep.PinnedBy {
				n.snapshotStream(st)
			}
		}
	}
}

func (n *Node) snapshotStream(stream uint64) {
	if t := n.actor.Table(); t != nil {
		for _, r := range t.Routes {
			if s, err := route.Parse(r.Shard); err == nil && s.Stream() == stream {
				n.system.Root.Send(actor.NewPID(n.system.Address(), server.Name+"/"+server.ShardName(r.Shard)), &shard.TakeSnapshot{})
			}
		}
	}
}

// resolve finds the NameServer's PID through the cluster (activating it if needed).
func (n *Node) resolve() {
	done := make(chan *actor.PID, 1)
	go func() {
		defer func() { _ = recover() }()
		done <- n.cl.Get(nameserver.Identity, nameserver.Kind)
	}()
	select {
	case pid := <-done:
		if pid != nil {
			n.ns.Store(pid)
		}
	case <-time.After(2 * time.Second):
	case <-n.stop:
	}
}

// Address is the node's remote address (host:port).
func (n *Node) Address() string { return n.system.Address() }

// System is the node's actor system.
func (n *Node) System() *actor.ActorSystem { return n.system }

// Journal is the node's journal.
func (n *Node) Journal() *persistence.Journal { return n.journal }

// Recovery is what the journal found at start.
func (n *Node) Recovery() persistence.RecoveryReport { return n.report }

// Routes is the last route table the node was pushed (nil before the first).
func (n *Node) Routes() *messages.RouteTable { return n.actor.Table() }

// NameServer is the NameServer PID this node last resolved (nil if none yet).
func (n *Node) NameServer() *actor.PID { return n.ns.Load() }

// Ready reports why the node is not ready, or nil when it serves.
func (n *Node) Ready() error {
	if err := n.journal.Err(); err != nil {
		return fmt.Errorf("journal failed: %w", err)
	}
	if n.ns.Load() == nil {
		return errors.New("no name server resolved yet")
	}
	if n.actor.Table() == nil {
		return errors.New("no route table received yet")
	}
	return nil
}

// Close leaves the cluster and closes the journal.
func (n *Node) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(n.stop)
	n.wg.Wait()
	n.stopHTTP()
	func() {
		defer func() { _ = recover() }()
		n.cl.Shutdown(false)
	}()
	return n.journal.Close()
}
