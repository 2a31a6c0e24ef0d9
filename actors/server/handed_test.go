package server

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/shard"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
)

func TestHandedOnFile(t *testing.T) {
	f := HandedOnFile(filepath.Join(t.TempDir(), "handed-on.json"))
	m, err := f.Load()
	if err != nil || len(m) != 0 {
		t.Fatalf("load of no file: %v %v, want an empty map", m, err)
	}
	if err := f.Save(map[string]int64{"a/0/0": 3, "b/1/1": 2}); err != nil {
		t.Fatal(err)
	}
	m, err = f.Load()
	if err != nil || len(m) != 2 || m["a/0/0"] != 3 || m["b/1/1"] != 2 {
		t.Fatalf("load after save: %v %v", m, err)
	}
	if _, err := os.Stat(string(f) + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("the temporary file is left: %v", err)
	}
	if err := os.WriteFile(string(f), []byte(`{"a/0/0": 3`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Load(); err == nil || !strings.Contains(err.Error(), string(f)) {
		t.Fatalf("load of a torn file: %v, want an error naming it", err)
	}
}

// TestHandedOnSurvivesRestart: a server that handed a shard on at epoch 3 and
// restarted (its stream dropped, no route table yet: a fresh NameServer) does not
// take the epoch-3 import a returning source resends: the store remembers it.
func TestHandedOnSurvivesRestart(t *testing.T) {
	store := HandedOnFile(filepath.Join(t.TempDir(), "handed-on.json"))
	sh, _ := route.Parse("app/0/0")
	snap2 := shardcore.New(shardcore.Config{Shard: sh}, time.Now().UnixMilli(), 1).HandoffSnapshot() // epoch 2
	snap3 := shardcore.New(shardcore.Config{Shard: sh}, time.Now().UnixMilli(), 2).HandoffSnapshot() // epoch 3
	start := func() (*actor.ActorSystem, *actor.PID, *heldJournal) {
		j := &heldJournal{}
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet })))
		t.Cleanup(sys.Shutdown)
		ns, _ := inbox(sys)
		a := New(Deps{ServerID: "s1", Journal: j, Log: quiet, HandedOn: store,
			NameServer: func() *actor.PID { return ns },
			NewCore: func(s route.Shard, epoch int64) *shardcore.Core {
				return shardcore.New(shardcore.Config{Shard: s}, time.Now().UnixMilli(), epoch)
			}}, nil)
		pid, err := sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return a }), Name)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		t.Cleanup(func() { close(stop) })
		go releaseWhileWaiting(j, stop)
		return sys, pid, j
	}
	ask := func(sys *actor.ActorSystem, pid *actor.PID, m *messages.ImportShard) *messages.ImportShardReply {
		t.Helper()
		r, err := sys.Root.RequestFuture(pid, m, 3*time.Second).Result()
		if err != nil {
			t.Fatalf("import %s@%d: %v", m.Shard, m.Epoch, err)
		}
		return r.(*messages.ImportShardReply)
	}
	sys, pid, _ := start()
	if r := ask(sys, pid, &messages.ImportShard{Shard: "app/0/0", Epoch: 2, Snapshot: snap2}); r.Error != nil {
		t.Fatalf("first import: %v", r)
	}
	sys.Root.Send(pid, &shard.HandedOff{Shard: "app/0/0"}) // handed on at epoch 3
	waitUntilSaved := time.Now().Add(3 * time.Second)
	for {
		if m, _ := store.Load(); m["app/0/0"] == 3 {
			break
		}
		if time.Now().After(waitUntilSaved) {
			m, err := store.Load()
			t.Fatalf("handed on at epoch 3, the store holds %v (%v)", m, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The restart: a new server (in an actor system of its own) on the same store, an empty journal and no routes.
	sys, pid, j := start()
	r := ask(sys, pid, &messages.ImportShard{Shard: "app/0/0", Epoch: 2, Snapshot: snap2})
	if r.Error != nil || r.Shard.GetEpoch() != 3 {
		t.Fatalf("late epoch-2 import after a restart: %v, want success naming epoch 3", r)
	}
	if n := j.count(messages.RecordType_SHARD_IMPORTED); n != 0 {
		t.Fatalf("%d SHARD_IMPORTED records after the restart, want 0: the late import must not import", n)
	}
	// A later epoch is a shard coming back for real.
	if r := ask(sys, pid, &messages.ImportShard{Shard: "app/0/0", Epoch: 3, Snapshot: snap3}); r.Error == nil && r.Shard.GetPid() != nil {
		// epoch 3 itself was handed on from here (to 3): still stale.
		t.Fatalf("import at the epoch handed on: %v, want it answered without importing", r)
	}
	snap4 := shardcore.New(shardcore.Config{Shard: sh}, time.Now().UnixMilli(), 3).HandoffSnapshot()
	if r := ask(sys, pid, &messages.ImportShard{Shard: "app/0/0", Epoch: 4, Snapshot: snap4}); r.Error != nil || r.Shard.GetEpoch() != 4 || r.Shard.GetPid() == nil {
		t.Fatalf("import at epoch 4 (the shard comes back): %v, want it imported", r)
	}
	if n := j.count(messages.RecordType_SHARD_IMPORTED); n != 1 {
		t.Fatalf("%d SHARD_IMPORTED records, want 1 (epoch 4)", n)
	}
}

// TestNextIncarnation: each start counts one more, durably; a corrupt count is an
// error that names the file.
func TestNextIncarnation(t *testing.T) {
	dir := t.TempDir()
	for want := int64(1); want <= 3; want++ {
		n, err := NextIncarnation(dir)
		if err != nil || n != want {
			t.Fatalf("start %d: incarnation %d, %v", want, n, err)
		}
	}
	path := filepath.Join(dir, "incarnation")
	if err := os.WriteFile(path, []byte("x1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := NextIncarnation(dir); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("corrupt count: %v, want an error naming %s", err, path)
	}
}
