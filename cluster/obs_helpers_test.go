package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/kjob/kjob/cluster"
)

// Helpers of the observability tests (admin_test.go, metrics_test.go,
// obs_trace_test.go). Names start with obs so they keep out of other tests' way.

// obsLog records every log record at or above its level, for tests that follow a
// trace id through the logs.
type obsLog struct {
	mu    sync.Mutex
	recs  []obsRecord
	level slog.Level
	attrs []slog.Attr
	root  *obsLog
}

type obsRecord struct {
	msg   string
	attrs map[string]string
}

func newObsLog(level slog.Level) *obsLog { l := &obsLog{level: level}; l.root = l; return l }

func (l *obsLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= l.level }

func (l *obsLog) Handle(_ context.Context, r slog.Record) error {
	rec := obsRecord{msg: r.Message, attrs: map[string]string{}}
	for _, a := range l.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	l.root.mu.Lock()
	l.root.recs = append(l.root.recs, rec)
	l.root.mu.Unlock()
	return nil
}

func (l *obsLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &obsLog{level: l.level, attrs: append(append([]slog.Attr{}, l.attrs...), as...), root: l.root}
}

func (l *obsLog) WithGroup(string) slog.Handler { return l }

// find returns the records with message msg whose attribute key has value v.
func (l *obsLog) find(msg, key, v string) []obsRecord {
	l.root.mu.Lock()
	defer l.root.mu.Unlock()
	var out []obsRecord
	for _, r := range l.root.recs {
		if r.msg == msg && r.attrs[key] == v {
			out = append(out, r)
		}
	}
	return out
}

func obsQuiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func obsWait(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// obsNode starts a node with the admin API on a free loopback port.
func obsNode(t *testing.T, log *slog.Logger) *cluster.Node {
	t.Helper()
	if log == nil {
		log = obsQuiet()
	}
	n, err := cluster.StartNode(cluster.NodeConfig{Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", DataDir: t.TempDir(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if n.HTTPAddr() == "" || strings.HasSuffix(n.HTTPAddr(), ":0") {
		t.Fatalf("HTTPAddr() = %q, want the bound address", n.HTTPAddr())
	}
	return n
}

// obsWorker starts a worker of app on n with the given handlers.
func obsWorker(t *testing.T, n *cluster.Node, app string, log *slog.Logger, handlers map[string]cluster.HandlerFunc) *cluster.Worker {
	t.Helper()
	if log == nil {
		log = obsQuiet()
	}
	w, err := cluster.NewWorker(cluster.WorkerConfig{Servers: []string{n.Address()}, App: app, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range handlers {
		w.HandleFunc(name, h)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// obsReady waits until the node's /readyz says ready.
func obsReady(t *testing.T, n *cluster.Node) {
	t.Helper()
	obsWait(t, 15*time.Second, "/readyz", func() bool {
		st, _ := obsCall(t, n, "GET", "/readyz", "")
		return st == http.StatusOK
	})
}

var obsHTTP = &http.Client{Timeout: 20 * time.Second}

// obsCall makes one request to the node's admin API and decodes the JSON answer.
func obsCall(t *testing.T, n *cluster.Node, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+n.HTTPAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := obsHTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q, body %s", method, path, ct, b)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s %s: status %d, body is not a JSON object: %v: %s", method, path, resp.StatusCode, err, b)
	}
	return resp.StatusCode, out
}

// obsScrape reads /metrics in the text format.
func obsScrape(t *testing.T, n *cluster.Node) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := obsHTTP.Get("http://" + n.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: status %d: %s", resp.StatusCode, b)
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// obsValue sums the series of name whose labels include want: a counter's or
// gauge's value, a histogram's sample count.
func obsValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	sum := 0.0
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		}
	}
	return sum
}

// obsStr digs a string out of decoded JSON by a path of keys.
func obsStr(v any, path ...string) string {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[k]
	}
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

// obsErr checks an error answer: status, code and field.
func obsErr(t *testing.T, st int, body map[string]any, wantStatus int, wantCode, wantField string) {
	t.Helper()
	if st != wantStatus || obsStr(body, "error", "code") != wantCode || obsStr(body, "error", "field") != wantField ||
		obsStr(body, "error", "message") == "" {
		b, _ := json.Marshal(body)
		t.Fatalf("got %d %s, want %d with code %s, field %q and a message", st, b, wantStatus, wantCode, wantField)
	}
}
