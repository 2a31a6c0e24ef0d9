package cluster_test

import (
	"context"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

var traceparentRE = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// TestTraceFollowsRun follows one run's trace id from the shard that creates it, in
// its dispatch, through the worker's log lines and the handler's context, back into
// the shard's record and the job's run history (Go client and admin API alike).
func TestTraceFollowsRun(t *testing.T) {
	nodeLog, workerLog := newObsLog(slog.LevelDebug), newObsLog(slog.LevelDebug)
	n := obsNode(t, slog.New(nodeLog))
	type seen struct{ ctx, run, id string }
	var mu sync.Mutex
	got := map[int64]seen{}
	obsWorker(t, n, "traced", slog.New(workerLog), map[string]cluster.HandlerFunc{
		"echo": func(ctx context.Context, r *cluster.Run) error {
			mu.Lock()
			defer mu.Unlock()
			got[r.JobID] = seen{ctx: cluster.Traceparent(ctx), run: r.Traceparent, id: r.ID}
			return nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: obsQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ids []int64
	for i := 0; i < 2; i++ {
		j, err := c.Create(ctx, &messages.Job{App: "traced", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 20}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.Id)
	}
	obsWait(t, 10*time.Second, "both handlers", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	mu.Lock()
	a, b := got[ids[0]], got[ids[1]]
	mu.Unlock()
	if !traceparentRE.MatchString(a.ctx) {
		t.Fatalf("handler context carries traceparent %q, want W3C form", a.ctx)
	}
	if a.ctx != a.run {
		t.Fatalf("context says %q, Run says %q", a.ctx, a.run)
	}
	if a.ctx == b.ctx {
		t.Fatalf("two runs share trace id %q", a.ctx)
	}
	tp, run := a.ctx, a.id

	// Every hop logs it: the shard's dispatch, the worker's start and finish, the
	// shard's record of the outcome.
	obsWait(t, 5*time.Second, "the shard to record the run", func() bool { return len(nodeLog.find("run recorded", "traceparent", tp)) == 1 })
	for _, hop := range []struct {
		log *obsLog
		msg string
	}{{nodeLog, "dispatch"}, {workerLog, "run started"}, {workerLog, "run finished"}, {nodeLog, "run recorded"}} {
		recs := hop.log.find(hop.msg, "traceparent", tp)
		if len(recs) != 1 {
			t.Fatalf("%d %q log lines carry traceparent %s, want 1", len(recs), hop.msg, tp)
		}
		if recs[0].attrs["run"] != run {
			t.Fatalf("%q line with traceparent %s is about run %q, want %q", hop.msg, tp, recs[0].attrs["run"], run)
		}
	}

	// The run history keeps it.
	obsWait(t, 5*time.Second, "the run in the history", func() bool {
		rs, err := c.Runs(ctx, "traced", ids[0], 10)
		return err == nil && len(rs) == 1 && rs[0].Outcome == messages.Outcome_SUCCEEDED
	})
	rs, _ := c.Runs(ctx, "traced", ids[0], 10)
	if rs[0].TraceId != tp || rs[0].RunId != run {
		t.Fatalf("history has run %s with trace %q, want %s with %q", rs[0].RunId, rs[0].TraceId, run, tp)
	}
	st, body := obsCall(t, n, "GET", "/v1/jobs/traced/"+strconv.FormatInt(ids[0], 10)+"/runs", "")
	if st != http.StatusOK {
		t.Fatalf("runs: %d %v", st, body)
	}
	runs, _ := body["runs"].([]any)
	if len(runs) != 1 || obsStr(runs[0], "trace_id") != tp {
		t.Fatalf("admin API runs = %v, want one with trace_id %s", body, tp)
	}
}
