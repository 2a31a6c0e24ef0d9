package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// TestClientIgnoresRoutesItCannotUse: a route table (a server's answer to a pull)
// whose entries the client cannot route by — no owner (one took the client down
// with a nil pointer in Get, List and the dead-letter calls), an owner with no
// address, another app's, a level or index no shard has — is not taken: the client
// routes by the good entries beside them, over a real remote, and with none left
// says the app has no shard yet (and goes on asking) instead of panicking.
func TestClientIgnoresRoutesItCannotUse(t *testing.T) {
	sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return obsQuiet() })))
	rem := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
	rem.Start()
	defer rem.Shutdown(false)

	var table atomic.Pointer[messages.RouteTable]
	if _, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		switch ctx.Message().(type) {
		case *messages.LeaseNode:
			ctx.Respond(&messages.LeaseNodeReply{Node: 7, TtlMs: 3000})
		case *messages.GetRoutes:
			ctx.Respond(table.Load())
		}
	}), server.Name); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int64
	good, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		switch ctx.Message().(type) {
		case *messages.GetJob:
			asked.Add(1)
			ctx.Respond(&messages.JobReply{Error: kerr.New(messages.Code_NOT_FOUND, "id", "no such job")})
		case *messages.ListJobs:
			asked.Add(1)
			ctx.Respond(&messages.ListJobsReply{})
		case *messages.ListDeadLetters:
			asked.Add(1)
			ctx.Respond(&messages.DeadLettersReply{})
		}
	}), "shard-orders")
	if err != nil {
		t.Fatal(err)
	}
	goodRef := &messages.Ref{Address: good.Address, Id: good.Id}
	root := &messages.RouteEntry{Shard: "orders/0/0", App: "orders", Owner: goodRef, ServerId: "s1", Epoch: 1}
	table.Store(&messages.RouteTable{Version: 1, Complete: true, Routes: []*messages.RouteEntry{root}})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{sys.Address()}, Log: obsQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const id = 12345
	half := route.Hash(id) >> 63 // the level-1 shard holding the job
	deep := func(f func(r *messages.RouteEntry)) *messages.RouteEntry {
		r := &messages.RouteEntry{Shard: fmt.Sprintf("orders/1/%d", half), App: "orders", Level: 1, Index: int64(half),
			Owner: &messages.Ref{Address: "127.0.0.1:1", Id: "shard-orders/1"}, ServerId: "s2", Epoch: 2}
		f(r)
		return r
	}
	noPanic := func(t *testing.T, what string, f func() error) (err error) {
		t.Helper()
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("%s panicked: %v", what, p)
			}
		}()
		return f()
	}
	for _, tc := range []struct {
		name string
		bad  *messages.RouteEntry
	}{
		{"no owner", deep(func(r *messages.RouteEntry) { r.Owner = nil })},
		{"owner without an address", deep(func(r *messages.RouteEntry) { r.Owner.Address = "" })},
		{"owner without an id", deep(func(r *messages.RouteEntry) { r.Owner.Id = "" })},
		{"another app", deep(func(r *messages.RouteEntry) { r.App = "billing" })},
		{"level -1", deep(func(r *messages.RouteEntry) { r.Level, r.Index = -1, 0 })},
		{"level past MaxLevel", deep(func(r *messages.RouteEntry) { r.Level, r.Index = 99, 0 })},
		{"index past its level", deep(func(r *messages.RouteEntry) { r.Index = 2 })},
		{"index -1", deep(func(r *messages.RouteEntry) { r.Index = -1 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table.Store(&messages.RouteTable{Version: 2, Complete: true, Routes: []*messages.RouteEntry{root, tc.bad}})
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			before := asked.Load()
			// List and DeadLetters pull the table; Get then routes by what List took.
			if err := noPanic(t, "List", func() error { _, _, err := c.List(ctx, "orders", cluster.ListOptions{}); return err }); err != nil {
				t.Errorf("List: %v", err)
			}
			if err := noPanic(t, "DeadLetters", func() error { _, _, err := c.DeadLetters(ctx, "orders", "", 10); return err }); err != nil {
				t.Errorf("DeadLetters: %v", err)
			}
			err := noPanic(t, "Get", func() error { _, err := c.Get(ctx, "orders", id); return err })
			var ke *kerr.Error
			if !errors.As(err, &ke) || ke.Code != messages.Code_NOT_FOUND {
				t.Errorf("Get: %v, want NOT_FOUND from the root shard", err)
			}
			if n := asked.Load() - before; n != 3 {
				t.Errorf("the root shard was asked %d times, want 3 (the bad entry is not routed to)", n)
			}
		})
	}

	// Nothing usable: the app's shards cannot be reached yet (UNAVAILABLE; a call
	// retries until its deadline). A fresh client, with no route of the app cached.
	table.Store(&messages.RouteTable{Version: 3, Complete: true, Routes: []*messages.RouteEntry{deep(func(r *messages.RouteEntry) { r.Owner = nil })}})
	c2, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{sys.Address()}, Log: obsQuiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := noPanic(t, "List", func() error { _, _, err := c2.List(ctx, "orders", cluster.ListOptions{}); return err }); !errors.Is(err, kerr.ErrUnavailable) {
		t.Errorf("List with no usable route: %v, want UNAVAILABLE", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	if err := noPanic(t, "Get", func() error { _, err := c2.Get(short, "orders", id); return err }); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, kerr.ErrUnavailable) {
		t.Errorf("Get with no usable route: %v, want the deadline after UNAVAILABLE", err)
	}
}
