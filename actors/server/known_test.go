package server

import (
	"testing"

	"github.com/kjob/kjob/messages"
)

// A shard handed off from here is reported as hearsay (where it went) until the
// route table catches up, so a fresh NameServer never takes it for a new app.
func TestKnownRoutesCarryHandoffs(t *testing.T) {
	handed := map[string]*messages.RouteEntry{
		"a/0/0": {Shard: "a/0/0", App: "a", Epoch: 2},
		"b/0/0": {Shard: "b/0/0", App: "b", Epoch: 3},
	}
	tbl := &messages.RouteTable{Routes: []*messages.RouteEntry{{Shard: "a/0/0", App: "a", Epoch: 1}, {Shard: "b/0/0", App: "b", Epoch: 3}}}
	got := knownRoutes(tbl, handed)
	if len(got) != 2 || got[0].Epoch != 2 || got[1].Epoch != 3 {
		t.Fatalf("known %v", got)
	}
	if handed["b/0/0"] != nil || handed["a/0/0"] == nil {
		t.Fatalf("hearsay kept %v: want a (newer than the table) only", handed)
	}
	if got := knownRoutes(nil, handed); len(got) != 1 || got[0].Shard != "a/0/0" {
		t.Fatalf("no table: %v", got)
	}
}
