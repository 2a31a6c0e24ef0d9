package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// Admin API bounds.
const (
	adminRequestTimeout    = 10 * time.Second // one API call, client start included
	adminClientTimeout     = 15 * time.Second // starting the in-process client (it leases a snowflake node id)
	adminMaxBodyBytes      = 1 << 20          // job params are at most 64 KiB; base64 and JSON fit well inside
	adminReadHeaderTimeout = 5 * time.Second
	adminShutdownTimeout   = 2 * time.Second
)

var errNotStarted = errors.New("node is still starting")

// admin is a node's HTTP server: /metrics, health, and the JSON admin API. The API is
// a thin layer over an in-process Client connected to the node itself, so it routes,
// retries and fails exactly like the Go client and returns the same typed errors, as
// HTTP status codes with a JSON body:
//
//	{"error":{"code":"NOT_FOUND","field":"id","message":"job 7 not found in app \"shop\""}}
//
// Messages are protojson with the proto field names (int64 as strings, enums by name,
// params as base64), like `kjob … --json`.
type admin struct {
	n      *Node
	ln     net.Listener
	srv    *http.Server
	ctx    context.Context // parent of every request: cancelled first on stop
	cancel context.CancelFunc
	served sync.WaitGroup
	reqs   *prometheus.CounterVec

	mu     sync.Mutex
	cl     *Client
	closed bool
}

// HTTPAddr is the address the admin API and /metrics listen on ("" when none); with
// NodeConfig.HTTP ending in :0 it tells the port that was picked.
func (n *Node) HTTPAddr() string {
	if n.admin == nil {
		return ""
	}
	return n.admin.ln.Addr().String()
}

// startHTTP serves the admin API and /metrics on addr.
func (n *Node) startHTTP(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	scheme := "http"
	if n.cfg.TLS != nil {
		ln, scheme = tls.NewListener(ln, n.cfg.TLS.httpConfig()), "https"
	}
	a := &admin{n: n, ln: ln}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.reqs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kjob_admin_requests_total",
		Help: "Requests to the HTTP admin API and /metrics, by route pattern and status code."}, []string{"route", "code"})
	n.metrics.reg.MustRegister(a.reqs)
	a.srv = &http.Server{
		Handler:           a.routes(),
		ReadHeaderTimeout: adminReadHeaderTimeout,
		ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return a.ctx },
	}
	n.admin = a
	a.served.Add(1)
	go func() {
		defer a.served.Done()
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("admin http stopped", "http", ln.Addr().String(), "err", err)
		}
	}()
	n.log.Info("admin http listening", "http", ln.Addr().String(), "metrics", scheme+"://"+ln.Addr().String()+"/metrics")
	return nil
}

// stopHTTP stops the admin server, if any: requests in flight are cancelled, then
// the server and the in-process client are closed.
func (n *Node) stopHTTP() {
	a := n.admin
	if a == nil {
		return
	}
	a.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
	a.served.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.cl != nil {
		a.cl.Close()
		a.cl = nil
	}
}

// client returns the in-process client, starting it on first use.
func (a *admin) client(ctx context.Context) (*Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, &kerr.Error{Code: messages.Code_UNAVAILABLE, Message: "the node is shutting down"}
	}
	if a.cl != nil {
		return a.cl, nil
	}
	ctx, cancel := context.WithTimeout(ctx, adminClientTimeout)
	defer cancel()
	// Replies from other nodes must reach the client: listen on the node's own host.
	host, _, err := net.SplitHostPort(a.n.Address())
	if err != nil {
		return nil, err
	}
	c, err := NewClient(ctx, ClientConfig{Servers: []string{a.n.Address()}, Listen: net.JoinHostPort(host, "0"), Log: a.n.log, TLS: a.n.cfg.TLS})
	if err != nil {
		return nil, fmt.Errorf("start the admin API's client: %w", err)
	}
	a.cl = c
	return c, nil
}

func (a *admin) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.n.metrics.reg, promhttp.HandlerOpts{
		ErrorLog: promLogger{a.n.log}, Registry: a.n.metrics.reg}))
	for _, r := range []struct {
		pattern string
		h       apiFunc
	}{
		{"POST /v1/jobs", a.createJob},
		{"GET /v1/jobs", a.listJobs},
		{"GET /v1/jobs/{app}/{id}", a.getJob},
		{"PUT /v1/jobs/{app}/{id}", a.updateJob},
		{"DELETE /v1/jobs/{app}/{id}", a.deleteJob},
		{"POST /v1/jobs/{app}/{id}/pause", a.pauseJob},
		{"POST /v1/jobs/{app}/{id}/resume", a.resumeJob},
		{"POST /v1/jobs/{app}/{id}/trigger", a.triggerJob},
		{"GET /v1/jobs/{app}/{id}/runs", a.runs},
		{"GET /v1/dlq/{app}", a.listDead},
		{"DELETE /v1/dlq/{app}", a.purgeAllDead},
		{"GET /v1/dlq/{app}/{run_id}", a.getDead},
		{"POST /v1/dlq/{app}/{run_id}/replay", a.replayDead},
		{"DELETE /v1/dlq/{app}/{run_id}", a.purgeDead},
		{"GET /v1/cluster", a.cluster},
	} {
		mux.Handle(r.pattern, a.authenticated(r.h))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		if _, pattern := mux.Handler(r); pattern == "" {
			// The mux would answer in plain text: no such route (404) or method (405).
			mux.ServeHTTP(&jsonFallback{w: sw}, r)
		} else {
			mux.ServeHTTP(sw, r)
		}
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		a.reqs.WithLabelValues(route, strconv.Itoa(sw.status)).Inc()
	})
}

// ---------------------------------------------------------------- health

// healthz is liveness: a node whose journal failed is alive in no useful sense —
// it takes no write until a restart recovers it from the disk — so it answers 503,
// and an orchestrator's liveness probe restarts it (kjob server exits by itself
// unless --exit-on-journal-failure=false).
func (a *admin) healthz(w http.ResponseWriter, _ *http.Request) {
	if a.n.journal != nil {
		if err := a.n.JournalErr(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "journal failed", "reason": err.Error(),
				"address": a.n.Address()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "address": a.n.Address(),
		"uptime_seconds": int64(time.Since(a.n.started).Seconds())})
}

func (a *admin) readyz(w http.ResponseWriter, _ *http.Request) {
	if err := a.n.ready(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}

// ---------------------------------------------------------------- API plumbing

// apiFunc handles one API call; it returns the status and body of a success.
type apiFunc func(ctx context.Context, r *http.Request) (int, any, error)

// authenticated lets a request through to h unless the node runs with TLS and the
// request came without a client certificate (one that was given has been verified
// against the CA in the handshake): 401, UNAUTHENTICATED.
func (a *admin) authenticated(h http.Handler) http.Handler {
	if a.n.cfg.TLS == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: errorDetail{Code: "UNAUTHENTICATED", Field: "client certificate",
				Message: "this node runs with TLS: the admin API wants a client certificate signed by the cluster's CA (curl --cacert ca.pem --cert kjob.pem --key kjob-key.pem)"}})
			return
		}
		if role, ok := RoleOf(r.TLS.PeerCertificates[0]); !ok || role == RoleWorker {
			writeJSON(w, http.StatusForbidden, errorBody{Error: errorDetail{Code: "PERMISSION_DENIED", Field: "client certificate",
				Message: fmt.Sprintf("a certificate with role %q may not use the admin API: use a client's (kjob tls issue --role client) or a server's", role)}})
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (f apiFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), adminRequestTimeout)
	defer cancel()
	status, body, err := f(ctx, r)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, status, body)
}

// httpStatus maps a kjob error code to an HTTP status.
func httpStatus(c messages.Code) int {
	switch c {
	case messages.Code_INVALID_ARGUMENT:
		return http.StatusBadRequest
	case messages.Code_NOT_FOUND:
		return http.StatusNotFound
	case messages.Code_ALREADY_EXISTS:
		return http.StatusConflict
	case messages.Code_NOT_OWNER:
		return http.StatusMisdirectedRequest
	case messages.Code_UNAVAILABLE:
		return http.StatusServiceUnavailable
	case messages.Code_RESOURCE_EXHAUSTED:
		return http.StatusTooManyRequests
	case messages.Code_FAILED_PRECONDITION:
		return http.StatusPreconditionFailed
	default:
		return http.StatusInternalServerError
	}
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string        `json:"code"`
	Field   string        `json:"field"`
	Message string        `json:"message"`
	Hint    *messages.Ref `json:"hint,omitempty"` // NOT_OWNER: where the shard lives now
}

// asKjobError gives any error its kjob form: running out of time is UNAVAILABLE, even
// when the client that gave up wraps the last error it saw (a NOT_OWNER, say: the
// cluster could not serve in time, and the message tells the whole story); a typed
// error stays itself; transport (the cluster did not answer) is UNAVAILABLE; the rest
// INTERNAL.
func asKjobError(err error) *kerr.Error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return &kerr.Error{Code: messages.Code_UNAVAILABLE, Message: err.Error()}
	}
	var e *kerr.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, errTransport) || errors.Is(err, actor.ErrTimeout) || errors.Is(err, actor.ErrDeadLetter) {
		return &kerr.Error{Code: messages.Code_UNAVAILABLE, Message: err.Error()}
	}
	return &kerr.Error{Code: messages.Code_INTERNAL, Message: err.Error()}
}

func writeError(w http.ResponseWriter, err error) {
	e := asKjobError(err)
	status := httpStatus(e.Code)
	if e.Code == messages.Code_RESOURCE_EXHAUSTED && e.Field == "journal" {
		status = http.StatusInsufficientStorage // a full disk, not a limit the caller hit
	}
	writeJSON(w, status, errorBody{Error: errorDetail{Code: e.Code.String(), Field: e.Field, Message: e.Message, Hint: e.Hint}})
}

var jsonOut = protojson.MarshalOptions{UseProtoNames: true}

// marshalProto is protojson made compact and stable (protojson varies its spacing on
// purpose; people diffing curl output should not see that).
func marshalProto(m proto.Message) ([]byte, error) {
	b, err := jsonOut.Marshal(m)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var b []byte
	var err error
	switch x := v.(type) {
	case proto.Message:
		b, err = marshalProto(x)
	case json.RawMessage:
		b = x
	default:
		b, err = json.Marshal(x)
	}
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errorBody{Error: errorDetail{Code: messages.Code_INTERNAL.String(), Message: err.Error()}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// list renders {"<key>":[…],"<nextKey>":"…"} with the items in protojson; the list is
// present (possibly empty) and the next key only when there is a next page.
func list[T proto.Message](key string, items []T, nextKey, next string) (json.RawMessage, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"` + key + `":[`)
	for i, it := range items {
		if i > 0 {
			buf.WriteByte(',')
		}
		b, err := marshalProto(it)
		if err != nil {
			return nil, err
		}
		buf.Write(b)
	}
	buf.WriteByte(']')
	if next != "" {
		nb, _ := json.Marshal(next)
		buf.WriteString(`,"` + nextKey + `":`)
		buf.Write(nb)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func invalid(field, format string, args ...any) error {
	return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: field, Message: fmt.Sprintf(format, args...)}
}

// pathJob parses {app} and {id}.
func pathJob(r *http.Request) (string, int64, error) {
	app := r.PathValue("app")
	if why := route.ValidApp(app); why != "" {
		return "", 0, invalid("app", "%s", why)
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return "", 0, invalid("id", "%q is not a job id (a positive integer)", r.PathValue("id"))
	}
	return app, id, nil
}

func pathApp(r *http.Request) (string, error) {
	app := r.PathValue("app")
	if why := route.ValidApp(app); why != "" {
		return "", invalid("app", "%s", why)
	}
	return app, nil
}

func queryInt(r *http.Request, name string) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, invalid(name, "%q is not a non-negative integer", s)
	}
	return v, nil
}

func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, adminMaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, invalid("body", "exceeds the limit of %d bytes", adminMaxBodyBytes)
		}
		return nil, invalid("body", "%v", err)
	}
	return b, nil
}

// decodeJob reads a job in protojson. For people with curl, params may also be any
// JSON value other than a string (an object, say): it is taken verbatim as the
// params bytes. A string is protojson's base64 form of bytes.
func decodeJob(r *http.Request) (*messages.Job, error) {
	body, err := readBody(r)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, invalid("body", "a job must be a JSON object")
	}
	if p, ok := fields["params"]; ok {
		p = bytes.TrimSpace(p)
		switch {
		case string(p) == "null":
			delete(fields, "params")
		case len(p) > 0 && p[0] != '"':
			fields["params"], _ = json.Marshal(base64.StdEncoding.EncodeToString(p))
		}
	}
	b, _ := json.Marshal(fields)
	j := &messages.Job{}
	if err := protojson.Unmarshal(b, j); err != nil {
		return nil, invalid("body", "%v", err)
	}
	return j, nil
}

// knownApp answers NOT_FOUND at once for an app that has no shard, instead of letting
// the client retry until its deadline waiting for one to appear.
func (a *admin) knownApp(ctx context.Context, c *Client, app string) error {
	c.mu.Lock()
	known := len(c.routes[app]) > 0
	c.mu.Unlock()
	if known {
		return nil
	}
	return c.refresh(ctx, app, false)
}

// jobClient parses {app}/{id} and returns the client once the app is known.
func (a *admin) jobClient(ctx context.Context, r *http.Request) (*Client, string, int64, error) {
	app, id, err := pathJob(r)
	if err != nil {
		return nil, "", 0, err
	}
	c, err := a.client(ctx)
	if err != nil {
		return nil, "", 0, err
	}
	if err := a.knownApp(ctx, c, app); err != nil {
		return nil, "", 0, err
	}
	return c, app, id, nil
}

// ---------------------------------------------------------------- jobs

func (a *admin) createJob(ctx context.Context, r *http.Request) (int, any, error) {
	j, err := decodeJob(r)
	if err != nil {
		return 0, nil, err
	}
	if why := route.ValidApp(j.App); why != "" {
		return 0, nil, invalid("app", "%s", why)
	}
	c, err := a.client(ctx)
	if err != nil {
		return 0, nil, err
	}
	out, err := c.Create(ctx, j)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, out, nil
}

func parseState(s string) (messages.JobState, error) {
	switch strings.ToLower(s) {
	case "":
		return messages.JobState_JOB_STATE_UNSPECIFIED, nil
	case "active":
		return messages.JobState_ACTIVE, nil
	case "paused":
		return messages.JobState_PAUSED, nil
	case "done":
		return messages.JobState_DONE, nil
	}
	return 0, invalid("state", "%q: use active, paused or done", s)
}

func (a *admin) listJobs(ctx context.Context, r *http.Request) (int, any, error) {
	q := r.URL.Query()
	app := q.Get("app")
	if app == "" {
		return 0, nil, invalid("app", "is required (?app=…)")
	}
	if why := route.ValidApp(app); why != "" {
		return 0, nil, invalid("app", "%s", why)
	}
	st, err := parseState(q.Get("state"))
	if err != nil {
		return 0, nil, err
	}
	after, err := queryInt(r, "after")
	if err != nil {
		return 0, nil, err
	}
	limit, err := queryInt(r, "limit")
	if err != nil {
		return 0, nil, err
	}
	c, err := a.client(ctx)
	if err != nil {
		return 0, nil, err
	}
	var jobs []*messages.Job
	var next int64
	if err := a.knownApp(ctx, c, app); err != nil && !errors.Is(err, kerr.ErrNotFound) {
		return 0, nil, err
	} else if err == nil {
		jobs, next, err = c.List(ctx, app, ListOptions{State: st, Handler: q.Get("handler"), AfterID: after, Limit: int(limit)})
		if err != nil {
			return 0, nil, err
		}
	}
	nextS := ""
	if next != 0 {
		nextS = strconv.FormatInt(next, 10)
	}
	body, err := list("jobs", jobs, "next_after_id", nextS)
	return http.StatusOK, body, err
}

func (a *admin) getJob(ctx context.Context, r *http.Request) (int, any, error) {
	c, app, id, err := a.jobClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	j, err := c.Get(ctx, app, id)
	return http.StatusOK, j, err
}

func (a *admin) updateJob(ctx context.Context, r *http.Request) (int, any, error) {
	app, id, err := pathJob(r)
	if err != nil {
		return 0, nil, err
	}
	j, err := decodeJob(r)
	if err != nil {
		return 0, nil, err
	}
	if j.App != "" && j.App != app {
		return 0, nil, invalid("app", "%q in the body differs from %q in the path", j.App, app)
	}
	if j.Id != 0 && j.Id != id {
		return 0, nil, invalid("id", "%d in the body differs from %d in the path", j.Id, id)
	}
	j.App, j.Id = app, id
	c, _, _, err := a.jobClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	out, err := c.Update(ctx, j)
	return http.StatusOK, out, err
}

func (a *admin) deleteJob(ctx context.Context, r *http.Request) (int, any, error) {
	c, app, id, err := a.jobClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	// jobCall rather than Delete: the shard answers with the job as it was.
	j, err := c.jobCall(ctx, app, id, false, &messages.DeleteJob{App: app, Id: id})
	return http.StatusOK, j, err
}

func (a *admin) pauseJob(ctx context.Context, r *http.Request) (int, any, error) {
	c, app, id, err := a.jobClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	j, err := c.Pause(ctx, app, id)
	return http.StatusOK, j, err
}

func (a *admin) resumeJob(ctx context.Context, r *http.Request) (int, any, error) {
	c, app, id, err := a.jobClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	j, err := c.Resume(ctx, app, id)
	return http.StatusOK, j, err
}

// triggerJob fires a job now. The optional body {"params": …} replaces the job's
// params for this run: a string is base64, any other JSON value is taken verbatim.
func (a *admin) triggerJob(ctx context.Context, r *http.Request) (int, any, error) {
	body, err := readBody(r)
	if err != nil {
		return 0, nil, err
	}
	var params []byte
	if len(bytes.TrimSpace(body)) > 0 {
		var in struct {
			Params json.RawMessage `json:"params"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			return 0, nil, invalid("body", "want {\"params\": …}: %v", err)
		}
		p := bytes.TrimSpace(in.Params)
		switch {
		case len(p) == 0 || string(p) == "null":
		case p[0] == '"':
			var s string
			_ = json.Unmarshal(p, &s)
			if params, err = base64.StdEncoding.DecodeString(s); err != nil {
				return 0, nil, invalid("params", "a string is base64 (send JSON params as an object): %v", err)
			}
		default:
			params = p
		}
	}
	c, app, id, err := a.jobClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	j, err := c.Trigger(ctx, app, id, params)
	return http.StatusOK, j, err
}

func (a *admin) runs(ctx context.Context, r *http.Request) (int, any, error) {
	limit, err := queryInt(r, "limit")
	if err != nil {
		return 0, nil, err
	}
	c, app, id, err := a.jobClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	rs, err := c.Runs(ctx, app, id, int(limit))
	if err != nil {
		return 0, nil, err
	}
	body, err := list("runs", rs, "", "")
	return http.StatusOK, body, err
}

// ---------------------------------------------------------------- dead letters

func (a *admin) deadClient(ctx context.Context, r *http.Request) (*Client, string, error) {
	app, err := pathApp(r)
	if err != nil {
		return nil, "", err
	}
	c, err := a.client(ctx)
	if err != nil {
		return nil, "", err
	}
	return c, app, a.knownApp(ctx, c, app)
}

func (a *admin) listDead(ctx context.Context, r *http.Request) (int, any, error) {
	limit, err := queryInt(r, "limit")
	if err != nil {
		return 0, nil, err
	}
	c, app, err := a.deadClient(ctx, r)
	var ds []*messages.DeadLetter
	next := ""
	switch {
	case errors.Is(err, kerr.ErrNotFound): // an app without shards has no dead letters
	case err != nil:
		return 0, nil, err
	default:
		if ds, next, err = c.DeadLetters(ctx, app, r.URL.Query().Get("after"), int(limit)); err != nil {
			return 0, nil, err
		}
	}
	body, err := list("dead_letters", ds, "next_after_run_id", next)
	return http.StatusOK, body, err
}

func (a *admin) getDead(ctx context.Context, r *http.Request) (int, any, error) {
	c, app, err := a.deadClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	d, err := c.DeadLetter(ctx, app, r.PathValue("run_id"))
	return http.StatusOK, d, err
}

func (a *admin) replayDead(ctx context.Context, r *http.Request) (int, any, error) {
	c, app, err := a.deadClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	d, err := c.Replay(ctx, app, r.PathValue("run_id"))
	return http.StatusOK, d, err
}

func (a *admin) purgeDead(ctx context.Context, r *http.Request) (int, any, error) {
	c, app, err := a.deadClient(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	n, err := c.Purge(ctx, app, r.PathValue("run_id"))
	return http.StatusOK, map[string]int{"purged": n}, err
}

func (a *admin) purgeAllDead(ctx context.Context, r *http.Request) (int, any, error) {
	if r.URL.Query().Get("all") != "true" {
		return 0, nil, invalid("all", "purging every dead letter of an app needs ?all=true")
	}
	c, app, err := a.deadClient(ctx, r)
	if errors.Is(err, kerr.ErrNotFound) {
		return http.StatusOK, map[string]int{"purged": 0}, nil
	}
	if err != nil {
		return 0, nil, err
	}
	n, err := c.Purge(ctx, app, "")
	return http.StatusOK, map[string]int{"purged": n}, err
}

// ---------------------------------------------------------------- cluster

func (a *admin) cluster(ctx context.Context, _ *http.Request) (int, any, error) {
	c, err := a.client(ctx)
	if err != nil {
		return 0, nil, err
	}
	s, err := c.Status(ctx)
	return http.StatusOK, s, err
}

// ---------------------------------------------------------------- helpers

// statusWriter remembers the status for kjob_admin_requests_total.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// jsonFallback turns the mux's plain-text 404 and 405 into the API's JSON errors
// (keeping its Allow header).
type jsonFallback struct {
	w      http.ResponseWriter
	status int
}

func (j *jsonFallback) Header() http.Header { return j.w.Header() }

func (j *jsonFallback) WriteHeader(code int) {
	if j.status != 0 {
		return
	}
	j.status = code
	e := errorDetail{Code: messages.Code_NOT_FOUND.String(), Message: "no such endpoint"}
	if code == http.StatusMethodNotAllowed {
		e = errorDetail{Code: messages.Code_INVALID_ARGUMENT.String(), Field: "method",
			Message: "method not allowed here; allowed: " + j.w.Header().Get("Allow")}
	}
	writeJSON(j.w, code, errorBody{Error: e})
}

func (j *jsonFallback) Write(b []byte) (int, error) {
	if j.status == 0 {
		j.WriteHeader(http.StatusOK)
	}
	return len(b), nil // the mux's plain text is replaced
}

// promLogger sends promhttp's errors to slog.
type promLogger struct{ log *slog.Logger }

func (p promLogger) Println(v ...any) {
	p.log.Warn("metrics: " + strings.TrimSpace(fmt.Sprintln(v...)))
}
