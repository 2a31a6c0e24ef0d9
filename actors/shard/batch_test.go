package shard

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// What a step sends to a worker goes in batches of one kind, in the order sent, per
// worker; a lone message goes as itself; bounds split long runs.
func TestOutboxBatchesInOrder(t *testing.T) {
	w1 := &messages.Ref{Address: "a:1", Id: "w1"}
	w2 := &messages.Ref{Address: "a:1", Id: "w2"}
	w1again := &messages.Ref{Address: "a:1", Id: "w1"} // another pointer, the same worker
	d := func(id string, params int) *messages.Dispatch {
		return &messages.Dispatch{RunId: id, Params: make([]byte, params)}
	}
	ack := func(id string) *messages.ResultAck { return &messages.ResultAck{RunId: id} }
	var o outbox
	o.add(w1, d("1", 0))
	o.add(w2, d("x", 0))
	o.add(w1again, d("2", 0))
	o.add(w1, ack("a"))
	o.add(w1, ack("b"))
	o.add(w1, d("3", 0))
	for i := range outBatchMax + 1 {
		o.add(w2, ack(fmt.Sprint(i)))
	}
	type sent struct {
		to string
		m  proto.Message
	}
	var got []sent
	o.each(func(to *messages.Ref, m proto.Message) { got = append(got, sent{to.Id, m}) })
	want := []sent{
		{"w1", &messages.Dispatches{Dispatches: []*messages.Dispatch{d("1", 0), d("2", 0)}}},
		{"w1", &messages.ResultAcks{Acks: []*messages.ResultAck{ack("a"), ack("b")}}},
		{"w1", d("3", 0)},
		{"w2", d("x", 0)},
	}
	acks := &messages.ResultAcks{}
	for i := range outBatchMax {
		acks.Acks = append(acks.Acks, ack(fmt.Sprint(i)))
	}
	want = append(want, sent{"w2", acks}, sent{"w2", ack(fmt.Sprint(outBatchMax))})
	if len(got) != len(want) {
		t.Fatalf("%d messages sent, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].to != want[i].to || !proto.Equal(got[i].m, want[i].m) {
			t.Fatalf("message %d: to %s %v, want to %s %v", i, got[i].to, got[i].m, want[i].to, want[i].m)
		}
	}
	if len(o.dests) != 0 {
		t.Fatal("the outbox kept messages after sending them")
	}
	for _, d := range o.dests[:cap(o.dests)] {
		for _, m := range d.msgs[:cap(d.msgs)] {
			if m != nil {
				t.Fatalf("the outbox's reused slices keep %v alive after sending it", m)
			}
		}
	}
	// Params bound a batch of dispatches.
	o.add(w1, d("big1", outBatchMaxBytes/2+1))
	o.add(w1, d("big2", outBatchMaxBytes/2+1))
	n := 0
	o.each(func(*messages.Ref, proto.Message) { n++ })
	if n != 2 {
		t.Fatalf("two dispatches over the byte bound went in %d messages, want 2", n)
	}
}

// The outbox's slices serve step after step: a step that sends to the workers an
// earlier one sent to allocates nothing of the outbox's own.
func TestOutboxReusesItsSlices(t *testing.T) {
	w1 := &messages.Ref{Address: "a:1", Id: "w1"}
	w2 := &messages.Ref{Address: "a:1", Id: "w2"}
	acks := []*messages.ResultAck{{RunId: "a"}, {RunId: "b"}}
	var o outbox
	step := func() {
		o.add(w1, acks[0])
		o.add(w2, acks[1])
		o.each(func(*messages.Ref, proto.Message) {})
	}
	step()
	if n := testing.AllocsPerRun(100, step); n != 0 {
		t.Fatalf("%v allocations a step, want 0", n)
	}
}

// Dispatches go out saying when they were sent, not when the core decided them: an
// armed run's DispatchedMs is its due until then. Acks are left as they are.
func TestOutboxStampsDispatchesWhenSent(t *testing.T) {
	w1 := &messages.Ref{Address: "a:1", Id: "w1"}
	w2 := &messages.Ref{Address: "a:1", Id: "w2"}
	var o outbox
	armed := &messages.Dispatch{RunId: "armed", DueMs: 1000, DispatchedMs: 1000}
	now := &messages.Dispatch{RunId: "now", DueMs: 990, DispatchedMs: 995}
	ack := &messages.ResultAck{RunId: "a"}
	o.add(w1, armed)
	o.add(w1, ack)
	o.add(w2, now)
	o.stamp(1007)
	if armed.DispatchedMs != 1007 || now.DispatchedMs != 1007 {
		t.Fatalf("dispatched at %d and %d, want both 1007", armed.DispatchedMs, now.DispatchedMs)
	}
	if armed.DueMs != 1000 || now.DueMs != 990 || ack.RunId != "a" {
		t.Fatal("stamp changed more than DispatchedMs")
	}
	var sent []int64
	o.each(func(_ *messages.Ref, m proto.Message) {
		if d, ok := m.(*messages.Dispatch); ok {
			sent = append(sent, d.DispatchedMs)
		}
	})
	if len(sent) != 2 || sent[0] != 1007 || sent[1] != 1007 {
		t.Fatalf("sent dispatches stamped %v, want [1007 1007]", sent)
	}
}
