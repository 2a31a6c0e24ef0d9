package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/shard"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

type globals struct {
	servers   string
	logLevel  string
	logFormat string
}

var g globals

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kjob",
		Short:         "kjob: a distributed scheduler for delayed, one-shot and periodic jobs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.servers, "servers", envOr("KJOB_SERVERS", "127.0.0.1:7070"), "comma-separated server addresses (env KJOB_SERVERS)")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	addTLSFlags(root)
	root.AddCommand(serverCmd(), workerCmd(), jobCmd(), dlqCmd(), clusterCmd(), demoCmd(), tlsCmd())
	root.AddCommand(benchCmd(), simCmd())
	return root
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func logger() *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(g.logLevel)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if g.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func serverCmd() *cobra.Command {
	var listen, peers, data, syncPol, webhook, httpAddr, appPolicies string
	var doneRetention time.Duration
	var armMs, lazyMs int64
	var split nscore.SplitPolicy
	exitOnJournal := true
	c := &cobra.Command{
		Use:   "server",
		Short: "run a kjob server (a cluster node); alone it is a single embedded node",
		RunE: func(cmd *cobra.Command, _ []string) error {
			pol := persistence.SyncAlways
			switch syncPol {
			case "sync":
			case "interval":
				pol = persistence.SyncInterval
			case "none":
				pol = persistence.SyncNone
			default:
				return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "sync", Message: fmt.Sprintf("%q: use sync, interval or none", syncPol)}
			}
			var hooks []shard.AlertHook
			if webhook != "" {
				hooks = append(hooks, shard.Webhook{URL: webhook})
			}
			var policies map[string]*messages.Policy
			if appPolicies != "" {
				var err error
				if policies, err = cluster.LoadAppPolicies(appPolicies); err != nil {
					return err
				}
			}
			if doneRetention < time.Second {
				return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "done-retention", Message: fmt.Sprintf("%s: must be at least 1s", doneRetention)}
			}
			tl, err := clusterTLS()
			if err != nil {
				return err
			}
			cluster.RouteLibraryLogs(logger())
			httpAddr = serverHTTP(cmd, listen, httpAddr)
			n, err := cluster.StartNode(cluster.NodeConfig{Listen: listen, Peers: splitList(peers), DataDir: data, Sync: pol, Log: logger(),
				AlertHooks: hooks, HTTP: httpAddr, Split: split, AppPolicies: policies, TLS: tl,
				Shard: shardcore.Config{DoneRetentionMs: doneRetention.Milliseconds()}, ArmMs: armFlag(armMs), LazySyncMs: armFlag(lazyMs)})
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			var failed <-chan struct{}
			if exitOnJournal {
				failed = n.JournalFailed()
			}
			select {
			case <-ctx.Done():
				return n.Close()
			case <-failed:
				return journalFailedExit(n, logger())
			}
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:7070", "address of this node's proto.actor remote")
	c.Flags().StringVar(&peers, "peers", "", "comma-separated remote addresses of all servers (self included); empty = single node")
	c.Flags().StringVar(&data, "data", "kjob-data", "data directory (journal and snapshots)")
	c.Flags().StringVar(&httpAddr, "http", "127.0.0.1:7080", "address of the admin API and /metrics; default: the --listen host, port + 10; \"off\" for none")
	c.Flags().StringVar(&webhook, "dlq-webhook", "", "URL that receives a JSON POST for each new dead letter")
	c.Flags().StringVar(&appPolicies, "app-policies", "", "JSON file of per-app default policies, {\"app\": {\"attempts\": 3, \"ladderMs\": [\"1000\"], \"timeoutMs\": \"30000\", \"misfire\": \"SKIP\", ...}}: what a job's policy leaves unset (give every server the same file)")
	c.Flags().StringVar(&syncPol, "sync", "sync", "journal flush policy: sync (ack after msync), interval, none (tests only)")
	c.Flags().Int64Var(&armMs, "arm-ms", shardcore.DefaultArmMs, armUsage)
	c.Flags().Int64Var(&lazyMs, "lazy-sync-ms", shardcore.DefaultLazySyncMs, lazyUsage)
	c.Flags().DurationVar(&doneRetention, "done-retention", time.Duration(shardcore.DefaultDoneRetentionMs)*time.Millisecond, "how long a job that will never fire again (a one-shot that ran) stays readable with its run history")
	c.Flags().IntVar(&split.Workers, "split-workers", nscore.DefaultSplitWorkers, "split an app's shard when the app has more live workers than this per shard (-1: never)")
	c.Flags().Int64Var(&split.Fires, "split-fires", nscore.DefaultSplitFires, "split a shard that fires more runs than this a minute (-1: never)")
	c.Flags().BoolVar(&exitOnJournal, "exit-on-journal-failure", true, "exit (status 1) when the journal fails (a failed msync or fsync is fatal), so the supervisor restarts the node and the restart recovers it from the disk; false: stay up, serving reads, until someone restarts it (/healthz and /readyz answer 503 either way, so a liveness probe restarts it too)")
	return c
}

// journalFailedExit ends a server whose journal failed a sync. Nothing is
// retried after a failed sync (the page cache may no longer match the disk), so
// the node takes no write until a restart, which recovers every shard from what
// reached the disk: exiting hands that to the supervisor (systemd's Restart=,
// an orchestrator's restart policy), as databases do after a failed fsync. The
// node leaves the cluster first if it can within closeWait.
func journalFailedExit(n *cluster.Node, log *slog.Logger) error {
	err := n.JournalErr()
	log.Error("journal failed: exiting so that a restart recovers the node from its disk", "err", err)
	done := make(chan struct{})
	go func() {
		_ = n.Close() // its error is the journal's
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
		log.Error("leaving the cluster took too long: exiting without it", "waited", closeWait)
	}
	return fmt.Errorf("journal failed (restart the server to recover it from the disk): %w", err)
}

// closeWait bounds how long a server whose journal failed waits to leave the
// cluster before it exits.
const closeWait = 10 * time.Second

const armUsage = "a shard journals a fire up to this many ms before its due and sends it at the due, so the fire does not wait for the msync; a change to a job arriving that close to a due is applied after the fire (0: journal at the due)"

const lazyUsage = "a shard's records that nothing waits for at once (results' acknowledgements, fires armed ahead of their due) may wait this many ms for their msync, riding on the next one another append asks for: fewer msyncs under a steady stream of fires (0: every step syncs at once)"

// armFlag is NodeConfig.ArmMs for an --arm-ms, and NodeConfig.LazySyncMs for a
// --lazy-sync-ms (0 = none).
func armFlag(ms int64) int64 {
	if ms <= 0 {
		return -1
	}
	return ms
}

func newClient(ctx context.Context) (*cluster.Client, error) {
	tl, err := clusterTLS()
	if err != nil {
		return nil, err
	}
	return cluster.NewClient(ctx, cluster.ClientConfig{Servers: splitList(g.servers), Log: logger(), TLS: tl})
}

// nextPage tells how to get the next page of a list: after the rows, or on
// stderr with --json so stdout stays one JSON object per line.
func nextPage(asJSON bool, after string) {
	w := os.Stdout
	if asJSON {
		w = os.Stderr
	}
	fmt.Fprintf(w, "# next page: --after %s\n", after)
}

func printJSON(v any) {
	if m, ok := v.(proto.Message); ok {
		b, _ := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false}.Marshal(m)
		fmt.Println(string(b))
		return
	}
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func ms(t int64) string {
	if t == 0 {
		return "-"
	}
	return time.UnixMilli(t).UTC().Format("2006-01-02T15:04:05.000Z")
}

// serverHTTP resolves --http: an explicit address is used as given ("off" = none);
// the default follows --listen (port + 10) and is dropped, with a warning, when
// something else already holds it, so several local nodes still start.
func serverHTTP(cmd *cobra.Command, listen, flag string) string {
	if cmd.Flags().Changed("http") {
		if flag == "off" {
			return ""
		}
		return flag
	}
	addr := cluster.DefaultHTTP(listen)
	if addr == "" {
		return ""
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		logger().Warn("admin http off: its default address is taken (set --http)", "http", addr, "err", err)
		return ""
	}
	_ = l.Close()
	return addr
}
