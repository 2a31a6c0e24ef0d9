package cluster

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/actors/server"
	"github.com/kjob/kjob/messages"
)

// Role is what a certificate lets its endpoint do in a cluster with mutual TLS.
//
// Without a role (RoleAny: a server's certificate, and every certificate issued
// before roles) an endpoint is a member in any role, as TLS describes. A client's
// certificate (kjob tls issue --role client) sends commands and reads, and
// nothing a server or a worker sends: it cannot register as a worker (and so be
// given jobs' params), report results, or pose as a server. A worker's (--role
// worker) registers, heartbeats and reports its runs' results, and nothing else:
// a host that runs business code cannot create, change, delete or read jobs, or
// replay dead letters. A worker's certificate may be bound to apps (kjob tls
// issue --role worker --app shop, the OU "kjob-app=shop", one per app): it then
// registers, leaves and reports results for those apps only, so a team's worker
// hosts are never dispatched another team's jobs and params. Unbound, it may
// register for any app, as any worker id. Clients
// and workers take messages only from servers (a client's or worker's
// certificate cannot send them dispatches or route tables), a restricted peer's
// messages must be for the server it sends them to (proto.actor would relay
// others, with the server's certificate), and the admin API's routes refuse a
// worker's certificate.
//
// The role is the certificate's subject organizational unit "kjob-role=<role>".
// A server refuses what a peer's role does not allow by ending its stream with
// PERMISSION_DENIED (and logs it); an endpoint started with a certificate whose
// role does not fit it (a client with a worker's) is refused at once, on tls-cert.
type Role string

const (
	RoleAny    Role = ""
	RoleServer Role = "server"
	RoleClient Role = "client"
	RoleWorker Role = "worker"
)

// roleOU is the prefix of the subject organizational unit that holds a role.
const roleOU = "kjob-role="

// ParseRole is the role named s ("" is RoleAny).
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RoleAny, RoleServer, RoleClient, RoleWorker:
		return r, nil
	}
	return "", tlsErr("role", fmt.Sprintf("%q is not a role: server, client or worker (none: any)", s))
}

// RoleOf is cert's role. A certificate with an unknown role, or two, has none
// that a peer accepts: ok is false.
func RoleOf(cert *x509.Certificate) (r Role, ok bool) {
	vals, ok := ouValues(cert, roleOU)
	switch {
	case !ok || len(vals) > 1:
		return "", false
	case len(vals) == 0:
		return RoleAny, true
	}
	if r, err := ParseRole(vals[0]); err == nil && r != RoleAny {
		return r, true
	}
	return "", false
}

// appOU is the prefix of the subject organizational units that bind a worker's
// certificate to apps.
const appOU = "kjob-app="

// AppsOf is the apps cert is bound to (nil: none, any app). A binding spelled
// otherwise than kjob tls issue spells it, or naming no valid app, binds to no
// app a peer takes: ok is false.
func AppsOf(cert *x509.Certificate) (apps []string, ok bool) {
	apps, ok = ouValues(cert, appOU)
	for _, a := range apps {
		if route.ValidApp(a) != "" {
			return nil, false
		}
	}
	return apps, ok
}

// ouValues is the values of cert's subject organizational units "prefix<value>".
// One spelled otherwise than kjob tls issue spells it ("KJOB-ROLE=client",
// " kjob-app=shop") makes ok false: it grants nothing, rather than being taken for
// absent (which, for a role, would be any).
func ouValues(cert *x509.Certificate, prefix string) (vals []string, ok bool) {
	for _, ou := range cert.Subject.OrganizationalUnit {
		if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ou)), prefix[:len(prefix)-1]) {
			continue
		}
		v, is := strings.CutPrefix(ou, prefix)
		if !is {
			return nil, false
		}
		vals = append(vals, v)
	}
	return vals, true
}

// endpointKind is what a remote serves: a node, a client or a worker.
type endpointKind int

const (
	kindServer endpointKind = iota
	kindClient
	kindWorker
)

func (k endpointKind) String() string {
	return [...]string{"a server", "a client", "a worker"}[k]
}

// fits says whether an endpoint of kind k may run with a certificate of role r.
func (k endpointKind) fits(r Role) bool {
	switch r {
	case RoleAny, RoleServer:
		return true
	case RoleClient:
		return k == kindClient
	case RoleWorker:
		return k == kindWorker
	}
	return false
}

// checkRole refuses t for an endpoint of kind k whose certificate's role does
// not fit it.
func checkRole(t *TLS, k endpointKind) error {
	if t == nil {
		return nil
	}
	r, ok := RoleOf(t.Leaf())
	if !ok {
		return tlsErr("tls-cert", fmt.Sprintf("has an organizational unit %q... that names no role, or two: a peer accepts nothing from it", roleOU))
	}
	if !k.fits(r) {
		return tlsErr("tls-cert", fmt.Sprintf("is a %s certificate (role %s): it may not run %s", r, r, k))
	}
	if apps, ok := AppsOf(t.Leaf()); !ok || (len(apps) > 0 && r != RoleWorker) {
		return tlsErr("tls-cert", fmt.Sprintf("has an organizational unit %q... that binds it to no valid app, or binds a certificate that is not a worker's", appOU))
	}
	return nil
}

// checkWorkerApp refuses t for a worker of app when t's certificate is bound to
// other apps, and a bound worker's id (when set) that does not begin with its app.
func checkWorkerApp(t *TLS, app, id string) error {
	if t == nil {
		return nil
	}
	apps, _ := AppsOf(t.Leaf()) // (checkRole refused a bad binding)
	if len(apps) > 0 && !slices.Contains(apps, app) {
		return tlsErr("tls-cert", fmt.Sprintf("is bound to app(s) %s, not %s", strings.Join(apps, ", "), app))
	}
	if len(apps) > 0 && id != "" && !strings.HasPrefix(id, app+"-") {
		return tlsErr("id", fmt.Sprintf("%q: a worker whose certificate is bound to apps has an id that begins with its app and a dash (%s-…), as the default id does", id, app))
	}
	return nil
}

// Messages a server takes from a peer with a client's or a worker's role (by
// protobuf full name); a server's or a role-less peer's are all taken.
var (
	clientMessages = typeSet(&messages.CreateJob{}, &messages.CreateJobs{}, &messages.UpdateJob{}, &messages.DeleteJob{},
		&messages.PauseJob{}, &messages.ResumeJob{}, &messages.TriggerJob{}, &messages.GetJob{}, &messages.ListJobs{},
		&messages.GetRuns{}, &messages.GetRoutes{}, &messages.LeaseNode{}, &messages.ClusterStatus{},
		&messages.ListDeadLetters{}, &messages.GetDeadLetter{}, &messages.ReplayDeadLetter{}, &messages.PurgeDeadLetters{},
		&messages.Ping{})
	workerMessages = typeSet(&messages.WorkerHeartbeat{}, &messages.WorkerLeft{}, &messages.RunResult{}, &messages.RunResults{})
)

func typeSet(ms ...proto.Message) map[string]bool {
	s := make(map[string]bool, len(ms))
	for _, m := range ms {
		s[string(proto.MessageName(m))] = true
	}
	return s
}

// allowed is the messages an endpoint of kind k takes from a peer of role r: nil
// for all of them.
func (k endpointKind) allowed(r Role) (set map[string]bool, all bool) {
	if r == RoleAny || r == RoleServer {
		return nil, true
	}
	if k != kindServer {
		return map[string]bool{}, false // clients and workers hear from servers only
	}
	if r == RoleClient {
		return clientMessages, false
	}
	return workerMessages, false
}

// roleGuard checks what peers send an endpoint's remote (gRPC) server before
// proto.actor's endpoint reader sees it: their certificates' roles (with TLS),
// and, from every peer, that each batch is one proto.actor can take. The endpoint
// reader indexes a batch's targets, senders and serializers unchecked and decodes
// an unknown type name through a nil lookup, on a goroutine nothing recovers: one
// malformed batch, or a message type this build does not know (a newer version's,
// during a rolling upgrade), stopped the whole process. Its two diagnostic calls
// (ListProcesses, GetProcessDiagnostics) panic as well, and are refused.
type roleGuard struct {
	kind      endpointKind
	addr      func() string // the endpoint's own address (proto.actor's), once it listens
	log       *slog.Logger
	refused   atomic.Int64 // streams and calls ended for a peer's role
	malformed atomic.Int64 // streams ended for a batch proto.actor cannot take
	unknown   atomic.Int64 // messages of a type this build does not know, dropped
}

// peerCert is the certificate the peer of ctx presented, nil without TLS.
func peerCert(ctx context.Context) *x509.Certificate {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, isTLS := p.AuthInfo.(credentials.TLSInfo); isTLS && len(ti.State.PeerCertificates) > 0 {
			return ti.State.PeerCertificates[0]
		}
	}
	return nil
}

// peerRole is the role of the peer's certificate (RoleAny without TLS: no roles,
// and no identity, to enforce); ok is false for a certificate whose role is not
// one (refused like a role with no rights).
func peerRole(ctx context.Context) (Role, bool) {
	if c := peerCert(ctx); c != nil {
		return RoleOf(c)
	}
	return RoleAny, true
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return p.Addr.String()
	}
	return "?"
}

func (g *roleGuard) warn(msg string, args ...any) {
	g.log.Warn(msg, args...)
}

func (g *roleGuard) deny(ctx context.Context, r Role, what string) error {
	g.refused.Add(1)
	g.warn("refused a peer's message: its certificate's role does not allow it", "peer", peerAddr(ctx), "role", string(r), "message", what)
	return status.Errorf(codes.PermissionDenied, "kjob tls: %s refuses %s from a peer whose certificate has role %q", g.kind, what, r)
}

func (g *roleGuard) reject(ctx context.Context, what string) error {
	g.malformed.Add(1)
	g.warn("refused a peer's batch: proto.actor cannot take it", "peer", peerAddr(ctx), "batch", what)
	return status.Errorf(codes.InvalidArgument, "kjob: %s refuses a batch with %s", g.kind, what)
}

func (g *roleGuard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	// proto.actor's ListProcesses and GetProcessDiagnostics panic ("implement
	// me"); nothing in kjob calls them.
	return nil, status.Errorf(codes.Unimplemented, "kjob: %s does not serve %s", g.kind, info.FullMethod)
}

func (g *roleGuard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	r, ok := peerRole(ss.Context())
	if !ok {
		return g.deny(ss.Context(), r, info.FullMethod)
	}
	set, all := g.kind.allowed(r)
	if !all && len(set) == 0 {
		return g.deny(ss.Context(), r, info.FullMethod)
	}
	gs := &guardedStream{ServerStream: ss, g: g, role: r, set: set, restricted: !all}
	if r == RoleWorker {
		apps, ok := AppsOf(peerCert(ss.Context())) // (a worker's role comes with TLS)
		if !ok {
			return g.deny(ss.Context(), r, "a certificate bound to no valid app")
		}
		if len(apps) > 0 {
			gs.apps = make(map[string]bool, len(apps))
			for _, a := range apps {
				gs.apps[a] = true
			}
		}
	}
	return h(srv, gs)
}

// guardedStream checks every batch a peer sends before proto.actor's endpoint
// reader sees it.
type guardedStream struct {
	grpc.ServerStream
	g          *roleGuard
	role       Role
	set        map[string]bool // what a restricted peer may send
	restricted bool
	apps       map[string]bool // a worker's certificate's apps (nil: any)
	known      []bool          // scratch: the batch's type names this build knows
}

func (s *guardedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	rm, ok := m.(*remote.RemoteMessage)
	if !ok {
		return s.g.reject(s.Context(), fmt.Sprintf("a %T", m))
	}
	if b := rm.GetMessageBatch(); b != nil {
		return s.check(b)
	}
	return nil // connect and disconnect requests
}

// check refuses a batch proto.actor cannot take or the peer's role may not send,
// and drops the messages of types this build does not know.
func (s *guardedStream) check(b *remote.MessageBatch) error {
	ctx := s.Context()
	s.known = s.known[:0]
	for _, name := range b.TypeNames {
		_, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
		s.known = append(s.known, err == nil)
	}
	// (Protobuf decodes no nil element of a repeated field: every target, sender
	// and envelope is there.)
	for _, t := range b.Targets {
		// A target elsewhere is sent on by proto.actor, with this endpoint's
		// certificate: a relay a restricted peer may not use.
		if s.restricted && t.Address != s.g.addr() {
			return s.g.deny(ctx, s.role, "a message for "+t.Address)
		}
	}
	dropped := 0
	for i, e := range b.Envelopes {
		switch {
		case e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames):
			return s.g.reject(ctx, fmt.Sprintf("type %d of %d", e.TypeId, len(b.TypeNames)))
		case e.Target < 0 || int(e.Target) >= len(b.Targets):
			return s.g.reject(ctx, fmt.Sprintf("target %d of %d", e.Target, len(b.Targets)))
		case e.Sender < 0 || int(e.Sender) > len(b.Senders):
			return s.g.reject(ctx, fmt.Sprintf("sender %d of %d", e.Sender, len(b.Senders)))
		case e.SerializerId != 0 && (s.restricted || e.SerializerId != 1):
			return s.g.reject(ctx, fmt.Sprintf("serializer %d", e.SerializerId)) // 0 protobuf, 1 JSON (kjob sends protobuf)
		}
		name := b.TypeNames[e.TypeId]
		if s.restricted && !s.set[name] {
			return s.g.deny(ctx, s.role, name)
		}
		if s.apps != nil {
			if app, ok := appOfWorkerMessage(name, e.MessageData, s.apps); !ok {
				return s.g.deny(ctx, s.role, fmt.Sprintf("%s for app %q (the certificate is bound to others)", name, app))
			}
			// And it goes to the server, or to a shard of a bound app: a shard
			// takes a result by its run id, whatever shard the result names.
			if app, ok := appOfTarget(b.Targets[e.Target].Id, s.apps); !ok {
				return s.g.deny(ctx, s.role, fmt.Sprintf("%s for %s (app %q; the certificate is bound to others)", name, b.Targets[e.Target].Id, app))
			}
		}
		if e.SerializerId == 0 && !s.known[e.TypeId] {
			s.g.unknown.Add(1)
			s.g.warn("dropped a message of a type this build does not know (a newer version's?)", "peer", peerAddr(ctx), "type", name)
			dropped++
			continue
		}
		b.Envelopes[i-dropped] = e
	}
	if dropped > 0 {
		clear(b.Envelopes[len(b.Envelopes)-dropped:])
		b.Envelopes = b.Envelopes[:len(b.Envelopes)-dropped]
	}
	return nil
}

// appOfWorkerMessage checks that a worker's message (one of workerMessages,
// encoded) is for one of apps: a heartbeat's or goodbye's app, or the app of each
// result's shard. It returns an app that is not, or ok.
func appOfWorkerMessage(name string, data []byte, apps map[string]bool) (string, bool) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil || !workerMessages[name] {
		return "", false
	}
	m := mt.New().Interface()
	if proto.Unmarshal(data, m) != nil {
		return "", false
	}
	shardApp := func(shard string) string {
		sh, err := route.Parse(shard)
		if err != nil {
			return ""
		}
		return sh.App
	}
	// A bound worker's id begins with its app (as a worker's default id does):
	// the NameServer keeps workers by id alone, so one bound to orders could
	// otherwise take over, or remove, billing's worker of the same id.
	switch v := m.(type) {
	case *messages.WorkerHeartbeat:
		a := v.GetWorker().GetApp()
		return a, apps[a] && strings.HasPrefix(v.GetWorker().GetWorkerId(), a+"-")
	case *messages.WorkerLeft:
		return v.App, apps[v.App] && strings.HasPrefix(v.WorkerId, v.App+"-")
	case *messages.RunResult:
		a := shardApp(v.Shard)
		return a, apps[a]
	case *messages.RunResults:
		for _, r := range v.Results {
			if a := shardApp(r.GetShard()); !apps[a] {
				return a, false
			}
		}
	}
	return "", true
}

// appOfTarget checks that an actor id a bound worker sends to is the server's, or
// one of its shards' (server.Name/shard-<shard>) of one of apps. It returns the
// app of a shard that is not, or ok.
func appOfTarget(id string, apps map[string]bool) (string, bool) {
	if id == server.Name {
		return "", true
	}
	name, ok := strings.CutPrefix(id, server.Name+"/"+server.ShardName(""))
	if !ok {
		return "", false
	}
	sh, err := route.Parse(name)
	if err != nil {
		return "", false
	}
	return sh.App, apps[sh.App]
}
