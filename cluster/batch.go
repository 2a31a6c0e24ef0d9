package cluster

import (
	"context"
	"fmt"
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/messages"
)

// Create batching.
//
// Each request to a shard costs a future (an actor of its own in proto.actor), a
// remote envelope each way and a turn of the shard's mailbox, whatever it carries:
// at tens of thousands of creates a second that overhead is most of a create's CPU.
// So the client keeps at most batchInFlight create requests in flight per shard;
// creates that come while they are all out wait, and go together, as one
// CreateJobs, as soon as one comes back. A lone create goes at once (a batch of
// one): batching adds no wait, it only forms under load, and its size follows the
// load (Nagle's algorithm, without the timer).
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

	mu       sync.Mutex
	queue    []*batchItem
	inflight int
}

func (c *Client) batcherFor(owner *messages.Ref) *batcher {
	key := owner.Address + "\x00" + owner.Id
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.batchers[key]
	if b == nil {
		if c.batchers == nil {
			c.batchers = map[string]*batcher{}
		}
		b = &batcher{c: c, pid: actor.NewPID(owner.Address, owner.Id)}
		c.batchers[key] = b
	}
	return b
}

// createBatched is Create's first try, in a batch; done is false when it must be
// tried alone (no route yet, or the batch failed as a whole).
func (c *Client) createBatched(ctx context.Context, m *messages.CreateJob) (j *messages.Job, done bool, err error) {
	e := c.shardFor(m.Job.App, m.Job.Id)
	if e == nil || e.Owner == nil {
		return nil, false, nil
	}
	b := c.batcherFor(e.Owner)
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
		return nil, true, ctx.Err()
	}
}

func (b *batcher) add(it *batchItem) {
	b.mu.Lock()
	b.queue = append(b.queue, it)
	if b.inflight >= batchInFlight {
		b.mu.Unlock()
		return
	}
	b.inflight++
	batch := b.takeLocked()
	b.mu.Unlock()
	go b.run(batch)
}

// takeLocked takes the next batch off the queue.
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
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return batch
}

// run sends batches until the queue is empty.
func (b *batcher) run(batch []*batchItem) {
	for {
		b.send(batch)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.inflight--
			b.mu.Unlock()
			return
		}
		batch = b.takeLocked()
		b.mu.Unlock()
	}
}

func (b *batcher) send(batch []*batchItem) {
	b.c.batches.Add(1)
	b.c.batched.Add(int64(len(batch)))
	req := &messages.CreateJobs{Jobs: make([]*messages.CreateJob, len(batch))}
	for i, it := range batch {
		req.Jobs[i] = it.m
	}
	var rep *messages.CreateJobsReply
	r, err := b.c.system.Root.RequestFuture(b.pid, req, requestTimeout).Result()
	if err == nil {
		var ok bool
		if rep, ok = r.(*messages.CreateJobsReply); !ok || len(rep.Replies) != len(batch) {
			err = fmt.Errorf("%w: %s: unexpected reply %T to a batch of %d", errTransport, b.pid.Address, r, len(batch))
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
			it.done <- batchResult{reply: rep.Replies[i]}
		}
	}
}

// CreateBatches reports how many batches the client sent and how many creates they
// carried (a create tried again alone after its batch failed counts in both).
func (c *Client) CreateBatches() (batches, creates int64) {
	return c.batches.Load(), c.batched.Load()
}

func appsOf(batch []*batchItem) map[string]bool {
	apps := map[string]bool{}
	for _, it := range batch {
		apps[it.m.Job.App] = true
	}
	return apps
}
