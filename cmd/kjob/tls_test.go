package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// TestTLSCluster: two `kjob server` processes, a worker and the CLI, all with
// certificates from `kjob tls init` and `kjob tls issue`: the servers form a cluster
// over mutual TLS, a job created with the CLI and one created with the Go client
// fire at the worker, the admin API answers over HTTPS, and the CLI without TLS is
// told why it cannot reach the cluster (exit 5) instead of timing out.
func TestTLSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildKjob(t)
	dir := filepath.Join(t.TempDir(), "tls")
	for _, args := range [][]string{{"tls", "init", "--dir", dir}, {"tls", "issue", "--dir", dir, "--name", "worker", "--role", "worker", "--app", "secure"},
		{"tls", "issue", "--dir", dir, "--name", "cli", "--role", "client"}} {
		if out, code := cli(bin, "127.0.0.1:1", args...); code != 0 {
			t.Fatalf("kjob %v: exit %d %s", args, code, out)
		}
	}
	if out, code := cli(bin, "127.0.0.1:1", "tls", "issue", "--dir", dir, "--name", "cli"); code != 4 || !strings.Contains(out, "not overwritten") {
		t.Fatalf("issuing a name twice: exit %d %q, want 4 (already exists)", code, out)
	}
	if out, code := cli(bin, "127.0.0.1:1", "tls", "issue", "--dir", dir, "--name", "root", "--role", "root"); code != 2 || !strings.Contains(out, "role") {
		t.Fatalf("issuing an unknown role: exit %d %q, want 2 naming the role", code, out)
	}
	if out, code := cli(bin, "127.0.0.1:1", "tls", "issue", "--dir", dir, "--name", "ops", "--role", "client", "--app", "secure"); code != 2 || !strings.Contains(out, "app") {
		t.Fatalf("binding a client's certificate to an app: exit %d %q, want 2 naming app", code, out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca-key.pem: %v %v, want mode 0600", fi, err)
	}
	files := func(name string) []string {
		return []string{"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"),
			"--tls-key", filepath.Join(dir, name+"-key.pem")}
	}
	addrs := freePorts(t, 2)
	for _, a := range addrs {
		startServer(t, bin, a, addrs, filepath.Join(t.TempDir(), "data"), files("kjob")...)
	}
	w := startWorker(t, bin, "secure", addrs, files("worker")...)

	var out string
	var code int
	waitUntil(t, 60*time.Second, "the TLS cluster to accept a job from the CLI", func() bool {
		out, code = cli(bin, addrs[1], append([]string{"job", "create", "--app", "secure", "--handler", "echo", "--in", "200ms", "--json"}, files("cli")...)...)
		return code == 0
	})
	var j struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(lastLine(out)), &j); err != nil || j.ID == "" {
		t.Fatalf("create --json printed %q", out)
	}
	tl, err := cluster.LoadTLS(cluster.TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cli.pem"), Key: filepath.Join(dir, "cli-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: addrs, TLS: tl, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	j2, err := c.Create(ctx, &messages.Job{App: "secure", Handler: "echo", Schedule: &messages.Schedule{Kind: messages.ScheduleKind_ONCE, DelayMs: 200}})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "both jobs to fire at the TLS worker", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.total >= 2 && len(w.runs[j2.Id]) == 1
	})
	st, err := c.Status(ctx)
	if err != nil || len(st.Servers) != 2 {
		t.Fatalf("status over TLS: %v, %v; want both servers", st, err)
	}

	// The CLI with the worker's certificate: a worker's may not send commands.
	if out, code := cli(bin, addrs[0], append([]string{"job", "get", j.ID, "--app", "secure"}, files("worker")...)...); code != 2 || !strings.Contains(out, "tls-cert") {
		t.Fatalf("the CLI with a worker's certificate: exit %d %q, want 2 naming tls-cert", code, out)
	}

	// The CLI without TLS: told why, well before its deadline.
	start := time.Now()
	out, code = cli(bin, addrs[0], "job", "get", j.ID, "--app", "secure")
	if code != 5 || !strings.Contains(out, "speaks TLS and this endpoint has none") || time.Since(start) > 20*time.Second {
		t.Fatalf("the CLI without TLS: exit %d after %s: %q; want 5 saying the server speaks TLS", code, time.Since(start), out)
	}

	// The admin API (the default: --listen's port + 10) is HTTPS.
	base := "https://" + cluster.DefaultHTTP(addrs[0])
	roots := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	roots.AppendCertsFromPEM(caPEM)
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 10 * time.Second}
	authed := &http.Client{Transport: &http.Transport{TLSClientConfig: tl.HTTPClientConfig()}, Timeout: 10 * time.Second}
	status := func(hc *http.Client, path string) int {
		t.Helper()
		resp, err := hc.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := status(anon, "/readyz"); s != http.StatusOK {
		t.Fatalf("/readyz over HTTPS without a client certificate: %d", s)
	}
	if s := status(anon, "/v1/jobs/secure/"+j.ID); s != http.StatusUnauthorized {
		t.Fatalf("a job over HTTPS without a client certificate: %d, want 401", s)
	}
	if s := status(authed, "/v1/jobs/secure/"+j.ID); s != http.StatusOK {
		t.Fatalf("a job over HTTPS with a client certificate: %d", s)
	}
}
