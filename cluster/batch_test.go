package cluster

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

func batchItemN(i int) *batchItem {
	return &batchItem{m: &messages.CreateJob{Job: &messages.Job{Id: int64(i)}}}
}

// A closed loop of creates, as a load generator or a busy service makes them: every
// create whose request returned is made again at once. The oldest request returns
// first. The batches must settle into even shares of the requests in flight, not a
// convoy of one large batch beside batches of one (what the policy before
// readyLocked's share did: half the batches of 1, a tenth of more than 170).
func TestBatchesShareTheRequests(t *testing.T) {
	for _, conc := range []int{8, 64, 256, 1000} {
		b := &batcher{}
		var out [][]*batchItem // requests in flight, oldest first
		send := func(batch []*batchItem) {
			if batch != nil {
				out = append(out, batch)
			}
		}
		for i := range conc {
			send(b.queued(batchItemN(i)))
		}
		var sizes []int
		sent := 0
		for step := 0; step < 4000; step++ {
			if len(out) == 0 {
				t.Fatalf("C=%d step %d: nothing in flight, %d creates waiting", conc, step, len(b.queue))
			}
			done := out[0]
			out = out[1:]
			sizes = append(sizes, len(done))
			sent += len(done)
			send(b.returned(done))
			for _, it := range done {
				send(b.queued(it))
			}
			checkBatcher(t, b, out)
		}
		want := min((conc+batchInFlight-1)/batchInFlight, batchMax)
		for i, n := range sizes[len(sizes)/2:] { // after the start
			if n < want/2 || n > 2*want {
				t.Fatalf("C=%d: batch %d carried %d creates, want about %d (an even share of %d requests); sizes %v",
					conc, len(sizes)/2+i, n, want, batchInFlight, sizes[len(sizes)-20:])
			}
		}
		if len(out) < min(batchInFlight, conc/want) {
			t.Fatalf("C=%d: %d requests in flight at the end, want %d", conc, len(out), batchInFlight)
		}
		if sent < 4000 {
			t.Fatalf("C=%d: only %d creates sent in 4000 returns", conc, sent)
		}
	}
}

// A lone create goes at once, and the creates that wait always go: whatever the
// order of arrivals and returns, nothing waits while no request is out.
func TestBatcherNeverStalls(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	b := &batcher{}
	if batch := b.queued(batchItemN(0)); len(batch) != 1 {
		t.Fatalf("a lone create went in a batch of %d, want 1 at once", len(batch))
	}
	b = &batcher{}
	var out [][]*batchItem
	next, acked := 0, 0
	for step := 0; step < 100_000; step++ {
		if rng.IntN(3) > 0 || len(out) == 0 {
			if batch := b.queued(batchItemN(next)); batch != nil {
				out = append(out, batch)
			}
			next++
		} else {
			k := rng.IntN(len(out)) // requests return in any order
			done := out[k]
			out = append(out[:k], out[k+1:]...)
			acked += len(done)
			if batch := b.returned(done); batch != nil {
				out = append(out, batch)
			}
		}
		checkBatcher(t, b, out)
	}
	for len(out) > 0 {
		done := out[0]
		out = out[1:]
		acked += len(done)
		if batch := b.returned(done); batch != nil {
			out = append(out, batch)
		}
		checkBatcher(t, b, out)
	}
	if acked != next || len(b.queue) != 0 {
		t.Fatalf("%d of %d creates sent, %d still waiting with no request out", acked, next, len(b.queue))
	}
}

func checkBatcher(t *testing.T, b *batcher, out [][]*batchItem) {
	t.Helper()
	carried := 0
	for _, batch := range out {
		if len(batch) == 0 || len(batch) > batchMax {
			t.Fatalf("a batch of %d creates", len(batch))
		}
		carried += len(batch)
	}
	switch {
	case b.inflight != len(out) || b.carried != carried:
		t.Fatalf("batcher counts %d requests carrying %d, in flight are %d carrying %d", b.inflight, b.carried, len(out), carried)
	case len(out) > batchInFlight:
		t.Fatalf("%d requests in flight, at most %d", len(out), batchInFlight)
	case len(out) == 0 && len(b.queue) > 0:
		t.Fatalf("%d creates waiting with no request out", len(b.queue))
	}
}

// A shard that says it reads packed batches gets the next ones packed. A reply to
// a packed batch without that word is from a shard that predates the form (it saw
// an empty batch): every create of it fails (Create then tries each alone, plain)
// and the next batch goes plain. A packed batch refused as a whole fails every
// create and turns packing off towards that shard for good.
func TestBatchGoesPackedOnceTheShardSaysSo(t *testing.T) {
	sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(actorLogger(slog.New(slog.DiscardHandler), slog.LevelWarn))))
	defer sys.Shutdown()
	var mu sync.Mutex
	var got []string
	var mode atomic.Int32 // 0: reads packed; 1: predates it; 2: refuses packed batches
	answer := func(ctx actor.Context, jobs []*messages.CreateJob, lean, takes bool) {
		replies := make([]*messages.JobReply, len(jobs))
		for i, x := range jobs {
			replies[i] = &messages.JobReply{Job: proto.Clone(x.Job).(*messages.Job)}
		}
		out := &messages.CreateJobsReply{Replies: replies}
		if lean {
			out = messages.Lean(jobs, replies)
		}
		out.TakesPacked = takes
		ctx.Respond(out)
	}
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		m, ok := ctx.Message().(*messages.CreateJobs)
		if !ok {
			return
		}
		form := "plain"
		if len(m.Packed) > 0 {
			form = "packed"
		}
		mu.Lock()
		got = append(got, form)
		mu.Unlock()
		switch {
		case mode.Load() == 1: // an old shard: packed is an unknown field, the batch empty
			answer(ctx, m.Jobs, m.LeanReplies, false)
		case form == "packed" && mode.Load() == 2:
			ctx.Respond(&messages.CreateJobsReply{Error: &messages.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "packed"}})
		default:
			b, err := m.Unpacked()
			if err != nil {
				t.Errorf("unpack: %v", err)
				return
			}
			answer(ctx, b.Jobs, b.LeanReplies, true)
		}
	}))
	c := &Client{system: sys, routes: map[string][]*messages.RouteEntry{}}
	b := &batcher{c: c, pid: pid}
	round := func(wantFail bool) {
		t.Helper()
		var items []*batchItem
		for i := range 3 {
			items = append(items, &batchItem{m: &messages.CreateJob{RequestId: int64(i + 1), Job: &messages.Job{Id: int64(i + 1), App: "a", Handler: "h",
				Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, AtMs: 5}}}, done: make(chan batchResult, 1)})
		}
		b.send(items)
		for i, it := range items {
			r := <-it.done
			if wantFail != (r.err != nil) || (!wantFail && r.reply.GetJob().GetId() != int64(i+1)) {
				t.Fatalf("create %d: %v, %v (want failed: %v)", i, r.reply, r.err, wantFail)
			}
		}
	}
	round(false) // plain; the shard says it reads packed
	round(false) // packed
	mode.Store(1)
	round(true)  // packed, to a shard that predates it: not read
	round(false) // plain again
	mode.Store(0)
	round(false) // plain; the shard says it reads packed again
	round(false) // packed
	mode.Store(2)
	round(true) // packed, refused
	mode.Store(0)
	round(false) // plain, and it says it reads packed: no matter
	round(false) // plain
	mu.Lock()
	defer mu.Unlock()
	if want := "[plain packed packed plain plain packed packed plain plain]"; fmt.Sprint(got) != want || c.PackedBatches() != 4 {
		t.Fatalf("sent %v, want %s; %d counted packed", got, want, c.PackedBatches())
	}
}
