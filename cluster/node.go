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
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/dispatch"
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
	// AppPolicies are per-app default policies (LoadAppPolicies reads them from a
	// file): what a job's policy leaves unset comes from its app's entry, then from
	// Shard's defaults. Every server of a cluster should have the same ones: a
	// shard takes those of the node it runs on.
	AppPolicies map[string]*messages.Policy
	// AlertHooks are called for each new dead letter (e.g. shard.Webhook).
	AlertHooks []shard.AlertHook
	// HTTP is the address of the admin API and /metrics ("" = none).
	HTTP string
	// Split sets when the NameServer (while on this node) splits a shard: more live
	// workers per shard of an app than Workers, or more fires a minute than Fires
	// (zero: the defaults, 500 and 300,000; negative: never).
	Split nscore.SplitPolicy
	// ArmMs is how far ahead of its due a shard journals a fire, to send it at the
	// due with its record already durable (shardcore.Config.ArmMs): 0 =
	// shardcore.DefaultArmMs, negative = none (journaled at the due). A change to a
	// job that reaches its shard within ArmMs of a due is applied after that fire.
	ArmMs int64
	// LazySyncMs is how long a shard's records that nothing waits for at once
	// (results' acknowledgements, fires armed ahead) may wait for their msync,
	// to ride on another sync (shardcore.Config.LazySyncMs): 0 =
	// shardcore.DefaultLazySyncMs, negative = none (every step syncs at once).
	LazySyncMs int64
	// OnJournalSync, if set, is told how long each of the journal's group commits
	// took to sync and when it ended (persistence.Options.OnSync), on the
	// journal's flusher: it must return quickly. kjob bench reads the disk's
	// share of fire lateness from it.
	OnJournalSync func(took time.Duration, at time.Time)
	// CompactEvery is how often the node deletes the journal's segments that every
	// shard's snapshots cover, and asks the shards that pin the oldest one to
	// snapshot (0 = DefaultCompactEvery).
	CompactEvery time.Duration
	// TLS, if set, is the cluster's mutual TLS (LoadTLS): the node talks only to
	// servers, clients and workers that present a certificate signed by its CA, and
	// serves the admin API over HTTPS, its routes only to such clients (/healthz,
	// /readyz and /metrics to anyone). Every server of a cluster needs it, or none.
	TLS *TLS
}

// DefaultCompactEvery is NodeConfig.CompactEvery's default.
const DefaultCompactEvery = 30 * time.Second

// Node is a running kjob server.
type Node struct {
	cfg     NodeConfig
	system  *actor.ActorSystem
	cl      *pcluster.Cluster
	journal *persistence.Journal
	guard   *roleGuard          // the peers' roles on the remote's listener (roles.go)
	handed  server.HandedOnFile // the epochs shards were handed on at from here
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
	// compaction's work, for /metrics: segments deleted, and the shards whose
	// records held the oldest segment at the last compaction
	compacted, pinning atomic.Int64
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
	if err := checkAppPolicies(cfg.AppPolicies); err != nil {
		return nil, err
	}
	if err := checkRole(cfg.TLS, kindServer); err != nil {
		return nil, err
	}
	host, port, err := splitHostPort(cfg.Listen)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, stop: make(chan struct{}), log: cfg.Log, started: time.Now(), guard: &roleGuard{kind: kindServer, log: cfg.Log},
		handed: server.HandedOnFile(filepath.Join(cfg.DataDir, "handed-on.json"))}
	n.metrics = newMetrics(n)
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	incarnation, err := server.NextIncarnation(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("count this start: %w", err)
	}
	// The journal is opened and replayed while the cluster member starts: proto.actor's
	// StartMember ends with a fixed one-second sleep, which the replay of a large
	// journal now fills instead of following. Nothing of the member needs the shards
	// before the server actor is spawned, after both are done.
	var recovered []server.Recovered
	recDone := make(chan error, 1)
	go func() {
		msync, onSync := n.metrics.journalMsync, cfg.OnJournalSync
		j, err := persistence.Open(persistence.Options{Dir: cfg.DataDir, Sync: cfg.Sync,
			SegmentSizeBytes: cfg.SegmentSizeBytes, Logger: cfg.Log, AfterFunc: shard.AfterFunc,
			OnSync: func(took time.Duration, at time.Time) {
				msync.Observe(took.Seconds())
				if onSync != nil {
					onSync(took, at)
				}
			},
			FailSync: failSyncFromEnv(), FailSegment: failSegmentFromEnv()})
		if err != nil {
			recDone <- fmt.Errorf("open journal in %s: %w", cfg.DataDir, err)
			return
		}
		n.journal, n.report = j, j.Report()
		restoreGC := recoveryGC.raise()
		recovered, err = n.recover()
		restoreGC()
		if err != nil {
			_ = j.Close()
		}
		recDone <- err
	}()

	n.system = actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(actorLogger(cfg.Log, cfg.ActorLogLevel))))
	n.guard.addr = n.system.Address
	rcfg := remoteConfig(host, port, cfg.TLS, n.guard)
	peers := cfg.Peers
	if len(peers) == 0 {
		peers = []string{cfg.Listen}
	}
	self := cfg.Listen
	// The NameServer places a new app only while every configured peer reports (see
	// nameserver/core SetMembers); a single node (no peers) is its own only member.
	provider := &startSignal{ClusterProvider: newPeerProvider(self, peers, cfg.Log), started: make(chan struct{})}
	ccfg := pcluster.Configure(ClusterName, provider, disthash.New(), rcfg,
		pcluster.WithKinds(pcluster.NewKind(nameserver.Kind, n.metrics.ns.props(nameserver.Props(nil, cfg.Peers, cfg.Split)))))
	n.cl = pcluster.New(n.system, ccfg)
	var startErr, recErr error
	memberUp, recWaited := false, false
	waitRecovery := func() error {
		if !recWaited {
			recErr, recWaited = <-recDone, true
		}
		return recErr
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				startErr = fmt.Errorf("start cluster member on %s: %v", cfg.Listen, p)
			}
		}()
		// proto.actor's StartMember ends with a fixed one-second sleep after the
		// provider has started; the member is up from there, so StartNode goes on and
		// leaves the sleep to a goroutine.
		memberErr := make(chan error, 1)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					memberErr <- fmt.Errorf("start cluster member on %s: %v", cfg.Listen, p)
				}
			}()
			n.cl.StartMember()
			memberErr <- nil
		}()
		select {
		case <-provider.started:
		case err := <-memberErr:
			if err != nil {
				startErr = err
				return
			}
		}
		memberUp = true
		if waitRecovery() != nil {
			return
		}
		n.actor = server.New(server.Deps{
			ServerID: n.system.ID, Journal: n.metrics.journal(n.journal), Log: cfg.Log, Metrics: n.metrics,
			NameServer: func() *actor.PID { return n.ns.Load() },
			NewCore:    n.newCore,
			Alerts:     cfg.AlertHooks,
			HandedOn:   n.handed, Incarnation: incarnation,
		}, recovered)
		// Spawned after the remote started, so its PIDs (and its shards') carry the
		// real address rather than "nonhost".
		n.server, err = n.system.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return n.actor },
			actor.WithReceiverMiddleware(n.metrics.serverMiddleware(func() *messages.RouteTable { return n.actor.Table() })), actor.WithDispatcher(dispatch.Shared), actor.WithMailbox(dispatch.Mailbox)), server.Name)
		if err != nil {
			startErr = err
		}
	}()
	if waitRecovery() != nil || startErr != nil {
		if memberUp {
			func() {
				defer func() { _ = recover() }()
				n.cl.Shutdown(false)
			}()
		}
		if recErr != nil { // the journal is closed already
			return nil, recErr
		}
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

// recoveryGCPercent is the garbage collector's target while journals replay. Nearly
// everything recovery allocates stays live (the jobs it rebuilds), so each
// collection of the growing heap marks it all again for little gain: at the default
// 100 that was a quarter of a replay's time. The old target comes back as soon as
// the last concurrent recovery of the process ends.
const recoveryGCPercent = 400

// recoveryGC raises the GC target while any node of the process recovers. The GC
// target is process state, so this is too (StartNode may run concurrently).
var recoveryGC gcRaise

type gcRaise struct {
	mu   sync.Mutex
	n    int
	prev int
}

func (g *gcRaise) raise() (restore func()) {
	g.mu.Lock()
	if g.n == 0 {
		g.prev = debug.SetGCPercent(-1) // read the current target...
		if g.prev >= 0 && g.prev < recoveryGCPercent {
			debug.SetGCPercent(recoveryGCPercent)
		} else {
			debug.SetGCPercent(g.prev) // ...and keep one already higher (or off)
		}
	}
	g.n++
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			if g.n--; g.n == 0 {
				debug.SetGCPercent(g.prev)
			}
			g.mu.Unlock()
		})
	}
}

// startSignal is the node's cluster provider, which says when proto.actor has
// started it: the last step of StartMember before its sleep.
type startSignal struct {
	pcluster.ClusterProvider
	started chan struct{}
	once    sync.Once
}

func (s *startSignal) StartMember(c *pcluster.Cluster) error {
	err := s.ClusterProvider.StartMember(c)
	if err == nil {
		s.once.Do(func() { close(s.started) })
	}
	return err
}

// msSetting is a NodeConfig setting in ms where 0 means the default and a
// negative value none (0 in the shard's Config).
func msSetting(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v > 0:
		return v
	}
	return 0
}

func (n *Node) newCore(s route.Shard, epoch int64) *shardcore.Core {
	cfg := n.cfg.Shard
	cfg.Shard = s
	cfg.ArmMs = msSetting(n.cfg.ArmMs, shardcore.DefaultArmMs)
	cfg.LazySyncMs = msSetting(n.cfg.LazySyncMs, shardcore.DefaultLazySyncMs)
	if cfg.Seed == 0 {
		// The core's randomness (trace ids, random routing) is seeded for the
		// simulator's sake; left at 0, every node and every restart would draw
		// the same trace ids for a shard of the same name, and a tracing backend
		// would merge unrelated runs into one trace.
		cfg.Seed = rand.Uint64() | 1
	}
	if p := n.cfg.AppPolicies[s.App]; p != nil {
		cfg.AppPolicy = p
	}
	return shardcore.New(cfg, time.Now().UnixMilli(), epoch)
}

// recover rebuilds every shard of the journal: snapshot first, then its records.
func (n *Node) recover() ([]server.Recovered, error) {
	cores := map[uint64]*shardcore.Core{}
	var order []uint64
	// The records after the snapshots are decoded on one goroutine and applied on
	// another, in journal order (decoding is about half of a record's cost). Replay
	// hands over every snapshot before the first record, so the applier never runs
	// alongside onSnapshot.
	pipe := newReplayPipe(n.applyRecord(cores, &order))
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
		c.Reserve(n.journal.RecordsAfter(stream, lsn))
		cores[stream] = c
		order = append(order, stream)
		return nil
	}, pipe.add)
	if perr := pipe.close(); perr != nil && (err == nil || errors.Is(err, errReplayStopped)) {
		err = perr
	}
	if err != nil {
		return nil, fmt.Errorf("recover journal in %s: %w", n.cfg.DataDir, err)
	}
	durable := n.journal.DurableLSN()
	handed, err := n.handed.Load()
	if err != nil {
		return nil, fmt.Errorf("shards handed on from here: %w", err)
	}
	out := make([]server.Recovered, 0, len(order))
	var drop []uint64
	changed := false
	for _, st := range order {
		c := cores[st]
		if c.Closed() { // handed off before the crash: finish dropping it
			if name := c.Shard().String(); handed[name] < c.Epoch()+1 {
				handed[name], changed = c.Epoch()+1, true
			}
			drop = append(drop, st)
			continue
		}
		out = append(out, server.Recovered{Core: c, DurableLSN: durable})
	}
	// Saved before the streams go: their records are what says so until then.
	if changed {
		if err := n.handed.Save(handed); err != nil {
			return nil, fmt.Errorf("save the shards handed on from here: %w", err)
		}
	}
	for _, st := range drop {
		if err := n.journal.DropStream(st); err != nil {
			return nil, fmt.Errorf("drop handed-off stream %d: %w", st, err)
		}
	}
	return out, nil
}

// applyRecord applies one decoded journal record to its shard's core during recovery.
func (n *Node) applyRecord(cores map[uint64]*shardcore.Core, order *[]uint64) func(persistence.Record, *shardcore.Decoded) error {
	return func(r persistence.Record, d *shardcore.Decoded) error {
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
			c.Reserve(n.journal.RecordsAfter(r.Stream, r.LSN))
			if cores[r.Stream] == nil {
				*order = append(*order, r.Stream)
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
			// Every record of the stream could create a job: the tables are sized
			// for them all at once (Recovered gives back what they did not use).
			c.Reserve(n.journal.RecordsAfter(r.Stream, r.LSN))
			cores[r.Stream] = c
			*order = append(*order, r.Stream)
		}
		return c.ReplayDecoded(r, d)
	}
}

// Recovery's record pipeline: records are copied out of the mapping in batches of
// replayBatchRecords, decoded on one goroutine and applied on another, at most
// replayBatchesAhead batches ahead of the applier. A batch the applier is done
// with goes back to the reader, its arena and items reused: a million records
// were 300 MB of fresh memory to fault in and zero, in 256 KiB arenas and 1024-item
// slices, for the garbage collector to scan and free.
const (
	replayBatchRecords = 1024
	replayBatchesAhead = 8
	replayArenaBytes   = 256 << 10
	// replayBatchesFree bounds the batches waiting for reuse: as many as can be
	// in the pipe at once, and one for the reader.
	replayBatchesFree = 2*replayBatchesAhead + 3
)

type replayItem struct {
	r persistence.Record
	d shardcore.Decoded
}

type replayBatch struct {
	items []replayItem
	arena []byte // the payloads' copies, back to back (those that fit; a larger one has its own)
	// keep: a payload of the batch may be kept by what it was applied to (an
	// imported shard's snapshot), so its memory is not reused.
	keep bool
}

// replayPipe decodes records on one goroutine and applies them in order on another.
// The first error stops it: later records are dropped, close returns the error.
type replayPipe struct {
	batch   *replayBatch
	decode  chan *replayBatch
	apply   chan *replayBatch
	free    chan *replayBatch
	done    chan error
	failed  atomic.Bool
	applyFn func(persistence.Record, *shardcore.Decoded) error
}

func newReplayPipe(apply func(persistence.Record, *shardcore.Decoded) error) *replayPipe {
	p := &replayPipe{decode: make(chan *replayBatch, replayBatchesAhead), apply: make(chan *replayBatch, replayBatchesAhead),
		free: make(chan *replayBatch, replayBatchesFree), done: make(chan error, 1), applyFn: apply}
	go func() {
		defer close(p.apply)
		for b := range p.decode {
			for i := range b.items {
				if it := &b.items[i]; messages.RecordType(it.r.Type) != messages.RecordType_SHARD_IMPORTED { // a whole snapshot: the applier loads it
					it.d = shardcore.DecodeRecord(messages.RecordType(it.r.Type), it.r.Payload)
				}
			}
			p.apply <- b
		}
	}()
	go func() {
		var err error
		for b := range p.apply {
			for i := 0; i < len(b.items) && err == nil; i++ {
				err = p.applyFn(b.items[i].r, &b.items[i].d)
			}
			if err != nil {
				p.failed.Store(true)
			}
			if !b.keep {
				clear(b.items) // what the records decoded to belongs to the shards now
				b.items, b.arena = b.items[:0], b.arena[:0]
				select {
				case p.free <- b:
				default:
				}
			}
		}
		p.done <- err
	}()
	p.batch = p.newBatch()
	return p
}

// newBatch is a batch the applier is done with, or a new one.
func (p *replayPipe) newBatch() *replayBatch {
	select {
	case b := <-p.free:
		return b
	default:
		return &replayBatch{items: make([]replayItem, 0, replayBatchRecords), arena: make([]byte, 0, replayArenaBytes)}
	}
}

// add takes one record (its payload is copied: the mapping's is valid only during
// the call).
func (p *replayPipe) add(r persistence.Record) error {
	if p.failed.Load() {
		return errReplayStopped
	}
	b := p.batch
	if len(b.arena)+len(r.Payload) > cap(b.arena) {
		b.arena = make([]byte, 0, max(replayArenaBytes, len(r.Payload)))
	}
	at := len(b.arena)
	b.arena = append(b.arena, r.Payload...)
	r.Payload = b.arena[at:len(b.arena):len(b.arena)]
	b.items = append(b.items, replayItem{r: r})
	b.keep = b.keep || messages.RecordType(r.Type) == messages.RecordType_SHARD_IMPORTED
	if len(b.items) == replayBatchRecords {
		p.decode <- b
		p.batch = p.newBatch()
	}
	return nil
}

// close applies what is left and returns the first error.
func (p *replayPipe) close() error {
	if len(p.batch.items) > 0 {
		p.decode <- p.batch
	}
	p.batch = nil
	close(p.decode)
	return <-p.done
}

// errReplayStopped stops the journal's replay once the pipeline failed; close
// returns the pipeline's own error instead.
var errReplayStopped = errors.New("kjob: replay stopped")

// loop resolves the NameServer, sends heartbeats and compacts the journal.
func (n *Node) loop() {
	defer n.wg.Done()
	hb := time.NewTicker(nscore.HeartbeatMs * time.Millisecond)
	defer hb.Stop()
	every := n.cfg.CompactEvery
	if every <= 0 {
		every = DefaultCompactEvery
	}
	compact := time.NewTicker(every)
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
			n.compacted.Add(int64(len(rep.DeletedSegments)))
			n.pinning.Store(int64(len(rep.PinnedBy)))
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

// JournalErr is the error that stopped the node's journal (a failed msync or
// fsync, or a rollover that could not make its segment on a full disk), or nil.
// It is fatal until a restart, which recovers from the disk.
func (n *Node) JournalErr() error { return n.journal.Err() }

// JournalFailed is closed when the node's journal stops (JournalErr says why).
func (n *Node) JournalFailed() <-chan struct{} { return n.journal.Failed() }

// FailSyncEnv names a file in the environment of a test process: while it exists,
// every journal sync fails as the disk's would (persistence.Options.FailSync).
// Unset (production) nothing is installed.
const FailSyncEnv = "KJOB_TEST_FAIL_SYNC_FILE"

func failSyncFromEnv() func() error {
	return faultFromEnv(FailSyncEnv, func(path string) error {
		return fmt.Errorf("injected sync failure: %s exists (%s)", path, FailSyncEnv)
	})
}

// NoSpaceEnv names a file in the environment of a test process: while it exists,
// the journal cannot make a new segment, as on a full disk
// (persistence.Options.FailSegment). Unset (production) nothing is installed.
const NoSpaceEnv = "KJOB_TEST_NO_SPACE_FILE"

func failSegmentFromEnv() func() error {
	return faultFromEnv(NoSpaceEnv, func(path string) error {
		return fmt.Errorf("injected: %s exists (%s): %w", path, NoSpaceEnv, syscall.ENOSPC)
	})
}

// faultFromEnv is a test process's fault injection named by env: while the file
// the environment names there exists, it fails with fail(path). Unset
// (production): nil, nothing installed.
func faultFromEnv(env string, fail func(path string) error) func() error {
	path := os.Getenv(env)
	if path == "" {
		return nil
	}
	return func() error {
		if _, err := os.Stat(path); err == nil {
			return fail(path)
		}
		return nil
	}
}

// Ready reports why the node is not ready, or nil when it serves.
func (n *Node) Ready() error {
	if err := n.JournalErr(); err != nil {
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
		// The server actor's children are the shards: stopping it takes them out of
		// the process registry, so a closed node's jobs are neither reachable nor
		// kept in memory by a process that goes on (an embedding one, kjob bench).
		_ = n.system.Root.StopFuture(n.server).Wait()
		n.cl.Shutdown(false)
	}()
	return n.journal.Close()
}
