package cluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// TestLoadAppPolicies: the file's policies are read in protobuf's JSON form, and a
// bad one is refused naming the file, the app and the field.
func TestLoadAppPolicies(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{"billing": {"attempts": 3, "ladderMs": ["2000", 60000], "timeoutMs": "30000"},
		"reports": {"misfire": "SKIP", "concurrency": "FORBID", "route": "LEAST_BUSY"}}`)
	m, err := cluster.LoadAppPolicies(good)
	if err != nil {
		t.Fatal(err)
	}
	b, r := m["billing"], m["reports"]
	if b.GetAttempts() != 3 || len(b.GetLadderMs()) != 2 || b.LadderMs[1] != 60000 || b.GetTimeoutMs() != 30000 ||
		r.GetMisfire() != messages.Misfire_SKIP || r.GetConcurrency() != messages.Concurrency_FORBID || r.GetRoute() != messages.Route_LEAST_BUSY {
		t.Fatalf("read %v", m)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"negative.json", `{"billing": {"attempts": -1}}`, "policy.attempts"},
		{"ladder.json", `{"billing": {"ladderMs": [0]}}`, "policy.ladder"},
		{"hash.json", `{"billing": {"route": "CONSISTENT_HASH"}}`, "policy.route_key"},
		{"unknown.json", `{"billing": {"retries": 3}}`, "retries"},
		{"app.json", `{"bad app!": {}}`, "bad app!"},
		{"notobject.json", `[1]`, "app name"},
	} {
		p := write(tc.name, tc.body)
		_, err := cluster.LoadAppPolicies(p)
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s and %q", tc.name, err, p, tc.want)
		}
	}
	if _, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog(),
		AppPolicies: map[string]*messages.Policy{"billing": {Attempts: -2}}}); err == nil || !strings.Contains(err.Error(), "policy.attempts") {
		t.Errorf("StartNode with a bad app policy: %v, want it refused naming policy.attempts", err)
	}
}

// TestAppPolicyThroughANode: a job that sets no policy runs by its app's: two
// attempts 300 ms apart, then the dead-letter queue.
func TestAppPolicyThroughANode(t *testing.T) {
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog(),
		AppPolicies: map[string]*messages.Policy{"pol": {Attempts: 2, LadderMs: []int64{300}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var starts [3]atomic.Int64
	var runs atomic.Int32
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "pol", Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleFunc("fail", func(ctx context.Context, r *cluster.Run) error {
		if i := runs.Add(1); i <= 3 {
			starts[i-1].Store(time.Now().UnixMilli())
		}
		return errors.New("always fails")
	})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	j, err := c.Create(ctx, &messages.Job{App: "pol", Handler: "fail", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE}})
	if err != nil {
		t.Fatal(err)
	}
	var dl *messages.DeadLetter
	for dl == nil && ctx.Err() == nil {
		ds, _, err := c.DeadLetters(ctx, "pol", "", 10)
		if err == nil && len(ds) == 1 {
			dl = ds[0]
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if dl == nil || dl.JobId != j.Id || dl.Attempts != 2 {
		t.Fatalf("dead letter %v, want job %d after the app's 2 attempts", dl, j.Id)
	}
	time.Sleep(500 * time.Millisecond) // a third attempt would come 300 ms after the second
	if got := runs.Load(); got != 2 {
		t.Fatalf("%d attempts ran, want the app's 2", got)
	}
	if gap := starts[1].Load() - starts[0].Load(); gap < 300 {
		t.Fatalf("attempt 2 started %d ms after attempt 1, before the app's 300 ms ladder delay", gap)
	}
}
