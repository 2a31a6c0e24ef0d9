package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/messages"
)

// TestSplitCrash kills a server at each step of splitting one of its shards into
// its two halves (a split is a handoff whose target is the shard's own server: the
// same crash points, source and target side in one process), and restarts it on
// its data directory. Once the SHARD_HANDOFF record is durable the split must
// finish after the restart: each job is then served by exactly one half, at epoch
// 2, and never again by the parent, in fact (direct reads) and in the NameServer's
// picture; the parent never answers as owner of a job once its half has; every
// acknowledged job is still there; every due one fired exactly once, none early;
// jobs created after recovery fire too.
func TestSplitCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kjob and runs 2 processes per crash point")
	}
	bin := buildKjob(t)
	probe := newProbe(t)
	var wg sync.WaitGroup
	for _, point := range server.CrashPoints() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(point, func(t *testing.T) { splitCrashScenario(t, bin, probe, point) })
		}()
	}
	wg.Wait()
}

func splitCrashScenario(t *testing.T, bin string, p *probe, point string) {
	const app = "splits"
	began := time.Now()
	at := func() string { return fmt.Sprintf("t+%.1fs", time.Since(began).Seconds()) }
	parent := route.Root(app)
	lo, hi := parent.Children()
	addr := freePorts(t, 1)[0]
	srv := &crashProc{addr: addr, data: filepath.Join(t.TempDir(), "data")}
	srv.start(t, bin, []string{addr}, point)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Log(srv.logText())
		t.Fatalf(format, args...)
	}
	w := startWorker(t, bin, app, []string{addr})
	c := newTestClient(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var mu sync.Mutex
	acked := map[int64]string{} // job id → kind: "due", "far", "rate", "stream", "after"
	create := func(kind string, s *messages.Schedule) (int64, error) {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		j, err := c.Create(cctx, &messages.Job{App: app, Handler: "echo", Schedule: s})
		if err != nil {
			return 0, err
		}
		mu.Lock()
		acked[j.Id] = kind
		mu.Unlock()
		return j.Id, nil
	}
	once := func(delayMs int64) *messages.Schedule {
		return &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: delayMs}
	}

	// Phase 1: far jobs (one in each half at least: they must survive and never
	// fire), jobs due over the next seconds, a fixed-rate job.
	far := map[route.Shard]int64{} // a far job of each half
	for i := 0; i < crashFarJobs || len(far) < 2; i++ {
		if i > 200 {
			fail("200 far jobs and still not one in each half")
		}
		id, err := create("far", once(3_600_000+int64(i)))
		if err != nil {
			fail("create a far job: %v", err)
		}
		for _, h := range []route.Shard{lo, hi} {
			if h.ContainsJob(id) && far[h] == 0 {
				far[h] = id
			}
		}
	}
	for i := 0; i < crashDueJobs; i++ {
		if _, err := create("due", once(int64(800+i*400))); err != nil {
			fail("create a due job: %v", err)
		}
	}
	if _, err := create("rate", &messages.Schedule{Kind: messages.ScheduleKind_FIXED_RATE, EveryMs: crashRatePeriodMs}); err != nil {
		fail("create the fixed-rate job: %v", err)
	}
	waitUntil(t, 15*time.Second, "the NameServer to report the shard's owner", func() bool { return ownerOf(t, c, app) == addr })

	// A steady stream of creates through the split, the crash and the recovery.
	streamCtx, stopStream := context.WithCancel(ctx)
	var streamWG sync.WaitGroup
	var streamErrs []string
	streamWG.Add(1)
	go func() {
		defer streamWG.Done()
		for i := 0; i < crashMaxStreamJobs && streamCtx.Err() == nil; i++ {
			if _, err := create("stream", once(int64(300+(i%10)*200))); err != nil && streamCtx.Err() == nil {
				mu.Lock()
				streamErrs = append(streamErrs, err.Error())
				mu.Unlock()
			}
			select {
			case <-streamCtx.Done():
			case <-time.After(crashCreateEvery):
			}
		}
	}()
	defer func() { stopStream(); streamWG.Wait() }()
	// The parent must never answer for a job after the job's half has.
	watch := &splitWatch{halfFirst: map[route.Shard]time.Time{}}
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watchWG sync.WaitGroup
	watchWG.Add(1)
	go func() { defer watchWG.Done(); watch.run(watchCtx, p, addr, app, parent, far) }()
	defer func() { stopWatch(); watchWG.Wait() }()

	// Phase 2: the split, and the crash at point.
	time.Sleep(500 * time.Millisecond) // some stream jobs land before the split
	t.Logf("%s %s: splitting %s on %s", at(), point, parent, addr)
	p.sys.Root.Send(actor.NewPID(addr, server.Name), &messages.MoveShard{Shard: parent.String(), Target: &messages.Ref{Address: addr, Id: server.Name}, Epoch: 1, Split: true})
	select {
	case <-srv.exited:
	case <-time.After(crashReachTimeout):
		fail("%s: the server was not killed within %s: the crash point was never reached", point, crashReachTimeout)
	}
	if b, _ := os.ReadFile(srv.logs[len(srv.logs)-1]); !bytes.Contains(b, []byte("crash point "+point)) {
		fail("%s: the server exited, but not at the crash point", point)
	}
	t.Logf("%s %s: killed at the crash point; restarting it", at(), point)
	time.Sleep(300 * time.Millisecond)
	srv.start(t, bin, []string{addr}, "")

	// Phase 3: the split finished — each half serves its far job at epoch 2, the
	// parent serves none; the NameServer reports the halves active and no parent.
	settled := eventually(crashSettleTimeout, func() bool {
		for h, id := range far {
			if !p.serves(addr, h.String(), app, id) || p.serves(addr, parent.String(), app, id) {
				return false
			}
		}
		st, err := c.Status(ctx)
		if err != nil || !st.Complete {
			return false
		}
		active := map[string]int64{}
		for _, s := range st.Servers {
			for _, sh := range s.Shards {
				if !sh.Frozen && sh.Shard != "" && (sh.Shard == parent.String() || sh.Shard == lo.String() || sh.Shard == hi.String()) {
					active[sh.Shard] = sh.Epoch
				}
			}
		}
		return len(active) == 2 && active[lo.String()] == 2 && active[hi.String()] == 2
	})
	if !settled {
		st, err := c.Status(ctx)
		fail("%s: the split did not finish within %s (halves %s and %s active at epoch 2, the parent gone): status %v (%v)",
			point, crashSettleTimeout, lo, hi, st, err)
	}
	t.Logf("%s %s: split done: %s and %s at epoch 2", at(), point, lo, hi)
	time.Sleep(time.Second) // the stream keeps creating against the halves for a while
	stopStream()
	streamWG.Wait()

	// Phase 4: jobs created after recovery work.
	for i := 0; i < crashAfterJobs; i++ {
		if _, err := create("after", once(int64(200+i*100))); err != nil {
			fail("create after recovery: %v", err)
		}
	}
	mu.Lock()
	jobs := make(map[int64]string, len(acked))
	for id, k := range acked {
		jobs[id] = k
	}
	errs := append([]string(nil), streamErrs...)
	mu.Unlock()
	if len(errs) > 0 {
		t.Logf("%s: %d stream creates failed (not acknowledged, so not checked): %s", point, len(errs), errs[0])
	}

	// Phase 5: every due job fires; every acknowledged job is still there, in its half.
	due := func() []int64 {
		var out []int64
		for id, k := range jobs {
			if k != "far" && k != "rate" && w.count(id) == 0 {
				out = append(out, id)
			}
		}
		return out
	}
	if !eventually(crashFireTimeout, func() bool { return len(due()) == 0 }) {
		m := due()
		fail("%s: %d acknowledged due jobs never fired, e.g. %d", point, len(m), m[0])
	}
	t.Logf("%s %s: all %d acknowledged due jobs fired", at(), point, len(jobs))
	time.Sleep(crashStragglerGrace)
	stopWatch()
	watchWG.Wait()
	checkJobsKept(ctx, c, app, jobs, point, fail)

	// Phase 6: exactly once, never early, never the parent after a half.
	checkRunsOnce(t, w, jobs, point)
	watch.mu.Lock()
	if len(watch.staleLate) > 0 {
		t.Errorf("%s: the parent served a job after its half had: %v", point, watch.staleLate)
	}
	watch.mu.Unlock()
	if t.Failed() {
		t.Log(srv.logText())
	}
}

// splitWatch reads each half's far job from the parent and from the half over and
// over, and records the parent answering as owner on a read sent after the half had
// answered: a stale owner serving.
type splitWatch struct {
	mu        sync.Mutex
	halfFirst map[route.Shard]time.Time // when each half first answered as owner
	staleLate []string
}

func (w *splitWatch) run(ctx context.Context, p *probe, addr, app string, parent route.Shard, far map[route.Shard]int64) {
	tick := time.NewTicker(crashProbeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for h, id := range far {
			sent := time.Now()
			if p.serves(addr, parent.String(), app, id) {
				w.mu.Lock()
				if f, ok := w.halfFirst[h]; ok && f.Before(sent) {
					w.staleLate = append(w.staleLate, fmt.Sprintf("job %d at %s (after %s since %s)", id, sent.Format("15:04:05.000"), h, f.Format("15:04:05.000")))
				}
				w.mu.Unlock()
			}
			if p.serves(addr, h.String(), app, id) {
				w.mu.Lock()
				if _, ok := w.halfFirst[h]; !ok {
					w.halfFirst[h] = time.Now()
				}
				w.mu.Unlock()
			}
		}
	}
}
