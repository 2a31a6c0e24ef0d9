package server

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
)

// An audit of what the NameServer and other servers send a server. Each malformed
// order is refused with the field at fault before anything of it is kept: no
// SHARD_OPENED or SHARD_IMPORTED record (before, an assignment of "app/00/0"
// wrote a second opening record into app/0/0's stream, and one of a bad app, a
// level-3 shard or an epoch of 0, -5 or MaxInt64 opened a shard), no handoff
// (before, a move to an empty target froze the shard for good), no table (before,
// a table with a nil entry panicked every heartbeat, and one with an entry
// without an owner was passed back to the NameServer as hearsay). After all of it
// the server's heartbeat is one the NameServer takes (nscore.Check), still
// holding app/0/0 only.

// snapshotNamed is a minimal shard snapshot that names shard at epoch.
func snapshotNamed(t *testing.T, shard string, epoch int64, f func(s *messages.ShardSnapshot)) []byte {
	t.Helper()
	s := &messages.ShardSnapshot{Meta: &messages.ShardMeta{Shard: shard, Epoch: epoch}}
	if f != nil {
		f(s)
	}
	b, err := proto.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fireWindow sets a snapshot's fire window to fires in the current second.
func fireWindow(fires int64) func(s *messages.ShardSnapshot) {
	return func(s *messages.ShardSnapshot) {
		s.FireWindow, s.FireWindowSec = make([]int64, 60), make([]int64, 60)
		now := time.Now().Unix()
		for i := range s.FireWindowSec {
			s.FireWindowSec[i] = now
		}
		s.FireWindow[0] = fires
	}
}

func TestServerRefusesBadOrders(t *testing.T) {
	j := &heldJournal{}
	sys, pid, nsIn, ns, a := startServerNS(t, j)
	stop := make(chan struct{})
	defer close(stop)
	go releaseWhileWaiting(j, stop)
	if r, err := sys.Root.RequestFuture(pid, &messages.AssignShard{Shard: "app/0/0", Epoch: 1}, 3*time.Second).Result(); err != nil || r.(*messages.ShardOpened).Error != nil {
		t.Fatalf("good assignment: %v %v", r, err)
	}
	ask := func(m proto.Message) *messages.Error {
		t.Helper()
		r, err := sys.Root.RequestFuture(pid, m, 3*time.Second).Result()
		if err != nil {
			t.Fatalf("%v: no reply: %v", m, err)
		}
		switch r := r.(type) {
		case *messages.ShardOpened:
			return r.Error
		case *messages.ImportShardReply:
			return r.Error
		}
		t.Fatalf("%v: reply %T", m, r)
		return nil
	}
	// A good table first: the refused ones must leave it.
	nsRef := &messages.Ref{Address: ns.Address, Id: ns.Id}
	shardRef := &messages.Ref{Address: pid.Address, Id: pid.Id + "/" + ShardName("app/0/0")}
	good := &messages.RouteTable{Version: 10, Nameserver: nsRef,
		Routes: []*messages.RouteEntry{{Shard: "app/0/0", App: "app", Owner: shardRef, ServerId: "s1", Epoch: 1}},
		Apps:   []*messages.AppWorkers{{App: "app", Workers: []*messages.WorkerInfo{{WorkerId: "w1", App: "app", Ref: &messages.Ref{Address: "w:1", Id: "worker"}}}}}}
	sys.Root.Send(pid, good)

	for _, tc := range []struct {
		name  string
		m     proto.Message
		field string
	}{
		{"assign empty", &messages.AssignShard{Epoch: 1}, "shard"},
		{"assign level 00", &messages.AssignShard{Shard: "app/00/0", Epoch: 1}, "shard"},
		{"assign index -0", &messages.AssignShard{Shard: "z/0/-0", Epoch: 1}, "shard"},
		{"assign app with a space", &messages.AssignShard{Shard: "a b/0/0", Epoch: 1}, "shard"},
		{"assign app with a slash", &messages.AssignShard{Shard: "a/b/0/0", Epoch: 1}, "shard"},
		{"assign app invalid UTF-8", &messages.AssignShard{Shard: "a\xff/0/0", Epoch: 1}, "shard"},
		{"assign level 3", &messages.AssignShard{Shard: "z/3/5", Epoch: 1}, "shard"},
		{"assign epoch 0", &messages.AssignShard{Shard: "z/0/0", Epoch: 0}, "epoch"},
		{"assign epoch -5", &messages.AssignShard{Shard: "z/0/0", Epoch: -5}, "epoch"},
		{"assign epoch MaxInt64", &messages.AssignShard{Shard: "z/0/0", Epoch: math.MaxInt64}, "epoch"},
		{"import app with a space", &messages.ImportShard{Shard: "a b/0/0", Epoch: 2, Snapshot: snapshotNamed(t, "a b/0/0", 2, nil)}, "shard"},
		{"import index 00", &messages.ImportShard{Shard: "y/0/00", Epoch: 2, Snapshot: snapshotNamed(t, "y/0/00", 2, nil)}, "shard"},
		{"import epoch 0", &messages.ImportShard{Shard: "y/0/0", Epoch: 0, Snapshot: snapshotNamed(t, "y/0/0", 0, nil)}, "epoch"},
		{"import epoch -1", &messages.ImportShard{Shard: "y/0/0", Epoch: -1, Snapshot: snapshotNamed(t, "y/0/0", -1, nil)}, "epoch"},
		{"import epoch past the limit", &messages.ImportShard{Shard: "y/0/0", Epoch: nscore.MaxEpoch + 1, Snapshot: snapshotNamed(t, "y/0/0", nscore.MaxEpoch+1, nil)}, "epoch"},
		{"import fire window -5", &messages.ImportShard{Shard: "y/0/0", Epoch: 2, Snapshot: snapshotNamed(t, "y/0/0", 2, fireWindow(-5))}, "snapshot"},
		{"import fire window MaxInt64", &messages.ImportShard{Shard: "y/0/0", Epoch: 2, Snapshot: snapshotNamed(t, "y/0/0", 2, fireWindow(math.MaxInt64))}, "snapshot"},
	} {
		if e := ask(tc.m); e.GetCode() != messages.Code_INVALID_ARGUMENT || e.GetField() != tc.field {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on %s", tc.name, e, tc.field)
		}
	}
	// No reply to these.
	for _, m := range []proto.Message{
		&messages.MoveShard{Shard: "app/0/0", Epoch: 1, Target: &messages.Ref{}},
		&messages.MoveShard{Shard: "app/0/0", Epoch: 1, Target: &messages.Ref{Address: "b:1", Id: "kjob\x00server"}},
		&messages.MoveShard{Shard: "app/0/0", Epoch: 1, Split: true},
	} {
		sys.Root.Send(pid, m)
	}
	table := func(f func(t *messages.RouteTable)) *messages.RouteTable {
		tb := proto.Clone(good).(*messages.RouteTable)
		tb.Version = 11
		f(tb)
		return tb
	}
	for _, m := range []*messages.RouteTable{
		table(func(t *messages.RouteTable) { t.Routes = append(t.Routes, nil) }),
		table(func(t *messages.RouteTable) { t.Routes[0].Owner = nil }),
		table(func(t *messages.RouteTable) { t.Routes[0].App = "other" }),
		table(func(t *messages.RouteTable) { t.Routes[0].Shard = "app/00/0" }),
		table(func(t *messages.RouteTable) { t.Routes[0].Epoch = -1 }),
		table(func(t *messages.RouteTable) { t.Apps = append(t.Apps, nil) }),
		table(func(t *messages.RouteTable) { t.Apps[0].App = "a b" }),
		table(func(t *messages.RouteTable) { t.Apps[0].Workers = append(t.Apps[0].Workers, nil) }),
		table(func(t *messages.RouteTable) { t.Apps[0].Workers[0].Ref = nil }),
	} {
		sys.Root.Send(pid, m)
	}
	if r, err := sys.Root.RequestFuture(pid, &messages.Ping{}, 3*time.Second).Result(); err != nil { // after all of them, in order
		t.Fatalf("ping: %v %v", r, err)
	}
	if tb := a.Table(); !proto.Equal(tb, good) {
		t.Errorf("table after the refused ones: %v, want the good one", tb)
	}
	time.Sleep(100 * time.Millisecond) // a refused move would have journaled its handoff by now
	for _, rt := range []messages.RecordType{messages.RecordType_SHARD_OPENED, messages.RecordType_SHARD_IMPORTED, messages.RecordType_SHARD_HANDOFF} {
		want := 0
		if rt == messages.RecordType_SHARD_OPENED {
			want = 1 // app/0/0's
		}
		if n := j.count(rt); n != want {
			t.Errorf("%d %v records, want %d", n, rt, want)
		}
	}
	hb := heartbeat(t, sys, pid, nsIn)
	if e := nscore.Check(hb); e != nil {
		t.Errorf("the NameServer refuses the server's heartbeat: %v", e)
	}
	if len(hb.Shards) != 1 || hb.Shards[0].Shard != "app/0/0" || hb.Shards[0].Frozen || len(hb.Opening) != 0 {
		t.Errorf("heartbeat shards %v opening %v, want app/0/0 (not frozen) only", hb.Shards, hb.Opening)
	}

	// Good imports are taken: one at the deepest level, one with a fire window.
	for _, m := range []*messages.ImportShard{
		{Shard: "deep/20/1048575", Epoch: 2, Snapshot: snapshotNamed(t, "deep/20/1048575", 2, nil)},
		{Shard: "busy/0/0", Epoch: 7, Snapshot: snapshotNamed(t, "busy/0/0", 7, fireWindow(1000))},
	} {
		if e := ask(m); e != nil {
			t.Errorf("good import of %s: %v", m.Shard, e)
		}
	}
	if hb := heartbeat(t, sys, pid, nsIn); len(hb.Shards) != 3 || nscore.Check(hb) != nil {
		t.Errorf("heartbeat after good imports: %d shards, check %v", len(hb.Shards), nscore.Check(hb))
	}
}

// TestHeartbeatIsOneTheNameServerTakes: a journal error that is not UTF-8 (a
// path) or is longer than the NameServer takes, and hearsay past MaxRoutes, are
// made to fit, not sent as they are (the NameServer would refuse every heartbeat
// of the server, which would go unheard until a restart).
func TestHeartbeatIsOneTheNameServerTakes(t *testing.T) {
	j := &heldJournal{failed: errors.New("sync /data/\xff\xfe/journal: " + strings.Repeat("é", nscore.MaxJournalErrorLen))}
	sys, pid, nsIn, _, _ := startServerNS(t, j)
	hb := heartbeat(t, sys, pid, nsIn)
	if e := nscore.Check(hb); e != nil {
		t.Fatalf("the NameServer refuses the heartbeat: %v", e)
	}
	if !strings.HasPrefix(hb.JournalError, "sync /data/") || !strings.HasSuffix(hb.JournalError, "...") || !utf8.ValidString(hb.JournalError) {
		t.Errorf("journal error %.60q...", hb.JournalError)
	}

	r := &messages.RouteEntry{Shard: "a/0/0", App: "a", Owner: &messages.Ref{Address: "a:1", Id: "x"}, Epoch: 1}
	tb := &messages.RouteTable{Routes: make([]*messages.RouteEntry, nscore.MaxRoutes+5)}
	for i := range tb.Routes {
		tb.Routes[i] = r
	}
	if got := knownRoutes(tb, map[string]*messages.RouteEntry{}); len(got) != nscore.MaxRoutes {
		t.Errorf("%d routes of hearsay, want the NameServer's limit %d", len(got), nscore.MaxRoutes)
	}
}

// The shard's own handoff snapshot of a legit shard is taken (the checks refuse
// no legitimate import).
func TestLegitImportPasses(t *testing.T) {
	j := &heldJournal{}
	sys, pid, _ := startServer(t, j)
	stop := make(chan struct{})
	defer close(stop)
	go releaseWhileWaiting(j, stop)
	sh, _ := route.Parse("orders/3/5")
	snap := shardcore.New(shardcore.Config{Shard: sh}, time.Now().UnixMilli(), 4).HandoffSnapshot() // epoch 5
	r, err := sys.Root.RequestFuture(actor.NewPID(pid.Address, pid.Id), &messages.ImportShard{Shard: "orders/3/5", Epoch: 5, Snapshot: snap}, 3*time.Second).Result()
	if err != nil || r.(*messages.ImportShardReply).Error != nil {
		t.Fatalf("legit import: %v %v", r, err)
	}
}
