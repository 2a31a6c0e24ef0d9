package persistence

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	crashEnvDir   = "KJOB_PERSISTENCE_CRASH_DIR"
	crashEnvCycle = "KJOB_PERSISTENCE_CRASH_CYCLE"
	// crashCycles is how many times the parent kills a child; at least 50 in
	// the normal run. KJOB_PERSISTENCE_CRASH_CYCLES raises it for soaks.
	crashCycles         = 100
	crashWriters        = 4
	crashSegmentBytes   = 256 << 10
	crashChildMaxTimeMs = 20_000 // a child that is never killed stops by itself
)

// crashPayload is self-describing: its first 12 bytes name who wrote it, and
// the rest follows from them, so any record read back can be checked.
func crashPayload(cycle, writer, seq uint32) []byte {
	r := rand.New(rand.NewPCG(uint64(cycle)<<32|uint64(writer), uint64(seq)))
	p := make([]byte, 12+r.IntN(600))
	binary.LittleEndian.PutUint32(p[0:], cycle)
	binary.LittleEndian.PutUint32(p[4:], writer)
	binary.LittleEndian.PutUint32(p[8:], seq)
	for i := 12; i < len(p); i++ {
		p[i] = byte(r.Uint32())
	}
	return p
}

func checkCrashPayload(p []byte) (cycle, writer, seq uint32, ok bool) {
	if len(p) < 12 {
		return 0, 0, 0, false
	}
	cycle, writer, seq = binary.LittleEndian.Uint32(p[0:]), binary.LittleEndian.Uint32(p[4:]), binary.LittleEndian.Uint32(p[8:])
	return cycle, writer, seq, bytes.Equal(p, crashPayload(cycle, writer, seq))
}

// TestCrashChild is the child half of TestCrashRecovery; it does nothing
// unless the parent started it. It appends from crashWriters goroutines and
// prints "lsn writer seq" for each record the moment its append is
// acknowledged, until it is killed.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashEnvDir)
	if dir == "" {
		t.Skip("run by TestCrashRecovery")
	}
	cycle, _ := strconv.Atoi(os.Getenv(crashEnvCycle))
	j, err := Open(Options{Dir: dir, SegmentSizeBytes: crashSegmentBytes})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(3)
	}
	time.AfterFunc(crashChildMaxTimeMs*time.Millisecond, func() { os.Exit(4) })
	var out sync.Mutex
	var wg sync.WaitGroup
	for w := range crashWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(cycle), uint64(w)))
			for seq := uint32(0); ; {
				// Batches of 1..4 entries, like a shard draining its mailbox.
				n := 1 + r.IntN(4)
				es := make([]Entry, n)
				for k := range es {
					es[k] = Entry{Stream: uint64(w), Type: 1, Payload: crashPayload(uint32(cycle), uint32(w), seq+uint32(k))}
				}
				last, err := j.AppendWait(context.Background(), es...)
				if err != nil {
					fmt.Fprintln(os.Stderr, "child append:", err)
					os.Exit(5)
				}
				var b []byte
				for k := range n {
					b = fmt.Appendf(b, "%d %d %d\n", last-uint64(n-1-k), w, seq+uint32(k))
				}
				out.Lock()
				os.Stdout.Write(b)
				out.Unlock()
				seq += uint32(n)
			}
		}()
	}
	wg.Wait()
}

type ack struct{ cycle, writer, seq uint32 }

// TestCrashRecovery really crashes: it runs the test binary as a child that
// appends, SIGKILLs it at a random moment, reopens the journal and checks
// that every acknowledged LSN is there with its exact payload, that LSNs are
// gap-free, and that nothing past the acknowledged records is garbage.
func TestCrashRecovery(t *testing.T) {
	if os.Getenv(crashEnvDir) != "" {
		t.Skip("child")
	}
	cycles := crashCycles
	if s := os.Getenv("KJOB_PERSISTENCE_CRASH_CYCLES"); s != "" {
		cycles, _ = strconv.Atoi(s)
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	acked := map[uint64]ack{}
	var truncations int
	var bytesTruncated int64
	for cycle := range cycles {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnvDir+"="+dir, crashEnvCycle+"="+strconv.Itoa(cycle))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill after a random number of acks, plus a random sliver of time,
		// so kills land in the middle of copies, msyncs and rollovers.
		killAfter := 1 + rng.IntN(400)
		var lines []string
		rd := bufio.NewReader(stdout)
		for len(lines) < killAfter {
			line, err := rd.ReadString('\n')
			if err != nil {
				break
			}
			lines = append(lines, line)
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
		// Whatever complete lines made it out before the kill are acks too.
		rest, _ := io.ReadAll(rd)
		for _, l := range strings.SplitAfter(string(rest), "\n") {
			if strings.HasSuffix(l, "\n") {
				lines = append(lines, l)
			}
		}
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("cycle %d: child was not killed: %v\n%s", cycle, err, stderr.String())
		}
		if len(lines) == 0 {
			t.Fatalf("cycle %d: child acknowledged nothing\n%s", cycle, stderr.String())
		}
		for _, l := range lines {
			var lsn uint64
			var w, s uint32
			if _, err := fmt.Sscanf(l, "%d %d %d\n", &lsn, &w, &s); err != nil {
				t.Fatalf("cycle %d: bad line %q", cycle, l)
			}
			if prev, dup := acked[lsn]; dup {
				t.Fatalf("cycle %d: LSN %d acknowledged twice (%v, then writer %d seq %d of this cycle)", cycle, lsn, prev, w, s)
			}
			acked[lsn] = ack{uint32(cycle), w, s}
		}

		j, err := Open(Options{Dir: dir, SegmentSizeBytes: crashSegmentBytes})
		if err != nil {
			t.Fatalf("cycle %d: reopen: %v", cycle, err)
		}
		if rep := j.Report(); rep.TruncatedBytes > 0 || rep.TruncatedAt != "" {
			truncations++
			bytesTruncated += rep.TruncatedBytes
		}
		next := uint64(1)
		err = j.Replay(nil, func(r Record) error {
			if r.LSN != next {
				return fmt.Errorf("gap: LSN %d after %d", r.LSN, next-1)
			}
			next++
			c, w, s, ok := checkCrashPayload(r.Payload)
			if !ok {
				return fmt.Errorf("LSN %d: garbage payload", r.LSN)
			}
			if a, was := acked[r.LSN]; was && a != (ack{c, w, s}) {
				return fmt.Errorf("LSN %d: acknowledged as %v, holds %v", r.LSN, a, ack{c, w, s})
			}
			return nil
		})
		if err != nil {
			t.Fatalf("cycle %d: %v", cycle, err)
		}
		for lsn := range acked {
			if lsn >= next {
				t.Fatalf("cycle %d: acknowledged LSN %d lost (journal ends at %d)", cycle, lsn, next-1)
			}
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d kill cycles, %d acknowledged records, %d recoveries truncated a tail (%d bytes)", cycles, len(acked), truncations, bytesTruncated)
}
