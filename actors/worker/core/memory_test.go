package core

import (
	"bytes"
	"hash/maphash"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/messages"
)

// fullResult is a result with every field set, its error text n bytes long.
func fullResult(run string, attempt int32, n int) *messages.RunResult {
	return &messages.RunResult{RunId: run, JobId: 42, Shard: "app/0/0", Epoch: 1, Attempt: attempt, DueMs: 1000,
		Outcome: messages.Outcome_FAILED, Error: strings.Repeat("é", n/2) + strings.Repeat("x", n%2),
		StartMs: 1001, EndMs: 1002, WorkerId: "w-1", Worker: &messages.Ref{Address: "w:1", Id: "worker"}}
}

func encode(t testing.TB, r *messages.RunResult) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkResend requires a Resend of run/attempt (asked by a dispatch at epoch 1, as
// the run was dispatched) whose result is want's byte for byte, but for Duplicate.
func checkResend(t *testing.T, c *Core, want *messages.RunResult) {
	t.Helper()
	a, r := c.Dispatch(disp(want.RunId, want.Attempt, 1, "s"))
	if a != Resend || !r.Duplicate {
		t.Fatalf("dispatch of %s/%d remembered: %v %v, want a Resend", want.RunId, want.Attempt, a, r)
	}
	r.Duplicate = false
	if got, w := encode(t, r), encode(t, want); !bytes.Equal(got, w) {
		t.Fatalf("%s/%d resent as %v, want %v", want.RunId, want.Attempt, r, want)
	}
}

// A remembered result is resent as it was reported, byte for byte, whatever its
// size (a chunk of its own above arenaChunkMax), acknowledged or not, and after
// the oldest chunks were freed.
func TestRememberedResultResentByteIdentical(t *testing.T) {
	c := New(1)
	want := map[string]*messages.RunResult{}
	n := RememberRuns + RememberRuns/2
	for i := 0; i < n; i++ {
		id := "run-" + strconv.Itoa(i)
		size := i * 37 % 301
		if i%9973 == 0 {
			size = 3 * arenaChunkMax / 2
		}
		r := fullResult(id, int32(1+i%3), size)
		if i >= n-RememberRuns {
			want[id] = proto.Clone(r).(*messages.RunResult)
		}
		c.Dispatch(disp(id, r.Attempt, 1, "s"))
		c.Finished(int64(i), r)
		if i%2 == 0 {
			c.Acked(id)
		}
	}
	for i := n - RememberRuns; i < n; i += 7 {
		checkResend(t, c, want["run-"+strconv.Itoa(i)])
	}
	for i := 0; i < n-RememberRuns; i += 101 {
		if a, _ := c.Dispatch(disp("run-"+strconv.Itoa(i), int32(1+i%3), 1, "s")); a != Start {
			t.Fatalf("forgotten run %d: %v, want Start", i, a)
		}
		c.Finished(0, &messages.RunResult{}) // (unknown: frees the slot)
	}
	// The resend tick sends the same bytes, at the epoch and shard of the owner.
	rs, _ := c.Unacked(10 * int64(n))
	if len(rs) != RememberRuns/2 {
		t.Fatalf("resent %d results, want %d", len(rs), RememberRuns/2)
	}
	for _, r := range rs {
		if got, w := encode(t, r), encode(t, want[r.RunId]); !bytes.Equal(got, w) {
			t.Fatalf("resend tick sent %v, want %v", r, want[r.RunId])
		}
	}
	// The arena holds what is remembered, not what ever finished.
	arena := 0
	for _, ch := range c.chunks {
		arena += cap(ch.buf)
	}
	if live := RememberRuns * (proto.Size(fullResult("run-99999", 1, 300)) + 2); arena > live+4*arenaChunkMax {
		t.Fatalf("arena of %d bytes for %d remembered results of at most %d", arena, RememberRuns, live)
	}
}

// A hash collision is a longer walk, never another run's answer: with every run id
// hashing alike (or into a few buckets) a new run still starts, a remembered run
// gets its own result, an ack stops only its run, and forgetting keeps the others.
func TestCollisionsNeverMakeANewRunADuplicate(t *testing.T) {
	seed := maphash.MakeSeed()
	for _, tc := range []struct {
		name string
		hash func(string) uint64
		runs int
	}{
		{"all alike", func(string) uint64 { return 7 }, 300},
		{"4096 buckets", func(s string) uint64 { return maphash.String(seed, s) & 4095 }, RememberRuns + 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(4, tc.hash)
			for i := 0; i < tc.runs; i++ {
				id := strconv.Itoa(i)
				for attempt := int32(1); attempt <= 2; attempt++ {
					if a, _ := c.Dispatch(disp(id, attempt, 1, "s")); a != Start {
						t.Fatalf("new run %s/%d: %v, want Start", id, attempt, a)
					}
					c.Finished(int64(i), fullResult(id, attempt, i%50))
				}
				if i%3 != 0 {
					c.Acked(id)
				}
			}
			first := max(0, tc.runs-RememberRuns/2) // both attempts remembered from here
			if want := (tc.runs - first + 2) / 3; c.Unacknowledged() != want {
				t.Fatalf("%d runs unacknowledged, want %d", c.Unacknowledged(), want)
			}
			for i := first; i < tc.runs; i += 1 + i%17 {
				for attempt := int32(1); attempt <= 2; attempt++ {
					checkResend(t, c, fullResult(strconv.Itoa(i), attempt, i%50))
				}
			}
			if first > 0 {
				if a, _ := c.Dispatch(disp(strconv.Itoa(first-1), 1, 1, "s")); a != Start {
					t.Fatalf("a forgotten run: %v, want Start", a)
				}
			}
			// An unknown run id hashing alike acks nothing.
			before := c.Unacknowledged()
			c.Acked("not-a-run")
			if c.Unacknowledged() != before {
				t.Fatalf("an unknown run's ack took %d runs", before-c.Unacknowledged())
			}
			rs, _ := c.Unacked(int64(tc.runs) + ResultResendMs)
			for _, r := range rs {
				if i, _ := strconv.Atoi(r.RunId); i%3 != 0 || i < first {
					t.Fatalf("resent %s, acknowledged or forgotten", r.RunId)
				}
			}
			if len(rs) != 2*before {
				t.Fatalf("resent %d results, want %d", len(rs), 2*before)
			}
		})
	}
}

// The places to answer are kept once each while a remembered run answers there:
// handoffs do not grow them without bound.
func TestOwnersFreedWithTheirRuns(t *testing.T) {
	c := New(1)
	for i := 0; i < 3*RememberRuns; i++ {
		id := strconv.Itoa(i)
		epoch := int64(1 + i/1000) // a new owner every 1,000 runs
		c.Dispatch(disp(id, 1, epoch, "node-"+strconv.FormatInt(epoch%3, 10)))
		c.Finished(0, &messages.RunResult{RunId: id, Attempt: 1})
		c.Acked(id)
	}
	if want := RememberRuns/1000 + 2; len(c.ownerIndex) > want || len(c.owners)-len(c.freeOwners) != len(c.ownerIndex) {
		t.Fatalf("%d owners (%d slots, %d free), want at most %d", len(c.ownerIndex), len(c.owners), len(c.freeOwners), want)
	}
	refs := 0
	for _, o := range c.owners {
		refs += o.refs
	}
	if refs != RememberRuns {
		t.Fatalf("owners counted %d references, want %d", refs, RememberRuns)
	}
}

// A handler's error text that is not UTF-8 would not encode, here nor for the shard:
// the result is sent and remembered with the bad bytes replaced.
func TestResultNotUTF8(t *testing.T) {
	c := New(1)
	c.Dispatch(disp("r", 1, 1, "s"))
	r := fullResult("r", 1, 10)
	r.Error = "bad \xff byte"
	c.Finished(0, r)
	if _, err := proto.Marshal(r); err != nil || r.Error != "bad \uFFFD byte" {
		t.Fatalf("sent %q: %v", r.Error, err)
	}
	checkResend(t, c, r)
}
