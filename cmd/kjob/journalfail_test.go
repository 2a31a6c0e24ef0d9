package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
)

// TestServerOnJournalFailure runs `kjob server` processes whose journal syncs fail on
// demand (cluster.FailSyncEnv: while a file exists, every sync fails as the disk's
// would). With --exit-on-journal-failure=false the server stays up with /healthz
// and /readyz at 503 naming the failure; by default it exits with status 1, so a
// supervisor restarts it; and a restart on the same data serves what was
// acknowledged before the failure.
func TestServerOnJournalFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes")
	}
	bin := buildKjob(t)
	addr := freePorts(t, 1)[0]
	host, port, _ := strings.Cut(addr, ":")
	p, _ := strconv.Atoi(port)
	admin := fmt.Sprintf("http://%s:%d", host, p+10)
	data := filepath.Join(t.TempDir(), "data")
	failFile := filepath.Join(t.TempDir(), "fail-syncs")

	// start runs a server; its channel yields how it ended, once, and is closed then.
	start := func(extra ...string) (*exec.Cmd, string, chan error) {
		t.Helper()
		logf := filepath.Join(t.TempDir(), "server.log")
		f, err := os.Create(logf)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, append([]string{"server", "--listen", addr, "--data", data, "--log-level", "warn"}, extra...)...)
		cmd.Env = append(os.Environ(), cluster.FailSyncEnv+"="+failFile)
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		done := make(chan struct{})
		go func() { exited <- cmd.Wait(); f.Close(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-done
		})
		return cmd, logf, exited
	}
	create := func() string { t.Helper(); return cliCreate(t, bin, addr, "jf") }
	get := func(path string) (int, map[string]any) {
		resp, err := http.Get(admin + path)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		var b map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&b)
		return resp.StatusCode, b
	}
	// failSyncs makes the journal's syncs fail and sends a create to make one. The
	// create must not be acknowledged; its client retries it until its deadline
	// (the server may restart), so the returned stop ends it before the next step.
	failSyncs := func() (stop func()) {
		t.Helper()
		if err := os.WriteFile(failFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		cl := exec.Command(bin, "job", "create", "--app", "jf", "--handler", "echo", "--in", "1h", "--servers", addr)
		if err := cl.Start(); err != nil {
			t.Fatal(err)
		}
		acked := make(chan error, 1)
		go func() { acked <- cl.Wait() }()
		t.Cleanup(func() { _ = cl.Process.Kill() }) // if the test ends before stop
		return func() {
			t.Helper()
			_ = cl.Process.Kill()
			if err := <-acked; err == nil {
				t.Fatal("a create was acknowledged while the journal's syncs fail")
			}
		}
	}

	// 1. Staying up: the failure shows in /healthz and /readyz.
	cmd, _, exited := start("--exit-on-journal-failure=false")
	first := create()
	if st, b := get("/healthz"); st != http.StatusOK {
		t.Fatalf("/healthz before the failure: %d %v", st, b)
	}
	stop := failSyncs()
	waitUntil(t, 10*time.Second, "/healthz to report the failed journal", func() bool {
		st, b := get("/healthz")
		return st == http.StatusServiceUnavailable && b["status"] == "journal failed" && strings.Contains(fmt.Sprint(b["reason"]), "injected sync failure")
	})
	if st, b := get("/readyz"); st != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(b["reason"]), "journal failed") {
		t.Fatalf("/readyz after the failure: %d %v", st, b)
	}
	select {
	case err := <-exited:
		t.Fatalf("the server exited with --exit-on-journal-failure=false: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	stop()
	_ = cmd.Process.Kill()
	<-exited
	if err := os.Remove(failFile); err != nil {
		t.Fatal(err)
	}

	// 2. The default: the server exits with status 1 and says why.
	_, logf, exited := start()
	second := create()
	stop = failSyncs()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("the server ended with %v, want exit status 1", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the server did not exit after its journal failed")
	}
	stop()
	if b, _ := os.ReadFile(logf); !strings.Contains(string(b), "journal failed (restart the server to recover it from the disk)") {
		t.Fatalf("the server's output does not say why it exited:\n%s", b)
	}
	if err := os.Remove(failFile); err != nil {
		t.Fatal(err)
	}

	// 3. A restart on the same data serves both acknowledged jobs.
	start()
	create()
	for _, id := range []string{first, second} {
		if out, code := cli(bin, addr, "job", "get", id, "--app", "jf"); code != 0 || !strings.Contains(out, "state=active") {
			t.Fatalf("job %s after the restart: %d %q", id, code, out)
		}
	}
}
