package core

import (
	"fmt"
	"testing"

	workercore "github.com/kjob/kjob/actors/worker/core"
	"github.com/kjob/kjob/messages"
)

// Tests of the shard's credit at each worker (CreditPerSlot): what a worker would
// refuse is held in the shard, in order, and sent when a result makes room.

// The credit is what a worker queues before it refuses, so one shard alone is
// never refused.
func TestCreditIsWhatAWorkerQueues(t *testing.T) {
	if CreditPerSlot != workercore.QueuePerSlot {
		t.Fatalf("CreditPerSlot %d, worker QueuePerSlot %d", CreditPerSlot, workercore.QueuePerSlot)
	}
	if defaultWorkerCapacity != workercore.DefaultCapacity {
		t.Fatalf("defaultWorkerCapacity %d, worker DefaultCapacity %d", defaultWorkerCapacity, workercore.DefaultCapacity)
	}
	w := workercore.New(1)
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_ROUND_ROBIN}, policyWorker("w1", 1))
	for i := range 3 * CreditPerSlot {
		for _, sd := range trigger(t, c, e, 2000+int64(i), "") {
			if a, _ := w.Dispatch(sd.d); a == workercore.Refuse {
				t.Fatalf("trigger %d: the worker refused the shard's dispatch", i)
			}
		}
	}
	if got, want := c.Held(), 2*CreditPerSlot; got != want {
		t.Fatalf("held %d, want %d", got, want)
	}
}

// Round robin skips a worker out of credit for the next one that has some; when
// all are out, runs wait, and each result sends the oldest waiting run, in order.
func TestCreditHoldsInOrderAndResultsRelease(t *testing.T) {
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_ROUND_ROBIN}, policyWorker("w1", 1), policyWorker("w2", 2))
	credit := map[string]int{"w1": CreditPerSlot, "w2": 2 * CreditPerSlot}
	total := credit["w1"] + credit["w2"]
	var sent []sentDispatch
	at := map[string]int{}
	for i := range total + 10 {
		for _, sd := range trigger(t, c, e, 2000+int64(i), "") {
			sent = append(sent, sd)
			at[sd.to]++
		}
	}
	if len(sent) != total || at["w1"] != credit["w1"] || at["w2"] != credit["w2"] {
		t.Fatalf("sent %d (%v), want %d (%v)", len(sent), at, total, credit)
	}
	if c.Held() != 10 {
		t.Fatalf("held %d, want 10", c.Held())
	}
	// The held runs are the last ten triggered, and go out oldest first.
	var held []string
	for _, s := range c.held.seqs[c.held.head:] {
		held = append(held, c.bySeq[s].st.RunId)
	}
	for k := range 10 {
		report(c, e, 3000+int64(k), sent[k], messages.Outcome_SUCCEEDED, "", 2999)
	}
	// (report drops what it released: the runs say where and when they went.)
	for k, id := range held {
		if want := sent[total-1].d.DueMs + int64(k) + 1; c.runs[id].st.DueMs != want {
			t.Fatalf("held run %d was due %d, want %d (the last ten triggered, in order)", k, c.runs[id].st.DueMs, want)
		}
		r := c.runs[id]
		if r == nil || r.held || r.st.WorkerId == "" {
			t.Fatalf("held run %d (%s) not sent after ten results: %+v", k, id, r)
		}
		if r.st.DispatchedMs != 3000+int64(k) {
			t.Fatalf("held run %d sent at %d, want %d (oldest first, one per result)", k, r.st.DispatchedMs, 3000+k)
		}
	}
	if c.Held() != 0 {
		t.Fatalf("held %d after ten results, want 0", c.Held())
	}
}

// A run tied to one worker (consistent hash) waits for that worker only, and the
// runs behind it that may go elsewhere go.
func TestCreditHashedRunDoesNotBlockOthers(t *testing.T) {
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_CONSISTENT_HASH, RouteKey: "k"}, policyWorker("w1", 1), policyWorker("w2", 1))
	n, full := 0, ""
	var first sentDispatch
	for full == "" || c.Held() == 0 {
		ds := trigger(t, c, e, 2000+int64(n), `{"k":"a"}`)
		if len(ds) == 1 && full == "" {
			full, first = ds[0].to, ds[0]
		}
		if n++; n > 10*CreditPerSlot {
			t.Fatal("no run held")
		}
	}
	other := ""
	for k := 0; other == ""; k++ {
		ds := trigger(t, c, e, 5000+int64(k), fmt.Sprintf(`{"k":"b%d"}`, k))
		switch {
		case len(ds) == 1 && ds[0].to != full:
			other = ds[0].to
		case len(ds) == 1:
			t.Fatalf("a run to %s, out of credit, was sent", full)
		}
		if k > 100 {
			t.Fatal("no key went to the other worker while one run waited")
		}
	}
	heldNow := c.Held() // the first "a" run, and any "b" key that hashed to the full worker
	// A result from the full worker makes room there: the oldest run held for it goes.
	c.Handle(9000, &messages.Ref{Address: full, Id: full}, &messages.RunResult{RunId: first.d.RunId, JobId: 7, Shard: first.d.Shard,
		Epoch: first.d.Epoch, Attempt: 1, DueMs: first.d.DueMs, Outcome: messages.Outcome_SUCCEEDED, EndMs: 9000, WorkerId: full}, e)
	if ds := settle(c, e); len(ds) != 1 || ds[0].to != full || string(ds[0].d.Params) != `{"k":"a"}` || c.Held() != heldNow-1 {
		t.Fatalf("after a result from %s: sent %v, held %d (was %d); want the held \"a\" run sent there", full, ds, c.Held(), heldNow)
	}
}

// A miscount (here: forced) cannot keep a run held: after HeldRecheckMs the shard
// counts its runs at each worker again and sends it.
func TestCreditRecountFreesAStuckRun(t *testing.T) {
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_ROUND_ROBIN}, policyWorker("w1", 1))
	c.busy["w1"] = CreditPerSlot // as if CreditPerSlot runs were there, which are not
	if ds := trigger(t, c, e, 2000, ""); len(ds) != 0 || c.Held() != 1 {
		t.Fatalf("sent %v, held %d; want the run held", ds, c.Held())
	}
	c.Tick(2000+HeldRecheckMs-1, e)
	if ds := settle(c, e); len(ds) != 0 {
		t.Fatalf("sent %v before the recheck", ds)
	}
	c.Tick(2000+HeldRecheckMs, e)
	if ds := settle(c, e); len(ds) != 1 || ds[0].to != "w1" || c.Held() != 0 {
		t.Fatalf("at the recheck: sent %v, held %d; want the run sent to w1", ds, c.Held())
	}
	if c.busy["w1"] != 1 {
		t.Fatalf("count at w1 %d after the recount, want 1", c.busy["w1"])
	}
}

// A held run of a deleted job is dropped, not sent later; a new worker takes the
// held runs at once.
func TestCreditHeldRunsDeletedAndNewWorker(t *testing.T) {
	c, e := routeRig(t, &messages.Policy{Route: messages.Route_ROUND_ROBIN}, policyWorker("w1", 1))
	for i := range CreditPerSlot + 3 {
		trigger(t, c, e, 2000+int64(i), "")
	}
	if c.Held() != 3 {
		t.Fatalf("held %d, want 3", c.Held())
	}
	c.SetWorkers(2100, []*messages.WorkerInfo{policyWorker("w1", 1), policyWorker("w2", 1)}, e)
	ds := settle(c, e)
	if len(ds) != 3 || c.Held() != 0 {
		t.Fatalf("a new worker: sent %v, held %d; want the 3 held runs sent", ds, c.Held())
	}
	for _, sd := range ds {
		if sd.to != "w2" {
			t.Fatalf("held run sent to %s, want w2 (w1 has no credit)", sd.to)
		}
	}
	for i := range CreditPerSlot - 3 + 2 {
		trigger(t, c, e, 2200+int64(i), "")
	}
	if c.Held() != 2 {
		t.Fatalf("held %d, want 2", c.Held())
	}
	if r := reply(t, c, e, 2300, &messages.DeleteJob{App: "app", Id: 7}); r.Error != nil {
		t.Fatal(r.Error)
	}
	c.Tick(2300+HeldRecheckMs, e)
	if ds := settle(c, e); len(ds) != 0 {
		t.Fatalf("runs of a deleted job sent: %v", ds)
	}
	if len(c.runs) != 0 {
		t.Fatalf("%d runs left of a deleted job", len(c.runs))
	}
}
