package core

import (
	"slices"

	"github.com/kjob/kjob/messages"
)

// Credit: a shard keeps at most CreditPerSlot of its runs per pool slot at each
// worker (WorkerInfo.Capacity, the worker's default when it reports none). A run
// that every worker it may go to is out of credit for is held: it waits in the
// shard, in order, and goes out as soon as a result (or a new worker) makes room.
// The alternative — sending anyway — fills the worker's queue until it refuses,
// and each refusal costs a round trip and a retry RefusedRetryMs later, under
// exactly the load where the CPU is scarcest.
//
// Runs that may go to any worker (round robin, random, least busy) wait in one
// queue; a run tied to one worker (consistent hash) waits in that worker's queue,
// so it holds up only the runs for the same worker. Sending from a queue stops at
// its first run that cannot go: a step costs O(runs sent), never O(runs held).
// The counts are kept as runs go and come; a held run's timer (HeldRecheckMs)
// counts them again from the runs themselves, so a miscount cannot strand a run.
// Nothing here is journaled: held is a state of the in-memory run (its journaled
// state is "dispatched, no worker yet"), rebuilt by dispatching again after a
// recovery or a handoff.

// heldRuns is a FIFO of run seqs; entries of runs that finished or were dropped
// meanwhile are skipped when they reach the front.
type heldRuns struct {
	seqs []uint64
	head int
}

func (q *heldRuns) len() int { return len(q.seqs) - q.head }

func (q *heldRuns) push(s uint64) { q.seqs = append(q.seqs, s) }

func (q *heldRuns) pop() {
	q.seqs[q.head] = 0
	if q.head++; q.head == len(q.seqs) {
		q.seqs, q.head = q.seqs[:0], 0
	} else if q.head >= 1024 && q.head*2 >= len(q.seqs) {
		n := copy(q.seqs, q.seqs[q.head:])
		q.seqs, q.head = q.seqs[:n], 0
	}
}

// credit is how many of this shard's runs worker w may have at once.
func credit(w *messages.WorkerInfo) int {
	n := int(w.Capacity)
	if n <= 0 {
		n = defaultWorkerCapacity
	}
	return n * CreditPerSlot
}

func (c *Core) hasCredit(w *messages.WorkerInfo) bool { return c.busy[w.WorkerId] < credit(w) }

// withCredit is the worker r goes to when its policy picked w: w if it has credit;
// for the policies that do not tie a run to a worker (round robin, random), the
// next live worker in turn that has; nil when none may take it now.
func (c *Core) withCredit(r *run, w *messages.WorkerInfo) *messages.WorkerInfo {
	if c.hasCredit(w) {
		return w
	}
	switch c.route(r) {
	case messages.Route_ROUND_ROBIN, messages.Route_RANDOM, messages.Route_ROUTE_DEFAULT:
	default:
		return nil // least busy: w is the least loaded already; consistent hash: only w
	}
	at := 0
	for i, x := range c.workers {
		if x == w {
			at = i
		}
	}
	for i := 1; i < len(c.workers); i++ {
		if x := c.workers[(at+i)%len(c.workers)]; c.hasCredit(x) {
			return x
		}
	}
	return nil
}

// waitsFor is the worker r would wait for when held: "" (any) unless its policy
// ties it to one.
func (c *Core) waitsFor(r *run) string {
	if c.route(r) != messages.Route_CONSISTENT_HASH {
		return ""
	}
	if ws := c.pickWorkers(r); len(ws) > 0 {
		return ws[0].WorkerId
	}
	return ""
}

// waitsForPicked is waitsFor when the policy picked w.
func (c *Core) waitsForPicked(r *run, w *messages.WorkerInfo) string {
	if c.route(r) != messages.Route_CONSISTENT_HASH {
		return ""
	}
	return w.WorkerId
}

func (c *Core) heldQueue(workerID string) *heldRuns {
	if workerID == "" {
		return &c.held
	}
	q := c.heldAt[workerID]
	if q == nil {
		if c.heldAt == nil {
			c.heldAt = make(map[string]*heldRuns)
		}
		q = &heldRuns{}
		c.heldAt[workerID] = q
	}
	return q
}

// hold queues r in q until a worker has credit for it; its timer is the fallback.
func (c *Core) hold(r *run, q *heldRuns, nowMs int64) {
	r.held = true
	c.ownSt(r)
	r.st.WorkerId = ""
	c.heldN++
	q.push(r.seq)
	c.armRun(r, nowMs+HeldRecheckMs)
}

// Held is how many runs wait for credit at a worker.
func (c *Core) Held() int { return c.heldN }

// RunHeld says run runID is in flight and waits for credit at a worker: it fired
// (its record is journaled) and goes when a worker has room for it.
func (c *Core) RunHeld(runID string) bool {
	r := c.runs[runID]
	return r != nil && r.held
}

// sendHeld sends held runs, oldest first in each queue, while workers have credit.
func (c *Core) sendHeld(nowMs int64) {
	if c.heldN == 0 || !c.live || c.frozen != nil || c.failed != nil || len(c.workers) == 0 {
		return
	}
	c.sendFrom(&c.held, "", nowMs)
	if len(c.heldAt) == 0 {
		return
	}
	ids := make([]string, 0, len(c.heldAt))
	for id := range c.heldAt {
		if w := c.known[id]; w == nil || c.hasCredit(w) { // (commonly its worker is still full)
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // the core is deterministic: not in map order
	for _, id := range ids {
		q := c.heldAt[id]
		c.sendFrom(q, id, nowMs)
		if q.len() == 0 {
			delete(c.heldAt, id)
		}
	}
}

// sendFrom sends from q until its front run cannot go. A run that now waits for
// another worker (the workers changed under a consistent hash) moves to its queue.
func (c *Core) sendFrom(q *heldRuns, workerID string, nowMs int64) {
	for q.len() > 0 {
		r := c.bySeq[q.seqs[q.head]]
		if r == nil || !r.held {
			q.pop() // finished or dropped meanwhile
			continue
		}
		r.held = false
		ok, waitFor := c.place(r, nowMs)
		if !ok && waitFor == workerID {
			r.held = true
			return
		}
		q.pop()
		c.heldN--
		if !ok {
			c.hold(r, c.heldQueue(waitFor), nowMs)
		}
	}
}

// recount counts this shard's runs at each worker again from the runs themselves.
func (c *Core) recount() {
	clear(c.busy)
	for _, r := range c.runs {
		if r.st.Level < 0 && r.st.WorkerId != "" && c.known[r.st.WorkerId] != nil {
			c.busy[r.st.WorkerId]++
		}
	}
}
