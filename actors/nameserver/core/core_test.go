package core

import (
	"strings"
	"testing"

	"github.com/kjob/kjob/messages"
)

type sendLog struct{ sent []any }

func (s *sendLog) Send(_ *messages.Ref, m any) { s.sent = append(s.sent, m) }

func (s *sendLog) assigns() int {
	n := 0
	for _, m := range s.sent {
		if _, ok := m.(*messages.AssignShard); ok {
			n++
		}
	}
	return n
}

func hb(addr string, shards ...*messages.ShardLoad) *messages.ServerHeartbeat {
	return &messages.ServerHeartbeat{ServerId: addr + "-id", Address: addr,
		Server: &messages.Ref{Address: addr, Id: "kjob-server"}, Shards: shards}
}

// A new app is placed only while every configured server reports: the app may live
// on the one that does not (its owner is down; the NameServer's state is soft).
func TestNewAppWaitsForEveryMember(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetMembers([]string{"a:1", "b:1"})
	c.ServerHeartbeat(100, hb("a:1"), env)
	now := int64(WarmupMs + 1)
	t1 := c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	if t1.Error.GetCode() != messages.Code_UNAVAILABLE || !strings.Contains(t1.Error.GetMessage(), "b:1") || env.assigns() != 0 {
		t.Fatalf("placed with b:1 silent: %v, %d assigns", t1.Error, env.assigns())
	}
	c.ServerHeartbeat(now, hb("b:1"), env)
	c.GetRoutes(now, &messages.GetRoutes{App: "new", Ensure: true}, nil, env)
	if env.assigns() != 1 {
		t.Fatalf("every member reports: %d assigns, want 1", env.assigns())
	}
}

// A shard that is being handed off is reported frozen; a fresh NameServer must take
// it as existing (route to it) rather than place the app again.
func TestFrozenShardIsNotPlacedAgain(t *testing.T) {
	env := &sendLog{}
	c := New(0, nil)
	c.SetMembers([]string{"a:1"})
	c.ServerHeartbeat(100, hb("a:1", &messages.ShardLoad{Shard: "app/0/0", Epoch: 3, Frozen: true,
		Pid: &messages.Ref{Address: "a:1", Id: "shard-app/0/0"}}), env)
	tb := c.GetRoutes(WarmupMs+1, &messages.GetRoutes{App: "app", Ensure: true}, nil, env)
	if env.assigns() != 0 || len(tb.Routes) != 1 || tb.Routes[0].Epoch != 3 {
		t.Fatalf("frozen shard: %d assigns, routes %v", env.assigns(), tb.Routes)
	}
}
