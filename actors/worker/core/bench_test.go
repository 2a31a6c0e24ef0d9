package core

import (
	"strconv"
	"testing"
	"time"

	"github.com/kjob/kjob/messages"
)

// benchFinish dispatches and finishes the runs prefix0..prefix(n-1) at nowMs and acks
// all of them but every unackedEvery-th (0: ack all).
func benchFinish(c *Core, prefix string, n, unackedEvery int, nowMs int64) {
	for i := 0; i < n; i++ {
		id := prefix + strconv.Itoa(i)
		d := &messages.Dispatch{RunId: id, Attempt: 1, Epoch: 1, Shard: "app/0/0", ReplyTo: &messages.Ref{Address: "s", Id: "shard"}}
		if a, _ := c.Dispatch(d); a != Start {
			panic("benchFinish: dispatch " + id + " not started")
		}
		c.Finished(nowMs, &messages.RunResult{RunId: id, Attempt: 1, Outcome: messages.Outcome_SUCCEEDED})
		if unackedEvery == 0 || i%unackedEvery != 0 {
			c.Acked(id)
		}
	}
}

// walkRemembered is the resend tick as it was before the unacked results were kept
// apart: one map lookup per remembered run. It is the baseline the ratios compare to.
func walkRemembered(c *Core) int {
	n := 0
	for _, k := range c.order {
		if e := c.seen[k]; e != nil && e.result != nil {
			n++
		}
	}
	return n
}

// BenchmarkUnacked is the worker's resend tick with RememberRuns remembered runs.
//
//   - idle: nothing finished since the last tick, 16 results waiting (not yet due).
//   - tick: 20,000 results finished and acked since the last tick (a second at the
//     fire scenario's 20,000 fires/s), 2 of them left unacked; only Unacked is timed.
//   - ack: one Acked, the shard's acknowledgement of one result.
//
// x-walk is the tick's time over walkRemembered's, measured in the same run.
func BenchmarkUnacked(b *testing.B) {
	b.Run("idle", func(b *testing.B) {
		c := New(64)
		benchFinish(c, "old-", RememberRuns, RememberRuns/16, 0)
		c.Unacked(1) // settle: drop what was acked
		var walk time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if rs, _ := c.Unacked(1); len(rs) != 0 {
				b.Fatalf("resent %d", len(rs))
			}
		}
		b.StopTimer()
		t0 := time.Now()
		for i := 0; i < 10; i++ {
			walkRemembered(c)
		}
		walk = time.Since(t0) / 10
		b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(walk), "x-walk")
	})
	b.Run("tick", func(b *testing.B) {
		const perTick = 20000
		c := New(64)
		benchFinish(c, "old-", RememberRuns, 0, 0)
		c.Unacked(1)
		// Only Unacked is timed, by hand (b.StopTimer around each tick's 20,000
		// finishes would scale b.N by the timed part alone: minutes of setup);
		// B/op and allocs/op include the finishes.
		var timed, walk time.Duration
		for i := 0; i < b.N; i++ {
			nowMs := int64(i+1) * 1000
			benchFinish(c, "t"+strconv.Itoa(i)+"-", perTick, perTick/2, nowMs-1000)
			t0 := time.Now()
			c.Unacked(nowMs)
			timed += time.Since(t0)
			t0 = time.Now()
			walkRemembered(c)
			walk += time.Since(t0)
		}
		b.ReportMetric(float64(timed)/float64(b.N), "ns/op")
		b.ReportMetric(float64(timed)/float64(walk), "x-walk")
	})
	b.Run("ack", func(b *testing.B) {
		// Batches of RememberRuns results finished untimed, then acked timed, newest
		// first (none forgotten).
		c := New(64)
		benchFinish(c, "old-", RememberRuns, 0, 0)
		ids := make([]string, RememberRuns)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			j := i % RememberRuns
			if j == 0 {
				b.StopTimer()
				for n := range ids {
					ids[n] = "b" + strconv.Itoa(i) + "-" + strconv.Itoa(n)
					c.Dispatch(&messages.Dispatch{RunId: ids[n], Attempt: 1, Epoch: 1, ReplyTo: &messages.Ref{Address: "s", Id: "shard"}})
					c.Finished(int64(i), &messages.RunResult{RunId: ids[n], Attempt: 1})
				}
				c.Unacked(int64(i)) // drop what the last batch acked
				b.StartTimer()
			}
			c.Acked(ids[RememberRuns-1-j])
		}
	})
}
