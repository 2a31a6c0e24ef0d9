package cluster_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// segments counts the journal's segment files in dir.
func segments(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".seg") {
			n++
		}
	}
	return n
}

// TestCompactionFreesSegmentsAQuietShardPinned: the node's compaction keeps the
// journal's size bounded while one app churns and another, after a snapshot, takes
// one more job and then says nothing (reminders due in an hour): the quiet shard's
// last record pins the oldest segment, and a journal releases a stream's records
// only up to its older retained snapshot, so the node's request for a snapshot must
// give a second one at the same LSN (before, the journal grew by every segment the
// churn filled). The jobs are still there after a restart from what is left.
func TestCompactionFreesSegmentsAQuietShardPinned(t *testing.T) {
	if testing.Short() {
		t.Skip("about 15 s")
	}
	dir := t.TempDir()
	cfg := cluster.NodeConfig{Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", DataDir: dir, Log: quietLog(), SegmentSizeBytes: 64 << 10,
		CompactEvery: 200 * time.Millisecond}
	n, err := cluster.StartNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	reminder := func() *messages.Job {
		j, err := c.Create(ctx, &messages.Job{App: "reminders", Handler: "echo",
			Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: time.Hour.Milliseconds()}})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	quiet := reminder()
	// Churn: each round creates and deletes jobs of another app, about 2 segments' worth.
	var kept []int64
	churn := func() {
		for i := range 400 {
			j, err := c.Create(ctx, &messages.Job{App: "orders", Handler: "echo", Params: []byte(strings.Repeat("x", 100)),
				Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: time.Hour.Milliseconds()}})
			if err != nil {
				t.Fatal(err)
			}
			if i%100 == 0 {
				kept = append(kept, j.Id)
			} else if err := c.Delete(ctx, "orders", j.Id); err != nil {
				t.Fatal(err)
			}
		}
	}
	most := 0
	var quiet2 *messages.Job
	for round := range 15 {
		if round == 3 {
			// The quiet shard has been snapshotted by now; one more record of it, then silence.
			quiet2 = reminder()
		}
		churn()
		time.Sleep(300 * time.Millisecond) // a compaction or more
		s := segments(t, dir)
		most = max(most, s)
		t.Logf("round %d: %d segments", round, s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for segments(t, dir) > 4 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if s := segments(t, dir); s > 4 {
		t.Fatalf("%d segments of 64 KiB left after the churn (at most %d during it): compaction did not free what the quiet shard pinned", s, most)
	}
	f := obsScrape(t, n)
	if got := obsValue(f, "kjob_journal_segments", nil); got < 1 || got > 4 {
		t.Errorf("kjob_journal_segments = %v, want 1 to 4", got)
	}
	if got := obsValue(f, "kjob_journal_compacted_segments_total", nil); got < 10 {
		t.Errorf("kjob_journal_compacted_segments_total = %v, want the churn's segments", got)
	}
	c.Close()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	e := start(t, dir)
	for _, j := range []*messages.Job{quiet, quiet2} {
		if _, err := e.client.Get(ctx, "reminders", j.Id); err != nil {
			t.Fatalf("the quiet app's job after compaction and a restart: %v", err)
		}
	}
	for _, id := range kept {
		if _, err := e.client.Get(ctx, "orders", id); err != nil {
			t.Fatalf("a kept job after compaction and a restart: %v", err)
		}
	}
}
