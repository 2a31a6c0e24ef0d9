package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// Bounds of one crash scenario (each phase fails the test when it overruns).
const (
	crashReachTimeout   = 25 * time.Second // the move starts and the hook kills its process
	crashSettleTimeout  = 45 * time.Second // after the restart: one active owner at epoch 2
	crashFireTimeout    = 40 * time.Second // every acknowledged due job has fired
	crashProbeEvery     = 100 * time.Millisecond
	crashProbeTimeout   = 700 * time.Millisecond
	crashCreateEvery    = 120 * time.Millisecond
	crashMaxStreamJobs  = 200 // jobs the background creator makes at most
	crashDueJobs        = 24
	crashFarJobs        = 8
	crashAfterJobs      = 6
	crashRatePeriodMs   = 700
	crashStragglerGrace = 1500 * time.Millisecond // after the last fire, for duplicates to show
)

// TestHandoffCrash kills the source or the target of a live shard handoff at each
// step of the protocol (server.CrashPoints: a hook in the real `kjob server`
// process, SIGKILL) and restarts it on its data directory. Each point runs in its
// own two-server cluster, all at once. After recovery, exactly one server serves
// the shard, at epoch 2 (the highest), and the NameServer reports only it; while
// the handoff ran, the old owner never answered once the new one had; every
// acknowledged job is still there; every due one fired exactly once at the worker,
// none early; jobs created after recovery fire too.
func TestHandoffCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kjob and runs 3 processes per crash point")
	}
	bin := buildKjob(t)
	probe := newProbe(t)
	// All points at once, whatever -parallel says: each scenario mostly waits (for
	// due times, warm-ups, retries), so running them together keeps the wall time
	// near one scenario's.
	var wg sync.WaitGroup
	for _, point := range append(server.CrashPoints(), crashStaleSource) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(point, func(t *testing.T) { crashScenario(t, bin, probe, point) })
		}()
	}
	wg.Wait()
}

// ---------------------------------------------------------------- processes

// crashProc is a `kjob server` process whose exit is observed (the hook kills it).
type crashProc struct {
	addr, data string
	logs       []string // one file per start
	cmd        *exec.Cmd
	exited     chan struct{}
}

func (p *crashProc) start(t *testing.T, bin string, peers []string, crashAt string) {
	t.Helper()
	logf := filepath.Join(t.TempDir(), fmt.Sprintf("server-%d.log", len(p.logs)))
	f, err := os.Create(logf)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "server", "--listen", p.addr, "--peers", strings.Join(peers, ","), "--data", p.data,
		"--log-level", "warn", "--http", "off")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, server.CrashEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if crashAt != "" {
		cmd.Env = append(cmd.Env, server.CrashEnv+"="+crashAt)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	p.logs = append(p.logs, logf)
	t.Cleanup(p.kill)
}

func (p *crashProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func (p *crashProc) logText() string {
	var b strings.Builder
	for i, l := range p.logs {
		data, _ := os.ReadFile(l)
		fmt.Fprintf(&b, "--- %s, start %d:\n%s", p.addr, i+1, data)
	}
	return b.String()
}

// ---------------------------------------------------------------- probes

// probe is an actor system of the test's own, for what no client API offers:
// asking one server's shard actor directly, and forcing a move.
type probe struct{ sys *actor.ActorSystem }

func newProbe(t *testing.T) *probe {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet })))
	r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
	r.Start()
	t.Cleanup(func() { r.Shutdown(false); sys.Shutdown() })
	return &probe{sys: sys}
}

// serves reports whether the shard actor on addr answers a read of job id as its
// owner (a frozen or closed copy answers NOT_OWNER; a dropped one is not there).
func (p *probe) serves(addr, shard, app string, id int64) bool {
	pid := actor.NewPID(addr, server.Name+"/"+server.ShardName(shard))
	r, err := p.sys.Root.RequestFuture(pid, &messages.GetJob{App: app, Id: id}, crashProbeTimeout).Result()
	if err != nil {
		return false
	}
	jr, ok := r.(*messages.JobReply)
	return ok && jr.Error == nil && jr.Job.GetId() == id
}

// move asks the owner's server actor to hand the shard to target, as the
// NameServer's balancer does.
func (p *probe) move(owner, target, shard string, epoch int64) {
	p.sys.Root.Send(actor.NewPID(owner, server.Name),
		&messages.MoveShard{Shard: shard, Target: &messages.Ref{Address: target, Id: server.Name}, Epoch: epoch})
}

// ownerWatch reads the shard on each server of its chain of owners (oldest
// first) over and over, and records an old owner answering as owner on a read sent
// after a newer one had answered: a stale owner serving.
type ownerWatch struct {
	mu        sync.Mutex
	first     map[string]time.Time // when each server first answered as owner (reply received)
	staleLate []string
}

func (w *ownerWatch) run(ctx context.Context, p *probe, owners []string, shard, app string, id int64) {
	tick := time.NewTicker(crashProbeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for i, o := range owners {
			sent := time.Now()
			if !p.serves(o, shard, app, id) {
				continue
			}
			w.mu.Lock()
			for _, newer := range owners[i+1:] {
				if f, ok := w.first[newer]; ok && f.Before(sent) {
					w.staleLate = append(w.staleLate, fmt.Sprintf("%s at %s (after %s since %s)", o, sent.Format("15:04:05.000"), newer, f.Format("15:04:05.000")))
				}
			}
			if _, ok := w.first[o]; !ok {
				w.first[o] = time.Now()
			}
			w.mu.Unlock()
		}
	}
}

// ---------------------------------------------------------------- scenario

// crashStaleSource is the scenario where the source dies at crashStaleSourcePoint
// and stays down while its target hands the shard on to a third server; when it
// returns, its frozen copy resends the old import to the second server, which must
// not take it again.
const (
	crashStaleSource      = "stale-source-returns"
	crashStaleSourcePoint = server.CrashSourceSnapshotSent
)

func crashScenario(t *testing.T, bin string, p *probe, point string) {
	const app = "handoff"
	began := time.Now()
	at := func() string { return fmt.Sprintf("t+%.1fs", time.Since(began).Seconds()) }
	shard := route.Root(app).String()
	stale := point == crashStaleSource
	sourceSide := strings.HasPrefix(point, "source-") || stale
	nServers, hook := 2, point
	if stale {
		nServers, hook = 3, "" // the hook goes to the first owner only, once it is known
	}
	addrs := freePorts(t, nServers)
	procs := map[string]*crashProc{}
	for _, a := range addrs {
		procs[a] = &crashProc{addr: a, data: filepath.Join(t.TempDir(), "data")}
		procs[a].start(t, bin, addrs, hook) // a source point fires only on the source, a target point only on the target
	}
	dump := func() {
		for _, a := range addrs {
			t.Log(procs[a].logText())
		}
	}
	fail := func(format string, args ...any) {
		t.Helper()
		dump()
		t.Fatalf(format, args...)
	}
	w := startWorker(t, bin, app, addrs)
	c := newTestClient(t, addrs)
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

	// Phase 1: jobs far out (they must survive, and never fire), jobs due over the
	// next seconds (before, during and after the move), and a fixed-rate job.
	var farID int64
	for i := 0; i < crashFarJobs; i++ {
		id, err := create("far", once(3_600_000+int64(i)))
		if err != nil {
			fail("create a far job: %v", err)
		}
		if farID == 0 {
			farID = id
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
	var src string
	waitUntil(t, 15*time.Second, "the NameServer to report the shard's owner", func() bool {
		src = ownerOf(t, c, app)
		return src != ""
	})
	var others []string
	for _, a := range addrs {
		if a != src {
			others = append(others, a)
		}
	}
	dst := others[0]
	owners, final, finalEpoch := []string{src, dst}, dst, int64(2)
	if stale {
		owners, final, finalEpoch = []string{src, dst, others[1]}, others[1], 3
	}
	victim := procs[dst]
	if sourceSide {
		victim = procs[src]
	}
	if stale {
		// Give the first owner the hook: a plain crash and restart, its shard recovers.
		victim.kill()
		victim.start(t, bin, addrs, crashStaleSourcePoint)
		waitUntil(t, 20*time.Second, "the first owner serving again after its restart", func() bool { return p.serves(src, shard, app, farID) })
	}
	t.Logf("%s %s: moving %s from %s to %s; the hook kills %s", at(), point, shard, src, dst, victim.addr)

	// A steady stream of creates through the move, the crash and the recovery.
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
	watch := &ownerWatch{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watchWG sync.WaitGroup
	watchWG.Add(1)
	watch.first = map[string]time.Time{}
	go func() { defer watchWG.Done(); watch.run(watchCtx, p, owners, shard, app, farID) }()
	defer func() { stopWatch(); watchWG.Wait() }()

	// Phase 2: the move, and the crash at point.
	time.Sleep(500 * time.Millisecond) // some stream jobs land before the move
	p.move(src, dst, shard, 1)
	select {
	case <-victim.exited:
	case <-time.After(crashReachTimeout):
		fail("%s: the process at %s was not killed within %s: the crash point was never reached", point, victim.addr, crashReachTimeout)
	}
	if b, _ := os.ReadFile(victim.logs[len(victim.logs)-1]); !bytes.Contains(b, []byte("crash point "+hookOf(point))) {
		fail("%s: %s exited, but not at the crash point", point, victim.addr)
	}
	if stale {
		// While the first owner is down, the second hands the shard on to the third.
		waitUntil(t, crashSettleTimeout, "the second owner serving at epoch 2", func() bool { return p.serves(dst, shard, app, farID) })
		p.move(dst, final, shard, 2)
		waitUntil(t, crashSettleTimeout, "the third owner serving and the second not", func() bool {
			return p.serves(final, shard, app, farID) && !p.serves(dst, shard, app, farID)
		})
		t.Logf("%s %s: %s handed the shard on to %s while %s was down", at(), point, dst, final, src)
	}
	t.Logf("%s %s: %s killed at the crash point; restarting it", at(), point, victim.addr)
	time.Sleep(300 * time.Millisecond)
	victim.start(t, bin, addrs, "")

	// Phase 3: one owner, the last target, at the highest epoch — in fact (direct
	// reads) and in the NameServer's picture.
	serving := func() []string {
		var out []string
		for _, a := range addrs {
			if p.serves(a, shard, app, farID) {
				out = append(out, a)
			}
		}
		return out
	}
	settled := eventually(crashSettleTimeout, func() bool {
		if s := serving(); len(s) != 1 || s[0] != final {
			return false
		}
		st, err := c.Status(ctx)
		if err != nil || !st.Complete {
			return false
		}
		active, maxEpoch := 0, int64(0)
		var owner string
		for _, s := range st.Servers {
			for _, sh := range s.Shards {
				if sh.Shard != shard {
					continue
				}
				maxEpoch = max(maxEpoch, sh.Epoch)
				if !sh.Frozen {
					active++
					owner = s.Address
				}
			}
		}
		rt := p.route(final, app, shard)
		return active == 1 && owner == final && maxEpoch == finalEpoch && rt.GetEpoch() == finalEpoch && rt.GetOwner().GetAddress() == final
	})
	if !settled {
		st, err := c.Status(ctx)
		fail("%s: no single active owner of %s at epoch %d on %s within %s: serving %v, status %v (%v)",
			point, shard, finalEpoch, final, crashSettleTimeout, serving(), st, err)
	}
	t.Logf("%s %s: one active owner, %s at epoch %d", at(), point, final, finalEpoch)
	// The returning source resends its old import once it has recovered and its
	// handoff retry comes round (shard.HandoffRetry), which may be after the owner
	// settled: wait for it.
	if stale && !eventually(crashSettleTimeout, func() bool { return strings.Contains(procs[dst].logText(), "moved on since") }) {
		fail("%s: the returning source's old import never reached %s within %s (the case under test did not happen)", point, dst, crashSettleTimeout)
	}
	time.Sleep(time.Second) // the stream keeps creating against the new owner for a while
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

	// Phase 5: every due job fires; every acknowledged job is still there.
	fired := eventually(crashFireTimeout, func() bool {
		for id, k := range jobs {
			if k != "far" && k != "rate" && w.count(id) == 0 {
				return false
			}
		}
		return true
	})
	if !fired {
		var missing []int64
		for id, k := range jobs {
			if k != "far" && k != "rate" && w.count(id) == 0 {
				missing = append(missing, id)
			}
		}
		fail("%s: %d acknowledged due jobs never fired, e.g. %d", point, len(missing), missing[0])
	}
	t.Logf("%s %s: all %d acknowledged due jobs fired", at(), point, len(jobs))
	time.Sleep(crashStragglerGrace)
	stopWatch()
	watchWG.Wait()
	checkJobsKept(ctx, c, app, jobs, point, fail)

	// Phase 6: exactly once, never early, never a stale owner.
	checkRunsOnce(t, w, jobs, point)
	watch.mu.Lock()
	if len(watch.staleLate) > 0 {
		t.Errorf("%s: an old owner served the shard after a newer one had: %v", point, watch.staleLate)
	}
	watch.mu.Unlock()
	if t.Failed() {
		dump()
	}
}

// route is the NameServer's route of the shard, asked through the server at addr.
func (p *probe) route(addr, app, shard string) *messages.RouteEntry {
	r, err := p.sys.Root.RequestFuture(actor.NewPID(addr, server.Name), &messages.GetRoutes{App: app}, 2*time.Second).Result()
	if err != nil {
		return nil
	}
	if t, ok := r.(*messages.RouteTable); ok {
		for _, e := range t.Routes {
			if e.Shard == shard {
				return e
			}
		}
	}
	return nil
}

// hookOf is the crash point a scenario's hook is set to.
func hookOf(scenario string) string {
	if scenario == crashStaleSource {
		return crashStaleSourcePoint
	}
	return scenario
}

// checkJobsKept fails unless every acknowledged job (id → kind) can be read back.
func checkJobsKept(ctx context.Context, c *cluster.Client, app string, jobs map[int64]string, point string, fail func(string, ...any)) {
	for id, k := range jobs {
		gctx, gcancel := context.WithTimeout(ctx, 15*time.Second)
		j, err := c.Get(gctx, app, id)
		gcancel()
		if err != nil {
			if errors.Is(err, kerr.ErrNotFound) {
				fail("%s: acknowledged %s job %d is lost: %v", point, k, id, err)
			}
			fail("%s: get %s job %d: %v", point, k, id, err)
		}
		if j.Id != id {
			fail("%s: get %d returned job %d", point, id, j.Id)
		}
	}
}

// checkRunsOnce checks the worker's runs of the crash tests' jobs: none early, a
// far job never, the fixed-rate job at least once and no run twice, every other
// job exactly once.
func checkRunsOnce(t *testing.T, w *workerProc, jobs map[int64]string, point string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.early) > 0 {
		t.Errorf("%s: %d runs started before their due time, e.g. %s", point, len(w.early), w.early[0])
	}
	for id, k := range jobs {
		runs := w.runs[id]
		switch k {
		case "far":
			if len(runs) != 0 {
				t.Errorf("%s: far job %d fired %d times", point, id, len(runs))
			}
		case "rate":
			seen := map[string]bool{}
			for _, r := range runs {
				key := fmt.Sprintf("%s#%d", r.RunID, r.Attempt)
				if seen[key] {
					t.Errorf("%s: fixed-rate run %s executed twice", point, key)
				}
				seen[key] = true
			}
			if len(runs) == 0 {
				t.Errorf("%s: the fixed-rate job never fired", point)
			}
		default:
			if len(runs) != 1 {
				var ids []string
				for _, r := range runs {
					ids = append(ids, fmt.Sprintf("%s#%d", r.RunID, r.Attempt))
				}
				t.Errorf("%s: %s job %d executed %d times (%v), want once", point, k, id, len(runs), ids)
			}
		}
	}
}
