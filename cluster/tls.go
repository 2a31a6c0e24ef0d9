package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	"github.com/kjob/kjob/messages"
)

// TLS is a cluster's mutual TLS. Every kjob endpoint — server, client, worker —
// both listens (proto.actor's remote answers a sender by dialing its address) and
// dials, and with TLS it does both only with a peer that presents a certificate
// signed by the cluster's CA: a process without one can neither send a command,
// take a dispatch as a worker, nor pose as a server.
//
// The CA is the cluster's identity: every certificate it signed is a member, in
// the role it names (Role; without one, any). Host names are not checked, since
// clients and workers listen on addresses nobody can list in advance; keep the
// CA's key off the machines and issue each endpoint its own certificate (kjob tls
// issue).
type TLS struct {
	server *tls.Config // the remote's listener, and the admin HTTP's
	client *tls.Config // the remote's dials
	// files are reread when they change (material), when LoadTLS made t.
	files     TLSFiles
	cur       atomic.Pointer[tlsMaterial]
	checkAt   atomic.Int64 // Unix ns of the next look at the files
	reloadErr atomic.Pointer[error]
	reload    sync.Mutex // one look at a time
}

// tlsMaterial is what an endpoint's TLS files hold.
type tlsMaterial struct {
	cert  tls.Certificate
	roots *x509.CertPool
	stamp [3]fileStamp // the files' (CA, cert, key) as they were read
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// TLSReloadEvery is how often, at most, an endpoint whose TLS came from files
// (LoadTLS) looks at them, on its next handshake or metrics scrape: a certificate,
// key or CA file replaced (a renewal, a CA rotation) is used from then on, for new
// connections, with no restart. A set of files that does not load (a rotation
// half done: the certificate replaced and not yet its key) leaves the last good
// one in use and is tried again a look later (ReloadErr).
const TLSReloadEvery = time.Second

// TLSFiles names the PEM files of an endpoint's TLS: the CA's certificate (or
// several, during a CA rotation), and the endpoint's certificate (the chain up to
// the CA, leaf first) and private key.
type TLSFiles struct {
	CA, Cert, Key string
}

// Configured says whether any file is named.
func (f TLSFiles) Configured() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// tlsFile is one of TLSFiles with the field its errors name.
type tlsFile struct{ field, path string }

func (f TLSFiles) files() [3]tlsFile {
	return [3]tlsFile{{"tls-ca", f.CA}, {"tls-cert", f.Cert}, {"tls-key", f.Key}}
}

// LoadTLS reads f. It wants all three files or none (nil, nil); its errors are
// INVALID_ARGUMENT naming the field (tls-ca, tls-cert, tls-key). The files are
// reread when they change (TLSReloadEvery).
func LoadTLS(f TLSFiles) (*TLS, error) {
	if !f.Configured() {
		return nil, nil
	}
	for _, p := range f.files() {
		if p.path == "" {
			return nil, tlsErr(p.field, "is required with the other TLS files (tls-ca, tls-cert, tls-key)")
		}
	}
	m, err := loadMaterial(f)
	if err != nil {
		return nil, err
	}
	return newTLS(m, f), nil
}

// loadMaterial reads and checks f. The files are stamped before they are read, so
// that one replaced meanwhile is read again at the next look.
func loadMaterial(f TLSFiles) (*tlsMaterial, error) {
	stamp, err := stampFiles(f)
	if err != nil {
		return nil, err
	}
	var pems [3][]byte
	for i, p := range f.files() {
		if pems[i], err = os.ReadFile(p.path); err != nil {
			return nil, tlsErr(p.field, err.Error())
		}
	}
	m, err := parseMaterial(pems[0], pems[1], pems[2])
	if err != nil {
		return nil, err
	}
	m.stamp = stamp
	return m, nil
}

func stampFiles(f TLSFiles) (st [3]fileStamp, err error) {
	for i, p := range f.files() {
		fi, err := os.Stat(p.path)
		if err != nil {
			return st, tlsErr(p.field, err.Error())
		}
		st[i] = fileStamp{size: fi.Size(), mod: fi.ModTime()}
	}
	return st, nil
}

// NewTLS is LoadTLS on the files' contents (never reloaded).
func NewTLS(caPEM, certPEM, keyPEM []byte) (*TLS, error) {
	m, err := parseMaterial(caPEM, certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return newTLS(m, TLSFiles{}), nil
}

func parseMaterial(caPEM, certPEM, keyPEM []byte) (*tlsMaterial, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, tlsErr("tls-ca", "holds no PEM certificate")
	}
	if b, _ := pem.Decode(certPEM); b == nil || b.Type != "CERTIFICATE" {
		return nil, tlsErr("tls-cert", "holds no PEM certificate")
	}
	if b, _ := pem.Decode(keyPEM); b == nil {
		return nil, tlsErr("tls-key", "holds no PEM private key")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, tlsErr("tls-key", fmt.Sprintf("is not tls-cert's key: %v", err))
	}
	chain := make([]*x509.Certificate, len(cert.Certificate))
	for i, der := range cert.Certificate {
		if chain[i], err = x509.ParseCertificate(der); err != nil {
			return nil, tlsErr("tls-cert", err.Error())
		}
	}
	cert.Leaf = chain[0]
	// An endpoint whose own certificate its CA did not sign would be refused by
	// every peer, each of them logging a failed handshake: say so at the start.
	if err := verifyChain(roots, chain, time.Now()); err != nil {
		return nil, tlsErr("tls-cert", fmt.Sprintf("is not valid under tls-ca: %v", err))
	}
	return &tlsMaterial{cert: cert, roots: roots}, nil
}

func newTLS(m *tlsMaterial, files TLSFiles) *TLS {
	t := &TLS{files: files}
	t.cur.Store(m)
	t.checkAt.Store(time.Now().Add(TLSReloadEvery).UnixNano())
	verify := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("kjob tls: the peer presented no certificate")
		}
		return verifyChain(t.material().roots, cs.PeerCertificates, time.Now())
	}
	t.server = &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return &t.material().cert, nil
		},
		ClientAuth:       tls.RequireAnyClientCert, // verified by VerifyConnection
		VerifyConnection: verify,
	}
	t.client = &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &t.material().cert, nil
		},
		// The chain is verified by VerifyConnection, against the CA and without
		// the host name (see TLS).
		InsecureSkipVerify: true,
		VerifyConnection:   verify,
	}
	return t
}

// material is the endpoint's certificate and CA: the files' current ones, looked
// at at most once every TLSReloadEvery.
func (t *TLS) material() *tlsMaterial {
	m := t.cur.Load()
	if !t.files.Configured() {
		return m
	}
	now := time.Now()
	if now.UnixNano() < t.checkAt.Load() || !t.reload.TryLock() {
		return m
	}
	defer t.reload.Unlock()
	t.checkAt.Store(now.Add(TLSReloadEvery).UnixNano())
	if st, err := stampFiles(t.files); err == nil && st == m.stamp {
		t.reloadErr.Store(nil) // the files are the good set again (a rollback by mv)
		return m
	}
	nm, err := loadMaterial(t.files)
	if err != nil {
		t.reloadErr.Store(&err)
		return m
	}
	t.reloadErr.Store(nil)
	t.cur.Store(nm)
	return nm
}

// ReloadErr is why the files, changed since they were last read, do not load (the
// last good certificate and CA stay in use), or nil.
func (t *TLS) ReloadErr() error {
	if p := t.reloadErr.Load(); p != nil {
		return *p
	}
	return nil
}

// verifyChain checks that chain (leaf first; a handshake's peer certificates,
// parsed already) leads to one of roots.
func verifyChain(roots *x509.CertPool, chain []*x509.Certificate, now time.Time) error {
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// Leaf is the endpoint's own certificate (the current one: see TLSReloadEvery).
func (t *TLS) Leaf() *x509.Certificate { return t.material().cert.Leaf }

// HTTPClientConfig is a TLS configuration for an HTTPS client of a node's admin
// API: it presents the endpoint's certificate and verifies the node's against the
// CA, host name included (the admin API is reached by name; issue node
// certificates for the names and addresses it is reached at).
func (t *TLS) HTTPClientConfig() *tls.Config {
	m := t.material()
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: m.roots, Certificates: []tls.Certificate{m.cert}}
}

// serverCreds and dialCreds are the remote's transport credentials.
func (t *TLS) serverCreds() credentials.TransportCredentials { return credentials.NewTLS(t.server) }
func (t *TLS) dialCreds() credentials.TransportCredentials   { return credentials.NewTLS(t.client) }

// httpConfig is the admin HTTP's: a client certificate is asked for and verified
// when given, and required by the API's routes (not by /healthz, /readyz and
// /metrics, which probes and Prometheus reach without one).
func (t *TLS) httpConfig() *tls.Config {
	c := t.server.Clone()
	c.ClientAuth = tls.RequestClientCert
	verify := t.server.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return nil
		}
		return verify(cs)
	}
	c.NextProtos = []string{"h2", "http/1.1"}
	return c
}

func tlsErr(field, msg string) error {
	return &kerr.Error{Code: messages.Code_INVALID_ARGUMENT, Field: field, Message: msg}
}

// ---------------------------------------------------------------- issuing

// CA is a certificate authority for a kjob cluster's TLS (kjob tls init).
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA valid for validity from now.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"kjob"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// ParseCA reads a CA from its certificate's and key's PEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, tlsErr("ca", "the CA certificate holds no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, tlsErr("ca", err.Error())
	}
	if !cert.IsCA {
		return nil, tlsErr("ca", "the certificate is not a CA's")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, tlsErr("ca-key", "holds no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, tlsErr("ca-key", err.Error())
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, tlsErr("ca-key", "is not the CA certificate's key")
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM and KeyPEM encode the CA.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.Key) }

// Issue makes a certificate for an endpoint named name, usable both as a TLS
// server and a TLS client, with hosts (DNS names or IP addresses) as its subject
// alternative names for HTTPS clients of the admin API that check them, role
// (Role: RoleAny for none) and, for a worker's, the apps it is bound to (none:
// any). It returns the certificate's and the key's PEM.
func (ca *CA) Issue(name string, hosts []string, validity time.Duration, role Role, apps ...string) (certPEM, keyPEMBytes []byte, err error) {
	if name == "" {
		return nil, nil, tlsErr("name", "is required")
	}
	if _, err := ParseRole(string(role)); err != nil {
		return nil, nil, err
	}
	if len(apps) > 0 && role != RoleWorker {
		return nil, nil, tlsErr("app", "binds a worker's certificate only (role worker)")
	}
	for _, a := range apps {
		if why := route.ValidApp(a); why != "" {
			return nil, nil, tlsErr("app", fmt.Sprintf("%q: %s", a, why))
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter // a certificate outlives its CA in no verifier
	}
	if !notAfter.After(now) {
		return nil, nil, tlsErr("ca", fmt.Sprintf("expired %s: make a new CA (kjob tls init) and rotate to it", ca.Cert.NotAfter.UTC().Format(time.RFC3339)))
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"kjob"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if role != RoleAny {
		tmpl.Subject.OrganizationalUnit = []string{roleOU + string(role)}
	}
	for _, a := range apps {
		tmpl.Subject.OrganizationalUnit = append(tmpl.Subject.OrganizationalUnit, appOU+a)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

// ---------------------------------------------------------------- diagnosis

// tlsProbeWait bounds a TLS probe (tlsMismatch): the dial, the handshake, and the
// wait for the peer's verdict on this endpoint's certificate.
const tlsProbeWait = time.Second

// tlsMismatch says why addr and an endpoint with t (nil: no TLS) cannot talk,
// when the cause is TLS: the server speaks it and the endpoint does not, or the
// other way round, or one refuses the other's certificate. It returns an
// UNAVAILABLE error on field "tls" saying which, or nil when it finds no such
// cause; known says whether it could tell (a server that is down, or a proxy
// that hangs up, tells nothing). An endpoint asks only after a request failed:
// without it, a client of a TLS cluster with no TLS of its own waited out its
// deadline and then reported a timeout.
func tlsMismatch(ctx context.Context, addr string, t *TLS) (mismatch error, known bool) {
	ctx, cancel := context.WithTimeout(ctx, tlsProbeWait)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	cfg := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	if t != nil {
		cfg = t.client.Clone()
		cfg.NextProtos = []string{"h2"}
	}
	tc := tls.Client(conn, cfg)
	herr := tc.Handshake()
	var rec tls.RecordHeaderError
	switch {
	case t == nil && herr == nil:
		return tlsHint("the server at %s speaks TLS and this endpoint has none: give it the cluster's (--tls-ca, --tls-cert, --tls-key; ClientConfig.TLS, WorkerConfig.TLS)", addr), true
	case errors.As(herr, &rec):
		// Only a record that is not TLS proves a plain server (a plain gRPC
		// server writes its SETTINGS frame first); an EOF is any peer that hung up.
		if t == nil {
			return nil, true
		}
		return tlsHint("the server at %s does not speak TLS and this endpoint is configured with it: give both the same setting", addr), true
	case t == nil:
		return nil, false
	case herr != nil && strings.Contains(herr.Error(), "certificate"):
		return tlsHint("the server at %s presented a certificate that tls-ca does not accept: %v", addr, herr), true
	case herr != nil:
		return nil, false
	}
	// TLS 1.3: the server checks this endpoint's certificate after the client's
	// handshake is done, and says so in an alert on the first read.
	var one [1]byte
	if _, err := tc.Read(one[:]); err != nil && strings.Contains(err.Error(), "remote error") {
		return tlsHint("the server at %s refused this endpoint's certificate (is it signed by the server's CA, and current?): %v", addr, err), true
	}
	return nil, true
}

// probeTLS is tlsMismatch on the first few servers, until one tells of a
// mismatch; known says whether any could tell (or ctx ended: nothing more to
// look at), so that a caller looks again until one could.
func probeTLS(ctx context.Context, servers []string, t *TLS) (mismatch error, known bool) {
	for _, addr := range servers[:min(len(servers), 3)] {
		if ctx.Err() != nil {
			return nil, true
		}
		m, k := tlsMismatch(ctx, addr, t)
		if m != nil {
			return m, true
		}
		known = known || k
	}
	return nil, known
}

func tlsHint(format string, args ...any) error {
	return &kerr.Error{Code: messages.Code_UNAVAILABLE, Field: "tls", Message: fmt.Sprintf(format, args...)}
}

// TLSExpiryWarning is how long before its certificate expires an endpoint says
// so in its log (a client's or a worker's, which no node's metric covers).
const TLSExpiryWarning = 14 * 24 * time.Hour

// expiryWarner logs, at most once a day, that t's certificate expires within
// TLSExpiryWarning (or has expired).
type expiryWarner struct {
	t    *TLS
	log  *slog.Logger
	what string // "client", "worker …"
	last time.Time
}

func (w *expiryWarner) check(now time.Time) {
	if w == nil || w.t == nil || now.Sub(w.last) < 24*time.Hour {
		return
	}
	leaf := w.t.Leaf()
	if left := leaf.NotAfter.Sub(now); left < TLSExpiryWarning {
		w.last = now
		w.log.Warn("kjob tls: this endpoint's certificate expires soon: renew its file (it is reread within a second)",
			"endpoint", w.what, "subject", leaf.Subject.CommonName, "not_after", leaf.NotAfter.UTC().Format(time.RFC3339), "left", left.Round(time.Minute))
	}
}
