package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kjob/kjob/messages"
)

func testActor(h HandlerFunc) (*Actor, runTask) {
	a := NewActor("w-1", 4, map[string]HandlerFunc{"h": h}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	d := &messages.Dispatch{RunId: "7:1000", JobId: 7, App: "app", Handler: "h", Params: []byte("{}"), DueMs: 1000,
		Attempt: 2, TimeoutMs: 60000, Shard: "app/0/0", Epoch: 3, Traceparent: "00-trace-01", DispatchedMs: 1001}
	return a, runTask{d: d, h: h, self: &messages.Ref{Address: "w:1", Id: "worker"}}
}

// A handler's context carries the run's traceparent and its timeout, and is
// cancelled, with what was derived from it, when the handler returns; the result
// names the run as its dispatch did.
func TestRunContextAndResult(t *testing.T) {
	var got context.Context
	var child context.Context
	var cancelChild context.CancelFunc
	a, task := testActor(func(ctx context.Context, r *Run) error {
		got = ctx
		child, cancelChild = context.WithCancel(ctx) // cancelled through its parent: checked below
		if tp := Traceparent(ctx); tp != "00-trace-01" || r.Traceparent != tp {
			t.Errorf("traceparent %q (run %q)", tp, r.Traceparent)
		}
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > time.Minute {
			t.Errorf("deadline %v %v, want within the run's minute", dl, ok)
		}
		if ctx.Err() != nil {
			t.Errorf("context ended while the handler runs: %v", ctx.Err())
		}
		return nil
	})
	st := a.run(task)
	if !errors.Is(got.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
		t.Fatalf("after the run: context %v, derived %v, want both cancelled", got.Err(), child.Err())
	}
	<-child.Done()
	cancelChild()
	r := &st.res
	d := task.d
	if r.RunId != d.RunId || r.JobId != d.JobId || r.Shard != d.Shard || r.Epoch != d.Epoch || r.Attempt != d.Attempt ||
		r.DueMs != d.DueMs || r.WorkerId != "w-1" || r.Worker != task.self || r.Outcome != messages.Outcome_SUCCEEDED ||
		r.StartMs != st.run.StartMs || r.EndMs < r.StartMs {
		t.Fatalf("result %v for dispatch %v", r, d)
	}
}

// A handler past its timeout times out, whether it waits on its context or not.
func TestRunTimesOut(t *testing.T) {
	for name, h := range map[string]HandlerFunc{
		"waits":   func(ctx context.Context, _ *Run) error { <-ctx.Done(); return ctx.Err() },
		"ignores": func(context.Context, *Run) error { time.Sleep(30 * time.Millisecond); return nil },
		"derives": func(ctx context.Context, _ *Run) error {
			child, cancel := context.WithCancel(ctx)
			defer cancel()
			<-child.Done()
			return child.Err()
		},
	} {
		a, task := testActor(h)
		task.d.TimeoutMs = 5
		if st := a.run(task); st.res.Outcome != messages.Outcome_TIMED_OUT {
			t.Fatalf("%s: outcome %v (%q), want TIMED_OUT", name, st.res.Outcome, st.res.Error)
		}
	}
}

// context.AfterFunc on a handler's context runs once the run ends, unless stopped;
// a run without a timeout has a context that never ends, as before.
func TestRunContextAfterFuncAndNoTimeout(t *testing.T) {
	ran := make(chan struct{})
	var stopped bool
	var again bool
	a, task := testActor(func(ctx context.Context, _ *Run) error {
		context.AfterFunc(ctx, func() { close(ran) })
		stop := context.AfterFunc(ctx, func() { t.Error("a stopped AfterFunc ran") })
		stopped, again = stop(), stop()
		return nil
	})
	a.run(task)
	<-ran // (never closed: the test times out)
	if !stopped || again {
		t.Fatalf("stop: %v then %v, want true then false", stopped, again)
	}

	var got context.Context
	a, task = testActor(func(ctx context.Context, _ *Run) error { got = ctx; return nil })
	task.d.TimeoutMs = 0
	if st := a.run(task); st.res.Outcome != messages.Outcome_SUCCEEDED {
		t.Fatalf("outcome %v", st.res.Outcome)
	}
	if _, ok := got.Deadline(); ok || got.Done() != nil || got.Err() != nil || Traceparent(got) != "00-trace-01" {
		t.Fatalf("without a timeout: deadline %v, done %v, err %v", ok, got.Done(), got.Err())
	}
}
