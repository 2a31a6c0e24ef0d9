package core

import (
	"testing"

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
	c.Finished(10, &messages.RunResult{RunId: "r", Attempt: 1, Epoch: 2, Outcome: messages.Outcome_SUCCEEDED})
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
	if next := c.Finished(1, &messages.RunResult{RunId: "a", Attempt: 1}); next == nil || next.RunId != "b" {
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
	if rs, _ := c.Unacked(10 * ResultResendMs); len(rs) != 0 || len(c.unacked) != 0 {
		t.Fatalf("after the acks: resent %v, %d waiting", rs, len(c.unacked))
	}
}
