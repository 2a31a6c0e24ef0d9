package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/shard"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// heldJournal is a journal whose appends become durable only when the test says so.
type heldJournal struct {
	mu        sync.Mutex
	lsn       uint64
	entries   []persistence.Entry
	held      []func(uint64, error)
	lsns      []uint64
	snapshots int
	failed    error // what Err says (persistence.Journal.Err: a failed sync)
}

func (j *heldJournal) Err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.failed
}

func (j *heldJournal) Append(entries []persistence.Entry, cb func(uint64, error)) (uint64, uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	first := j.lsn + 1
	j.lsn += uint64(len(entries))
	j.entries = append(j.entries, entries...)
	j.held = append(j.held, cb)
	j.lsns = append(j.lsns, j.lsn)
	return first, j.lsn, nil
}

func (j *heldJournal) SyncNow() {}

func (j *heldJournal) AppendWithin(es []persistence.Entry, _ time.Duration, cb func(uint64, error)) (uint64, uint64, error) {
	return j.Append(es, cb)
}

func (j *heldJournal) WriteSnapshot(uint64, uint64, []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.snapshots++
	return nil
}
func (j *heldJournal) DropStream(uint64) error { return nil }
func (j *heldJournal) Room() error             { return nil }

// release makes every held append durable (or failed with err).
func (j *heldJournal) release(err error) {
	j.mu.Lock()
	held, lsns := j.held, j.lsns
	j.held, j.lsns = nil, nil
	j.mu.Unlock()
	for i, cb := range held {
		if cb != nil {
			cb(lsns[i], err)
		}
	}
}

func (j *heldJournal) count(t messages.RecordType) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, e := range j.entries {
		if messages.RecordType(e.Type) == t {
			n++
		}
	}
	return n
}

// inbox is an actor that hands every proto message it gets to a channel.
func inbox(sys *actor.ActorSystem) (*actor.PID, chan proto.Message) {
	ch := make(chan proto.Message, 64)
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(proto.Message); ok {
			ch <- m
		}
	}))
	return pid, ch
}

func startServer(t *testing.T, j *heldJournal) (*actor.ActorSystem, *actor.PID, chan proto.Message) {
	sys, pid, nsIn, _, _ := startServerNS(t, j)
	return sys, pid, nsIn
}

func startServerNS(t *testing.T, j *heldJournal) (*actor.ActorSystem, *actor.PID, chan proto.Message, *actor.PID, *Actor) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet })))
	t.Cleanup(sys.Shutdown)
	ns, nsIn := inbox(sys)
	a := New(Deps{
		ServerID: "s1", Journal: j, Log: quiet,
		NameServer: func() *actor.PID { return ns },
		NewCore: func(s route.Shard, epoch int64) *shardcore.Core {
			return shardcore.New(shardcore.Config{Shard: s}, time.Now().UnixMilli(), epoch)
		},
	}, nil)
	pid, err := sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return a }), Name)
	if err != nil {
		t.Fatal(err)
	}
	return sys, pid, nsIn, ns, a
}

// heartbeat asks the server for a heartbeat and returns it.
func heartbeat(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, nsIn chan proto.Message) *messages.ServerHeartbeat {
	t.Helper()
	sys.Root.Send(pid, &HeartbeatTick{})
	deadline := time.After(2 * time.Second)
	for {
		select {
		case m := <-nsIn:
			if hb, ok := m.(*messages.ServerHeartbeat); ok {
				return hb
			}
		case <-deadline:
			t.Fatal("no heartbeat")
		}
	}
}

// heartbeatShards asks the server for a heartbeat and returns the shards in it.
func heartbeatShards(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, nsIn chan proto.Message) []string {
	t.Helper()
	var out []string
	for _, l := range heartbeat(t, sys, pid, nsIn).Shards {
		out = append(out, l.Shard)
	}
	return out
}

// wantOpened waits for a ShardOpened without an error on reply.
func wantOpened(t *testing.T, reply chan any, what string) {
	t.Helper()
	select {
	case r := <-reply:
		if so, ok := r.(*messages.ShardOpened); !ok || so.Error != nil {
			t.Fatalf("%s: %v", what, r)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("no answer to the %s", what)
	}
}

func waitReply(f *actor.Future) chan any {
	ch := make(chan any, 1)
	go func() {
		r, err := f.Result()
		if err != nil {
			ch <- err
			return
		}
		ch <- r
	}()
	return ch
}

// TestAssignAnswersOnlyOnceDurable: a newly assigned shard is confirmed and
// heartbeated only after its SHARD_OPENED record is durable (the simulator's
// QuirkEarlyOpen: reported earlier, a crash loses the shard while the NameServer
// keeps routing to it).
func TestAssignAnswersOnlyOnceDurable(t *testing.T) {
	j := &heldJournal{}
	sys, pid, nsIn := startServer(t, j)
	reply := waitReply(sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 5*time.Second))
	// A repeat while the record is on its way is answered with the first, not written twice.
	again := waitReply(sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 5*time.Second))
	select {
	case r := <-reply:
		t.Fatalf("ShardOpened before the open record is durable: %v", r)
	case <-time.After(300 * time.Millisecond):
	}
	if got := heartbeatShards(t, sys, pid, nsIn); len(got) != 0 {
		t.Fatalf("heartbeat reports %v before the open record is durable", got)
	}
	if n := j.count(messages.RecordType_SHARD_OPENED); n != 1 {
		t.Fatalf("%d SHARD_OPENED records appended, want 1", n)
	}
	j.release(nil)
	for _, ch := range []chan any{reply, again} {
		select {
		case r := <-ch:
			so, ok := r.(*messages.ShardOpened)
			if !ok || so.Error != nil || so.Shard.GetShard() != "app/0/0" || so.Shard.GetEpoch() != 1 || so.Shard.GetPid() == nil {
				t.Fatalf("reply %v, want ShardOpened of app/0/0 at epoch 1", r)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("no ShardOpened after the open record became durable")
		}
	}
	if got := heartbeatShards(t, sys, pid, nsIn); len(got) != 1 || got[0] != "app/0/0" {
		t.Fatalf("heartbeat reports %v once durable, want [app/0/0]", got)
	}
	if n := j.count(messages.RecordType_SHARD_OPENED); n != 1 {
		t.Fatalf("%d SHARD_OPENED records appended in all, want 1 (the shard must not open itself again)", n)
	}
	// The shard serves: a create is acknowledged once durable.
	f := waitReply(sys.Root.RequestFuture(actor.NewPID(pid.Address, pid.Id+"/"+ShardName("app/0/0")), &messages.GetJob{App: "app", Id: 1}, 3*time.Second))
	select {
	case r := <-f:
		jr, ok := r.(*messages.JobReply)
		if !ok || jr.Error.GetCode() != messages.Code_NOT_FOUND {
			t.Fatalf("get from the opened shard: %v, want NOT_FOUND", r)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("opened shard does not answer")
	}
}

// TestAssignWithoutSenderTellsTheNameServer: the NameServer sends AssignShard
// without a sender; the server confirms to it directly, only once durable.
func TestAssignWithoutSenderTellsTheNameServer(t *testing.T) {
	j := &heldJournal{}
	sys, pid, nsIn := startServer(t, j)
	sys.Root.Send(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1})
	select {
	case m := <-nsIn:
		t.Fatalf("the NameServer heard %v before the open record is durable", m)
	case <-time.After(300 * time.Millisecond):
	}
	j.release(nil)
	select {
	case m := <-nsIn:
		so, ok := m.(*messages.ShardOpened)
		if !ok || so.Shard.GetShard() != "app/0/0" {
			t.Fatalf("the NameServer heard %v, want ShardOpened of app/0/0", m)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the NameServer never heard of the opened shard")
	}
}

// TestAssignJournalFailure: a failed open record is answered with UNAVAILABLE and
// leaves no shard behind; a later assignment tries again.
func TestAssignJournalFailure(t *testing.T) {
	j := &heldJournal{}
	sys, pid, nsIn := startServer(t, j)
	reply := waitReply(sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 5*time.Second))
	time.Sleep(100 * time.Millisecond)
	j.release(errors.New("disk on fire"))
	select {
	case r := <-reply:
		so, ok := r.(*messages.ShardOpened)
		if !ok || so.Error.GetCode() != messages.Code_UNAVAILABLE || so.Shard != nil {
			t.Fatalf("reply %v, want ShardOpened with UNAVAILABLE", r)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no answer after the open record failed")
	}
	if got := heartbeatShards(t, sys, pid, nsIn); len(got) != 0 {
		t.Fatalf("heartbeat reports %v after the open failed", got)
	}
	reply = waitReply(sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 5*time.Second))
	time.Sleep(100 * time.Millisecond)
	j.release(nil)
	wantOpened(t, reply, "second assignment")
	if n := j.count(messages.RecordType_SHARD_OPENED); n != 2 {
		t.Fatalf("%d SHARD_OPENED records, want 2 (one failed, one durable)", n)
	}
}

// releaseWhileWaiting makes appends durable as they come until stop is closed.
func releaseWhileWaiting(j *heldJournal, stop chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
			j.release(nil)
		}
	}
}

// TestImportChecksBeforePersisting: an import whose snapshot would not load, or
// would load as another shard or epoch, is refused and never reaches the journal
// (recovery rebuilds the shard from that record alone, so a bad one would stop the
// node from starting); a good one is persisted once, and a repeat answered alike.
func TestImportChecksBeforePersisting(t *testing.T) {
	j := &heldJournal{}
	sys, pid, _ := startServer(t, j)
	stop := make(chan struct{})
	defer close(stop)
	go releaseWhileWaiting(j, stop)
	sh, _ := route.Parse("app/0/0")
	src := shardcore.New(shardcore.Config{Shard: sh}, time.Now().UnixMilli(), 1)
	snap := src.HandoffSnapshot() // epoch 2
	ask := func(m *messages.ImportShard) *messages.ImportShardReply {
		t.Helper()
		r, err := sys.Root.RequestFuture(pid, m, 3*time.Second).Result()
		if err != nil {
			t.Fatalf("import %s@%d: %v", m.Shard, m.Epoch, err)
		}
		return r.(*messages.ImportShardReply)
	}
	for _, bad := range []*messages.ImportShard{
		{Shard: "app/0/0", Epoch: 2, Snapshot: []byte("not a snapshot")},
		{Shard: "app/0/0", Epoch: 3, Snapshot: snap},
		{Shard: "other/0/0", Epoch: 2, Snapshot: snap},
	} {
		if r := ask(bad); r.Error.GetCode() != messages.Code_INVALID_ARGUMENT {
			t.Errorf("import %s@%d of a mismatched snapshot: %v, want INVALID_ARGUMENT", bad.Shard, bad.Epoch, r)
		}
	}
	if n := j.count(messages.RecordType_SHARD_IMPORTED); n != 0 {
		t.Fatalf("%d SHARD_IMPORTED records after refused imports, want 0", n)
	}
	for i := 0; i < 2; i++ {
		r := ask(&messages.ImportShard{Shard: "app/0/0", Epoch: 2, Snapshot: snap})
		if r.Error != nil || r.Shard.GetEpoch() != 2 || r.Shard.GetPid() == nil {
			t.Fatalf("import %d: %v, want the shard at epoch 2", i+1, r)
		}
	}
	if n := j.count(messages.RecordType_SHARD_IMPORTED); n != 1 {
		t.Fatalf("%d SHARD_IMPORTED records, want 1 (a repeat is answered without a second copy)", n)
	}
}

// TestStaleImportAfterHandOn: a server that held a shard at epoch 2 and handed it
// on does not take the epoch-2 import again when a source that was down sends it
// late (it would be a second, stale owner); it answers as if done, so the source
// closes. The same holds when the route table shows a later epoch.
func TestStaleImportAfterHandOn(t *testing.T) {
	j := &heldJournal{}
	sys, pid, _, ns, _ := startServerNS(t, j)
	stop := make(chan struct{})
	defer close(stop)
	go releaseWhileWaiting(j, stop)
	sh, _ := route.Parse("app/0/0")
	snap := shardcore.New(shardcore.Config{Shard: sh}, time.Now().UnixMilli(), 1).HandoffSnapshot() // epoch 2
	ask := func(m *messages.ImportShard) *messages.ImportShardReply {
		t.Helper()
		r, err := sys.Root.RequestFuture(pid, m, 3*time.Second).Result()
		if err != nil {
			t.Fatalf("import %s@%d: %v", m.Shard, m.Epoch, err)
		}
		return r.(*messages.ImportShardReply)
	}
	if r := ask(&messages.ImportShard{Shard: "app/0/0", Epoch: 2, Snapshot: snap}); r.Error != nil {
		t.Fatalf("first import: %v", r)
	}
	sys.Root.Send(pid, &shard.HandedOff{Shard: "app/0/0"}) // as the shard says once its handoff to epoch 3 is done
	r := ask(&messages.ImportShard{Shard: "app/0/0", Epoch: 2, Snapshot: snap})
	if r.Error != nil || r.Shard.GetEpoch() != 3 {
		t.Fatalf("late repeat of the epoch-2 import: %v, want success naming epoch 3", r)
	}
	if n := j.count(messages.RecordType_SHARD_IMPORTED); n != 1 {
		t.Fatalf("%d SHARD_IMPORTED records, want 1: the late repeat must not import", n)
	}
	// The route table says epoch 5 lives elsewhere: an epoch-4 import is stale too.
	other := &messages.Ref{Address: "elsewhere:1", Id: "kjob-server/shard-b/0/0"}
	sys.Root.Send(pid, &messages.RouteTable{Version: 1, Nameserver: &messages.Ref{Address: ns.Address, Id: ns.Id},
		Routes: []*messages.RouteEntry{{Shard: "b/0/0", App: "b", Owner: other, ServerId: "s9", Epoch: 5}}})
	shB, _ := route.Parse("b/0/0")
	c := shardcore.New(shardcore.Config{Shard: shB}, time.Now().UnixMilli(), 3)
	r = ask(&messages.ImportShard{Shard: "b/0/0", Epoch: 4, Snapshot: c.HandoffSnapshot()})
	if r.Error != nil || r.Shard.GetEpoch() != 5 || r.Shard.GetPid().GetAddress() != "elsewhere:1" {
		t.Fatalf("import at epoch 4 of a shard routed at epoch 5: %v, want success naming the owner at 5", r)
	}
	if n := j.count(messages.RecordType_SHARD_IMPORTED); n != 1 {
		t.Fatalf("%d SHARD_IMPORTED records, want 1", n)
	}
}

// TestLateAssignAfterHandOn: an assignment that arrives after the shard moved on
// from here (a late or repeated AssignShard; here the shard was handed on at epoch
// 3) opens nothing: a second, empty owner at the old epoch would stand next to the
// live one (the simulator's seed 3967: a split root re-opened beside its halves).
func TestLateAssignAfterHandOn(t *testing.T) {
	j := &heldJournal{}
	sys, pid, _, _, _ := startServerNS(t, j)
	stop := make(chan struct{})
	defer close(stop)
	go releaseWhileWaiting(j, stop)
	sh, _ := route.Parse("app/0/0")
	snap := shardcore.New(shardcore.Config{Shard: sh}, time.Now().UnixMilli(), 1).HandoffSnapshot() // epoch 2
	r, err := sys.Root.RequestFuture(pid, &messages.ImportShard{Shard: "app/0/0", Epoch: 2, Snapshot: snap}, 3*time.Second).Result()
	if err != nil || r.(*messages.ImportShardReply).Error != nil {
		t.Fatalf("import: %v %v", r, err)
	}
	sys.Root.Send(pid, &shard.HandedOff{Shard: "app/0/0"}) // handed on at epoch 3
	res, err := sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 3*time.Second).Result()
	if err != nil {
		t.Fatalf("late assignment: %v", err)
	}
	if so := res.(*messages.ShardOpened); so.Error.GetCode() != messages.Code_FAILED_PRECONDITION {
		t.Fatalf("late assignment of a shard handed on answered %v, want FAILED_PRECONDITION", so)
	}
	if n := j.count(messages.RecordType_SHARD_OPENED); n != 0 {
		t.Fatalf("%d SHARD_OPENED records, want none: the late assignment must not open the shard again", n)
	}
}

// TestFrozenShardIsNotSnapshotted: once a shard is frozen for a handoff, a snapshot
// request (the journal's compaction asks one of a stream that pins a segment) writes
// nothing. A snapshot has no room for the handoff: a restart from it would bring
// the old owner back active at the old epoch, next to the new owner.
func TestFrozenShardIsNotSnapshotted(t *testing.T) {
	sys, pid, j := serverWithShard(t)
	shardPID := actor.NewPID(pid.Address, pid.Id+"/"+ShardName("app/0/0"))
	create := &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 3_600_000}}}
	if r, err := sys.Root.RequestFuture(shardPID, create, 3*time.Second).Result(); err != nil || r.(*messages.JobReply).Error != nil {
		t.Fatalf("create: %v %v", r, err)
	}
	snapshots := func() int {
		// Stats is answered after the TakeSnapshot before it: the mailbox is in order.
		sys.Root.Send(shardPID, &shard.TakeSnapshot{})
		if _, err := sys.Root.RequestFuture(shardPID, &shard.Stats{}, 3*time.Second).Result(); err != nil {
			t.Fatal(err)
		}
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.snapshots
	}
	if n := snapshots(); n != 1 {
		t.Fatalf("%d snapshots of an active shard with a new record, want 1 (the test's premise)", n)
	}
	target, _ := inbox(sys) // takes the ImportShard and never answers: the shard stays frozen
	sys.Root.Send(pid, &messages.MoveShard{Shard: "app/0/0", Epoch: 1, Target: &messages.Ref{Address: target.Address, Id: target.Id}})
	deadline := time.Now().Add(3 * time.Second)
	for j.count(messages.RecordType_SHARD_HANDOFF) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if j.count(messages.RecordType_SHARD_HANDOFF) != 1 {
		t.Fatal("no SHARD_HANDOFF record after MoveShard")
	}
	time.Sleep(50 * time.Millisecond) // durable, so the shard is quiescent again
	if n := snapshots(); n != 1 {
		t.Fatalf("%d snapshots after the shard froze, want still 1", n)
	}
}

// TestPullsTheRouteTable: every PullEveryTicks heartbeats the server pulls the whole
// route table with workers, and takes the answer as it takes a push, so a push it
// missed is repaired.
func TestPullsTheRouteTable(t *testing.T) {
	j := &heldJournal{}
	sys, pid, nsIn, ns, a := startServerNS(t, j)
	pulls := 0
	for i := 0; i < 2*PullEveryTicks; i++ {
		sys.Root.Send(pid, &HeartbeatTick{})
	}
	deadline := time.After(3 * time.Second)
	for beats := 0; beats < 2*PullEveryTicks; {
		select {
		case m := <-nsIn:
			switch x := m.(type) {
			case *messages.ServerHeartbeat:
				beats++
			case *messages.GetRoutes:
				if !x.WithWorkers || x.App != "" {
					t.Fatalf("pull %v, want the whole table with workers", x)
				}
				pulls++
			}
		case <-deadline:
			t.Fatal("heartbeats missing")
		}
	}
	time.Sleep(50 * time.Millisecond)
	for len(nsIn) > 0 {
		if _, ok := (<-nsIn).(*messages.GetRoutes); ok {
			pulls++
		}
	}
	if pulls != 2 {
		t.Fatalf("%d pulls in %d heartbeats, want 2", pulls, 2*PullEveryTicks)
	}
	// The answer is taken like a push from the current NameServer.
	sys.Root.Send(pid, &messages.RouteTable{Version: 3, Nameserver: &messages.Ref{Address: ns.Address, Id: ns.Id}})
	if r, err := sys.Root.RequestFuture(pid, &messages.Ping{}, 3*time.Second).Result(); err != nil { // after the table, in order
		t.Fatalf("ping: %v %v", r, err)
	}
	if tb := a.Table(); tb.GetVersion() != 3 {
		t.Fatalf("table after the pull's answer: %v, want version 3", tb)
	}
}

// TestMoveToItselfIsIgnored: a move whose target is this very server (a stale order
// from a NameServer that took this process's restart for another server) is not
// begun: the shard would hand itself to itself, its import refused forever.
func TestMoveToItselfIsIgnored(t *testing.T) {
	sys, pid, j := serverWithShard(t)
	sys.Root.Send(pid, &messages.MoveShard{Shard: "app/0/0", Epoch: 1, Target: &messages.Ref{Address: pid.Address, Id: pid.Id}})
	shardPID := actor.NewPID(pid.Address, pid.Id+"/"+ShardName("app/0/0"))
	create := &messages.CreateJob{Job: &messages.Job{Id: 7, App: "app", Handler: "h",
		Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 3_600_000}}}
	r, err := sys.Root.RequestFuture(shardPID, create, 3*time.Second).Result()
	if err != nil || r.(*messages.JobReply).Error != nil {
		t.Fatalf("create after a move to itself: %v %v", r, err)
	}
	if n := j.count(messages.RecordType_SHARD_HANDOFF); n != 0 {
		t.Fatalf("%d SHARD_HANDOFF records after a move to itself, want 0", n)
	}
}

// TestFailedImportWaitsBeforeRetrying: after a refused import the shard waits
// HandoffRetry before the next, however many messages it gets meanwhile (each one
// used to start another import at once: thousands a second, all refused).
func TestFailedImportWaitsBeforeRetrying(t *testing.T) {
	sys, pid, _ := serverWithShard(t)
	var mu sync.Mutex
	imports := 0
	target := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*messages.ImportShard); ok {
			mu.Lock()
			imports++
			mu.Unlock()
			ctx.Respond(&messages.ImportShardReply{Error: &messages.Error{Code: messages.Code_UNAVAILABLE, Message: "not now"}})
		}
	}))
	sys.Root.Send(pid, &messages.MoveShard{Shard: "app/0/0", Epoch: 1, Target: &messages.Ref{Address: target.Address, Id: target.Id}})
	shardPID := actor.NewPID(pid.Address, pid.Id+"/"+ShardName("app/0/0"))
	deadline := time.Now().Add(shard.HandoffRetry / 2)
	sent := 0
	for time.Now().Before(deadline) {
		sys.Root.Send(shardPID, &messages.GetJob{App: "app", Id: 7})
		sent++
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	n := imports
	mu.Unlock()
	if n != 1 {
		t.Fatalf("%d imports within half of HandoffRetry (%d messages to the frozen shard), want 1", n, sent)
	}
}

// serverWithShard starts a server whose journal makes every append durable within
// 10 ms, with shard app/0/0 assigned at epoch 1.
func serverWithShard(t *testing.T) (*actor.ActorSystem, *actor.PID, *heldJournal) {
	t.Helper()
	j := &heldJournal{}
	sys, pid, _ := startServer(t, j)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go releaseWhileWaiting(j, stop)
	if r, err := sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 3*time.Second).Result(); err != nil {
		t.Fatalf("assign: %v %v", r, err)
	}
	return sys, pid, j
}

// TestAssignFromAnotherNameServerIgnored: an assignment stamped by a NameServer
// instance other than the one the node resolves now (an old instance's late order,
// whose app its successor may have placed elsewhere) opens nothing; the current
// one's does.
func TestAssignFromAnotherNameServerIgnored(t *testing.T) {
	j := &heldJournal{}
	sys, pid, _, ns, _ := startServerNS(t, j)
	stop := make(chan struct{})
	defer close(stop)
	go releaseWhileWaiting(j, stop)
	old := &messages.Ref{Address: "gone:1", Id: ns.Id}
	res, err := sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1, Nameserver: old}, 3*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	if so := res.(*messages.ShardOpened); so.Error.GetCode() != messages.Code_FAILED_PRECONDITION {
		t.Fatalf("assignment from another name server answered %v, want FAILED_PRECONDITION", so)
	}
	if n := j.count(messages.RecordType_SHARD_OPENED); n != 0 {
		t.Fatalf("%d SHARD_OPENED records after an assignment from another name server, want 0", n)
	}
	cur := &messages.Ref{Address: ns.Address, Id: ns.Id}
	res, err = sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1, Nameserver: cur}, 3*time.Second).Result()
	if err != nil || res.(*messages.ShardOpened).Error != nil {
		t.Fatalf("assignment from the current name server: %v %v", res, err)
	}
}

// TestHeartbeatSaysTheJournalFailed: once the journal has failed, heartbeats say so,
// and the NameServer then places no new app there (one would wait for a restart)
// and moves nothing to or from it.
func TestHeartbeatSaysTheJournalFailed(t *testing.T) {
	j := &heldJournal{}
	sys, pid, nsIn := startServer(t, j)
	if hb := heartbeat(t, sys, pid, nsIn); hb.JournalError != "" {
		t.Fatalf("journal error %q on a healthy journal", hb.JournalError)
	}
	j.mu.Lock()
	j.failed = errors.New("msync: input/output error")
	j.mu.Unlock()
	if hb := heartbeat(t, sys, pid, nsIn); hb.JournalError != "msync: input/output error" {
		t.Fatalf("journal error %q, want the journal's", hb.JournalError)
	}
}

// TestHeartbeatClaimsAnOpeningShard: a shard whose SHARD_OPENED record is on its way
// to disk, or whose sync failed (the record may be there all the same), is not
// reported as a shard but claimed as opening, so a NameServer that took over since
// the assignment holds its app for this server; once it opens, the claim ends.
func TestHeartbeatClaimsAnOpeningShard(t *testing.T) {
	j := &heldJournal{}
	sys, pid, nsIn := startServer(t, j)
	claims := func(when string, shards, opening []string) {
		t.Helper()
		hb := heartbeat(t, sys, pid, nsIn)
		var got []string
		for _, l := range hb.Shards {
			got = append(got, l.Shard)
		}
		if fmt.Sprint(got) != fmt.Sprint(shards) || fmt.Sprint(hb.Opening) != fmt.Sprint(opening) {
			t.Fatalf("%s: shards %v opening %v, want %v and %v", when, got, hb.Opening, shards, opening)
		}
	}
	claims("at start", nil, nil)
	reply := waitReply(sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 5*time.Second))
	claims("record on its way", nil, []string{"app/0/0"})
	j.release(errors.New("disk on fire"))
	select {
	case <-reply:
	case <-time.After(3 * time.Second):
		t.Fatal("no answer after the open record failed")
	}
	claims("sync failed", nil, []string{"app/0/0"})
	reply = waitReply(sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 5*time.Second))
	claims("tried again", nil, []string{"app/0/0"})
	j.release(nil)
	wantOpened(t, reply, "second assignment")
	claims("opened", []string{"app/0/0"}, nil)
}

// TestHandoffClosesOnlyOnAConfirmation: the copy here closes only on an answer that
// names the shard at the import's epoch or later. A reply without an error but with
// no shard, another shard or an older epoch (a server of another version, or not the
// one asked) is retried like a refusal: closing on it would leave no owner.
func TestHandoffClosesOnlyOnAConfirmation(t *testing.T) {
	sys, pid, j := serverWithShard(t)
	answers := []*messages.ImportShardReply{
		{},
		{Shard: &messages.ShardLoad{Shard: "app/0/1", Epoch: 2}},
		{Shard: &messages.ShardLoad{Shard: "app/0/0", Epoch: 1}},
		{Shard: &messages.ShardLoad{Shard: "app/0/0", Epoch: 2}},
	}
	var mu sync.Mutex
	asked := 0
	target := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if im, ok := ctx.Message().(*messages.ImportShard); ok {
			mu.Lock()
			i := min(asked, len(answers)-1)
			asked++
			mu.Unlock()
			if im.Shard != "app/0/0" || im.Epoch != 2 {
				t.Errorf("import of %s at %d, want app/0/0 at 2", im.Shard, im.Epoch)
			}
			ctx.Respond(answers[i])
		}
	}))
	sys.Root.Send(pid, &messages.MoveShard{Shard: "app/0/0", Epoch: 1, Target: &messages.Ref{Address: target.Address, Id: target.Id}})
	for i := range len(answers) - 1 {
		deadline := time.Now().Add(time.Duration(i+1)*shard.HandoffRetry + 2*time.Second)
		for {
			mu.Lock()
			n := asked
			mu.Unlock()
			if n > i {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d imports asked, want %d", n, i+1)
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		if n := j.count(messages.RecordType_SHARD_CLOSED); n != 0 {
			t.Fatalf("the copy closed on answer %d (%v)", i, answers[i])
		}
	}
	deadline := time.Now().Add(shard.HandoffRetry + 3*time.Second)
	for j.count(messages.RecordType_SHARD_CLOSED) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the copy did not close on a confirmation")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
