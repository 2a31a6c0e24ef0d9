package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/bwmarrin/snowflake"
	"google.golang.org/protobuf/proto"

	"github.com/kjob/kjob/actors/kerr"
	nscore "github.com/kjob/kjob/actors/nameserver/core"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/messages"
)

// Client timing and bounds.
const (
	requestTimeout  = 3 * time.Second
	backoffMin      = 20 * time.Millisecond
	backoffMax      = 1 * time.Second
	defaultDeadline = 30 * time.Second
	leaseRenewEvery = 1 * time.Second
)

// ClientConfig configures a client.
type ClientConfig struct {
	Servers []string // remote addresses of some or all servers
	Listen  string   // local remote address for replies; default 127.0.0.1:0
	Log     *slog.Logger
	// ActorLogLevel is the level from which proto.actor's own logs pass (default WARN).
	ActorLogLevel slog.Level
	// NoBatch sends every create alone, never in a batch (batch.go).
	NoBatch bool
	// TLS, if set, is the cluster's mutual TLS (LoadTLS): required when the
	// servers run with it.
	TLS *TLS
}

// Client is the Go API for jobs: it generates snowflake ids with a leased node id,
// routes each request to the shard owning the job and treats it as done only on the
// shard's durable acknowledgement. Requests that time out are retried with back-off
// after refreshing the route; the id makes a retried create idempotent.
type Client struct {
	cfg    ClientConfig
	system *actor.ActorSystem
	rem    *remote.Remote
	log    *slog.Logger

	mu       sync.Mutex
	routes   map[string][]*messages.RouteEntry // by app
	batchers map[batcherKey]*batcher           // by shard actor (batch.go)
	batches  atomic.Int64                      // batches sent (batch.go)
	batched  atomic.Int64                      // creates sent in them
	packed   atomic.Int64                      // batches of them sent packed
	next     int                               // server round robin
	node     *snowflake.Node
	nodeID   int64
	holder   string
	stop     chan struct{}
	wg       sync.WaitGroup
}

func newSystem(log *slog.Logger, listen string, level slog.Level, t *TLS, kind endpointKind) (*actor.ActorSystem, *remote.Remote, error) {
	if err := checkRole(t, kind); err != nil {
		return nil, nil, err
	}
	if level == 0 {
		level = slog.LevelWarn
	}
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	host, port, err := splitHostPort(listen)
	if err != nil {
		return nil, nil, err
	}
	sys := actor.NewActorSystemWithConfig(actor.Configure(actor.WithLoggerFactory(actorLogger(log, level))))
	g := &roleGuard{kind: kind, addr: sys.Address, log: log}
	r := remote.NewRemote(sys, remoteConfig(host, port, t, g))
	var startErr error
	func() {
		defer func() {
			if p := recover(); p != nil {
				startErr = fmt.Errorf("listen on %s: %v", listen, p)
			}
		}()
		r.Start()
	}()
	return sys, r, startErr
}

// NewClient connects to the cluster through any of cfg.Servers and leases a
// snowflake node id that no other live client holds.
func NewClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if len(cfg.Servers) == 0 {
		return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "servers", Message: "at least one server address is required"}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	sys, rem, err := newSystem(cfg.Log, cfg.Listen, cfg.ActorLogLevel, cfg.TLS, kindClient)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, system: sys, rem: rem, log: cfg.Log, routes: map[string][]*messages.RouteEntry{},
		nodeID: -1, holder: sys.ID, stop: make(chan struct{})}
	if err := c.lease(ctx); err != nil {
		c.Close()
		return nil, err
	}
	c.wg.Add(1)
	go c.renew()
	return c, nil
}

// Close releases the client's resources.
func (c *Client) Close() {
	select {
	case <-c.stop:
		return
	default:
		close(c.stop)
	}
	c.wg.Wait()
	c.rem.Shutdown(false)
	c.system.Shutdown()
}

func (c *Client) lease(ctx context.Context) error {
	back := backoffMin
	c.mu.Lock()
	probed := c.node != nil // only a first lease is probed
	c.mu.Unlock()
	for {
		r, err := c.toServer(ctx, &messages.LeaseNode{Holder: c.holder, Node: c.nodeID})
		if err == nil {
			rep, ok := r.(*messages.LeaseNodeReply)
			if !ok {
				err = fmt.Errorf("unexpected reply %T", r)
			} else if err = kerr.FromWire(rep.Error); err == nil {
				c.mu.Lock()
				if c.node == nil || rep.Node != c.nodeID {
					c.node, err = snowflake.NewNode(rep.Node)
					c.nodeID = rep.Node
				}
				c.mu.Unlock()
				return err
			}
		}
		if !retryable(err) {
			return err
		}
		if !probed {
			// A first lease that fails may be a TLS setting that differs from
			// the servers': say so now rather than time out. Looked at until a
			// server was reached.
			var terr error
			if terr, probed = probeTLS(ctx, c.cfg.Servers, c.cfg.TLS); terr != nil {
				return fmt.Errorf("lease a snowflake node id: %w", terr)
			}
		}
		if e := sleepCtx(ctx, back); e != nil {
			return fmt.Errorf("lease a snowflake node id: %w (last error: %w)", e, err)
		}
		back = min(back*2, backoffMax)
	}
}

func (c *Client) renew() {
	defer c.wg.Done()
	t := time.NewTicker(leaseRenewEvery)
	defer t.Stop()
	expiry := &expiryWarner{t: c.cfg.TLS, log: c.log, what: "client"}
	expiry.check(time.Now())
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			expiry.check(now)
			ctx, cancel := context.WithTimeout(context.Background(), leaseRenewEvery)
			if err := c.lease(ctx); err != nil {
				c.log.Warn("renew snowflake node lease", "err", err)
			}
			cancel()
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryable says whether a request should be retried after a route refresh.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, kerr.ErrUnavailable) || errors.Is(err, kerr.ErrNotOwner) ||
		errors.Is(err, actor.ErrTimeout) || errors.Is(err, actor.ErrDeadLetter) || errors.Is(err, errTransport)
}

var errTransport = errors.New("kjob: transport")

// request sends m to pid and waits for its reply.
func (c *Client) request(ctx context.Context, pid *actor.PID, m proto.Message) (any, error) {
	timeout := requestTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return nil, ctx.Err()
	}
	r, err := c.system.Root.RequestFuture(pid, m, timeout).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errTransport, pid.Address, err)
	}
	return r, nil
}

// toServer sends m to the server actor of the next address, trying each once.
func (c *Client) toServer(ctx context.Context, m proto.Message) (any, error) {
	var last error
	for range c.cfg.Servers {
		c.mu.Lock()
		addr := c.cfg.Servers[c.next%len(c.cfg.Servers)]
		c.mu.Unlock()
		r, err := c.request(ctx, actor.NewPID(addr, server.Name), m)
		if err == nil {
			return r, nil
		}
		last = err
		c.mu.Lock()
		c.next++
		c.mu.Unlock()
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

// refresh pulls the route table of app (placing its first shard when ensure).
func (c *Client) refresh(ctx context.Context, app string, ensure bool) error {
	r, err := c.toServer(ctx, &messages.GetRoutes{App: app, Ensure: ensure})
	if err != nil {
		return err
	}
	t, ok := r.(*messages.RouteTable)
	if !ok {
		return fmt.Errorf("unexpected reply %T", r)
	}
	if rs := usableRoutes(app, t.Routes); len(rs) > 0 {
		if len(rs) < len(t.Routes) {
			c.log.Warn("route table: entries the client cannot use are ignored", "app", app, "ignored", len(t.Routes)-len(rs))
		}
		c.mu.Lock()
		c.routes[app] = rs
		c.mu.Unlock()
		return nil
	}
	if err := kerr.FromWire(t.Error); err != nil {
		return err
	}
	if len(t.Routes) > 0 { // all unusable: the app has shards, the client cannot reach them (yet)
		return &kerr.Error{Code: messages.Code_UNAVAILABLE, Message: fmt.Sprintf("no usable route of app %q (%d entries ignored)", app, len(t.Routes))}
	}
	if t.Complete && !ensure {
		// The NameServer has heard from every live server: the app has no shard, so
		// nothing was ever created in it. Say so now rather than retry until the deadline.
		return &kerr.Error{Code: messages.Code_NOT_FOUND, Field: "app", Message: fmt.Sprintf("app %q has no shard: no job was ever created in it", app)}
	}
	return &kerr.Error{Code: messages.Code_UNAVAILABLE, Message: fmt.Sprintf("no shard of app %q is known yet", app)}
}

// usableRoutes keeps the entries of rs the client can route app's requests by: of
// app, and routes the NameServer would keep (nscore.ValidRoute: a shard's name
// agreeing with its app, level and index, an owner to send to; an entry without
// one took the client down: call, List and fanOut send to its owner).
func usableRoutes(app string, rs []*messages.RouteEntry) []*messages.RouteEntry {
	out := rs[:0:0]
	for _, r := range rs {
		if r.GetApp() == app && nscore.ValidRoute(r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// shardFor is the route entry of the deepest shard of app holding id (route.Lookup's
// rule, without building a []route.Shard and names per request).
func (c *Client) shardFor(app string, id int64) *messages.RouteEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shardForLocked(app, id)
}

// shardForLocked is shardFor with c.mu held.
func (c *Client) shardForLocked(app string, id int64) *messages.RouteEntry {
	h := route.Hash(id)
	var best *messages.RouteEntry
	for _, r := range c.routes[app] {
		s := route.Shard{App: r.App, Level: int(r.Level), Index: r.Index}
		if s.Contains(h) && (best == nil || r.Level > best.Level) {
			best = r
		}
	}
	return best
}

// call routes a request for job id of app to its shard, retrying through route
// refreshes with back-off until ctx ends.
func (c *Client) call(ctx context.Context, app string, id int64, ensure bool, m proto.Message) (any, error) {
	if why := route.ValidApp(app); why != "" {
		return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "app", Message: why}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultDeadline)
		defer cancel()
	}
	back := backoffMin
	var last error
	for {
		e := c.shardFor(app, id)
		if e == nil {
			last = c.refresh(ctx, app, ensure)
			e = c.shardFor(app, id)
		}
		if e != nil {
			r, err := c.request(ctx, actor.NewPID(e.Owner.Address, e.Owner.Id), m)
			if err == nil {
				if werr := replyError(r); werr != nil && retryable(werr) {
					err = werr
				} else {
					return r, nil
				}
			}
			last = err
			c.mu.Lock()
			delete(c.routes, app) // refresh before the next try
			c.mu.Unlock()
		}
		if !retryable(last) {
			return nil, last
		}
		if err := sleepCtx(ctx, back); err != nil {
			return nil, fmt.Errorf("%w (last error: %w)", err, last)
		}
		back = min(back*2, backoffMax)
	}
}

func replyError(r any) error {
	switch x := r.(type) {
	case *messages.JobReply:
		return kerr.FromWire(x.Error)
	case *messages.ListJobsReply:
		return kerr.FromWire(x.Error)
	case *messages.RunsReply:
		return kerr.FromWire(x.Error)
	case *messages.DeadLettersReply:
		return kerr.FromWire(x.Error)
	case *messages.DeadLetterReply:
		return kerr.FromWire(x.Error)
	}
	return fmt.Errorf("unexpected reply %T", r)
}

// NewID returns a fresh snowflake job id from the client's leased node.
func (c *Client) NewID() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.node.Generate().Int64()
}

func (c *Client) jobCall(ctx context.Context, app string, id int64, ensure bool, m proto.Message) (*messages.Job, error) {
	r, err := c.call(ctx, app, id, ensure, m)
	if err != nil {
		return nil, err
	}
	if err := replyError(r); err != nil {
		return nil, err
	}
	return r.(*messages.JobReply).Job, nil
}

// Create durably creates job j (its id is generated when zero) and returns it as
// stored. Creating the same id with the same definition again is a no-op. The
// returned job may share j's Params, Schedule and Policy (a batched create is
// answered without its definition, which the client holds: see CreateJobs), so
// change neither after the call.
func (c *Client) Create(ctx context.Context, j *messages.Job) (*messages.Job, error) {
	if j == nil {
		return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "job", Message: "is required"}
	}
	if j.Id == 0 {
		j = proto.Clone(j).(*messages.Job)
		j.Id = c.NewID()
	}
	if len(j.Params) > maxParams {
		return nil, &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: "params",
			Message: fmt.Sprintf("%d bytes exceeds the limit of %d bytes", len(j.Params), maxParams)}
	}
	if err := checkUTF8(j); err != nil {
		return nil, err
	}
	m := &messages.CreateJob{Job: j, RequestId: c.NewID()}
	if !c.cfg.NoBatch {
		if r, done, err := c.createBatched(ctx, m); done {
			return r, err
		}
	}
	return c.jobCall(ctx, j.App, j.Id, true, m)
}

const maxParams = 64 << 10

// checkUTF8 refuses a job with a string field that is not UTF-8: protobuf does not
// marshal one, and the remote layer would drop the request, leaving the caller to
// time out instead of being told which field is wrong.
func checkUTF8(j *messages.Job) error {
	for _, f := range [...]struct{ name, v string }{{"app", j.GetApp()}, {"handler", j.GetHandler()},
		{"schedule.cron", j.GetSchedule().GetCron()}, {"schedule.tz", j.GetSchedule().GetTz()}, {"policy.route_key", j.GetPolicy().GetRouteKey()}} {
		if !utf8.ValidString(f.v) {
			return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: f.name, Message: fmt.Sprintf("%q is not valid UTF-8", f.v)}
		}
	}
	return nil
}

// Get returns a job.
func (c *Client) Get(ctx context.Context, app string, id int64) (*messages.Job, error) {
	return c.jobCall(ctx, app, id, false, &messages.GetJob{App: app, Id: id})
}

// Delete deletes a job; after it returns the job never fires again.
func (c *Client) Delete(ctx context.Context, app string, id int64) error {
	_, err := c.jobCall(ctx, app, id, false, &messages.DeleteJob{App: app, Id: id, RequestId: c.NewID()})
	return err
}

// Update replaces a job's definition (bumping its version).
func (c *Client) Update(ctx context.Context, j *messages.Job) (*messages.Job, error) {
	if err := checkUTF8(j); err != nil {
		return nil, err
	}
	return c.jobCall(ctx, j.GetApp(), j.GetId(), false, &messages.UpdateJob{Job: j, RequestId: c.NewID()})
}

// Pause stops a job from firing until Resume.
func (c *Client) Pause(ctx context.Context, app string, id int64) (*messages.Job, error) {
	return c.jobCall(ctx, app, id, false, &messages.PauseJob{App: app, Id: id, RequestId: c.NewID()})
}

// Resume lets a paused job fire again (fire times passed while paused are skipped).
func (c *Client) Resume(ctx context.Context, app string, id int64) (*messages.Job, error) {
	return c.jobCall(ctx, app, id, false, &messages.ResumeJob{App: app, Id: id, RequestId: c.NewID()})
}

// Trigger fires a job now; params, when non-nil, replace the job's for this run.
func (c *Client) Trigger(ctx context.Context, app string, id int64, params []byte) (*messages.Job, error) {
	return c.jobCall(ctx, app, id, false, &messages.TriggerJob{App: app, Id: id, Params: params, HasParams: params != nil, RequestId: c.NewID()})
}

// Runs returns a job's recent runs, newest first (runs in progress first).
func (c *Client) Runs(ctx context.Context, app string, id int64, limit int) ([]*messages.RunRecord, error) {
	lim, err := wireLimit(limit)
	if err != nil {
		return nil, err
	}
	r, err := c.call(ctx, app, id, false, &messages.GetRuns{App: app, Id: id, Limit: lim})
	if err != nil {
		return nil, err
	}
	if err := replyError(r); err != nil {
		return nil, err
	}
	return r.(*messages.RunsReply).Runs, nil
}

// wireLimit is a page size as the wire carries it (int32): one past its range is
// refused here, where it would wrap to another size.
func wireLimit(n int) (int32, error) {
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, kerr.FromWire(kerr.Invalid("limit", "%d does not fit the wire's 32 bits (%d to %d)", n, math.MinInt32, math.MaxInt32))
	}
	return int32(n), nil
}

// ListOptions filter and page a job listing.
type ListOptions struct {
	State   messages.JobState
	Handler string
	AfterID int64 // page after this id (the previous page's Next)
	Limit   int
}

// List lists an app's jobs in id order across all its shards. next is the AfterID
// of the following page (0 when this is the last page).
func (c *Client) List(ctx context.Context, app string, o ListOptions) (jobs []*messages.Job, next int64, err error) {
	if o.Limit <= 0 {
		o.Limit = 100
	}
	lim, err := wireLimit(o.Limit)
	if err != nil {
		return nil, 0, err
	}
	if err := c.refresh(ctx, app, false); err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	rs := append([]*messages.RouteEntry(nil), c.routes[app]...)
	c.mu.Unlock()
	var all []*messages.Job
	more := false
	for _, r := range rs {
		rep, err := c.request(ctx, actor.NewPID(r.Owner.Address, r.Owner.Id), &messages.ListJobs{App: app, State: o.State,
			Handler: o.Handler, AfterId: o.AfterID, Limit: lim})
		if err != nil {
			return nil, 0, err
		}
		if err := replyError(rep); err != nil {
			return nil, 0, err
		}
		lr := rep.(*messages.ListJobsReply)
		all = append(all, lr.Jobs...)
		more = more || lr.NextAfterId != 0
	}
	sortJobs(all)
	if len(all) > o.Limit {
		all, more = all[:o.Limit], true
	}
	if more && len(all) > 0 {
		next = all[len(all)-1].Id
	}
	return all, next, nil
}

// Status returns the cluster's status as the NameServer sees it.
func (c *Client) Status(ctx context.Context) (*messages.ClusterStatusReply, error) {
	r, err := c.toServer(ctx, &messages.ClusterStatus{})
	if err != nil {
		return nil, err
	}
	s, ok := r.(*messages.ClusterStatusReply)
	if !ok {
		return nil, fmt.Errorf("unexpected reply %T", r)
	}
	return s, kerr.FromWire(s.Error)
}
