package cluster

import (
	"context"
	"net"
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
	c, k, err := ca.Issue("c", nil, time.Hour)
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
