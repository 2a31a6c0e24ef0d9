package core

import (
	"runtime"
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
	for i := range c.records {
		if s, ok := c.index.lookup(c.records[i].keyHash, func(uint32) bool { return true }); ok && c.records[s].waiting {
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

// shellRun is a dispatch and the result the worker shell makes of it, as in the fire
// scenario: a snowflake job id, a run id of job id and due time, 16 bytes of params.
func shellRun(i int, worker *messages.Ref, owner *messages.Ref) (*messages.Dispatch, *messages.RunResult) {
	job := int64(7_300_000_000_000_000_000 + i)
	due := int64(1_796_000_000_000 + i/20)
	id := strconv.FormatInt(job, 10) + ":" + strconv.FormatInt(due, 10)
	d := &messages.Dispatch{RunId: id, JobId: job, App: "bench", Handler: "noop", Params: []byte(`{"n":1234567890}`),
		DueMs: due, Attempt: 1, TimeoutMs: 60000, Shard: "bench/0/0", Epoch: 1, ReplyTo: owner, DispatchedMs: due}
	r := &messages.RunResult{RunId: id, JobId: job, Shard: d.Shard, Epoch: 1, Attempt: 1, DueMs: due,
		Outcome: messages.Outcome_SUCCEEDED, StartMs: due + 1, EndMs: due + 1, WorkerId: "bench-worker-1", Worker: worker}
	return d, r
}

// pointerMemory is the baseline: finished runs as the core kept them before they
// were encoded (a map entry per run pointing at its slimmed dispatch and its result,
// the reply-to and shard name shared), the layout the collector marked.
type pointerMemory struct {
	seen  map[key]*pointerEntry
	order []key
}

type pointerEntry struct {
	d       *messages.Dispatch
	result  *messages.RunResult
	sentMs  int64
	resends int
	waiting bool
	sameRun *pointerEntry
}

func (m *pointerMemory) finish(d *messages.Dispatch, r *messages.RunResult) {
	k := key{d.RunId, d.Attempt}
	m.seen[k] = &pointerEntry{d: &messages.Dispatch{RunId: d.RunId, JobId: d.JobId, Attempt: d.Attempt, DueMs: d.DueMs,
		Shard: d.Shard, Epoch: d.Epoch, ReplyTo: d.ReplyTo}, result: r}
	m.order = append(m.order, k)
	for len(m.order) > RememberRuns {
		delete(m.seen, m.order[0])
		m.order = m.order[1:]
	}
}

// BenchmarkRemembered is what RememberRuns finished and acknowledged runs cost.
//
//   - finish: a dispatch started, finished and acknowledged with the memory full (a
//     run forgotten each time), the worker core's share of every fire.
//   - gc: a full collection with the memory full and nothing else live (ns-empty-heap
//     one without it); x-pointers is its time over the baseline's (pointerMemory,
//     measured in the same run), heap-MB the live heap the memory adds
//     (heap-MB-pointers the baseline's).
func BenchmarkRemembered(b *testing.B) {
	worker, owner := &messages.Ref{Address: "127.0.0.1:40000", Id: "kjob-worker-bench"}, &messages.Ref{Address: "127.0.0.1:7070", Id: "shard/bench/0"}
	b.Run("finish", func(b *testing.B) {
		c := New(64)
		for i := 0; i < RememberRuns; i++ {
			d, r := shellRun(i, worker, owner)
			c.Dispatch(d)
			c.Finished(0, r)
			c.Acked(d.RunId)
		}
		runs := make([]*messages.Dispatch, 4096)
		results := make([]*messages.RunResult, len(runs))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			j := i % len(runs)
			if j == 0 {
				b.StopTimer()
				for n := range runs {
					runs[n], results[n] = shellRun(RememberRuns+i+n, worker, owner)
				}
				b.StartTimer()
			}
			if a, _ := c.Dispatch(runs[j]); a != Start {
				b.Fatalf("dispatch: %v", a)
			}
			c.Finished(int64(i), results[j])
			c.Acked(runs[j].RunId)
		}
	})
	b.Run("gc", func(b *testing.B) {
		// One full collection per op with the memory full and nothing else live.
		heap := func() uint64 {
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		gcTime := func() time.Duration {
			best := time.Duration(1 << 62)
			for i := 0; i < 5; i++ {
				t0 := time.Now()
				runtime.GC()
				best = min(best, time.Since(t0))
			}
			return best
		}
		h0, empty := heap(), gcTime()
		base := &pointerMemory{seen: map[key]*pointerEntry{}}
		for i := 0; i < RememberRuns+RememberRuns/4; i++ {
			base.finish(shellRun(i, worker, owner))
		}
		hBase, tBase := heap(), gcTime()
		runtime.KeepAlive(base)
		base = nil
		h1 := heap()
		c := New(64)
		for i := 0; i < RememberRuns+RememberRuns/4; i++ {
			d, r := shellRun(i, worker, owner)
			c.Dispatch(d)
			c.Finished(0, r)
			c.Acked(d.RunId)
		}
		c.Unacked(0)
		hNew := heap()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			runtime.GC()
		}
		b.StopTimer()
		tNew := b.Elapsed() / time.Duration(b.N)
		runtime.KeepAlive(c)
		b.ReportMetric(float64(empty), "ns-empty-heap")
		b.ReportMetric(float64(tNew)/float64(tBase), "x-pointers")
		b.ReportMetric(float64(hNew-h1)/1e6, "heap-MB")
		b.ReportMetric(float64(hBase-h0)/1e6, "heap-MB-pointers")
	})
}
