package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// buildKjob builds the binary once per test run.
func buildKjob(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kjob")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("build kjob: %v", err)
	}
	return bin
}

// freePorts returns n loopback addresses for servers, each with its admin twin
// (port+10) free too. They are drawn from below the kernel's ephemeral range
// (32768-60999 here), so no outgoing connection of this or another test process can
// be bound to one while a killed server is down and its restart would meet
// "address already in use"; cluster's tests draw from 26000-32000, these from
// 20000-26000.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	var out []string
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			t.Fatal("no free port pairs on loopback in 20000-26000")
		}
		p := 20000 + rand.IntN(6000-10)
		// Neither may have gone to another test of this process.
		if portsUsed[p] || portsUsed[p+10] || portsUsed[p-10] || !portFree(p) || !portFree(p+10) {
			continue
		}
		portsUsed[p], portsUsed[p+10] = true, true
		out = append(out, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return out
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// portsUsed are the ports freePorts handed out (and their +10 twins): tests that run
// side by side never get each other's.
var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

type proc struct {
	cmd  *exec.Cmd
	addr string
	data string
	log  string
}

func startServer(t *testing.T, bin, addr string, peers []string, data string, extra ...string) *proc {
	t.Helper()
	logf := filepath.Join(t.TempDir(), "server.log")
	f, err := os.Create(logf)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"server", "--listen", addr, "--peers", strings.Join(peers, ","), "--data", data, "--log-level", testLogLevel()}, extra...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, addr: addr, data: data, log: logf}
	t.Cleanup(func() { p.kill() })
	return p
}

// testLogLevel is the servers' log level in these tests: warn, or $KJOB_TEST_LOG_LEVEL
// when chasing a failure.
func testLogLevel() string {
	if l := os.Getenv("KJOB_TEST_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}

func (p *proc) kill() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_, _ = p.cmd.Process.Wait()
	}
}

// workerProc runs `kjob worker` and collects its JSON lines.
type workerProc struct {
	mu    sync.Mutex
	runs  map[int64][]runLine
	early []string
	total int
}

func startWorker(t *testing.T, bin, app string, servers []string, extra ...string) *workerProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"worker", "--app", app, "--servers", strings.Join(servers, ","), "--log-level", "warn"}, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGKILL); _, _ = cmd.Process.Wait() })
	w := &workerProc{runs: map[int64][]runLine{}}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l runLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			w.mu.Lock()
			w.runs[l.JobID] = append(w.runs[l.JobID], l)
			w.total++
			if l.StartMs < l.DueMs {
				w.early = append(w.early, l.RunID)
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *workerProc) count(id int64) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.runs[id])
}

func eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func newTestClient(t *testing.T, servers []string) *cluster.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: servers, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// ownerOf returns the address of the server owning app's root shard.
func ownerOf(t *testing.T, c *cluster.Client, app string) string {
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Servers {
		for _, sh := range s.Shards {
			if strings.HasPrefix(sh.Shard, app+"/") {
				return s.Address
			}
		}
	}
	return ""
}

// TestThreeProcessCluster: three `kjob server` processes and workers; jobs of several
// apps fire once; a SIGKILLed shard owner restarted on its data directory still fires
// every acknowledged job; killing the NameServer's node, routing recovers.
func TestThreeProcessCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildKjob(t)
	addrs := freePorts(t, 3)
	procs := map[string]*proc{}
	for _, a := range addrs {
		procs[a] = startServer(t, bin, a, addrs, filepath.Join(t.TempDir(), "data"))
	}
	apps := []string{"billing", "mail", "reports", "search"}
	workers := map[string]*workerProc{}
	for _, app := range apps {
		workers[app] = startWorker(t, bin, app, addrs)
	}
	c := newTestClient(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	create := func(app string, delayMs int64) int64 {
		j, err := c.Create(ctx, &messages.Job{App: app, Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: delayMs}})
		if err != nil {
			t.Fatalf("create in %s: %v", app, err)
		}
		return j.Id
	}
	// Phase 1: jobs of several apps all fire once.
	ids := map[string][]int64{}
	for _, app := range apps {
		for i := 0; i < 25; i++ {
			ids[app] = append(ids[app], create(app, int64(200+i*20)))
		}
	}
	for _, app := range apps {
		for _, id := range ids[app] {
			if !eventually(30*time.Second, func() bool { return workers[app].count(id) >= 1 }) {
				dumpCluster(t, c, procs, app, id)
				t.Fatalf("job %d of %s never fired", id, app)
			}
		}
	}

	// Phase 2: SIGKILL a server that owns shards, with jobs pending on it; restart it.
	victim := ownerOf(t, c, "billing")
	if procs[victim] == nil {
		st, _ := c.Status(ctx)
		t.Fatalf("owner of billing's shard %q is none of %v; status %v", victim, addrs, st)
	}
	var pending []int64
	for i := 0; i < 40; i++ {
		pending = append(pending, create("billing", int64(3000+i*25)))
	}
	procs[victim].kill()
	time.Sleep(300 * time.Millisecond)
	procs[victim] = startServer(t, bin, victim, addrs, procs[victim].data)
	for _, id := range pending {
		if !eventually(45*time.Second, func() bool { return workers["billing"].count(id) >= 1 }) {
			dumpCluster(t, c, procs, "billing", id)
			t.Fatalf("timed out after 45s waiting for acknowledged job %d after the owner's restart", id)
		}
	}

	// Phase 3: kill the node hosting the NameServer; routing recovers on the others.
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nsAddr := st.Nameserver
	if procs[nsAddr] == nil {
		t.Fatalf("name server at %q is none of %v", nsAddr, addrs)
	}
	procs[nsAddr].kill()
	var others []string
	for _, a := range addrs {
		if a != nsAddr {
			others = append(others, a)
		}
	}
	waitUntil(t, 30*time.Second, "a new name server", func() bool {
		s, err := c.Status(ctx)
		return err == nil && s.Nameserver != "" && s.Nameserver != nsAddr && s.Complete
	})
	// An app whose shard is on a live node keeps working through the new NameServer.
	var liveApp string
	for _, app := range apps {
		if o := ownerOf(t, c, app); o != "" && o != nsAddr {
			liveApp = app
			break
		}
	}
	// A new app is not placed while a configured server is down: the app might live
	// there (the NameServer's state is soft), and a second copy would be a second
	// owner. The refusal names the server; once it is back the app is placed.
	fresh := "fresh"
	wf := startWorker(t, bin, fresh, others)
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err = c.Create(short, &messages.Job{App: fresh, Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 100}})
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "cannot place new app") || !strings.Contains(err.Error(), nsAddr) {
		t.Fatalf("new app with %s down: %v; want the refusal naming it", nsAddr, err)
	}
	procs[nsAddr] = startServer(t, bin, nsAddr, addrs, procs[nsAddr].data)
	id := create(fresh, 100)
	waitUntil(t, 30*time.Second, "a new app placed by the new name server once every server reports", func() bool { return wf.count(id) >= 1 })
	if liveApp != "" {
		id := create(liveApp, 100)
		waitUntil(t, 30*time.Second, "a job of "+liveApp+" after the name server moved", func() bool { return workers[liveApp].count(id) >= 1 })
	}
	// Exactly once, never early.
	for app, w := range workers {
		w.mu.Lock()
		if len(w.early) > 0 {
			t.Errorf("app %s: %d runs started early: %v", app, len(w.early), w.early[:1])
		}
		for id, rs := range w.runs {
			if len(rs) > 1 {
				seen := map[string]bool{}
				for _, r := range rs {
					k := fmt.Sprintf("%s#%d", r.RunID, r.Attempt)
					if seen[k] {
						t.Errorf("app %s job %d: run %s executed twice", app, id, k)
					}
					seen[k] = true
				}
			}
		}
		w.mu.Unlock()
	}
}

// dumpCluster logs what the cluster knows of one job of app, its status and every
// server's log, for a test about to fail on that job.
func dumpCluster(t *testing.T, c *cluster.Client, procs map[string]*proc, app string, id int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j, jerr := c.Get(ctx, app, id)
	t.Logf("job %d of %s: %v %v", id, app, j, jerr)
	rs, rerr := c.Runs(ctx, app, id, 5)
	t.Logf("runs of %d: %v %v", id, rs, rerr)
	st, serr := c.Status(ctx)
	t.Logf("status: %v %v", st, serr)
	for _, p := range procs {
		b, _ := os.ReadFile(p.log)
		t.Logf("server %s log:\n%s", p.addr, b)
	}
}

// TestCLIBadInput: bad input through the CLI exits non-zero with a typed error naming the field.
func TestCLIBadInput(t *testing.T) {
	bin := buildKjob(t)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"job", "create", "--app", "a", "--handler", "echo", "--in", "-5s"}, 2, "in: must not be negative"},
		{[]string{"job", "create", "--app", "a", "--handler", "echo", "--every", "0s"}, 2, "every: must be positive"},
		{[]string{"job", "create", "--app", "a", "--handler", "echo"}, 2, "schedule: give exactly one"},
		{[]string{"job", "create", "--handler", "echo", "--in", "1s"}, 2, "app: is required"},
		{[]string{"job", "create", "--app", "a", "--handler", "echo", "--in", "1s", "--misfire", "sometimes"}, 2, "misfire"},
		{[]string{"job", "create", "--app", "a", "--handler", "echo", "--in", "1s", "--ladder", "1s,-5s"}, 2, "ladder"},
		{[]string{"job", "get", "abc", "--app", "a"}, 2, "id: "},
		{[]string{"job", "create", "--app", "a", "--handler", "echo", "--at", "tomorrow"}, 2, "at: "},
	}
	for _, tc := range cases {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("kjob %v: exit %v, output %q; want exit %d containing %q", tc.args, err, out, tc.code, tc.want)
		}
	}
}

// TestCLIAgainstServer: the CLI's job commands against a real server, including
// server-side validation errors (invalid cron, unknown zone, unknown id).
func TestCLIAgainstServer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes")
	}
	bin := buildKjob(t)
	addr := freePorts(t, 1)[0]
	startServer(t, bin, addr, nil, filepath.Join(t.TempDir(), "data"))
	run := func(args ...string) (string, int) { return cli(bin, addr, args...) }
	id := cliCreate(t, bin, addr, "cli")
	var out string
	var code int
	if out, code = run("job", "get", id, "--app", "cli"); code != 0 || !strings.Contains(out, "state=active") {
		t.Fatalf("get: %d %q", code, out)
	}
	if out, code = run("job", "list", "--app", "cli"); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("list: %d %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"job", "create", "--app", "cli", "--handler", "echo", "--cron", "not a cron"}, 2, "schedule.cron"},
		{[]string{"job", "create", "--app", "cli", "--handler", "echo", "--cron", "@daily", "--tz", "Nowhere/City"}, 2, "schedule.tz"},
		{[]string{"job", "create", "--app", "cli", "--handler", "echo", "--in", "1s", "--params", strings.Repeat("x", 70000)}, 2, "params"},
		{[]string{"job", "get", "777", "--app", "cli"}, 3, "not found"},
	} {
		if out, code := run(tc.args...); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("kjob %v: exit %d %q, want %d containing %q", tc.args[:3], code, out, tc.code, tc.want)
		}
	}
	if out, code = run("job", "delete", id, "--app", "cli"); code != 0 {
		t.Fatalf("delete: %d %q", code, out)
	}
	if out, code = run("job", "get", id, "--app", "cli"); code != 3 {
		t.Fatalf("get after delete: %d %q", code, out)
	}
}

// cli runs the kjob CLI against the server at addr: its output and exit status.
func cli(bin, addr string, args ...string) (string, int) {
	out, err := exec.Command(bin, append(args, "--servers", addr)...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	return string(out), 0
}

// cliCreate creates a one-shot job of app due in an hour with the CLI, trying until
// the server accepts it, and returns its id.
func cliCreate(t *testing.T, bin, addr, app string) string {
	t.Helper()
	var out string
	var code int
	waitUntil(t, 30*time.Second, "the server to accept a job", func() bool {
		out, code = cli(bin, addr, "job", "create", "--app", app, "--handler", "echo", "--in", "1h", "--json")
		return code == 0
	})
	var j struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(lastLine(out))), &j); err != nil || j.ID == "" {
		t.Fatalf("create --json printed %q", out)
	}
	return j.ID
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
