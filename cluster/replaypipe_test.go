package cluster

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
	"github.com/kjob/kjob/persistence"
)

// The replay pipe applies every record once, in order, with its payload as it was
// read, although it reuses the memory of the batches applied before; a batch with
// an imported shard's snapshot, which the shard may keep, is never reused.
func TestReplayPipeReusesBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 200*replayBatchRecords + 17
	want := make([][]byte, n+1)
	var kept []persistence.Record // imported snapshots, checked after the replay
	next := uint64(1)
	pipe := newReplayPipe(func(r persistence.Record, _ *shardcore.Decoded) error {
		if r.LSN != next {
			return fmt.Errorf("applied lsn %d, want %d", r.LSN, next)
		}
		next++
		if !bytes.Equal(r.Payload, want[r.LSN]) {
			return fmt.Errorf("lsn %d: payload %x, want %x", r.LSN, r.Payload, want[r.LSN])
		}
		if messages.RecordType(r.Type) == messages.RecordType_SHARD_IMPORTED {
			kept = append(kept, r)
			println("kept", r.LSN, &r.Payload[0])
		}
		return nil
	})
	mapping := make([]byte, replayArenaBytes) // the journal's, valid only during add
	for lsn := uint64(1); lsn <= n; lsn++ {
		size := 1 + rng.IntN(200) // a batch's fit its arena...
		if lsn == 3 || lsn == n-3 {
			size = replayArenaBytes + 5 // ...but for two larger than an arena
		}
		p := make([]byte, size)
		for i := range p {
			p[i] = byte(rng.IntN(256))
		}
		want[lsn] = p
		typ := messages.RecordType_JOB_DELETED // a payload that is not a valid message: an error for the applier only
		if lsn%2500 == 0 {
			typ = messages.RecordType_SHARD_IMPORTED
		}
		if len(mapping) < size {
			mapping = make([]byte, size)
		}
		r := persistence.Record{LSN: lsn, Stream: 1, Type: uint8(typ), Payload: mapping[:size]}
		copy(r.Payload, p)
		if err := pipe.add(r); err != nil {
			t.Fatal(err)
		}
		clear(mapping) // the mapping's bytes change once add returns
	}
	if err := pipe.close(); err != nil {
		t.Fatal(err)
	}
	if next != n+1 {
		t.Fatalf("applied %d records, want %d", next-1, n)
	}
	if len(kept) != n/2500 {
		t.Fatalf("%d imported snapshots applied, want %d", len(kept), n/2500)
	}
	for _, r := range kept {
		if !bytes.Equal(r.Payload, want[r.LSN]) {
			t.Fatalf("imported snapshot at lsn %d changed after it was applied", r.LSN)
		}
	}
}
