package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// Bench defaults and bounds. The defaults are sized for a 2-core machine: a full
// `kjob bench` takes about 70 s there when nothing else runs, half of it
// populating the million jobs that recover and memory share.
const (
	benchCreateN        = 200_000
	benchConcurrency    = 256
	benchFireN          = 200_000
	benchFireRate       = 20_000 // offered fires per second
	benchRecoverN       = 1_000_000
	benchMemoryN        = 1_000_000
	benchParamsBytes    = 16 // "small params"
	benchProbeCreates   = 2_000
	benchFarFuture      = time.Hour // due time of jobs that must not fire during a scenario
	benchFireGrace      = 30 * time.Second
	benchReadyTimeout   = 30 * time.Second
	benchProgressEvery  = 200 * time.Millisecond
	benchMaxErrors      = 100 // a scenario stops after this many failed requests
	benchRecoverTimeout = 60 * time.Second
	benchRecoverDown    = 500 * time.Millisecond // the sentinel is due this long after it is created
	benchRecoverPoll    = 200 * time.Millisecond // per attempt of the serving probe
)

// Short mode: a correctness check that runs in the normal tests in seconds.
const (
	shortCreateN     = 2_000
	shortConcurrency = 64
	shortFireN       = 2_000
	shortFireRate    = 2_000
	shortRecoverN    = 5_000
	shortMemoryN     = 5_000
)

// benchScenarios are the scenario names, in the order they run.
var benchScenarios = []string{"create", "fire", "recover", "memory"}

type benchOpts struct {
	scenarios   []string
	createN     int
	concurrency int
	fireN       int
	fireRate    int
	recoverN    int
	memoryN     int
	noBatch     bool
	paramsBytes int
	capacity    int // worker pool size (0 = the worker's default)
	sync        persistence.SyncPolicy
	servers     []string     // a running cluster; nil = embedded nodes
	tls         *cluster.TLS // the cluster's mutual TLS (--tls-*): the embedded nodes' too
	dataDir     string       // parent of the embedded nodes' data directories ("" = a temp dir)
	latencyOut  string       // file for the raw fire lateness samples (ns, one per line)
	armMs       int64        // embedded nodes' --arm-ms (0 = none)
	lazyMs      int64        // embedded nodes' --lazy-sync-ms (0 = none)
	memProfile  string       // heap profile, written when the memory scenario measures (else at the end)
	syncs       *benchSyncs  // the embedded nodes' journal syncs (nil with --servers)
	progress    io.Writer
	log         *slog.Logger
}

// BenchReport is what `kjob bench --json` prints.
type BenchReport struct {
	Date      string            `json:"date"`
	Cores     int               `json:"cores"`
	Procs     int               `json:"gomaxprocs"` // Ps the run had (main's procs: cores + 1 unless GOMAXPROCS is set)
	GoVersion string            `json:"go_version"`
	Mode      string            `json:"mode"` // embedded or servers
	Sync      string            `json:"sync"`
	Create    *BenchCreate      `json:"create,omitempty"`
	Fire      *BenchFire        `json:"fire,omitempty"`
	Recover   *BenchRecover     `json:"recover,omitempty"`
	Memory    *BenchMemory      `json:"memory,omitempty"`
	Skipped   map[string]string `json:"skipped,omitempty"`
}

// BenchDist is a latency distribution in milliseconds.
type BenchDist struct {
	N      int     `json:"n"`
	MinMs  float64 `json:"min_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// BenchCreate is the create scenario: N durable creates with C in flight.
type BenchCreate struct {
	N           int       `json:"n"`
	Concurrency int       `json:"concurrency"`
	Seconds     float64   `json:"seconds"`
	AcksPerSec  float64   `json:"acks_per_sec"`
	Latency     BenchDist `json:"ack_latency"`
	Errors      int       `json:"errors"`
	// PerBatch is the mean number of creates per CreateJobs batch the client sent
	// (cluster/batch.go); 0 with --no-batch.
	PerBatch float64 `json:"creates_per_batch"`
	// CPUSeconds is the CPU time (user + system) this process used while the
	// creates ran: load generator, client and, on an embedded node (the report's
	// mode), the node.
	CPUSeconds float64 `json:"cpu_seconds"`
}

// processCPU is the CPU time (user + system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchFire is the fire scenario: N one-shot jobs due evenly over a window.
type BenchFire struct {
	N             int       `json:"n"`
	OfferedPerSec float64   `json:"offered_per_sec"`
	WindowSeconds float64   `json:"window_seconds"`
	CreatePerSec  float64   `json:"create_acks_per_sec"`
	CreatedLate   int       `json:"created_after_due"`
	Fired         int       `json:"fired"`
	Missing       int       `json:"missing"`
	Duplicates    int       `json:"duplicates"`
	Early         int       `json:"early"`
	Retried       int       `json:"retried"` // the first handler start was a later attempt (the first was refused or lost)
	Lateness      BenchDist `json:"lateness"`
	// Lateness split where the shard sent the attempt that ran (its dispatched_ms,
	// stamped as the dispatch leaves the shard, whole ms): due to the shard's send (the
	// timer, the shard's mailbox and step, the journal commit when the run was not
	// armed ahead, any resends of a dispatch a full worker refused), and send to
	// handler start (transport, the worker's queue).
	ShardLateness    BenchDist `json:"shard_lateness"`
	DeliveryLateness BenchDist `json:"dispatch_to_start"`
	FiresPerSec      float64   `json:"fires_per_sec"`
	FiresPerSecMax   float64   `json:"fires_per_sec_max_1s"`
	CreateErrors     int       `json:"create_errors"`
	// The embedded node's journal syncs (msyncs) that ended in the window (from a
	// second before the first due until the last fire): a dispatch leaves only once
	// its record is durable, so a sync longer than the arming lead (--arm-ms)
	// makes the fires due meanwhile late by about its excess. Absent with --servers.
	JournalSync      *BenchDist `json:"journal_sync,omitempty"`
	JournalSlowSyncs int        `json:"journal_syncs_over_5ms"`
	JournalSyncCut   bool       `json:"journal_syncs_cut,omitempty"` // more syncs than kept: some are missing
	// Process is what this process (load generator, client, worker and, embedded,
	// the node) did from the first due until the last fire: the garbage collector's
	// cycles and pauses, what was allocated, and page faults (a first touch of a page
	// here costs about 13 µs, and faults contend with the journal's msyncs).
	Process *BenchProcess `json:"process,omitempty"`
}

// BenchProcess is the process's runtime figures over a window.
type BenchProcess struct {
	Seconds        float64 `json:"seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	AllocBytes     uint64  `json:"alloc_bytes"`
	GCCycles       uint64  `json:"gc_cycles"`
	GCPauseMs      float64 `json:"gc_pause_ms"` // stop-the-world time, summed
	MinorFaults    int64   `json:"minor_faults"`
	MajorFaults    int64   `json:"major_faults"`
	HeapStartBytes uint64  `json:"heap_start_bytes"` // live and unswept heap objects at the start
	HeapEndBytes   uint64  `json:"heap_end_bytes"`
}

// processMark is a point to measure a BenchProcess from.
type processMark struct {
	at                  time.Time
	cpu                 time.Duration
	minflt, majflt      int64
	alloc, cycles, heap uint64
	pauseNs             float64
}

var processMetrics = []string{"/gc/heap/allocs:bytes", "/gc/cycles/total:gc-cycles", "/sched/pauses/total/gc:seconds", "/memory/classes/heap/objects:bytes"}

func markProcess() processMark {
	m := processMark{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		m.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		m.minflt, m.majflt = ru.Minflt, ru.Majflt
	}
	ss := make([]metrics.Sample, len(processMetrics))
	for i, n := range processMetrics {
		ss[i].Name = n
	}
	metrics.Read(ss)
	if ss[0].Value.Kind() == metrics.KindUint64 {
		m.alloc = ss[0].Value.Uint64()
	}
	if ss[1].Value.Kind() == metrics.KindUint64 {
		m.cycles = ss[1].Value.Uint64()
	}
	if ss[2].Value.Kind() == metrics.KindFloat64Histogram {
		h := ss[2].Value.Float64Histogram()
		for i, c := range h.Counts {
			// A bucket's lower bound stands for its pauses (the first may be -Inf).
			lo := h.Buckets[i]
			if math.IsInf(lo, -1) {
				lo = 0
			}
			m.pauseNs += float64(c) * lo * 1e9
		}
	}
	if ss[3].Value.Kind() == metrics.KindUint64 {
		m.heap = ss[3].Value.Uint64()
	}
	return m
}

// since is the window from m to now.
func (m processMark) since() *BenchProcess {
	e := markProcess()
	return &BenchProcess{Seconds: e.at.Sub(m.at).Seconds(), CPUSeconds: (e.cpu - m.cpu).Seconds(),
		AllocBytes: e.alloc - m.alloc, GCCycles: e.cycles - m.cycles, GCPauseMs: (e.pauseNs - m.pauseNs) / 1e6,
		MinorFaults: e.minflt - m.minflt, MajorFaults: e.majflt - m.majflt, HeapStartBytes: m.heap, HeapEndBytes: e.heap}
}

// benchSlowSync is the sync time the fire report counts as slow: the default arming
// lead, past which a sync delays the fires behind it.
const benchSlowSync = shardcore.DefaultArmMs * time.Millisecond

// BenchRecover is the recover scenario: restart a node holding N pending jobs.
type BenchRecover struct {
	Pending             int     `json:"pending"`
	JournalBytes        int64   `json:"journal_bytes"`
	Records             uint64  `json:"records_replayed"`
	EmptyStartSeconds   float64 `json:"empty_start_seconds"` // StartNode again on a node's empty journal (a restart's fixed part)
	ReplaySeconds       float64 `json:"replay_seconds"`
	ServingSeconds      float64 `json:"serving_seconds"`
	FirstFireSeconds    float64 `json:"first_fire_seconds"`
	ReplayJobsPerSec    float64 `json:"replay_jobs_per_sec"`
	NetReplayJobsPerSec float64 `json:"net_replay_jobs_per_sec"` // over replay minus the empty start
	JobsPerSec          float64 `json:"jobs_per_sec"`
	Verified            int     `json:"verified"`
}

// BenchMemory is the memory scenario: resident memory per pending job.
type BenchMemory struct {
	Pending         int     `json:"pending"`
	RSSBeforeBytes  int64   `json:"rss_before_bytes"`
	RSSAfterBytes   int64   `json:"rss_after_bytes"`
	BytesPerJob     float64 `json:"rss_bytes_per_job"`
	AnonBytesPerJob float64 `json:"rss_anon_bytes_per_job"`
	FileBytesPerJob float64 `json:"rss_file_bytes_per_job"`
	HeapBytesPerJob float64 `json:"heap_bytes_per_job"`
}

func benchCmd() *cobra.Command {
	var (
		o        benchOpts
		scen     string
		short    bool
		jsonOut  bool
		quiet    bool
		syncPol  string
		cpuProf  string
		traceOut string
		memProf  string
	)
	c := &cobra.Command{
		Use:   "bench",
		Short: "measure create, fire, recover and memory against an embedded node (or --servers)",
		Long: `bench runs load scenarios with a client and a worker in this process:

  create   N durable creates, C in flight: acks/s and ack latency
  fire     N one-shot jobs due evenly at --fire-rate: lateness due -> handler start, fires/s
  recover  restart a node holding N pending jobs: time until serving and until a due job fires
  memory   resident memory (VmRSS) per pending one-shot job

create and fire share one embedded node (temporary data directory, the durable
sync policy), each with an app, so a shard, of its own. recover and memory start a
node of their own; when both run with the same N, one population serves both
(memory is measured before the restart). With --servers, create and fire run
against that cluster instead, and recover and memory are skipped (they restart and
measure the node). Every figure is wall-clock on whatever else the machine runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range splitList(scen) {
				if !slices.Contains(benchScenarios, s) {
					return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "scenarios",
						Message: fmt.Sprintf("%q: use %s", s, strings.Join(benchScenarios, ", "))}
				}
				o.scenarios = append(o.scenarios, s)
			}
			pol, err := benchParseSync(syncPol)
			if err != nil {
				return err
			}
			o.sync = pol
			if short {
				benchDefault(cmd, "create-n", &o.createN, shortCreateN)
				benchDefault(cmd, "concurrency", &o.concurrency, shortConcurrency)
				benchDefault(cmd, "fire-n", &o.fireN, shortFireN)
				benchDefault(cmd, "fire-rate", &o.fireRate, shortFireRate)
				benchDefault(cmd, "recover-n", &o.recoverN, shortRecoverN)
				benchDefault(cmd, "memory-n", &o.memoryN, shortMemoryN)
			}
			if o.capacity < 0 || o.capacity > nscore.MaxWorkerCapacity {
				return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "worker-capacity",
					Message: fmt.Sprintf("must be 0 (the worker's default) to %d, got %d", nscore.MaxWorkerCapacity, o.capacity)}
			}
			for name, v := range map[string]int{"create-n": o.createN, "concurrency": o.concurrency, "fire-n": o.fireN,
				"fire-rate": o.fireRate, "recover-n": o.recoverN, "memory-n": o.memoryN} {
				if v <= 0 {
					return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: name, Message: fmt.Sprintf("must be positive, got %d", v)}
				}
			}
			if o.paramsBytes < 0 || o.paramsBytes > 64<<10 {
				return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "params-bytes", Message: "must be 0 to 65536"}
			}
			if f := cmd.Flag("servers"); f != nil && f.Changed {
				o.servers = splitList(g.servers)
			}
			tl, err := clusterTLS()
			if err != nil {
				return err
			}
			o.tls = tl
			if !quiet {
				o.progress = cmd.ErrOrStderr()
			}
			o.log = benchLogger(cmd)
			if cpuProf != "" {
				f, err := os.Create(cpuProf)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if traceOut != "" {
				f, err := os.Create(traceOut)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := trace.Start(f); err != nil {
					return err
				}
				defer trace.Stop()
			}
			if memProf != "" {
				o.memProfile = memProf
				defer func() {
					if !slices.Contains(o.scenarios, "memory") {
						_ = benchWriteHeapProfile(memProf)
					}
				}()
			}
			ctx, cancel := signalContext()
			defer cancel()
			rep, err := runBench(ctx, o)
			if rep != nil {
				if jsonOut {
					b, _ := json.MarshalIndent(rep, "", "  ")
					fmt.Fprintln(cmd.OutOrStdout(), string(b))
				} else {
					printBench(cmd.OutOrStdout(), rep)
				}
			}
			return err
		},
	}
	f := c.Flags()
	f.StringVar(&scen, "scenarios", strings.Join(benchScenarios, ","), "comma-separated scenarios: "+strings.Join(benchScenarios, ", "))
	f.BoolVar(&short, "short", false, "small N for every scenario: a correctness run of about 20 s, not a measurement")
	f.IntVar(&o.createN, "create-n", benchCreateN, "create: jobs to create")
	f.IntVar(&o.concurrency, "concurrency", benchConcurrency, "create requests in flight (create, and populating the other scenarios)")
	f.IntVar(&o.fireN, "fire-n", benchFireN, "fire: one-shot jobs")
	f.IntVar(&o.fireRate, "fire-rate", benchFireRate, "fire: due times per second (window = fire-n / fire-rate)")
	f.IntVar(&o.recoverN, "recover-n", benchRecoverN, "recover: pending jobs held by the restarted node")
	f.IntVar(&o.memoryN, "memory-n", benchMemoryN, "memory: pending jobs")
	f.IntVar(&o.paramsBytes, "params-bytes", benchParamsBytes, "params size of every job")
	f.IntVar(&o.capacity, "worker-capacity", 0, "fire and recover: the worker's handler pool (0 = its default)")
	f.StringVar(&syncPol, "sync", "sync", "embedded node's journal flush policy: sync (durable acks), interval, none")
	f.StringVar(&o.dataDir, "data", "", "parent directory for the embedded nodes' data (default: a temporary one, removed after)")
	f.StringVar(&o.latencyOut, "lateness-out", "", "fire: write every lateness sample (ns, one per line) to this file")
	f.Int64Var(&o.armMs, "arm-ms", shardcore.DefaultArmMs, "embedded nodes: "+armUsage)
	f.Int64Var(&o.lazyMs, "lazy-sync-ms", shardcore.DefaultLazySyncMs, "embedded nodes: "+lazyUsage)
	f.BoolVar(&jsonOut, "json", false, "print the report as JSON")
	f.BoolVar(&o.noBatch, "no-batch", false, "the client sends every create alone (no CreateJobs batches): the baseline of batching")
	f.BoolVar(&quiet, "quiet", false, "no progress bar on stderr")
	f.StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of the whole run (node, client and worker) to this file")
	f.StringVar(&traceOut, "trace", "", "write an execution trace of the whole run to this file (go tool trace; large: use a small N)")
	f.StringVar(&memProf, "memprofile", "", "write a heap profile to this file: when the memory scenario measures, else at the end")
	return c
}

func benchDefault(cmd *cobra.Command, name string, p *int, v int) {
	if !cmd.Flags().Changed(name) {
		*p = v
	}
}

func benchParseSync(s string) (persistence.SyncPolicy, error) {
	switch s {
	case "sync":
		return persistence.SyncAlways, nil
	case "interval":
		return persistence.SyncInterval, nil
	case "none":
		return persistence.SyncNone, nil
	}
	return 0, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "sync", Message: fmt.Sprintf("%q: use sync, interval or none", s)}
}

// benchLogger logs kjob's warnings unless --log-level was given: info lines would
// tear the progress bar, and proto.actor's reconnect errors for the client, worker
// and node systems a scenario has just closed are noise here.
func benchLogger(cmd *cobra.Command) *slog.Logger {
	if f := cmd.Flag("log-level"); f != nil && f.Changed {
		return logger()
	}
	return slog.New(benchLogHandler{slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})})
}

// benchLogHandler drops the records of loggers tagged component=protoactor.
type benchLogHandler struct{ slog.Handler }

func (h benchLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	for _, a := range as {
		if a.Key == "component" && a.Value.String() == "protoactor" {
			return slog.DiscardHandler
		}
	}
	return benchLogHandler{h.Handler.WithAttrs(as)}
}

func (h benchLogHandler) WithGroup(name string) slog.Handler {
	return benchLogHandler{h.Handler.WithGroup(name)}
}

func runBench(ctx context.Context, o benchOpts) (*BenchReport, error) {
	rep := &BenchReport{Date: time.Now().UTC().Format(time.RFC3339), Cores: runtime.NumCPU(), Procs: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), Mode: "embedded", Sync: o.sync.String()}
	if o.servers != nil {
		rep.Mode, rep.Sync = "servers", "(the cluster's)"
	} else {
		o.syncs = &benchSyncs{}
	}
	parent := o.dataDir
	if parent == "" {
		d, err := os.MkdirTemp("", "kjob-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		parent = d
	}
	// create and fire share one node and client, each with an app (so a shard) of
	// its own. recover and memory each start a node of their own after the shared
	// one is closed (its heap would slow their GC); when both run with the same N,
	// one population serves both: memory is measured on it before the restart.
	var shared *benchEnv
	closeShared := func() {
		if shared != nil {
			shared.close()
			shared = nil
		}
	}
	defer closeShared()
	both := slices.Contains(o.scenarios, "recover") && slices.Contains(o.scenarios, "memory") && o.recoverN == o.memoryN
	for _, s := range o.scenarios {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		var err error
		switch s {
		case "create", "fire":
			if shared == nil {
				if shared, err = newBenchEnv(ctx, o, filepath.Join(parent, "node")); err != nil {
					return rep, fmt.Errorf("bench: start: %w", err)
				}
			}
			if s == "create" {
				rep.Create, err = benchCreate(ctx, o, shared.scenario(s))
			} else {
				rep.Fire, err = benchFire(ctx, o, shared.scenario(s))
			}
		case "recover", "memory":
			if o.servers != nil {
				if rep.Skipped == nil {
					rep.Skipped = map[string]string{}
				}
				rep.Skipped[s] = "needs an embedded node (it restarts the node or reads its memory)"
				continue
			}
			if both && s == "memory" {
				continue // measured with recover
			}
			closeShared()
			dir := filepath.Join(parent, s)
			n := o.recoverN
			if s == "memory" {
				n = o.memoryN
			}
			var rr *BenchRecover
			var mr *BenchMemory
			rr, mr, err = benchRecoverMemory(ctx, o, dir, n, s == "recover", s == "memory" || both)
			if rr != nil {
				rep.Recover = rr
			}
			if mr != nil {
				rep.Memory = mr
			}
			_ = os.RemoveAll(dir)
		}
		if err != nil {
			return rep, fmt.Errorf("bench %s: %w", s, err)
		}
	}
	return rep, nil
}

// ---------------------------------------------------------------- environment

// benchEnv is a node (embedded, or none with --servers), a client and, for one
// app, a worker. A scenario's view of a shared env owns only its worker.
type benchEnv struct {
	node    *cluster.Node
	client  *cluster.Client
	worker  *cluster.Worker
	servers []string
	app     string
	suffix  string // of app names: unique per run on a shared cluster
	view    bool
}

// scenario is the view of e for scenario s: its own app, so its own shard.
func (e *benchEnv) scenario(s string) *benchEnv {
	return &benchEnv{node: e.node, client: e.client, servers: e.servers, app: "bench-" + s + e.suffix, suffix: e.suffix, view: true}
}

func (e *benchEnv) close() {
	if e.worker != nil {
		e.worker.Stop()
		e.worker = nil
	}
	if e.view {
		return
	}
	if e.client != nil {
		e.client.Close()
	}
	if e.node != nil {
		_ = e.node.Close()
	}
}

// benchStartNode starts an embedded node in dir and waits until it serves.
func benchStartNode(ctx context.Context, o benchOpts, dir, listen string) (*cluster.Node, error) {
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: listen, DataDir: dir, Sync: o.sync, Log: o.log, ArmMs: armFlag(o.armMs), LazySyncMs: armFlag(o.lazyMs), TLS: o.tls,
		OnJournalSync: o.syncs.add})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, benchReadyTimeout)
	defer cancel()
	for {
		err := n.Ready()
		if err == nil {
			return n, nil
		}
		if benchSleep(ctx, 10*time.Millisecond) != nil {
			_ = n.Close()
			return nil, fmt.Errorf("node not ready after %s: %w", benchReadyTimeout, err)
		}
	}
}

// benchSyncs keeps how long each of the embedded nodes' journal syncs took and
// when it ended, so that a scenario can say what the disk did in its window: a
// fire whose record is not yet durable at its due waits for the sync.
type benchSyncs struct {
	mu  sync.Mutex
	at  []int64 // Unix ns the sync ended
	ns  []int64 // how long it took
	cut int     // syncs not kept: past benchSyncsMax
}

// benchSyncsMax bounds the memory of benchSyncs: 24 MiB, over an hour of this
// machine's syncs at their busiest.
const benchSyncsMax = 1 << 20

// add is the nodes' NodeConfig.OnJournalSync (a nil b keeps nothing).
func (b *benchSyncs) add(took time.Duration, at time.Time) {
	if b == nil {
		return
	}
	b.mu.Lock()
	if len(b.at) < benchSyncsMax {
		b.at, b.ns = append(b.at, at.UnixNano()), append(b.ns, int64(took))
	} else {
		b.cut++
	}
	b.mu.Unlock()
}

// between are the durations of the syncs that ended in [from, to], and whether
// some may be missing (more syncs than benchSyncsMax).
func (b *benchSyncs) between(from, to time.Time) (ns []int64, cut bool) {
	if b == nil {
		return nil, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	lo, hi := from.UnixNano(), to.UnixNano()
	for i, at := range b.at {
		if at >= lo && at <= hi {
			ns = append(ns, b.ns[i])
		}
	}
	return ns, b.cut > 0
}

func benchSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// newBenchEnv starts (or reaches) the servers and connects a client.
func newBenchEnv(ctx context.Context, o benchOpts, dir string) (*benchEnv, error) {
	e := &benchEnv{servers: o.servers, app: "bench"}
	if o.servers == nil {
		n, err := benchStartNode(ctx, o, dir, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		e.node, e.servers = n, []string{n.Address()}
	} else {
		// Apps of its own on a shared cluster, so runs of other apps are not counted.
		e.suffix = fmt.Sprintf("-%d", time.Now().UnixNano()%1_000_000_000)
	}
	if err := e.connect(ctx, o, nil); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// startWorker starts a worker for e's app running handler as "noop".
func (e *benchEnv) startWorker(o benchOpts, handler cluster.HandlerFunc) error {
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: e.servers, App: e.app, Capacity: o.capacity, Log: o.log, TLS: o.tls})
	if err != nil {
		return err
	}
	w.HandleFunc("noop", handler)
	if err := w.Start(); err != nil {
		return err
	}
	e.worker = w
	return nil
}

// connect starts a worker (when handler is set) and a client.
func (e *benchEnv) connect(ctx context.Context, o benchOpts, handler cluster.HandlerFunc) error {
	if handler != nil {
		if err := e.startWorker(o, handler); err != nil {
			return err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, benchReadyTimeout)
	defer cancel()
	c, err := cluster.NewClient(cctx, cluster.ClientConfig{Servers: e.servers, Log: o.log, NoBatch: o.noBatch, TLS: o.tls})
	if err != nil {
		return err
	}
	e.client = c
	return nil
}

// job is a one-shot job of the bench app due at atMs with params p.
func (e *benchEnv) job(atMs int64, p []byte) *messages.Job {
	return &messages.Job{Id: e.client.NewID(), App: e.app, Handler: "noop", Params: p,
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: atMs}}
}

// params is the job's index in decimal, padded to size bytes (at least the digits).
func benchParams(i, size int) []byte {
	b := strconv.AppendInt(make([]byte, 0, max(size, 20)), int64(i), 10) // one allocation, as the Asynq side's payload
	for len(b) < size {
		b = append(b, ' ')
	}
	return b
}

func benchParamsIndex(p []byte) (int, bool) {
	i, err := strconv.Atoi(strings.TrimRight(string(p), " "))
	return i, err == nil
}

// benchCreateMany creates n jobs made by mk with conc requests in flight, in index
// order; latNs[i] (when non-nil) gets each ack's latency and ackNs[i] (when
// non-nil) the ack's wall time.
func benchCreateMany(ctx context.Context, e *benchEnv, n, conc int, mk func(i int) *messages.Job,
	latNs, ackNs []int64, p *benchProgress) (errs int, err error) {
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				j := mk(i)
				t0 := time.Now()
				_, err := e.client.Create(ctx, j)
				t1 := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					firstErr.CompareAndSwap(nil, &err)
					if failed.Add(1) >= benchMaxErrors {
						cancel()
					}
					continue
				}
				if latNs != nil {
					latNs[i] = int64(t1.Sub(t0))
				}
				if ackNs != nil {
					ackNs[i] = t1.UnixNano()
				}
				p.add(1)
			}
		}()
	}
	wg.Wait()
	errs = int(failed.Load())
	if errs >= benchMaxErrors {
		return errs, fmt.Errorf("%d creates failed, first: %w", errs, *firstErr.Load())
	}
	if e := ctx.Err(); e != nil && errs == 0 {
		return errs, e
	}
	return errs, nil
}

// ---------------------------------------------------------------- create

func benchCreate(ctx context.Context, o benchOpts, e *benchEnv) (*BenchCreate, error) {
	far := time.Now().Add(benchFarFuture).UnixMilli()
	// Warm-up: place the shard, open connections, fill the pools.
	warm := min(o.createN, 1_000)
	if _, err := benchCreateMany(ctx, e, warm, o.concurrency, func(i int) *messages.Job { return e.job(far, benchParams(i, o.paramsBytes)) }, nil, nil, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	lat := make([]int64, o.createN)
	p := startBenchProgress(o.progress, "create", o.createN)
	b0, k0 := e.client.CreateBatches()
	cpu0, t0 := processCPU(), time.Now()
	errs, err := benchCreateMany(ctx, e, o.createN, o.concurrency, func(i int) *messages.Job { return e.job(far, benchParams(i, o.paramsBytes)) }, lat, nil, p)
	el, cpu := time.Since(t0), processCPU()-cpu0
	p.finish()
	if err != nil {
		return nil, err
	}
	ok := o.createN - errs
	res := &BenchCreate{N: o.createN, Concurrency: o.concurrency, Seconds: el.Seconds(),
		AcksPerSec: float64(ok) / el.Seconds(), Latency: benchDist(benchNonZero(lat)), Errors: errs,
		CPUSeconds: cpu.Seconds()}
	if b1, k1 := e.client.CreateBatches(); b1 > b0 {
		res.PerBatch = float64(k1-k0) / float64(b1-b0)
	}
	return res, nil
}

// ---------------------------------------------------------------- fire

// fireRecorder is the handler side of the fire scenario.
type fireRecorder struct {
	count   []atomic.Int32 // executions per job index
	lateNs  []atomic.Int64 // first execution's lateness, by job index
	startNs []atomic.Int64 // first execution's handler start, by job index
	sentNs  []atomic.Int64 // first execution's dispatch by the shard (dispatched_ms), by job index
	fired   atomic.Int64
	dups    atomic.Int64
	early   atomic.Int64
	retried atomic.Int64
	other   atomic.Int64 // runs that are not fire-scenario jobs (warm-up)
	p       atomic.Pointer[benchProgress]
}

func newFireRecorder(n int) *fireRecorder {
	return &fireRecorder{count: make([]atomic.Int32, n), lateNs: make([]atomic.Int64, n), startNs: make([]atomic.Int64, n),
		sentNs: make([]atomic.Int64, n)}
}

func (r *fireRecorder) handle(_ context.Context, run *cluster.Run) error {
	now := time.Now().UnixNano()
	i, ok := benchParamsIndex(run.Params)
	if !ok || i < 0 || i >= len(r.count) {
		r.other.Add(1)
		return nil
	}
	if r.count[i].Add(1) > 1 {
		r.dups.Add(1)
		return nil
	}
	late := now - run.DueMs*int64(time.Millisecond)
	if late < 0 {
		r.early.Add(1)
	}
	if run.Attempt > 1 {
		r.retried.Add(1)
	}
	r.lateNs[i].Store(late)
	r.startNs[i].Store(now)
	r.sentNs[i].Store(run.DispatchedMs * int64(time.Millisecond))
	r.fired.Add(1)
	if p := r.p.Load(); p != nil {
		p.add(1)
	}
	return nil
}

func benchFire(ctx context.Context, o benchOpts, e *benchEnv) (*BenchFire, error) {
	n := o.fireN
	rec := newFireRecorder(n)
	if err := e.startWorker(o, rec.handle); err != nil {
		return nil, err
	}
	defer e.close()
	// Warm-up: one job due now must fire (the worker is registered with the shard),
	// then a probe of creates far in the future measures the create rate to set the
	// lead time, so that every job is acknowledged before it is due.
	warmParams := []byte("warm-up")
	if _, err := e.client.Create(ctx, e.job(time.Now().UnixMilli(), warmParams)); err != nil {
		return nil, fmt.Errorf("warm-up create: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, benchReadyTimeout)
	for rec.other.Load() == 0 {
		if benchSleep(wctx, 5*time.Millisecond) != nil {
			cancel()
			return nil, fmt.Errorf("warm-up job did not fire within %s (no worker registered?)", benchReadyTimeout)
		}
	}
	cancel()
	far := time.Now().Add(benchFarFuture).UnixMilli()
	probe := min(benchProbeCreates, n)
	t0 := time.Now()
	if _, err := benchCreateMany(ctx, e, probe, o.concurrency, func(int) *messages.Job { return e.job(far, warmParams) }, nil, nil, nil); err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	probeRate := float64(probe) / time.Since(t0).Seconds()
	lead := time.Duration(float64(n)/probeRate*1.5*float64(time.Second)) + time.Second
	firstDue := time.Now().Add(lead).UnixMilli()
	dueMs := func(i int) int64 { return firstDue + int64(i)*1000/int64(o.fireRate) }
	ack := make([]int64, n)
	p := startBenchProgress(o.progress, "fire: create", n)
	c0 := time.Now()
	cerrs, err := benchCreateMany(ctx, e, n, o.concurrency, func(i int) *messages.Job { return e.job(dueMs(i), benchParams(i, o.paramsBytes)) }, nil, ack, p)
	createEl := time.Since(c0)
	p.finish()
	if err != nil {
		return nil, err
	}
	// The process's figures from the first due (the creates are all acknowledged
	// well before it) until the last fire.
	var start processMark
	if wait := time.Until(time.UnixMilli(firstDue)); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	start = markProcess()
	// Fires already done count toward the bar from its start.
	p = startBenchProgress(o.progress, "fire: wait", n)
	rec.p.Store(p)
	p.add(rec.fired.Load())
	deadline := time.UnixMilli(dueMs(n - 1)).Add(benchFireGrace)
	for rec.fired.Load() < int64(n-cerrs) && time.Now().Before(deadline) {
		if benchSleep(ctx, 10*time.Millisecond) != nil {
			break
		}
	}
	windowEnd := time.Now()
	proc := start.since()
	time.Sleep(200 * time.Millisecond) // a duplicate would show up now
	rec.p.Store(nil)
	p.finish()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &BenchFire{N: n, OfferedPerSec: float64(o.fireRate), WindowSeconds: float64(dueMs(n-1)-firstDue) / 1000,
		CreatePerSec: float64(n-cerrs) / createEl.Seconds(), Fired: int(rec.fired.Load()),
		Duplicates: int(rec.dups.Load()), Early: int(rec.early.Load()), Retried: int(rec.retried.Load()), CreateErrors: cerrs,
		Process: proc}
	var lates, starts, shardLates, deliveries []int64
	for i := range n {
		if ack[i] > dueMs(i)*int64(time.Millisecond) {
			res.CreatedLate++
		}
		if rec.count[i].Load() == 0 || rec.startNs[i].Load() == 0 {
			continue
		}
		lates = append(lates, rec.lateNs[i].Load())
		starts = append(starts, rec.startNs[i].Load())
		sent := rec.sentNs[i].Load()
		shardLates = append(shardLates, sent-dueMs(i)*int64(time.Millisecond))
		deliveries = append(deliveries, rec.startNs[i].Load()-sent)
	}
	res.Fired = len(lates)
	res.Missing = n - cerrs - res.Fired
	res.Lateness = benchDist(lates)
	res.ShardLateness, res.DeliveryLateness = benchDist(shardLates), benchDist(deliveries)
	res.FiresPerSec, res.FiresPerSecMax = benchFireRates(starts)
	// The window's syncs: from the first fire's arming (ArmMs before its due, at
	// most a second) until the last fire (or the wait's end).
	if syncs, cut := o.syncs.between(time.UnixMilli(firstDue).Add(-time.Second), windowEnd); len(syncs) > 0 {
		d := benchDist(syncs)
		res.JournalSync, res.JournalSyncCut = &d, cut
		for _, ns := range syncs {
			if ns > int64(benchSlowSync) {
				res.JournalSlowSyncs++
			}
		}
	}
	if o.latencyOut != "" {
		if err := benchWriteSamples(o.latencyOut, lates); err != nil {
			return res, err
		}
	}
	return res, nil
}

// benchFireRates is the sustained rate (fires over the span from first to last) and the
// busiest one-second window's.
func benchFireRates(startNs []int64) (sustained, peak float64) {
	if len(startNs) < 2 {
		return 0, 0
	}
	s := slices.Clone(startNs)
	slices.Sort(s)
	span := float64(s[len(s)-1]-s[0]) / 1e9
	if span > 0 {
		sustained = float64(len(s)-1) / span
	}
	j := 0
	for i := range s {
		for s[i]-s[j] >= int64(time.Second) {
			j++
		}
		peak = max(peak, float64(i-j+1))
	}
	return sustained, peak
}

func benchWriteSamples(path string, ns []int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, v := range ns {
		w.WriteString(strconv.FormatInt(v, 10))
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ---------------------------------------------------------------- recover

// benchRecoverMemory populates a node of its own with n pending jobs; with mem it
// measures the memory they hold, with rec it then restarts the node and measures
// the recovery. The client and the worker stay up across the restart, on the same
// address, as they would in production.
func benchRecoverMemory(ctx context.Context, o benchOpts, dir string, n int, rec, mem bool) (*BenchRecover, *BenchMemory, error) {
	var rres *BenchRecover
	if rec {
		rres = &BenchRecover{Pending: n}
		// Baseline: the same restart of a node whose journal is empty, to tell the
		// fixed cost of starting a cluster member from the cost of replay. The
		// first start, which makes (and zero-fills) the journal's first segment,
		// is not timed: a restart does not do that.
		emptyCfg := cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: dir + "-empty", Sync: o.sync, Log: o.log, ArmMs: armFlag(o.armMs), LazySyncMs: armFlag(o.lazyMs), TLS: o.tls}
		defer os.RemoveAll(emptyCfg.DataDir)
		empty, err := cluster.StartNode(emptyCfg)
		if err != nil {
			return nil, nil, err
		}
		_ = empty.Close()
		t0 := time.Now()
		empty, err = cluster.StartNode(emptyCfg)
		if err != nil {
			return nil, nil, err
		}
		rres.EmptyStartSeconds = time.Since(t0).Seconds()
		_ = empty.Close()
	}
	addr, err := benchFreeAddr()
	if err != nil {
		return nil, nil, err
	}
	node, err := benchStartNode(ctx, o, dir, addr)
	if err != nil {
		return nil, nil, err
	}
	e := &benchEnv{node: node, servers: []string{addr}, app: "bench-recover"}
	defer e.close()
	var restarted atomic.Bool
	var early atomic.Int64
	var sentinelID atomic.Int64
	fired := make(chan time.Time, 1)
	handler := func(_ context.Context, r *cluster.Run) error {
		if r.JobID != sentinelID.Load() {
			return nil
		}
		if !restarted.Load() {
			early.Add(1)
			return nil
		}
		select {
		case fired <- time.Now():
		default:
		}
		return nil
	}
	if err := e.connect(ctx, o, handler); err != nil {
		return nil, nil, err
	}
	far := time.Now().Add(benchFarFuture).UnixMilli()
	mk := func(i int) *messages.Job { return e.job(far, benchParams(i, o.paramsBytes)) }
	// Warm-up: place the shard and fill the pools, so the baseline holds them.
	if _, err := benchCreateMany(ctx, e, min(n, 1_000), o.concurrency, mk, nil, nil, nil); err != nil {
		return nil, nil, fmt.Errorf("warm-up: %w", err)
	}
	ids := make([]int64, n) // before the baseline: the bench's own, not the node's
	var before benchRSS
	var heapBefore uint64
	if mem {
		if before, heapBefore, err = benchSettle(); err != nil {
			return nil, nil, err
		}
	}
	label := "recover: populate"
	if !rec {
		label = "memory: populate"
	}
	p := startBenchProgress(o.progress, label, n)
	_, err = benchCreateMany(ctx, e, n, o.concurrency, func(i int) *messages.Job {
		j := mk(i)
		ids[i] = j.Id
		return j
	}, nil, nil, p)
	p.finish()
	if err != nil {
		return nil, nil, err
	}
	var mres *BenchMemory
	if mem {
		// Let the journal's flusher and a snapshot in progress go quiet first.
		time.Sleep(200 * time.Millisecond)
		after, heapAfter, err := benchSettle()
		if err != nil {
			return nil, nil, err
		}
		if o.memProfile != "" {
			if err := benchWriteHeapProfile(o.memProfile); err != nil {
				return nil, nil, err
			}
		}
		per := func(a, b int64) float64 { return float64(a-b) / float64(n) }
		mres = &BenchMemory{Pending: n, RSSBeforeBytes: before.total, RSSAfterBytes: after.total,
			BytesPerJob: per(after.total, before.total), AnonBytesPerJob: per(after.anon, before.anon),
			FileBytesPerJob: per(after.file, before.file), HeapBytesPerJob: per(int64(heapAfter), int64(heapBefore))}
	}
	if !rec {
		return nil, mres, nil
	}

	// The sentinel is due while the node is down: the restarted node must fire it.
	sentinel := e.job(time.Now().Add(benchRecoverDown).UnixMilli(), []byte("sentinel"))
	sentinelID.Store(sentinel.Id)
	if _, err := e.client.Create(ctx, sentinel); err != nil {
		return nil, nil, err
	}
	_ = e.node.Close()
	e.node = nil
	if early.Load() > 0 {
		return nil, nil, errors.New("the sentinel fired before the node was stopped (Close took too long)")
	}
	rres.JournalBytes = benchDirBytes(dir)
	time.Sleep(time.Until(time.UnixMilli(sentinel.Schedule.AtMs + 10)))

	p = startBenchProgress(o.progress, "recover: restart", 0)
	defer p.finish()
	restarted.Store(true)
	t0 := time.Now()
	node, err = cluster.StartNode(cluster.NodeConfig{Listen: addr, DataDir: dir, Sync: o.sync, Log: o.log, ArmMs: armFlag(o.armMs), LazySyncMs: armFlag(o.lazyMs), TLS: o.tls})
	if err != nil {
		return nil, nil, fmt.Errorf("restart: %w", err)
	}
	rres.ReplaySeconds = time.Since(t0).Seconds()
	rres.Records = node.Recovery().Records
	e.node = node
	rctx, cancel := context.WithTimeout(ctx, benchRecoverTimeout)
	defer cancel()
	for {
		gctx, gcancel := context.WithTimeout(rctx, benchRecoverPoll)
		_, err := e.client.Get(gctx, e.app, ids[n/2])
		gcancel()
		if err == nil {
			break
		}
		if rctx.Err() != nil {
			return nil, nil, fmt.Errorf("not serving %s after restart: %w", benchRecoverTimeout, err)
		}
	}
	rres.ServingSeconds = time.Since(t0).Seconds()
	select {
	case at := <-fired:
		rres.FirstFireSeconds = at.Sub(t0).Seconds()
	case <-rctx.Done():
		return nil, nil, fmt.Errorf("the job due during the restart did not fire within %s", benchRecoverTimeout)
	}
	rres.ReplayJobsPerSec = float64(n) / rres.ReplaySeconds
	rres.JobsPerSec = float64(n) / rres.ServingSeconds
	if net := rres.ReplaySeconds - rres.EmptyStartSeconds; net > 0 {
		rres.NetReplayJobsPerSec = float64(n) / net
	}
	// Spot-check that acknowledged jobs survived.
	step := max(1, n/100)
	for i := 0; i < n; i += step {
		j, err := e.client.Get(ctx, e.app, ids[i])
		if err != nil {
			return nil, nil, fmt.Errorf("job %d (index %d) after restart: %w", ids[i], i, err)
		}
		if j.NextDueMs != far {
			return nil, nil, fmt.Errorf("job %d after restart: next due %d, want %d", ids[i], j.NextDueMs, far)
		}
		rres.Verified++
	}
	return rres, mres, nil
}

// benchFreeAddr is a loopback address with a port that was free a moment ago.
func benchFreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func benchDirBytes(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total
}

// ---------------------------------------------------------------- memory

// benchRSS is the process's resident memory from /proc/self/status, in bytes.
type benchRSS struct{ total, anon, file int64 }

func benchReadRSS() (benchRSS, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return benchRSS{}, err
	}
	var r benchRSS
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			r.total = kb << 10
		case "RssAnon":
			r.anon = kb << 10
		case "RssFile":
			r.file = kb << 10
		}
	}
	if r.total == 0 {
		return r, errors.New("no VmRSS in /proc/self/status")
	}
	return r, nil
}

// benchSettle collects garbage and returns freed memory to the OS, so what stays
// resident is what is referenced.
func benchSettle() (benchRSS, uint64, error) {
	var ms runtime.MemStats
	for range 2 {
		runtime.GC()
		debug.FreeOSMemory()
	}
	runtime.ReadMemStats(&ms)
	r, err := benchReadRSS()
	return r, ms.HeapAlloc, err
}

func benchWriteHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ---------------------------------------------------------------- statistics

func benchNonZero(ns []int64) []int64 {
	out := make([]int64, 0, len(ns))
	for _, v := range ns {
		if v != 0 {
			out = append(out, v)
		}
	}
	return out
}

// dist summarizes samples in nanoseconds (nearest-rank percentiles).
func benchDist(ns []int64) BenchDist {
	if len(ns) == 0 {
		return BenchDist{}
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return benchMs(s[min(max(i, 0), len(s)-1)])
	}
	return BenchDist{N: len(s), MinMs: benchMs(s[0]), P50Ms: q(0.50), P99Ms: q(0.99), P999Ms: q(0.999), MaxMs: benchMs(s[len(s)-1])}
}

func benchMs(ns int64) float64 { return math.Round(float64(ns)/1e3) / 1e3 }

// ---------------------------------------------------------------- output

func printBench(w io.Writer, r *BenchReport) {
	where := "embedded node, sync=" + r.Sync
	if r.Mode == "servers" {
		where = "against --servers"
	}
	fmt.Fprintf(w, "kjob bench  %s  %d cores (GOMAXPROCS %d)  %s  %s\n\n", r.Date, r.Cores, r.Procs, r.GoVersion, where)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tmetric\tvalue\t")
	row := func(s, m, v string) { fmt.Fprintf(tw, "%s\t%s\t%s\t\n", s, m, v) }
	if c := r.Create; c != nil {
		s := fmt.Sprintf("create (N=%d, C=%d)", c.N, c.Concurrency)
		row(s, "durable acks/s", benchNum(c.AcksPerSec))
		row(s, "ack latency p50 / p99 / p999", fmt.Sprintf("%.2f / %.2f / %.2f ms", c.Latency.P50Ms, c.Latency.P99Ms, c.Latency.P999Ms))
		row(s, "errors", strconv.Itoa(c.Errors))
		if c.PerBatch > 0 {
			row(s, "creates per client batch (mean)", fmt.Sprintf("%.1f", c.PerBatch))
		} else {
			row(s, "creates per client batch (mean)", "none sent (--no-batch)")
		}
		if c.CPUSeconds > 0 && c.N > 0 {
			of := "load generator, client and node"
			if r.Mode != "embedded" {
				of = "load generator and client; the servers not counted"
			}
			row(s, "CPU per create ("+of+")", fmt.Sprintf("%.1f µs (%.2f of %d cores busy)", c.CPUSeconds*1e6/float64(c.N), c.CPUSeconds/c.Seconds, runtime.NumCPU()))
		}
	}
	if f := r.Fire; f != nil {
		s := fmt.Sprintf("fire (N=%d at %s/s)", f.N, benchNum(f.OfferedPerSec))
		row(s, "lateness p50 / p99 / p999 / max", fmt.Sprintf("%.2f / %.2f / %.2f / %.2f ms", f.Lateness.P50Ms, f.Lateness.P99Ms, f.Lateness.P999Ms, f.Lateness.MaxMs))
		row(s, "  of which due -> shard's send p50 / p99 / max", fmt.Sprintf("%.0f / %.0f / %.0f ms (whole ms)", f.ShardLateness.P50Ms, f.ShardLateness.P99Ms, f.ShardLateness.MaxMs))
		row(s, "  and shard's send -> handler start p50 / p99 / max", fmt.Sprintf("%.2f / %.2f / %.2f ms", f.DeliveryLateness.P50Ms, f.DeliveryLateness.P99Ms, f.DeliveryLateness.MaxMs))
		if j := f.JournalSync; j != nil {
			cut := ""
			if f.JournalSyncCut {
				cut = "; some not kept"
			}
			row(s, "  the journal's msyncs in the window p50 / p99 / max", fmt.Sprintf("%.2f / %.2f / %.2f ms (%d syncs, %d over %s%s)",
				j.P50Ms, j.P99Ms, j.MaxMs, j.N, f.JournalSlowSyncs, benchSlowSync, cut))
		}
		if p := f.Process; p != nil && f.Fired > 0 {
			row(s, "  this process meanwhile: GC cycles, their pauses; allocated a fire; page faults", fmt.Sprintf("%d, %.1f ms; %s B; %d minor, %d major (%.1f s, %.2f cores busy)",
				p.GCCycles, p.GCPauseMs, benchNum(float64(p.AllocBytes)/float64(f.Fired)), p.MinorFaults, p.MajorFaults, p.Seconds, p.CPUSeconds/max(p.Seconds, 1e-9)))
		}
		row(s, "fires/s sustained (peak 1 s)", fmt.Sprintf("%s (%s)", benchNum(f.FiresPerSec), benchNum(f.FiresPerSecMax)))
		row(s, "fired / missing / duplicate / early / retried", fmt.Sprintf("%d / %d / %d / %d / %d", f.Fired, f.Missing, f.Duplicates, f.Early, f.Retried))
		row(s, "created after due (of N)", strconv.Itoa(f.CreatedLate))
	}
	if v := r.Recover; v != nil {
		s := fmt.Sprintf("recover (N=%d)", v.Pending)
		row(s, "journal on disk", fmt.Sprintf("%.1f MiB, %d records replayed", float64(v.JournalBytes)/(1<<20), v.Records))
		row(s, "StartNode (replay) / serving / first due fire", fmt.Sprintf("%.3f / %.3f / %.3f s", v.ReplaySeconds, v.ServingSeconds, v.FirstFireSeconds))
		row(s, "StartNode again on an empty journal (a restart: the baseline)", fmt.Sprintf("%.3f s", v.EmptyStartSeconds))
		row(s, "pending jobs/s of recovery (to serving)", benchNum(v.JobsPerSec))
		row(s, "pending jobs/s of StartNode (net of the baseline)", fmt.Sprintf("%s (%s)", benchNum(v.ReplayJobsPerSec), benchNum(v.NetReplayJobsPerSec)))
	}
	if m := r.Memory; m != nil {
		s := fmt.Sprintf("memory (N=%d)", m.Pending)
		row(s, "VmRSS per pending job", fmt.Sprintf("%.0f B (anon %.0f B, file %.0f B)", m.BytesPerJob, m.AnonBytesPerJob, m.FileBytesPerJob))
		row(s, "Go heap per pending job", fmt.Sprintf("%.0f B", m.HeapBytesPerJob))
		row(s, "VmRSS before / after", fmt.Sprintf("%.1f / %.1f MiB", float64(m.RSSBeforeBytes)/(1<<20), float64(m.RSSAfterBytes)/(1<<20)))
	}
	for _, s := range benchScenarios {
		if why, ok := r.Skipped[s]; ok {
			row(s, "skipped", why)
		}
	}
	tw.Flush()
}

// num formats a rate with thousands separators.
func benchNum(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[0] != '-' || i > 1 && (len(s)-i)%3 == 0 && s[0] == '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ---------------------------------------------------------------- benchProgress

// benchProgress is a one-line bar on stderr, redrawn with \r; nil (no writer) is a no-op.
type benchProgress struct {
	w     io.Writer
	label string
	total int64
	done  atomic.Int64
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startBenchProgress(w io.Writer, label string, total int) *benchProgress {
	if w == nil {
		return nil
	}
	p := &benchProgress{w: w, label: label, total: int64(total), start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(benchProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

func (p *benchProgress) add(n int64) {
	if p != nil {
		p.done.Add(n)
	}
}

func (p *benchProgress) draw() {
	const width = 30
	d := p.done.Load()
	el := time.Since(p.start)
	if p.total <= 0 {
		fmt.Fprintf(p.w, "\r%-18s %6.1fs", p.label, el.Seconds())
		return
	}
	f := min(float64(d)/float64(p.total), 1)
	bar := strings.Repeat("#", int(f*width)) + strings.Repeat(".", width-int(f*width))
	fmt.Fprintf(p.w, "\r%-18s [%s] %3.0f%% %d/%d %s/s %6.1fs", p.label, bar, f*100, d, p.total,
		benchNum(float64(d)/max(el.Seconds(), 1e-9)), el.Seconds())
}

func (p *benchProgress) finish() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.draw()
	fmt.Fprintln(p.w)
}
