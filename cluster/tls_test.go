package cluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// issue makes an endpoint's TLS under ca, with no role.
func issue(t *testing.T, ca *cluster.CA, name string) *cluster.TLS {
	t.Helper()
	return issueRole(t, ca, name, cluster.RoleAny)
}

// TestMutualTLS: a node with TLS serves clients and workers whose certificates its
// CA signed, and nobody else: a client without TLS, or with a certificate of
// another CA, gets no lease; the admin API over HTTPS answers its routes only to a
// client certificate, and its probes to anyone.
func TestMutualTLS(t *testing.T) {
	ca, err := cluster.NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog(),
		HTTP: "127.0.0.1:0", TLS: issue(t, ca, "node")})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	rec := newRecorder()
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: "orders", Log: quietLog(),
		OnRun: rec.onRun, TLS: issue(t, ca, "worker")})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleFunc("echo", func(ctx context.Context, r *cluster.Run) error { return nil })
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clientTLS := issue(t, ca, "client")
	c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog(), TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	j, err := c.Create(ctx, once(50))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the job to fire at the TLS worker", func() bool { return rec.n.Load() == 1 })
	if got, err := c.Get(ctx, "orders", j.Id); err != nil || got.Id != j.Id {
		t.Fatalf("get over TLS: %v, %v", got, err)
	}

	other, err := cluster.NewCA("another ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// An intruder that trusts the cluster's CA too, so that only the server's
	// check of its certificate stops it.
	ic, ik, err := other.Issue("intruder", nil, time.Hour, cluster.RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	trusting, err := cluster.NewTLS(append(other.CertPEM(), ca.CertPEM()...), ic, ik)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  *cluster.TLS
		says string
	}{
		{"no TLS", nil, "speaks TLS and this endpoint has none"},
		{"a certificate of another CA", issue(t, other, "intruder"), "presented a certificate that tls-ca does not accept"},
		{"a certificate of another CA, trusting the cluster's", trusting, "refused this endpoint's certificate"},
	} {
		// The client gives up at once, saying why, rather than at its deadline.
		rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
		rc, err := cluster.NewClient(rctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog(), TLS: tc.tls})
		rcancel()
		if err == nil {
			rc.Close()
			t.Fatalf("a client with %s got a lease from a TLS node", tc.name)
		}
		var ke *kerr.Error
		if !errors.As(err, &ke) || ke.Field != "tls" || !strings.Contains(ke.Message, tc.says) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a client with %s: %v; want a tls error saying %q", tc.name, err, tc.says)
		}
	}
	plain, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	rc, err := cluster.NewClient(rctx, cluster.ClientConfig{Servers: []string{plain.Address()}, Log: quietLog(), TLS: clientTLS})
	rcancel()
	var ke *kerr.Error
	if err == nil {
		rc.Close()
		t.Fatal("a TLS client got a lease from a plain node")
	} else if !errors.As(err, &ke) || ke.Field != "tls" || !strings.Contains(ke.Message, "does not speak TLS") {
		t.Fatalf("a TLS client of a plain node: %v; want a tls error", err)
	}

	base := "https://" + n.HTTPAddr()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 10 * time.Second}
	authed := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS.HTTPClientConfig()}, Timeout: 10 * time.Second}
	get := func(hc *http.Client, path string) (int, []byte) {
		t.Helper()
		resp, err := hc.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, b := get(anon, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz without a client certificate: %d %s", code, b)
	}
	code, metrics := get(anon, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics without a client certificate: %d", code)
	}
	// The node's certificate's expiry, for the alert that warns before it.
	issued := time.Now().Add(time.Hour).Truncate(time.Second)
	var expiry float64
	for _, line := range strings.Split(string(metrics), "\n") {
		if v, ok := strings.CutPrefix(line, "kjob_tls_certificate_expiry_timestamp_seconds "); ok {
			expiry, _ = strconv.ParseFloat(v, 64)
		}
	}
	if !strings.Contains(string(metrics), "\nkjob_tls_reload_failing 0\n") {
		t.Fatal("/metrics has no kjob_tls_reload_failing 0")
	}
	if d := time.Unix(int64(expiry), 0).Sub(issued); d < -time.Minute || d > time.Minute {
		t.Fatalf("kjob_tls_certificate_expiry_timestamp_seconds %v, want about %v (the node's certificate: an hour)", expiry, issued.Unix())
	}
	code, b := get(anon, "/v1/cluster")
	var eb struct {
		Error struct{ Code, Field string }
	}
	if err := json.Unmarshal(b, &eb); code != http.StatusUnauthorized || err != nil || eb.Error.Code != "UNAUTHENTICATED" {
		t.Fatalf("/v1/cluster without a client certificate: %d %s, want 401 UNAUTHENTICATED", code, b)
	}
	if code, b := get(authed, "/v1/jobs/orders/"+strconv.FormatInt(j.Id, 10)); code != http.StatusOK {
		t.Fatalf("GET a job with a client certificate: %d %s", code, b)
	}
	intruder := issue(t, other, "intruder").HTTPClientConfig()
	intruder.RootCAs = roots
	if resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: intruder}, Timeout: 10 * time.Second}).Get(base + "/v1/cluster"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client certificate of another CA was taken: %d", resp.StatusCode)
	}
	if resp, err := http.Get("http://" + n.HTTPAddr() + "/v1/cluster"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP answered by a TLS node")
		}
	}
}

// TestLoadTLSErrors: every bad TLS setting is an INVALID_ARGUMENT that names its
// field.
func TestLoadTLSErrors(t *testing.T) {
	ca, err := cluster.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := cluster.NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue("node", nil, time.Hour, cluster.RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	_, key2, err := ca.Issue("node2", nil, time.Hour, cluster.RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caF, certF, keyF := write("ca.pem", ca.CertPEM()), write("cert.pem", cert), write("key.pem", key)
	if tl, err := cluster.LoadTLS(cluster.TLSFiles{}); tl != nil || err != nil {
		t.Fatalf("no files: %v, %v; want no TLS", tl, err)
	}
	if tl, err := cluster.LoadTLS(cluster.TLSFiles{CA: caF, Cert: certF, Key: keyF}); tl == nil || err != nil || tl.Leaf().Subject.CommonName != "node" {
		t.Fatalf("good files: %v, %v", tl, err)
	}
	for _, tc := range []struct {
		name  string
		files cluster.TLSFiles
		field string
	}{
		{"no key", cluster.TLSFiles{CA: caF, Cert: certF}, "tls-key"},
		{"no CA", cluster.TLSFiles{Cert: certF, Key: keyF}, "tls-ca"},
		{"a missing CA file", cluster.TLSFiles{CA: filepath.Join(dir, "nope.pem"), Cert: certF, Key: keyF}, "tls-ca"},
		{"a CA file without PEM", cluster.TLSFiles{CA: write("junk.pem", []byte("junk")), Cert: certF, Key: keyF}, "tls-ca"},
		{"another certificate's key", cluster.TLSFiles{CA: caF, Cert: certF, Key: write("key2.pem", key2)}, "tls-key"},
		{"a key file without PEM", cluster.TLSFiles{CA: caF, Cert: certF, Key: write("junkkey.pem", []byte("junk"))}, "tls-key"},
		{"a certificate file without PEM", cluster.TLSFiles{CA: caF, Cert: write("junkcert.pem", []byte("junk")), Key: keyF}, "tls-cert"},
		{"a certificate another CA signed", cluster.TLSFiles{CA: write("other.pem", other.CertPEM()), Cert: certF, Key: keyF}, "tls-cert"},
	} {
		_, err := cluster.LoadTLS(tc.files)
		var ke *kerr.Error
		if !errors.As(err, &ke) || ke.Code != messages.Code_INVALID_ARGUMENT || ke.Field != tc.field {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on %s", tc.name, err, tc.field)
		}
	}
	// A CA read back from its PEM issues certificates the original's TLS takes.
	caKey, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	back, err := cluster.ParseCA(ca.CertPEM(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	c2, k2, err := back.Issue("later", nil, time.Hour, cluster.RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.NewTLS(ca.CertPEM(), c2, k2); err != nil {
		t.Fatalf("a certificate issued by the CA read back: %v", err)
	}
	if _, err := cluster.ParseCA(ca.CertPEM(), key); err == nil {
		t.Fatal("ParseCA took a key that is not the CA's")
	}
}

// TestTLSReload: a node's TLS files replaced while it runs are used for new
// connections within TLSReloadEvery: a CA added to its CA file lets that CA's
// clients in, a renewed certificate is served; a renewal half done (the
// certificate without its key) keeps the last good pair in use and says so.
func TestTLSReload(t *testing.T) {
	ca1, err := cluster.NewCA("ca one", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := cluster.NewCA("ca two", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := cluster.TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "node.pem"), Key: filepath.Join(dir, "node-key.pem")}
	write := func(path string, b []byte) {
		t.Helper()
		// As a renewal tool does: a new file renamed over the old.
		if err := os.WriteFile(path+".new", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	nodeCert := func(validity time.Duration) ([]byte, []byte) {
		c, k, err := ca1.Issue("node", []string{"127.0.0.1"}, validity, cluster.RoleAny)
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	c, k := nodeCert(time.Hour)
	write(files.CA, ca1.CertPEM())
	write(files.Cert, c)
	write(files.Key, k)
	tl, err := cluster.LoadTLS(files)
	if err != nil {
		t.Fatal(err)
	}
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Log: quietLog(), TLS: tl})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// A client of the second CA that trusts both: only the node's CA file stops it.
	ic, ik, err := ca2.Issue("newcomer", nil, time.Hour, cluster.RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	newcomer, err := cluster.NewTLS(append(ca1.CertPEM(), ca2.CertPEM()...), ic, ik)
	if err != nil {
		t.Fatal(err)
	}
	lease := func(tl *cluster.TLS) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := cluster.NewClient(ctx, cluster.ClientConfig{Servers: []string{n.Address()}, Log: quietLog(), TLS: tl})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := lease(newcomer); err == nil {
		t.Fatal("a client of another CA got a lease")
	}
	write(files.CA, append(ca1.CertPEM(), ca2.CertPEM()...))
	time.Sleep(cluster.TLSReloadEvery + 100*time.Millisecond)
	if err := lease(newcomer); err != nil {
		t.Fatalf("a client of the CA added to the node's CA file: %v", err)
	}

	first := tl.Leaf().NotAfter
	c2, k2 := nodeCert(2 * time.Hour)
	write(files.Cert, c2) // its key not yet
	time.Sleep(cluster.TLSReloadEvery + 100*time.Millisecond)
	if tl.Leaf().NotAfter != first || tl.ReloadErr() == nil {
		t.Fatalf("a certificate without its key: leaf until %v (was %v), reload error %v; want the old pair and an error", tl.Leaf().NotAfter, first, tl.ReloadErr())
	}
	if err := lease(issue(t, ca1, "client")); err != nil {
		t.Fatalf("a client while the node's renewal is half done: %v", err)
	}
	write(files.Key, k2)
	time.Sleep(cluster.TLSReloadEvery + 100*time.Millisecond)
	if got := tl.Leaf().NotAfter; !got.After(first) || tl.ReloadErr() != nil {
		t.Fatalf("renewed: leaf until %v (was %v), reload error %v", got, first, tl.ReloadErr())
	}
	if err := lease(issue(t, ca1, "client")); err != nil {
		t.Fatalf("a client after the node's renewal: %v", err)
	}
}

// TestTLSReloadRollback: a renewal half done and then undone by renaming the
// original back (its size and modification time as before) clears the reload
// error: the files are the set in use again.
func TestTLSReloadRollback(t *testing.T) {
	ca, err := cluster.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := cluster.TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "node.pem"), Key: filepath.Join(dir, "node-key.pem")}
	c, k, err := ca.Issue("node", nil, time.Hour, cluster.RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range map[string][]byte{f.CA: ca.CertPEM(), f.Cert: c, f.Key: k} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tl, err := cluster.LoadTLS(f)
	if err != nil {
		t.Fatal(err)
	}
	first := tl.Leaf().NotAfter
	if err := os.Rename(f.Cert, f.Cert+".old"); err != nil {
		t.Fatal(err)
	}
	c2, _, err := ca.Issue("node", nil, 2*time.Hour, cluster.RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Cert, c2, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(cluster.TLSReloadEvery + 100*time.Millisecond)
	if tl.Leaf(); tl.ReloadErr() == nil {
		t.Fatal("a certificate without its key: no reload error")
	}
	if err := os.Rename(f.Cert+".old", f.Cert); err != nil {
		t.Fatal(err)
	}
	time.Sleep(cluster.TLSReloadEvery + 100*time.Millisecond)
	if leaf := tl.Leaf(); tl.ReloadErr() != nil || leaf.NotAfter != first {
		t.Fatalf("rolled back: reload error %v, leaf until %v (want %v)", tl.ReloadErr(), leaf.NotAfter, first)
	}
}
