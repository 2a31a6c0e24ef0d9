package shard

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// outbox batches what a shard sends to its workers. One step of the shard (one
// message handled: a journal flush made durable, a tick, a batch of results) often
// releases many dispatches, and acks for many results, to the same few workers: each
// sent alone cost a remote envelope, a serialization and a turn of the worker's
// mailbox. They are collected here while the message is handled and sent at its end,
// per worker, in order: consecutive dispatches as one Dispatches, consecutive acks
// as one ResultAcks (a lone one goes as itself). The worker handles each element as
// if it came alone. Replies to clients are not held.
//
// Its slices are kept from one step to the next (a shard sends to the same few
// workers step after step): dests[:len] are this step's, and what is beyond the
// length keeps the message slices of earlier steps, emptied, for reuse.
type outbox struct {
	dests []outDest
}

type outDest struct {
	to   *messages.Ref
	msgs []proto.Message
}

// Bounds of one batch: a dispatch carries up to 64 KiB of params.
const (
	outBatchMax      = 512
	outBatchMaxBytes = 8 << 20
)

func (o *outbox) add(to *messages.Ref, m proto.Message) {
	for i := range o.dests {
		if d := &o.dests[i]; d.to == to || (d.to.Address == to.Address && d.to.Id == to.Id) {
			d.msgs = append(d.msgs, m)
			return
		}
	}
	if n := len(o.dests); n < cap(o.dests) {
		o.dests = o.dests[:n+1]
		d := &o.dests[n]
		d.to, d.msgs = to, append(d.msgs[:0], m)
		return
	}
	o.dests = append(o.dests, outDest{to: to, msgs: []proto.Message{m}})
}

func (o *outbox) flush(ctx actor.Context) {
	if len(o.dests) > 0 {
		o.stamp(time.Now().UnixMilli())
		o.each(func(to *messages.Ref, m proto.Message) { ctx.Send(actor.NewPID(to.Address, to.Id), m) })
	}
}

// stamp sets the DispatchedMs of every dispatch about to go to nowMs, so that a
// worker's Run tells when the shard actually sent it. The core fills in its clock
// when it decides to dispatch, and an armed run's journaled DispatchedMs is its due
// (armed.go), written ahead of it: sent by a shard that was late to its tick, the
// dispatch still said "sent at the due", and the lateness of the shard's step was
// counted as transport (kjob bench's fire breakdown).
func (o *outbox) stamp(nowMs int64) {
	for i := range o.dests {
		for _, m := range o.dests[i].msgs {
			if d, ok := m.(*messages.Dispatch); ok {
				d.DispatchedMs = nowMs
			}
		}
	}
}

// each hands every message to send, batched, and empties the outbox.
func (o *outbox) each(send func(to *messages.Ref, m proto.Message)) {
	for i := range o.dests {
		d := &o.dests[i]
		for ms := d.msgs; len(ms) > 0; {
			n := runLength(ms)
			if n == 1 {
				send(d.to, ms[0])
			} else {
				send(d.to, batchOf(ms[:n]))
			}
			ms = ms[n:]
		}
		clear(d.msgs) // sent: not kept alive by the reused slice
		d.to, d.msgs = nil, d.msgs[:0]
	}
	o.dests = o.dests[:0]
}

// runLength is how many messages from the start of ms go in one batch: of one kind,
// within the bounds.
func runLength(ms []proto.Message) int {
	_, dispatch := ms[0].(*messages.Dispatch)
	size := 0
	for n, m := range ms {
		d, isD := m.(*messages.Dispatch)
		if isD != dispatch || n == outBatchMax {
			return n
		}
		if isD {
			if size += len(d.Params); size > outBatchMaxBytes && n > 0 {
				return n
			}
		}
	}
	return len(ms)
}

func batchOf(ms []proto.Message) proto.Message {
	if _, ok := ms[0].(*messages.Dispatch); ok {
		b := &messages.Dispatches{Dispatches: make([]*messages.Dispatch, len(ms))}
		for i, m := range ms {
			b.Dispatches[i] = m.(*messages.Dispatch)
		}
		return b
	}
	b := &messages.ResultAcks{Acks: make([]*messages.ResultAck, len(ms))}
	for i, m := range ms {
		b.Acks[i] = m.(*messages.ResultAck)
	}
	return b
}
