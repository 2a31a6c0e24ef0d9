package cluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// TestOutOfDiskSpace: a node whose disk fills (cluster.NoSpaceEnv: the journal can
// make no new segment, as a full disk's fallocate) refuses new work once its journal
// is down to its reserve — creates, updates and triggers get RESOURCE_EXHAUSTED
// naming the journal, at once, not after the client's retries — while what it
// accepted before goes on: jobs due fire, reads, pauses and deletes are answered.
// /metrics and the cluster's status say so. Once space is back it takes creates again by itself, and a
// restart finds every job it acknowledged.
func TestOutOfDiskSpace(t *testing.T) {
	if testing.Short() {
		t.Skip("about 15 s")
	}
	noSpace := filepath.Join(t.TempDir(), "no-space")
	t.Setenv(cluster.NoSpaceEnv, noSpace)
	dir := t.TempDir()
	cfg := cluster.NodeConfig{Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", DataDir: dir, Log: quietLog(), SegmentSizeBytes: 256 << 10}
	n, err := cluster.StartNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	var mu sync.Mutex
	fired := map[int64]int{}
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "disk", Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error {
		mu.Lock()
		fired[r.JobID]++
		mu.Unlock()
		return nil
	})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	create := func(delay time.Duration, params int) (*messages.Job, error) {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		return c.Create(cctx, &messages.Job{App: "disk", Handler: "echo", Params: []byte(strings.Repeat("p", params)),
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: delay.Milliseconds()}})
	}
	var acked []int64
	// Jobs accepted before the disk fills, due while it is full.
	const dueN = 20
	var due []int64
	for range dueN {
		j, err := create(4*time.Second, 10)
		if err != nil {
			t.Fatal(err)
		}
		due = append(due, j.Id)
		acked = append(acked, j.Id)
	}

	// The disk fills: creates are taken until the journal is down to its reserve
	// (the spare segment used up, then the active one down to an eighth), then refused.
	if err := os.WriteFile(noSpace, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var refused error
	for i := 0; refused == nil; i++ {
		if i == 5000 { // about 10 segments' worth
			t.Fatalf("%d creates of 1,000 bytes taken with no segment to be made; want a refusal within the spare's and the active segment's space", i)
		}
		j, err := create(time.Hour, 1000)
		if err != nil {
			refused = err
			break
		}
		acked = append(acked, j.Id)
	}
	var ke *kerr.Error
	if !errors.Is(refused, kerr.ErrResourceExhausted) || errors.Is(refused, context.DeadlineExceeded) || !errors.As(refused, &ke) ||
		ke.Field != "journal" || !strings.Contains(ke.Message, "out of disk space") {
		t.Fatalf("create on a full disk: %v; want RESOURCE_EXHAUSTED on field journal, out of disk space, at once", refused)
	}
	t.Logf("%d creates taken, then: %v", len(acked), refused)
	fams := obsScrape(t, n)
	if obsValue(fams, "kjob_journal_no_room", nil) != 1 || obsValue(fams, "kjob_journal_spare_failing", nil) != 1 {
		t.Fatalf("kjob_journal_no_room %v, kjob_journal_spare_failing %v; want 1 and 1",
			obsValue(fams, "kjob_journal_no_room", nil), obsValue(fams, "kjob_journal_spare_failing", nil))
	}
	// Its heartbeats say so: the NameServer places no new app nor import there.
	statusSays := func(noRoom bool) func() bool {
		return func() bool {
			st, err := c.Status(ctx)
			return err == nil && len(st.Servers) == 1 && st.Servers[0].JournalNoRoom == noRoom
		}
	}
	waitFor(t, 5*time.Second, "the cluster status to show the journal out of disk space", statusSays(true))
	// What changes a job's definition or starts a run is refused too; reads, pauses
	// and deletes are answered.
	first, err := c.Get(ctx, "disk", acked[dueN])
	if err != nil {
		t.Fatalf("get on a full disk: %v", err)
	}
	upd := &messages.Job{Id: first.Id, App: "disk", Handler: "echo", Params: []byte("new"), Schedule: first.Schedule}
	if _, err := c.Update(ctx, upd); !errors.Is(err, kerr.ErrResourceExhausted) {
		t.Fatalf("update on a full disk: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := c.Trigger(ctx, "disk", first.Id, nil); !errors.Is(err, kerr.ErrResourceExhausted) {
		t.Fatalf("trigger on a full disk: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := c.Pause(ctx, "disk", acked[dueN+1]); err != nil {
		t.Fatalf("pause on a full disk: %v", err)
	}
	if err := c.Delete(ctx, "disk", acked[dueN+2]); err != nil {
		t.Fatalf("delete on a full disk: %v", err)
	}
	deleted := acked[dueN+2]
	// The jobs accepted before fire, into the reserve.
	waitFor(t, 20*time.Second, "the jobs due to fire on a full disk", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range due {
			if fired[id] == 0 {
				return false
			}
		}
		return true
	})

	// Space comes back: creates are taken again, without a restart.
	if err := os.Remove(noSpace); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a create taken once space is back", func() bool {
		j, err := create(time.Hour, 10)
		if err != nil {
			if !errors.Is(err, kerr.ErrResourceExhausted) {
				t.Fatalf("create once space is back: %v", err)
			}
			return false
		}
		acked = append(acked, j.Id)
		return true
	})
	if fams := obsScrape(t, n); obsValue(fams, "kjob_journal_no_room", nil) != 0 || obsValue(fams, "kjob_journal_spare_failing", nil) != 0 {
		t.Fatal("kjob_journal_no_room or kjob_journal_spare_failing still 1 once space is back")
	}
	waitFor(t, 5*time.Second, "the cluster status to show room again", statusSays(false))

	// Everything acknowledged is there after a restart; the deleted job is not.
	c.Close()
	w.Stop()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n, err = cluster.StartNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err = cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range acked {
		_, err := c.Get(ctx, "disk", id)
		switch {
		case id == deleted && !errors.Is(err, kerr.ErrNotFound):
			t.Fatalf("job %d, deleted on the full disk, after a restart: %v; want not found", id, err)
		case id != deleted && err != nil:
			t.Fatalf("job %d, acknowledged, after a restart: %v", id, err)
		}
	}
}
