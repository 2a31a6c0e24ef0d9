package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBenchShort runs every `kjob bench` scenario in short mode as a correctness
// check: every create is acknowledged, every one-shot fires exactly once and never
// early, a restarted node serves its jobs and fires the one due while it was down,
// and memory is measured. Timing is not asserted (the machine is shared).
func TestBenchShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four embedded nodes")
	}
	dir := t.TempDir()
	late := filepath.Join(dir, "lateness.txt")
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"bench", "--short", "--json", "--data", filepath.Join(dir, "data"), "--lateness-out", late})
	if err := root.Execute(); err != nil {
		t.Fatalf("kjob bench --short: %v\nstderr:\n%s", err, errOut.String())
	}
	var rep BenchReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out.String())
	}
	if rep.Mode != "embedded" || rep.Sync != "sync" || rep.Cores <= 0 {
		t.Errorf("header: mode %q, sync %q, cores %d", rep.Mode, rep.Sync, rep.Cores)
	}

	c := rep.Create
	if c == nil {
		t.Fatal("no create result")
	}
	if c.N != shortCreateN || c.Errors != 0 || c.Latency.N != shortCreateN || c.AcksPerSec <= 0 {
		t.Errorf("create: %+v", c)
	}
	// The process's CPU over the creates: some, and no more than every core for the
	// whole time, give or take the accounting (a clock mixed up with another would
	// break either bound).
	if c.CPUSeconds <= 0 || c.CPUSeconds > c.Seconds*float64(runtime.NumCPU())*1.05+0.02 {
		t.Errorf("create CPU: %.3f s over %.3f s on %d cores", c.CPUSeconds, c.Seconds, runtime.NumCPU())
	}
	if !(c.Latency.MinMs <= c.Latency.P50Ms && c.Latency.P50Ms <= c.Latency.P99Ms && c.Latency.P99Ms <= c.Latency.P999Ms && c.Latency.P999Ms <= c.Latency.MaxMs) {
		t.Errorf("create latency percentiles out of order: %+v", c.Latency)
	}

	f := rep.Fire
	if f == nil {
		t.Fatal("no fire result")
	}
	if f.N != shortFireN || f.Fired != shortFireN || f.Missing != 0 || f.Duplicates != 0 || f.CreateErrors != 0 {
		t.Errorf("fire: every job must run exactly once: %+v", f)
	}
	if f.Early != 0 || f.Lateness.MinMs < 0 {
		t.Errorf("fire: %d runs started before their due time (min lateness %.3f ms)", f.Early, f.Lateness.MinMs)
	}
	// The shard itself never dispatches early (its clock: now >= due), and the
	// handler starts after the dispatch; the two parts account for the whole.
	if f.ShardLateness.N != shortFireN || f.ShardLateness.MinMs < 0 || f.DeliveryLateness.N != shortFireN {
		t.Errorf("fire: lateness split %+v / %+v", f.ShardLateness, f.DeliveryLateness)
	}
	if f.ShardLateness.MaxMs > f.Lateness.MaxMs+1 {
		t.Errorf("fire: the shard dispatched %.0f ms late, later than any handler start (%.3f ms)", f.ShardLateness.MaxMs, f.Lateness.MaxMs)
	}
	if f.Lateness.N != shortFireN || f.FiresPerSec <= 0 {
		t.Errorf("fire: lateness %+v, fires/s %.0f", f.Lateness, f.FiresPerSec)
	}
	// The fires' records were synced in the window, each sync taking some time.
	if j := f.JournalSync; j == nil || j.N == 0 || j.MinMs <= 0 || !(j.P50Ms <= j.P99Ms && j.P99Ms <= j.MaxMs) ||
		f.JournalSlowSyncs > j.N || f.JournalSyncCut {
		t.Errorf("fire: the journal's syncs in the window %+v (%d slow, cut %v)", j, f.JournalSlowSyncs, f.JournalSyncCut)
	}
	// The process's figures over the window: it took time and CPU, and the fires
	// allocated (each makes a dispatch, a result and records at the least).
	if p := f.Process; p == nil || p.Seconds <= 0 || p.CPUSeconds <= 0 || p.AllocBytes < uint64(shortFireN)*100 ||
		p.MinorFaults < 0 || p.MajorFaults < 0 || p.GCPauseMs < 0 || p.HeapEndBytes == 0 {
		t.Errorf("fire: the process over the window %+v", p)
	}
	b, err := os.ReadFile(late)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != shortFireN {
		t.Errorf("--lateness-out holds %d samples, want %d", n, shortFireN)
	}

	r := rep.Recover
	if r == nil {
		t.Fatal("no recover result")
	}
	if r.Pending != shortRecoverN || r.Records < uint64(shortRecoverN) || r.Verified == 0 {
		t.Errorf("recover: %+v", r)
	}
	if !(r.ReplaySeconds > 0 && r.ReplaySeconds <= r.ServingSeconds && r.FirstFireSeconds >= r.ReplaySeconds) {
		t.Errorf("recover: replay %.3fs, serving %.3fs, first fire %.3fs", r.ReplaySeconds, r.ServingSeconds, r.FirstFireSeconds)
	}

	m := rep.Memory
	if m == nil {
		t.Fatal("no memory result")
	}
	if m.Pending != shortMemoryN || m.RSSBeforeBytes <= 0 || m.RSSAfterBytes <= 0 {
		t.Errorf("memory: %+v", m)
	}
	// The bar went to stderr, the table or JSON to stdout.
	if !strings.Contains(errOut.String(), "\r") || strings.Contains(out.String(), "\r") {
		t.Errorf("progress bar must be on stderr only")
	}
}

// benchSyncs keeps the syncs that end in a window, bounds, and says when it
// stopped keeping them.
func TestBenchSyncsWindow(t *testing.T) {
	var none *benchSyncs
	none.add(time.Millisecond, time.Now()) // --servers: nothing kept
	if ns, cut := none.between(time.Time{}, time.Now()); ns != nil || cut {
		t.Errorf("nil benchSyncs: %v %v", ns, cut)
	}
	b := &benchSyncs{}
	t0 := time.Unix(1000, 0)
	for i := range 10 {
		b.add(time.Duration(i+1)*time.Millisecond, t0.Add(time.Duration(i)*time.Second))
	}
	ns, cut := b.between(t0.Add(2*time.Second), t0.Add(4*time.Second))
	if !slices.Equal(ns, []int64{3e6, 4e6, 5e6}) || cut {
		t.Errorf("syncs in [2 s, 4 s]: %v (cut %v), want 3, 4 and 5 ms", ns, cut)
	}
	b.at, b.ns = make([]int64, benchSyncsMax), make([]int64, benchSyncsMax)
	b.add(time.Millisecond, t0)
	if _, cut := b.between(t0, t0); !cut || len(b.at) != benchSyncsMax {
		t.Errorf("past benchSyncsMax: cut %v, %d kept", cut, len(b.at))
	}
}

// TestBenchTable: the default output is a table with a row per scenario.
func TestBenchTable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded node")
	}
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"bench", "--scenarios", "create", "--create-n", "200", "--concurrency", "8", "--quiet"})
	if err := root.Execute(); err != nil {
		t.Fatalf("kjob bench: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"create (N=200, C=8)", "durable acks/s", "ack latency p50 / p99 / p999"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(errOut.String(), "\r") {
		t.Errorf("--quiet drew a progress bar: %q", errOut.String())
	}
}

// TestBenchBadInput: bad flags are INVALID_ARGUMENT (exit code 2) before anything starts.
func TestBenchBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--scenarios", "create,bogus"},
		{"bench", "--create-n", "0"},
		{"bench", "--sync", "sometimes"},
		{"bench", "--worker-capacity", "-1"},
	} {
		root := newRoot()
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		root.SetArgs(args)
		err := root.Execute()
		if err == nil || exitCode(err) != 2 {
			t.Errorf("%v: err %v (exit %d), want an invalid-argument error", args, err, exitCode(err))
		}
	}
}

// A job's params are its index in decimal, padded with spaces to the params size
// (never cut), and read back as that index.
func TestBenchParams(t *testing.T) {
	for _, c := range []struct {
		i, size int
		want    string
	}{{0, 16, "0               "}, {1234567, 16, "1234567         "}, {123, 0, "123"}, {123456, 3, "123456"},
		{-5, 4, "-5  "}, {1<<62 + 1, 24, "4611686018427387905     "}} {
		got := benchParams(c.i, c.size)
		if string(got) != c.want {
			t.Errorf("benchParams(%d, %d) = %q, want %q", c.i, c.size, got, c.want)
		}
		if i, ok := benchParamsIndex(got); !ok || i != c.i {
			t.Errorf("benchParamsIndex(%q) = %d, %v; want %d", got, i, ok, c.i)
		}
	}
}
