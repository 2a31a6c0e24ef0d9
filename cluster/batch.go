package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/messages"
)

// Create batching.
//
// Each request to a shard costs a future (an actor of its own in proto.actor), a
// remote envelope each way and a turn of the shard's mailbox, whatever it carries:
// at tens of thousands of creates a second that overhead is most of a create's CPU.
// So the client keeps at most batchInFlight create requests in flight per shard,
// and creates that come while requests are out wait and go together, as one
// CreateJobs. A lone create goes at once (a batch of one): batching adds no wait
// when nothing is out, and there is no timer.
//
// While requests are out, waiting creates go once an even share of everything
// outstanding (in flight and waiting, divided by batchInFlight) is waiting — in a
// free request or the one just returned — and always when the last request out
// returns, so waiting for a share never stalls a create. Without the share the
// requests fell into a convoy: a returning request took the one or two creates
// waiting at that instant, the creates its reply released came back one by one
// into free requests of their own, and under load one request carried nearly
// everything while the others carried one create each (half the batches were of
// 1, a tenth of more than 170, at 256 creates in flight).
//
// A batch goes packed (CreateJobs.packed: kjob's own encoding, which the remote
// layer carries as one bytes field) once the shard has said, in a reply, that it
// reads that form; the first batch to a shard goes plain. A reply to a packed batch
// that does not say so is from a shard that predates the form (rolled back in
// place, say), which saw an empty batch and applied nothing: the creates are tried
// alone and the batches after go plain until a reply says otherwise. A packed batch
// refused as a whole (it did not unpack) turns packing off towards that shard for
// good. Packing is the client's work, on the batch's own goroutine, where the
// remote layer would marshal the plain batch on its one endpoint goroutine per
// connection: in sixteen alternating create runs at 256 in flight, 5 % more acks/s
// on average (BENCHMARKS.md, 2026-12-06).
//
// A batch is only the first try. A create whose batch was lost (timeout, the
// shard's server gone) or refused as a whole (NOT_OWNER: the shard moved) is tried
// again alone through Client.call, with its routing, back-off and refresh, under
// the same request id, so the shard applies it once whichever try arrives.
const (
	batchInFlight = 4
	batchMax      = 256     // creates per batch
	batchMaxBytes = 8 << 20 // params per batch
)

type batchItem struct {
	m    *messages.CreateJob
	done chan batchResult // buffered: the waiter may have gone
}

type batchResult struct {
	reply *messages.JobReply
	err   error
}

// batcher is the create batching towards one shard actor.
type batcher struct {
	c   *Client
	pid *actor.PID

	packs   atomic.Bool // the shard reads packed batches (its last reply said so)
	noPacks atomic.Bool // it refused a packed batch: never pack towards it again

	mu       sync.Mutex
	queue    []*batchItem
	inflight int // requests out
	carried  int // creates in them
}

// batcherKey names a shard actor: a struct of its two strings, so a lookup does
// not build a string.
type batcherKey struct{ address, id string }

// batcherForJob returns the batcher towards the shard owning job id of app, or nil
// when the client has no route for it yet. One lock and no allocation once the
// batcher exists: every create comes here.
func (c *Client) batcherForJob(app string, id int64) *batcher {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.shardForLocked(app, id)
	if e == nil || e.Owner == nil {
		return nil
	}
	key := batcherKey{e.Owner.Address, e.Owner.Id}
	b := c.batchers[key]
	if b == nil {
		if c.batchers == nil {
			c.batchers = map[batcherKey]*batcher{}
		}
		b = &batcher{c: c, pid: actor.NewPID(e.Owner.Address, e.Owner.Id)}
		c.batchers[key] = b
	}
	return b
}

// createBatched is Create's first try, in a batch; done is false when it must be
// tried alone (no route yet, or the batch failed as a whole).
func (c *Client) createBatched(ctx context.Context, m *messages.CreateJob) (j *messages.Job, done bool, err error) {
	b := c.batcherForJob(m.Job.App, m.Job.Id)
	if b == nil {
		return nil, false, nil
	}
	it := &batchItem{m: m, done: make(chan batchResult, 1)}
	b.add(it)
	select {
	case r := <-it.done:
		if r.err != nil {
			return nil, false, nil
		}
		if err := kerr.FromWire(r.reply.Error); err != nil {
			if retryable(err) {
				return nil, false, nil
			}
			return nil, true, err
		}
		return r.reply.Job, true, nil
	case <-ctx.Done():
		return nil, true, fmt.Errorf("%w (waiting for the reply to a batch sent to %s)", ctx.Err(), b.pid.Address)
	}
}

func (b *batcher) add(it *batchItem) {
	if batch := b.queued(it); batch != nil {
		go b.run(batch)
	}
}

// queued queues a create, and returns a batch to send now in a request of its own,
// or nil.
func (b *batcher) queued(it *batchItem) []*batchItem {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = append(b.queue, it)
	if !b.readyLocked() {
		return nil
	}
	return b.takeLocked()
}

// returned ends a request, and returns the batch it sends next, or nil.
func (b *batcher) returned(batch []*batchItem) []*batchItem {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight--
	b.carried -= len(batch)
	if !b.readyLocked() {
		return nil
	}
	return b.takeLocked()
}

// readyLocked reports whether the waiting creates should go now, in a request of
// their own: at once when none is out, else when a request is free and an even share
// of the creates outstanding is waiting.
func (b *batcher) readyLocked() bool {
	if len(b.queue) == 0 || b.inflight >= batchInFlight {
		return false
	}
	// With none out the share is at most what waits: a lone create goes at once.
	share := (b.carried + len(b.queue) + batchInFlight - 1) / batchInFlight
	return len(b.queue) >= share
}

// takeLocked takes the next batch off the queue into a request.
func (b *batcher) takeLocked() []*batchItem {
	n, size := 0, 0
	for n < len(b.queue) && n < batchMax {
		size += len(b.queue[n].m.Job.GetParams())
		if n > 0 && size > batchMaxBytes {
			break
		}
		n++
	}
	batch := append([]*batchItem(nil), b.queue[:n]...)
	b.inflight++
	b.carried += n
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return batch
}

// run sends batches while its returning request is the one to take the waiting
// creates (readyLocked).
func (b *batcher) run(batch []*batchItem) {
	for batch != nil {
		b.send(batch)
		batch = b.returned(batch)
	}
}

// send sends one CreateJobs and hands each create its reply.
func (b *batcher) send(batch []*batchItem) {
	b.c.batches.Add(1)
	b.c.batched.Add(int64(len(batch)))
	req := &messages.CreateJobs{Jobs: make([]*messages.CreateJob, len(batch)), LeanReplies: true}
	for i, it := range batch {
		req.Jobs[i] = it.m
	}
	var replies []*messages.JobReply
	msg, packed := req, false
	if b.packs.Load() && !b.noPacks.Load() {
		if p := messages.PackCreateJobs(req); p != nil {
			msg, packed = p, true
			b.c.packed.Add(1)
		}
	}
	r, err := b.c.system.Root.RequestFuture(b.pid, msg, requestTimeout).Result()
	if err == nil {
		rep, ok := r.(*messages.CreateJobsReply)
		switch {
		case !ok:
			err = fmt.Errorf("%w: %s: unexpected reply %T to a batch of %d", errTransport, b.pid.Address, r, len(batch))
		case rep.Error != nil: // refused as a whole: none applied
			b.noPacks.Store(true)
			err = fmt.Errorf("%w: %s: a batch of %d refused: %v", errTransport, b.pid.Address, len(batch), kerr.FromWire(rep.Error))
		case packed && !rep.TakesPacked: // a shard that predates packed batches: it saw none
			b.packs.Store(false)
			err = fmt.Errorf("%w: %s: a packed batch of %d not read", errTransport, b.pid.Address, len(batch))
		default:
			if replies, err = rep.Expand(req.Jobs); err != nil {
				err = fmt.Errorf("%w: %s: %v", errTransport, b.pid.Address, err)
			} else {
				b.packs.Store(rep.TakesPacked)
			}
		}
	}
	if err != nil {
		b.c.mu.Lock()
		for app := range appsOf(batch) {
			delete(b.c.routes, app) // the creates are tried alone, after a refresh
		}
		b.c.mu.Unlock()
	}
	for i, it := range batch {
		if err != nil {
			it.done <- batchResult{err: err}
		} else {
			it.done <- batchResult{reply: replies[i]}
		}
	}
}

// CreateBatches reports how many batches the client sent and how many creates they
// carried (a create tried again alone after its batch failed counts in both).
func (c *Client) CreateBatches() (batches, creates int64) {
	return c.batches.Load(), c.batched.Load()
}

// PackedBatches reports how many of the client's batches went packed.
func (c *Client) PackedBatches() int64 { return c.packed.Load() }

func appsOf(batch []*batchItem) map[string]bool {
	apps := map[string]bool{}
	for _, it := range batch {
		apps[it.m.Job.App] = true
	}
	return apps
}
