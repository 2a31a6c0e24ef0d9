package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// TestTLSProbeTellsNothingOfAPeerThatHangsUp: a listener that takes a connection
// and closes it (a proxy or port-forward with nothing behind it yet, a server
// shutting down) is no evidence of a plain server, and one that says nothing is
// waited for only up to the caller's deadline. Before, the first was reported as
// "does not speak TLS", which ended a client's lease at once.
func TestTLSProbeTellsNothingOfAPeerThatHangsUp(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := ca.Issue("c", nil, time.Hour, RoleAny)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := NewTLS(ca.CertPEM(), c, k)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"close", "read-close", "silent"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				switch mode {
				case "close":
					conn.Close()
				case "read-close":
					go func() { b := make([]byte, 4096); conn.Read(b); conn.Close() }()
				case "silent":
					go func() { time.Sleep(3 * time.Second); conn.Close() }()
				}
			}
		}()
		for _, et := range []*TLS{tl, nil} {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			start := time.Now()
			m, known := tlsMismatch(ctx, ln.Addr().String(), et)
			took := time.Since(start)
			cancel()
			if m != nil || known {
				t.Errorf("%s, TLS %v: %v (known %v); want nothing known", mode, et != nil, m, known)
			}
			if took > 2*time.Second {
				t.Errorf("%s, TLS %v: the probe took %v past a 300 ms deadline", mode, et != nil, took)
			}
		}
		ln.Close()
	}
}

// TestExpiryWarner: a client's or worker's certificate that expires within
// TLSExpiryWarning is said in its log, once a day; one further out is not.
func TestExpiryWarner(t *testing.T) {
	ca, err := NewCA("ca", 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(validity time.Duration) *TLS {
		c, k, err := ca.Issue("w", nil, validity, RoleAny)
		if err != nil {
			t.Fatal(err)
		}
		tl, err := NewTLS(ca.CertPEM(), c, k)
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Now()
	far := &expiryWarner{t: mk(30 * 24 * time.Hour), log: log, what: "client"}
	far.check(now)
	if buf.Len() != 0 {
		t.Fatalf("a certificate 30 days from expiry: %s", buf.String())
	}
	soon := &expiryWarner{t: mk(48 * time.Hour), log: log, what: "worker w1"}
	soon.check(now)
	soon.check(now.Add(time.Hour))
	if n := strings.Count(buf.String(), "expires soon"); n != 1 || !strings.Contains(buf.String(), "worker w1") {
		t.Fatalf("a certificate 2 days from expiry, checked twice in an hour: %d warnings: %s", n, buf.String())
	}
	soon.check(now.Add(25 * time.Hour))
	if n := strings.Count(buf.String(), "expires soon"); n != 2 {
		t.Fatalf("a day later: %d warnings, want 2", n)
	}
	var none *expiryWarner
	none.check(now)                                                // no TLS: nothing
	(&expiryWarner{log: log}).check(now.Add(100 * 24 * time.Hour)) // nil TLS: nothing
}
