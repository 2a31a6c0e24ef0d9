package core

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kjob/kjob/messages"
)

func disp(run string, attempt int32, epoch int64, owner string) *messages.Dispatch {
	return &messages.Dispatch{RunId: run, Attempt: attempt, Epoch: epoch, Shard: "app/0/0", ReplyTo: &messages.Ref{Address: owner, Id: "shard"}}
}

func TestDuplicateDispatchDropped(t *testing.T) {
	c := New(2)
	if a, _ := c.Dispatch(disp("r", 1, 1, "a")); a != Start {
		t.Fatalf("first dispatch: %v", a)
	}
	if a, _ := c.Dispatch(disp("r", 1, 1, "a")); a != Duplicate {
		t.Fatalf("repeat while running: %v, want Duplicate", a)
	}
	if a, _ := c.Dispatch(disp("r", 2, 1, "a")); a != Start {
		t.Fatalf("a new attempt: %v, want Start", a)
	}
}

// A run still going when its shard moves is re-dispatched by the new owner: the
// worker does not run it again, and its result goes to the new owner at its epoch.
func TestRunGoingAcrossAHandoffAnswersTheNewOwner(t *testing.T) {
	c := New(2)
	c.Dispatch(disp("r", 1, 1, "old"))
	if a, _ := c.Dispatch(disp("r", 1, 2, "new")); a != Duplicate {
		t.Fatalf("re-dispatch by the new owner: %v, want Duplicate", a)
	}
	d := c.Latest("r", 1)
	if d.Epoch != 2 || d.ReplyTo.Address != "new" {
		t.Fatalf("answer %v, want the new owner at epoch 2", d)
	}
	c.Dispatch(disp("r", 1, 1, "old")) // a late copy of the old dispatch changes nothing
	if d := c.Latest("r", 1); d.Epoch != 2 {
		t.Fatalf("a stale dispatch took over: %v", d)
	}
	res := &messages.RunResult{RunId: "r", Attempt: 1, Epoch: 1, Shard: "old", Outcome: messages.Outcome_SUCCEEDED}
	if _, to := c.Finished(10, res); to.GetAddress() != "new" || res.Epoch != 2 || res.Shard != disp("r", 1, 2, "new").Shard {
		t.Fatalf("finished run answers %v at epoch %d shard %q, want the new owner at epoch 2", to, res.Epoch, res.Shard)
	}
	if a, r := c.Dispatch(disp("r", 1, 3, "newer")); a != Resend || r.Epoch != 3 {
		t.Fatalf("after finishing: %v %v, want the result resent at epoch 3", a, r)
	}
}

func TestQueueThenRefuse(t *testing.T) {
	c := New(1)
	c.Dispatch(disp("a", 1, 1, "s"))
	n := 0
	for i := 0; i < QueuePerSlot; i++ {
		if a, _ := c.Dispatch(disp(string(rune('b'+i)), 1, 1, "s")); a == Queued {
			n++
		}
	}
	if n != QueuePerSlot {
		t.Fatalf("queued %d, want %d", n, QueuePerSlot)
	}
	if a, _ := c.Dispatch(disp("zz", 1, 1, "s")); a != Refuse {
		t.Fatalf("over the queue: %v, want Refuse", a)
	}
	if next, _ := c.Finished(1, &messages.RunResult{RunId: "a", Attempt: 1}); next == nil || next.RunId != "b" {
		t.Fatalf("next after finishing: %v, want b", next)
	}
}

func TestUnackedResent(t *testing.T) {
	c := New(2)
	c.Dispatch(disp("a", 1, 1, "s"))
	c.Dispatch(disp("b", 1, 1, "s"))
	c.Finished(0, &messages.RunResult{RunId: "a", Attempt: 1})
	c.Finished(0, &messages.RunResult{RunId: "b", Attempt: 1})
	c.Acked("a")
	if rs, _ := c.Unacked(ResultResendMs - 1); len(rs) != 0 {
		t.Fatalf("resent before ResultResendMs: %v", rs)
	}
	rs, to := c.Unacked(ResultResendMs)
	if len(rs) != 1 || rs[0].RunId != "b" || to[0].Address != "s" {
		t.Fatalf("resent %v, want only b", rs)
	}
	c.Acked("b")
	if rs, _ := c.Unacked(10 * ResultResendMs); len(rs) != 0 || len(c.waiting) != 0 || len(c.waitingRun) != 0 {
		t.Fatalf("after the acks: resent %v, %d waiting, %d runs waiting", rs, len(c.waiting), len(c.waitingRun))
	}
}

// A result never acknowledged is sent again every ResultResendMs, MaxResultResends
// times, then given up.
func TestUnackedGivenUp(t *testing.T) {
	c := New(2)
	c.Dispatch(disp("a", 1, 1, "s"))
	c.Finished(0, &messages.RunResult{RunId: "a", Attempt: 1})
	var at []int64
	for now := int64(0); now <= 4*MaxResultResends*ResultResendMs; now += ResultResendMs / 2 {
		if rs, _ := c.Unacked(now); len(rs) > 0 {
			at = append(at, now)
		}
	}
	if len(at) != MaxResultResends {
		t.Fatalf("resent %d times (at %v), want %d", len(at), at, MaxResultResends)
	}
	for i, now := range at {
		if want := int64(i+1) * ResultResendMs; now != want {
			t.Fatalf("resend %d at %d ms, want %d", i+1, now, want)
		}
	}
	if len(c.waiting) != 0 || len(c.waitingRun) != 0 {
		t.Fatalf("given up but still waiting: %d, %d runs", len(c.waiting), len(c.waitingRun))
	}
	if a, r := c.Dispatch(disp("a", 1, 2, "s")); a != Resend || r == nil {
		t.Fatalf("a given-up result is still remembered: %v %v, want Resend", a, r)
	}
}

// An ack names a run, not an attempt: every attempt's result waiting stops.
func TestAckStopsEveryAttempt(t *testing.T) {
	c := New(4)
	for _, d := range []*messages.Dispatch{disp("r", 1, 1, "s"), disp("r", 2, 1, "s"), disp("q", 1, 1, "s")} {
		c.Dispatch(d)
		c.Finished(0, &messages.RunResult{RunId: d.RunId, Attempt: d.Attempt})
	}
	c.Acked("r")
	c.Acked("nothing") // unknown: no effect
	rs, _ := c.Unacked(ResultResendMs)
	if len(rs) != 1 || rs[0].RunId != "q" {
		t.Fatalf("resent %v, want only q", rs)
	}
	c.Acked("q")
	c.Acked("q") // twice: no effect
	if rs, _ := c.Unacked(10 * ResultResendMs); len(rs) != 0 {
		t.Fatalf("resent %v after every ack", rs)
	}
}

// A result resent moves behind those sent after it, and one acked behind one still
// waiting is dropped when it reaches the front: each is resent on time.
func TestUnackedOrderAfterResend(t *testing.T) {
	c := New(4)
	finish := map[int64]string{0: "a", ResultResendMs / 2: "b", ResultResendMs: "c"}
	want := map[int64][]string{ResultResendMs: {"a"}, 2 * ResultResendMs: {"a", "c"}, 3 * ResultResendMs: {"a"}}
	for now := int64(0); now <= 3*ResultResendMs; now += ResultResendMs / 4 {
		if id, ok := finish[now]; ok {
			c.Dispatch(disp(id, 1, 1, "s"))
			c.Finished(now, &messages.RunResult{RunId: id, Attempt: 1})
		}
		if now == ResultResendMs {
			c.Acked("b") // acked before its resend, behind a still waiting: never resent
		}
		if now == 5*ResultResendMs/2 {
			c.Acked("c")
		}
		rs, _ := c.Unacked(now)
		var got []string
		for _, r := range rs {
			got = append(got, r.RunId)
		}
		slices.Sort(got)
		if w := want[now]; !slices.Equal(got, w) {
			t.Fatalf("at %d ms resent %v, want %v", now, got, w)
		}
	}
}

// A result forgotten (RememberRuns newer runs finished since) is no longer resent,
// and its run id is no longer recognised as a duplicate.
func TestForgottenNotResent(t *testing.T) {
	c := New(1)
	for i := 0; i <= RememberRuns; i++ {
		id := strconv.Itoa(i)
		c.Dispatch(disp(id, 1, 1, "s"))
		c.Finished(0, &messages.RunResult{RunId: id, Attempt: 1})
	}
	rs, _ := c.Unacked(ResultResendMs)
	if len(rs) != RememberRuns || rs[0].RunId != "1" {
		t.Fatalf("resent %d results, first %v, want %d from run 1", len(rs), rs[0].RunId, RememberRuns)
	}
	if c.Unacknowledged() != RememberRuns || len(c.waitingRun) != RememberRuns {
		t.Fatalf("%d runs waiting (%d run hashes), want %d", c.Unacknowledged(), len(c.waitingRun), RememberRuns)
	}
	if a, _ := c.Dispatch(disp("1", 1, 1, "s")); a != Resend {
		t.Fatalf("remembered run: %v, want Resend", a)
	}
	if a, _ := c.Dispatch(disp("0", 1, 1, "s")); a != Start {
		t.Fatalf("forgotten run: %v, want Start", a)
	}
}

// A clock stepping back holds the core at the latest time it saw: nothing is resent
// early, nothing is lost.
func TestClockGoingBack(t *testing.T) {
	c := New(2)
	c.Dispatch(disp("a", 1, 1, "s"))
	c.Finished(10*ResultResendMs, &messages.RunResult{RunId: "a", Attempt: 1})
	c.Dispatch(disp("b", 1, 1, "s"))
	c.Finished(ResultResendMs, &messages.RunResult{RunId: "b", Attempt: 1}) // the clock went back
	if rs, _ := c.Unacked(3 * ResultResendMs); len(rs) != 0 {
		t.Fatalf("resent %v before ResultResendMs on the core's clock", rs)
	}
	if rs, _ := c.Unacked(11 * ResultResendMs); len(rs) != 2 {
		t.Fatalf("resent %v, want a and b", rs)
	}
}

// The reference model of the results waiting for an ack: the resend tick as a walk
// over every finished run, in the order they finished (the core before the waiting
// results were kept apart).
type refRun struct {
	finished bool
	sentMs   int64
	resends  int
	acked    bool
}

// TestUnackedModel drives the core and the reference with the same dispatches,
// finishes, acks and ticks on a clock that never goes back, and requires the same
// actions and the same results resent at every tick.
func TestUnackedModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := New(64)
		if rapid.Bool().Draw(t, "collide") { // every run id hashes alike
			c = newCore(64, func(string) uint64 { return 7 })
		}
		runs := map[key]*refRun{}
		var order []key
		nowMs := int64(0)
		runIDs := []string{"r0", "r1", "r2", "r3", "r4", "r5"}
		drawKey := func() key {
			return key{rapid.SampledFrom(runIDs).Draw(t, "run"), int32(rapid.IntRange(1, 3).Draw(t, "attempt"))}
		}
		steps := rapid.IntRange(1, 400).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			nowMs += int64(rapid.IntRange(0, ResultResendMs).Draw(t, "advanceMs"))
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0: // dispatch
				k := drawKey()
				a, res := c.Dispatch(disp(k.run, k.attempt, 1, "s"))
				want := Start
				if r := runs[k]; r != nil && r.finished {
					want = Resend
				} else if r != nil {
					want = Duplicate
				} else {
					runs[k] = &refRun{}
				}
				if a != want || (a == Resend && (res.RunId != k.run || res.Attempt != k.attempt || !res.Duplicate)) {
					t.Fatalf("dispatch %v at %d: %v %v, want %v", k, nowMs, a, res, want)
				}
			case 1: // a running handler finishes
				var running []key
				for k, r := range runs {
					if !r.finished {
						running = append(running, k)
					}
				}
				if len(running) == 0 {
					continue
				}
				slices.SortFunc(running, func(a, b key) int {
					return strings.Compare(a.run+strconv.Itoa(int(a.attempt)), b.run+strconv.Itoa(int(b.attempt)))
				})
				k := rapid.SampledFrom(running).Draw(t, "finish")
				if next, _ := c.Finished(nowMs, &messages.RunResult{RunId: k.run, Attempt: k.attempt}); next != nil {
					t.Fatalf("finish %v: started %v from an empty queue", k, next)
				}
				runs[k].finished, runs[k].sentMs = true, nowMs
				order = append(order, k)
			case 2: // ack
				id := rapid.SampledFrom(runIDs).Draw(t, "ack")
				c.Acked(id)
				for k, r := range runs {
					if k.run == id && r.finished {
						r.acked = true
					}
				}
			case 3: // resend tick
				rs, to := c.Unacked(nowMs)
				var got, want []string
				for i, r := range rs {
					if to[i] == nil || to[i].Address != "s" {
						t.Fatalf("resend of %s to %v", r.RunId, to[i])
					}
					got = append(got, r.RunId+"/"+strconv.Itoa(int(r.Attempt)))
				}
				for _, k := range order {
					r := runs[k]
					if r.acked || r.resends >= MaxResultResends || nowMs-r.sentMs < ResultResendMs {
						continue
					}
					r.resends++
					r.sentMs = nowMs
					want = append(want, k.run+"/"+strconv.Itoa(int(k.attempt)))
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("tick at %d: resent %v, want %v", nowMs, got, want)
				}
			}
			// Every result waiting in the reference is listed under its run, once,
			// and Unacknowledged counts the runs.
			nWaiting, refRuns := 0, map[string]bool{}
			for k, r := range runs {
				if r.finished && !r.acked && r.resends < MaxResultResends {
					nWaiting++
					refRuns[k.run] = true
				}
			}
			n, listedRuns := 0, map[string]bool{}
			for h, s := range c.waitingRun {
				for more := true; more; {
					rec := &c.records[s]
					id := string(runIDOf(c.encoding(s)))
					if !rec.waiting || rec.runHash != h || c.hash(id) != h {
						t.Fatalf("run hash %x lists %s (waiting %v)", h, id, rec.waiting)
					}
					n++
					listedRuns[id] = true
					s, more = rec.sameRun-1, rec.sameRun != 0
				}
			}
			if n != nWaiting || len(listedRuns) != len(refRuns) || c.Unacknowledged() != len(refRuns) {
				t.Fatalf("%d results of %d runs listed as waiting, Unacknowledged %d, want %d of %d",
					n, len(listedRuns), c.Unacknowledged(), nWaiting, len(refRuns))
			}
		}
	})
}

// A finished run remembers where to answer, not its dispatch: no params, no trace,
// and runs from one shard share its name and reference. The answers still go to
// the newest owner at its epoch.
func TestFinishedRunKeepsOnlyWhereToAnswer(t *testing.T) {
	c := New(4)
	var ds []*messages.Dispatch
	for _, run := range []string{"a", "b"} {
		d := disp(run, 1, 7, "s")
		d.Params, d.Traceparent, d.Handler, d.App = make([]byte, 4096), "00-trace-01", "h", "app"
		ds = append(ds, d)
		c.Dispatch(d)
		c.Finished(0, &messages.RunResult{RunId: run, Attempt: 1, Epoch: 7})
	}
	a, b := c.Latest("a", 1), c.Latest("b", 1)
	for _, d := range []*messages.Dispatch{a, b} {
		if d == ds[0] || d == ds[1] || d.Params != nil || d.Traceparent != "" || d.Handler != "" || d.App != "" {
			t.Fatalf("finished run keeps %v, want only where to answer", d)
		}
		if d.Epoch != 7 || d.Shard != "app/0/0" || d.ReplyTo.GetAddress() != "s" || d.Attempt != 1 {
			t.Fatalf("finished run keeps %v: lost where to answer", d)
		}
	}
	if a.ReplyTo != b.ReplyTo {
		t.Fatal("two runs of one shard keep two references to it")
	}
	rs, to := c.Unacked(ResultResendMs)
	if len(rs) != 2 || to[0].Address != "s" || rs[0].Epoch != 7 || rs[0].Shard != "app/0/0" {
		t.Fatalf("resent %v to %v, want both runs to s at epoch 7", rs, to)
	}
	// A new owner asks again: the result goes there, and the run keeps the new owner.
	act, r := c.Dispatch(disp("a", 1, 9, "new"))
	if act != Resend || r.Epoch != 9 {
		t.Fatalf("re-dispatch after finishing: %v %v, want a resend at epoch 9", act, r)
	}
	if d := c.Latest("a", 1); d.Epoch != 9 || d.ReplyTo.GetAddress() != "new" || d.Params != nil {
		t.Fatalf("after the new owner asked: %v", d)
	}
	rs, to = c.Unacked(2 * ResultResendMs)
	for i := range rs {
		if rs[i].RunId == "a" && (to[i].Address != "new" || rs[i].Epoch != 9) {
			t.Fatalf("a resent to %v at epoch %d, want the new owner at 9", to[i], rs[i].Epoch)
		}
	}
}
