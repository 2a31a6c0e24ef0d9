package cluster

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kjob/kjob/actors/shard"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Bucket bounds, in seconds. Lateness is judged against the design's target (p99
// under 100 ms), so the buckets are dense below it and sparse up to minutes (a shard
// that was down, a backlog waiting for workers).
var (
	latenessBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	appendBuckets   = prometheus.ExponentialBuckets(1e-6, 4, 12)    // 1 µs … 4 s
	durableBuckets  = prometheus.ExponentialBuckets(50e-6, 2.5, 12) // 50 µs … 1.2 s
	snapshotBuckets = prometheus.ExponentialBuckets(1e-3, 4, 9)     // 1 ms … 65 s
)

// nodeMetrics are one node's Prometheus figures. Each node has its own registry (no
// global state), so several nodes in one process — tests, the simulator's neighbours,
// an embedding service — never collide; an embedder may register its own collectors
// on Node.Metrics().
//
// Labels are bounded: app (tenants are few), shard on the per-shard gauges only, and
// enumerations (outcome, ladder level, decision). No job or run id is ever a label.
//
// Sources: the shard shells report through shard.Sink (dispatches, recorded outcomes,
// retries, dead letters, gauges); the journal the shards use is wrapped (append and
// durability latency, bytes); the server actor's and the NameServer's mailboxes are
// observed by proto.actor middleware (route tables, placements, heartbeats).
type nodeMetrics struct {
	reg *prometheus.Registry

	appMu sync.RWMutex
	apps  map[string]*appMetrics // app() caches

	dispatchLate *prometheus.HistogramVec
	startLate    *prometheus.HistogramVec
	dispatches   *prometheus.CounterVec
	runs         *prometheus.CounterVec
	retries      *prometheus.CounterVec
	deadLettered *prometheus.CounterVec

	journalAppend   prometheus.Histogram
	journalDurable  prometheus.Histogram
	journalBytes    prometheus.Counter
	journalRecords  prometheus.Counter
	journalErrors   prometheus.Counter
	journalLazy     prometheus.Histogram
	journalMsync    prometheus.Histogram
	snapshotSeconds prometheus.Histogram
	snapshotBytes   prometheus.Counter

	routeVersion prometheus.Gauge
	routeUpdates prometheus.Counter
	assigned     prometheus.Counter
	workers      *prometheus.GaugeVec

	ns     *nsObserver
	shards *shardGauges
}

func newMetrics(n *Node) *nodeMetrics {
	reg := prometheus.NewRegistry()
	f := factory{reg}
	m := &nodeMetrics{
		reg: reg,
		dispatchLate: f.histogramVec("kjob_dispatch_lateness_seconds",
			"Time from a run's due time until its first dispatch left the shard (after its record was durable).", latenessBuckets, "app"),
		startLate: f.histogramVec("kjob_start_lateness_seconds",
			"Time from a run's due time until its handler started, as reported by the worker (first attempts).", latenessBuckets, "app"),
		dispatches: f.counterVec("kjob_dispatches_total", "Run attempts sent to workers (a broadcast counts once).", "app"),
		runs:       f.counterVec("kjob_runs_total", "Run attempts whose outcome the shard recorded, by outcome.", "app", "outcome"),
		retries:    f.counterVec("kjob_retries_total", "Failed run attempts put on the retry ladder, by ladder level (0-based).", "app", "level"),
		deadLettered: f.counterVec("kjob_dead_lettered_total",
			"Runs that exhausted their attempts and landed in the dead-letter queue.", "app"),

		journalAppend: f.histogram("kjob_journal_append_seconds",
			"Time a shard's journal append took (encoding and copying into the mapping; not durability).", appendBuckets),
		journalDurable: f.histogram("kjob_journal_sync_seconds",
			"Time from a shard's journal append until it was durable (group commit wait plus msync), for appends that ask for a sync at once; lazy ones are in kjob_journal_lazy_sync_seconds.", durableBuckets),
		journalBytes:   f.counter("kjob_journal_appended_bytes_total", "Bytes appended to the journal by shards, framing included."),
		journalRecords: f.counter("kjob_journal_appended_records_total", "Records appended to the journal by shards."),
		journalErrors:  f.counter("kjob_journal_append_errors_total", "Journal appends or syncs that failed (each is fatal for the shard)."),
		journalLazy: f.histogram("kjob_journal_lazy_sync_seconds",
			"Time from a shard's lazy journal append (results' acks, armed fires: NodeConfig.LazySyncMs) until it was durable: its allowed wait, shared with the next sync, plus that sync.", durableBuckets),
		journalMsync: f.histogram("kjob_journal_msync_seconds",
			"Time one group commit's msync took (the disk's flush; a record waits for the sync in progress and then its own: kjob_journal_sync_seconds).", durableBuckets),
		snapshotSeconds: f.histogram("kjob_journal_snapshot_seconds",
			"Time a shard snapshot took to write (temporary file, fsync, rename).", snapshotBuckets),
		snapshotBytes: f.counter("kjob_journal_snapshot_bytes_total", "Bytes of shard snapshots written."),

		routeVersion: f.gauge("kjob_route_table_version", "Version of the last route table this node was pushed."),
		routeUpdates: f.counter("kjob_route_table_updates_total", "Route tables pushed to this node that it adopted."),
		assigned:     f.counter("kjob_shard_assignments_total", "Shards the NameServer assigned to this node."),
		workers:      f.gaugeVec("kjob_workers", "Live workers per app, as in the last route table this node was pushed.", "app"),
	}
	m.ns = newNSObserver(f)
	m.shards = newShardGauges()
	reg.MustRegister(m.shards,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_node_ready", Help: "1 when the node serves (see /readyz for why not)."},
			func() float64 { return b2f(n.ready() == nil) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_failed", Help: "1 when the node's journal hit a fatal error."},
			n.ofJournal(func(j *persistence.Journal) float64 { return b2f(j.Err() != nil) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_durable_lsn", Help: "Highest journal LSN known durable."},
			n.ofJournal(func(j *persistence.Journal) float64 { return float64(j.DurableLSN()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_last_lsn", Help: "Highest journal LSN assigned (minus durable = not yet synced)."},
			n.ofJournal(func(j *persistence.Journal) float64 { return float64(j.LastLSN()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kjob_journal_syncs_total",
			Help: "Group commits (msyncs) of the node's journal; appended records per sync is their gain."},
			n.ofJournal(func(j *persistence.Journal) float64 { return float64(j.Syncs()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_segments",
			Help: "Segment files the journal's log holds (64 MiB each by default; the active one included): compaction keeps this flat under a steady load."},
			n.ofJournal(func(j *persistence.Journal) float64 { return float64(j.Segments()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_spare_failing",
			Help: "1 while the journal cannot make its next segment (a full disk, most often; retried every second): it runs on what is left of the active one."},
			n.ofJournal(func(j *persistence.Journal) float64 { return b2f(j.SpareErr() != nil) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_no_room",
			Help: "1 while the journal is down to its reserve with no next segment: creates, updates, triggers and replays are refused (RESOURCE_EXHAUSTED), fires and results go on."},
			n.ofJournal(func(j *persistence.Journal) float64 { return b2f(j.Room() != nil) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kjob_journal_compacted_segments_total",
			Help: "Journal segments deleted by compaction, every shard's snapshots covering their records."},
			func() float64 { return float64(n.compacted.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_pinning_shards",
			Help: "Shards whose records held the journal's oldest segment at the last compaction (each was asked to snapshot)."},
			func() float64 { return float64(n.pinning.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_recovered_records", Help: "Records the journal held when the node started."},
			func() float64 { return float64(n.report.Records) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_journal_recovery_truncated_bytes",
			Help: "Bytes of torn tail the journal dropped when the node started."},
			func() float64 { return float64(n.report.TruncatedBytes) }),
	)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kjob_remote_malformed_batches_total",
		Help: "Peers' streams the node ended for a batch proto.actor cannot take (an index out of range, an unknown serializer): it would have stopped the process."},
		func() float64 { return float64(n.guard.malformed.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kjob_remote_unknown_messages_total",
			Help: "Messages of a type this build does not know (a newer version's, during a rolling upgrade), dropped on arrival: the rest of their batch is delivered."},
			func() float64 { return float64(n.guard.unknown.Load()) }))
	if t := n.cfg.TLS; t != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_tls_certificate_expiry_timestamp_seconds",
			Help: "When the node's TLS certificate (--tls-cert) expires, in Unix seconds: renew the file before then (it is reread within a second of a change)."},
			func() float64 { return float64(t.Leaf().NotAfter.Unix()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kjob_tls_reload_failing",
				Help: "1 while the node's TLS files, changed since they were last read, do not load (a certificate without its new key, say): the last good ones stay in use."},
				func() float64 { return b2f(t.ReloadErr() != nil) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kjob_tls_refused_total",
				Help: "Streams and calls the node ended because the peer's certificate's role does not allow what it sent (a worker's sending a command, a client's registering as a worker): a misissued certificate, or a compromised host."},
				func() float64 { return float64(n.guard.refused.Load()) }))
	}
	return m
}

// ofJournal reads a figure of the node's journal for /metrics: 0 before it is open.
func (n *Node) ofJournal(f func(*persistence.Journal) float64) func() float64 {
	return func() float64 {
		if n.journal == nil {
			return 0
		}
		return f(n.journal)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Metrics is the node's Prometheus registry (served at /metrics on the HTTP address).
func (n *Node) Metrics() *prometheus.Registry { return n.metrics.reg }

// ready is Ready, safe to call while the node is still starting.
func (n *Node) ready() error {
	if n.journal == nil || n.actor == nil {
		return errNotStarted
	}
	return n.Ready()
}

// factory registers what it makes.
type factory struct{ reg *prometheus.Registry }

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}

func (f factory) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(g)
	return g
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	f.reg.MustRegister(h)
	return h
}

func (f factory) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	f.reg.MustRegister(h)
	return h
}

func msToSeconds(ms int64) float64 { return float64(max(ms, 0)) / 1000 }

// ---------------------------------------------------------------- shard.Sink

var _ shard.Sink = (*nodeMetrics)(nil)

// ShardStarted implements shard.Sink.
func (m *nodeMetrics) ShardStarted(app, name string, read func() shard.Gauges) func() {
	return m.shards.add(app, name, read)
}

// Dispatched implements shard.Sink. Only first attempts feed the lateness histogram:
// a retry's "lateness" is its ladder delay, which is policy, not delay.
func (m *nodeMetrics) Dispatched(app string, d *messages.Dispatch, sentMs int64) {
	a := m.app(app)
	a.dispatches.Inc()
	if d.Attempt <= 1 {
		a.dispatchLate.Observe(msToSeconds(sentMs - d.DueMs))
	}
}

// appMetrics are an app's children of the per-run vectors, looked up once: a
// WithLabelValues per run allocated and hashed at every dispatch and result.
type appMetrics struct {
	dispatches   prometheus.Counter
	dispatchLate prometheus.Observer
	startLate    prometheus.Observer
	runs         [8]prometheus.Counter // by messages.Outcome
}

func (m *nodeMetrics) app(app string) *appMetrics {
	m.appMu.RLock()
	a := m.apps[app]
	m.appMu.RUnlock()
	if a != nil {
		return a
	}
	m.appMu.Lock()
	defer m.appMu.Unlock()
	if a = m.apps[app]; a == nil {
		a = &appMetrics{dispatches: m.dispatches.WithLabelValues(app), dispatchLate: m.dispatchLate.WithLabelValues(app),
			startLate: m.startLate.WithLabelValues(app)}
		if m.apps == nil {
			m.apps = map[string]*appMetrics{}
		}
		m.apps[app] = a
	}
	return a
}

// Finished implements shard.Sink.
func (m *nodeMetrics) Finished(app string, rec *messages.RunRecord) {
	a := m.app(app)
	if o := int(rec.Outcome); o >= 0 && o < len(a.runs) {
		m.appMu.RLock()
		c := a.runs[o]
		m.appMu.RUnlock()
		if c == nil { // the first time the app has this outcome
			m.appMu.Lock()
			if c = a.runs[o]; c == nil {
				c = m.runs.WithLabelValues(app, strings.ToLower(rec.Outcome.String()))
				a.runs[o] = c
			}
			m.appMu.Unlock()
		}
		c.Inc()
	} else {
		m.runs.WithLabelValues(app, strings.ToLower(rec.Outcome.String())).Inc()
	}
	if rec.Attempt <= 1 && rec.StartMs > 0 { // a lost run never reported a start
		a.startLate.Observe(msToSeconds(rec.StartMs - rec.DueMs))
	}
}

// RetryScheduled implements shard.Sink.
func (m *nodeMetrics) RetryScheduled(app string, level int32) {
	m.retries.WithLabelValues(app, strconv.Itoa(int(level))).Inc()
}

// DeadLettered implements shard.Sink.
func (m *nodeMetrics) DeadLettered(app string) { m.deadLettered.WithLabelValues(app).Inc() }

// shardGauges reports the gauges of the shards this node hosts, read at scrape time
// from what each shard actor last published.
type shardGauges struct {
	mu     sync.Mutex
	shards map[string]*shardEntry
	seq    uint64

	jobs, pending, backlog, inFlight, held, dead, failed, handoff, count *prometheus.Desc
}

type shardEntry struct {
	app  string
	read func() shard.Gauges
	id   uint64
}

func newShardGauges() *shardGauges {
	l := []string{"app", "shard"}
	return &shardGauges{shards: map[string]*shardEntry{},
		jobs:     prometheus.NewDesc("kjob_jobs", "Jobs held by a shard.", l, nil),
		pending:  prometheus.NewDesc("kjob_pending_jobs", "Jobs of a shard with a next fire time.", l, nil),
		backlog:  prometheus.NewDesc("kjob_backlog_runs", "Runs of a shard that are due but not yet dispatched (no live worker, or waiting for the journal).", l, nil),
		inFlight: prometheus.NewDesc("kjob_runs_in_flight", "Runs of a shard dispatched and not finished, or waiting on the retry ladder.", l, nil),
		held:     prometheus.NewDesc("kjob_runs_held", "Runs of a shard that are due and wait in the shard for a worker with room (each worker has as many of the shard's runs as it queues before refusing).", l, nil),
		dead:     prometheus.NewDesc("kjob_dead_letters", "Size of a shard's dead-letter queue.", l, nil),
		failed:   prometheus.NewDesc("kjob_shard_failed", "1 when a shard stopped serving because its journal failed.", l, nil),
		handoff:  prometheus.NewDesc("kjob_shard_handoff_seconds", "How long a shard has been frozen for its handoff or split on this node (0: it is not); it fires nothing meanwhile.", l, nil),
		count:    prometheus.NewDesc("kjob_shards", "Shards hosted by this node.", nil, nil),
	}
}

func (s *shardGauges) add(app, name string, read func() shard.Gauges) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	id := s.seq
	s.shards[name] = &shardEntry{app: app, read: read, id: id} // a newer actor of the same shard replaces the old
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if e := s.shards[name]; e != nil && e.id == id {
			delete(s.shards, name)
		}
	}
}

// Describe implements prometheus.Collector.
func (s *shardGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.jobs, s.pending, s.backlog, s.inFlight, s.held, s.dead, s.failed, s.handoff, s.count} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *shardGauges) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	entries := make(map[string]*shardEntry, len(s.shards))
	for k, v := range s.shards {
		entries[k] = v
	}
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(s.count, prometheus.GaugeValue, float64(len(entries)))
	nowMs := time.Now().UnixMilli()
	for name, e := range entries {
		g := e.read()
		var handoff float64
		if g.HandoffSinceMs > 0 {
			handoff = float64(max(nowMs-g.HandoffSinceMs, 0)) / 1000
		}
		for _, x := range []struct {
			d *prometheus.Desc
			v float64
		}{{s.jobs, float64(g.Jobs)}, {s.pending, float64(g.Pending)}, {s.backlog, float64(g.Backlog)},
			{s.inFlight, float64(g.InFlight)}, {s.held, float64(g.Held)}, {s.dead, float64(g.DeadLetters)}, {s.failed, b2f(g.Failed)},
			{s.handoff, handoff}} {
			ch <- prometheus.MustNewConstMetric(x.d, prometheus.GaugeValue, x.v, e.app, name)
		}
	}
}

// ---------------------------------------------------------------- journal

// meteredJournal is the journal as the shards see it, timed.
type meteredJournal struct {
	j shard.Journal
	m *nodeMetrics
}

func (m *nodeMetrics) journal(j shard.Journal) shard.Journal { return meteredJournal{j: j, m: m} }

func (mj meteredJournal) Append(entries []persistence.Entry, cb func(lastLSN uint64, err error)) (uint64, uint64, error) {
	return mj.AppendWithin(entries, 0, cb)
}

func (mj meteredJournal) SyncNow() { mj.j.SyncNow() }

func (mj meteredJournal) AppendWithin(entries []persistence.Entry, within time.Duration, cb func(lastLSN uint64, err error)) (uint64, uint64, error) {
	m := mj.m
	t0 := time.Now()
	durable := m.journalDurable
	if within > 0 {
		durable = m.journalLazy
	}
	first, last, err := mj.j.AppendWithin(entries, within, func(lsn uint64, err error) {
		if err != nil {
			m.journalErrors.Inc()
		} else {
			durable.Observe(time.Since(t0).Seconds())
		}
		cb(lsn, err)
	})
	m.journalAppend.Observe(time.Since(t0).Seconds())
	if err != nil {
		m.journalErrors.Inc()
		return first, last, err
	}
	n := 0
	for _, e := range entries {
		n += persistence.FrameSize(len(e.Payload))
	}
	m.journalBytes.Add(float64(n))
	m.journalRecords.Add(float64(len(entries)))
	return first, last, nil
}

func (mj meteredJournal) DropStream(stream uint64) error { return mj.j.DropStream(stream) }

func (mj meteredJournal) Room() error { return mj.j.Room() }

func (mj meteredJournal) WriteSnapshot(stream, lsn uint64, data []byte) error {
	t0 := time.Now()
	err := mj.j.WriteSnapshot(stream, lsn, data)
	if err == nil {
		mj.m.snapshotSeconds.Observe(time.Since(t0).Seconds())
		mj.m.snapshotBytes.Add(float64(len(data)))
	}
	return err
}

// ---------------------------------------------------------------- server actor

// serverMiddleware watches the server actor's mailbox: route tables and
// assignments. A route table counts once the server took it (table, the one it
// holds, is then that table): it refuses an older one, one from a NameServer that
// is not the current one, and one it cannot use.
func (m *nodeMetrics) serverMiddleware(table func() *messages.RouteTable) actor.ReceiverMiddleware {
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			switch x := env.Message.(type) {
			case *messages.RouteTable:
				next(c, env)
				if table() != x {
					return
				}
				m.routeVersion.Set(float64(x.Version))
				m.routeUpdates.Inc()
				m.workers.Reset()
				for _, a := range x.Apps {
					m.workers.WithLabelValues(a.App).Set(float64(len(a.Workers)))
				}
				return
			case *messages.AssignShard:
				m.assigned.Inc()
			}
			next(c, env)
		}
	}
}
