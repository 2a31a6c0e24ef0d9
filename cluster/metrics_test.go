package cluster_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	dto "github.com/prometheus/client_model/go"

	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// TestMetricsAfterWorkload runs a small workload — one-shots that succeed, a job that
// fails down the whole ladder into the dead-letter queue, a run with no worker, a
// worker that falls silent — and checks that /metrics moved as it should.
func TestMetricsAfterWorkload(t *testing.T) {
	n := obsNode(t, nil)
	var ok atomic.Int64
	obsWorker(t, n, "orders", nil, map[string]cluster.HandlerFunc{
		"echo": func(context.Context, *cluster.Run) error { ok.Add(1); return nil },
		"fail": func(context.Context, *cluster.Run) error { return errors.New("boom") },
	})
	obsReady(t, n)

	// A worker that heartbeats twice, 2.2 s apart (one interval missed), then falls
	// silent until the NameServer expires it.
	ghost := func() {
		n.System().Root.Send(actor.NewPID(n.Address(), server.Name), &messages.WorkerHeartbeat{SentMs: time.Now().UnixMilli(),
			Worker: &messages.WorkerInfo{WorkerId: "ghost-1", App: "ghosts", Capacity: 1, Ref: &messages.Ref{Address: n.Address(), Id: "nobody"}}})
	}
	ghost()
	ghostAgain := time.AfterFunc(2200*time.Millisecond, ghost)
	defer ghostAgain.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: obsQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const runs = 40
	for i := 0; i < runs; i++ {
		if _, err := c.Create(ctx, &messages.Job{App: "orders", Handler: "echo",
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: int64(50 + i*10)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Create(ctx, &messages.Job{App: "orders", Handler: "fail", Policy: &messages.Policy{Attempts: 3, LadderMs: []int64{100, 100}},
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 10}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, &messages.Job{App: "orders", Handler: "echo",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 3_600_000}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, &messages.Job{App: "lonely", Handler: "echo",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 10}}); err != nil {
		t.Fatal(err)
	}

	orders := map[string]string{"app": "orders"}
	obsWait(t, 20*time.Second, "the workload to finish and the ghost worker to expire", func() bool {
		f := obsScrape(t, n)
		return ok.Load() >= runs && obsValue(f, "kjob_dead_lettered_total", orders) == 1 &&
			obsValue(f, "kjob_workers_expired_total", map[string]string{"app": "ghosts"}) == 1 &&
			obsValue(f, "kjob_backlog_runs", map[string]string{"app": "lonely"}) == 1
	})
	f := obsScrape(t, n)
	for _, c := range []struct {
		name   string
		labels map[string]string
		min    float64
		max    float64 // 0 = no upper bound
	}{
		{"kjob_runs_total", map[string]string{"app": "orders", "outcome": "succeeded"}, runs, runs},
		{"kjob_runs_total", map[string]string{"app": "orders", "outcome": "failed"}, 3, 3},
		{"kjob_retries_total", map[string]string{"app": "orders", "level": "0"}, 1, 1},
		{"kjob_retries_total", map[string]string{"app": "orders", "level": "1"}, 1, 1},
		{"kjob_dead_lettered_total", orders, 1, 1},
		{"kjob_dead_letters", orders, 1, 1},
		{"kjob_dispatches_total", orders, runs + 3, runs + 3},
		{"kjob_dispatch_lateness_seconds", orders, runs + 1, runs + 1}, // first attempts only
		{"kjob_start_lateness_seconds", orders, runs + 1, runs + 1},
		{"kjob_pending_jobs", orders, 1, 1}, // the job an hour away
		{"kjob_jobs", orders, runs + 2, runs + 2},
		{"kjob_runs_in_flight", orders, 0, 0},
		{"kjob_runs_held", orders, 0, 0},
		{"kjob_backlog_runs", orders, 0, 0},
		{"kjob_backlog_runs", map[string]string{"app": "lonely"}, 1, 1},
		{"kjob_shards", nil, 2, 2},
		{"kjob_shard_failed", nil, 0, 0},
		{"kjob_journal_append_seconds", nil, runs, 0},
		{"kjob_journal_sync_seconds", nil, runs, 0},   // the creates
		{"kjob_journal_lazy_sync_seconds", nil, 1, 0}, // results' acks
		{"kjob_journal_appended_records_total", nil, 3 * runs, 0},
		{"kjob_journal_appended_bytes_total", nil, 3 * runs * persistence.RecordHeaderSize, 0},
		{"kjob_journal_append_errors_total", nil, 0, 0},
		{"kjob_journal_syncs_total", nil, 1, 0},
		{"kjob_journal_msync_seconds", nil, 1, 0},
		{"kjob_journal_durable_lsn", nil, 3 * runs, 0},
		{"kjob_route_table_version", nil, 1, 0},
		{"kjob_route_table_updates_total", nil, 1, 0},
		{"kjob_shard_assignments_total", nil, 2, 0},
		{"kjob_nameserver_active", nil, 1, 1},
		{"kjob_nameserver_decisions_total", map[string]string{"decision": "place"}, 2, 0},
		{"kjob_nameserver_route_pushes_total", nil, 1, 0},
		{"kjob_server_heartbeats_total", nil, 1, 0},
		{"kjob_worker_heartbeats_total", orders, 1, 0},
		{"kjob_worker_heartbeats_total", map[string]string{"app": "ghosts"}, 2, 2},
		{"kjob_worker_heartbeats_missed_total", map[string]string{"app": "ghosts"}, 1 + 3, 0}, // the gap, then ≥ 3 before expiry
		{"kjob_workers_expired_total", map[string]string{"app": "ghosts"}, 1, 1},
		{"kjob_workers_expired_total", orders, 0, 0},
		{"kjob_workers", orders, 1, 1},
		{"kjob_node_ready", nil, 1, 1},
		{"kjob_journal_failed", nil, 0, 0},
		{"kjob_journal_segments", nil, 1, 0},
		{"kjob_journal_compacted_segments_total", nil, 0, 0}, // one segment: nothing to compact
		{"go_goroutines", nil, 1, 0},
	} {
		got := obsValue(f, c.name, c.labels)
		if f[c.name] == nil && c.min > 0 {
			t.Errorf("%s: missing from /metrics", c.name)
		} else if got < c.min || (c.max > 0 && got > c.max) || (c.max == 0 && c.min == 0 && got != 0) {
			t.Errorf("%s%v = %v, want in [%v, %v]", c.name, c.labels, got, c.min, c.max)
		}
	}
	// Lateness: every first dispatch of this idle node is well under a second late.
	if h := f["kjob_dispatch_lateness_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleSum() > float64(runs+1) {
		t.Errorf("dispatch lateness sums to %v s over %d runs", h.GetSampleSum(), h.GetSampleCount())
	}
	for name, fam := range f {
		if !strings.HasPrefix(name, "kjob_") {
			continue
		}
		for _, m := range fam.Metric {
			for _, l := range m.Label {
				if l.GetName() == "job" || l.GetName() == "run" || l.GetName() == "id" {
					t.Errorf("%s has a label %q: job and run ids are unbounded", name, l.GetName())
				}
			}
		}
		if fam.GetType().String() == "COUNTER" && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
	}

	// The example alert rules only use metrics that exist.
	rules, err := os.ReadFile("../deploy/prometheus/kjob-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range regexp.MustCompile(`kjob_[a-z_]+`).FindAllString(string(rules), -1) {
		base := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suf); ok && f[b] != nil && f[b].GetType() == dto.MetricType_HISTOGRAM {
				base = b
			}
		}
		if base == "kjob_tls_certificate_expiry_timestamp_seconds" || base == "kjob_tls_reload_failing" || base == "kjob_tls_refused_total" {
			continue // served by a node with TLS only: TestMutualTLS and TestTLSRoles scrape them
		}
		if f[base] == nil {
			t.Errorf("deploy/prometheus/kjob-alerts.yml uses %s, which /metrics does not serve", name)
		}
	}

	// A worker for the lonely app drains its backlog.
	obsWorker(t, n, "lonely", nil, map[string]cluster.HandlerFunc{"echo": func(context.Context, *cluster.Run) error { return nil }})
	obsWait(t, 10*time.Second, "the lonely backlog to drain", func() bool {
		f := obsScrape(t, n)
		return obsValue(f, "kjob_backlog_runs", map[string]string{"app": "lonely"}) == 0 &&
			obsValue(f, "kjob_runs_total", map[string]string{"app": "lonely", "outcome": "succeeded"}) == 1
	})
	// The admin API counts its own requests.
	if v := obsValue(obsScrape(t, n), "kjob_admin_requests_total", map[string]string{"route": "GET /metrics", "code": "200"}); v < 2 {
		t.Errorf("kjob_admin_requests_total for /metrics = %v", v)
	}
}

// TestMetricsRegistryPerNode: two nodes in one process keep their own figures.
func TestMetricsRegistryPerNode(t *testing.T) {
	a := obsNode(t, nil)
	b := obsNode(t, nil)
	if a.Metrics() == b.Metrics() {
		t.Fatal("two nodes share a registry")
	}
	for _, n := range []*cluster.Node{a, b} {
		if _, err := n.Metrics().Gather(); err != nil {
			t.Fatalf("gather: %v", err)
		}
	}
}

// TestHandoffStuckMetric: a shard frozen for a handoff whose target never answers
// fires nothing, and says so: kjob_shard_handoff_seconds grows from the freeze on (the
// KjobShardHandoffStuck alert reads it); it is 0 for a shard that is not moving.
func TestHandoffStuckMetric(t *testing.T) {
	n := obsNode(t, nil)
	obsReady(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: obsQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Create(ctx, &messages.Job{App: "stuck", Handler: "echo",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 3_600_000}}); err != nil {
		t.Fatal(err)
	}
	shard := map[string]string{"app": "stuck", "shard": "stuck/0/0"}
	f := obsScrape(t, n)
	if obsValue(f, "kjob_jobs", shard) != 1 {
		t.Fatalf("kjob_jobs of stuck/0/0 is %v, want 1", obsValue(f, "kjob_jobs", shard))
	}
	if v := obsValue(f, "kjob_shard_handoff_seconds", shard); v != 0 {
		t.Fatalf("kjob_shard_handoff_seconds %v for a shard that is not moving", v)
	}
	// A move to a server that is not there: the import is never answered.
	n.System().Root.Send(actor.NewPID(n.Address(), server.Name), &messages.MoveShard{Shard: "stuck/0/0", Epoch: 1,
		Target: &messages.Ref{Address: "127.0.0.1:1", Id: server.Name}})
	obsWait(t, 10*time.Second, "kjob_shard_handoff_seconds to pass 1 s", func() bool {
		return obsValue(obsScrape(t, n), "kjob_shard_handoff_seconds", shard) >= 1
	})
}
