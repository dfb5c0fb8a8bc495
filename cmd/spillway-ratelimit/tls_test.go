package main_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/spillway-go/spillway/internal/redistest"
)

// pki is a test CA and the files of the certificates it signed.
type pki struct {
	t    *testing.T
	dir  string
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	n    int64
}

func newPKI(t *testing.T) *pki {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	p := &pki{t: t, dir: t.TempDir(), ca: ca, key: key, pool: x509.NewCertPool(), n: 1}
	p.pool.AddCert(ca)
	p.write("ca.pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(name, typ string, der []byte) string {
	f := filepath.Join(p.dir, name)
	require.NoError(p.t, os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	return f
}

func (p *pki) caFile() string { return filepath.Join(p.dir, "ca.pem") }

// issue signs a certificate for dns (and 127.0.0.1 with localhost) with usage, writes
// name.pem and name-key.pem and returns their paths.
func (p *pki) issue(name string, usage x509.ExtKeyUsage, dns ...string) (cert, key string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(p.t, err)
	p.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.n), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: dns}
	if slices.Contains(dns, "localhost") {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.key)
	require.NoError(p.t, err)
	kder, err := x509.MarshalECPrivateKey(k)
	require.NoError(p.t, err)
	return p.write(name+".pem", "CERTIFICATE", der), p.write(name+"-key.pem", "EC PRIVATE KEY", kder)
}

// tlsRedis starts a redis-server that also listens with TLS (client
// certificates required) under a certificate for names, and returns it
// and its TLS port.
func tlsRedis(t *testing.T, p *pki, names ...string) (*redistest.Server, int) {
	if names == nil {
		names = []string{"localhost"}
	}
	cert, key := p.issue("redis", x509.ExtKeyUsageServerAuth, names...)
	tlsPort, err := redistest.FreePort()
	require.NoError(t, err)
	rs := redistest.Start(t, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", cert, "--tls-key-file", key,
		"--tls-ca-cert-file", p.caFile(), "--tls-auth-clients", "yes")
	return rs, tlsPort
}

// dialTLS connects to the server's gRPC port over TLS, presenting cert
// when it is not empty.
func dialTLS(t *testing.T, s *server, p *pki, cert, key string) pb.RateLimitServiceClient {
	c := &tls.Config{RootCAs: p.pool, ServerName: "localhost"}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		require.NoError(t, err)
		c.Certificates = []tls.Certificate{pair}
	}
	conn, err := grpc.NewClient(s.conn.Target(), grpc.WithTransportCredentials(credentials.NewTLS(c)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

const tlsConfig = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"

// TestTLS: REDIS_TLS=true with a client certificate to a redis-server
// that requires one, and mTLS on the gRPC listener (GRPC_CLIENT_TLS_CACERT,
// GRPC_CLIENT_TLS_SAN): a client with a certificate carrying the SAN is
// answered, by Redis (the count is in Redis, nothing decided locally); one
// without a certificate, or with another name, is refused at the handshake.
func TestTLS(t *testing.T) {
	p := newPKI(t)
	rs, tlsPort := tlsRedis(t, p)
	rcert, rkey := p.issue("ratelimit-client", x509.ExtKeyUsageClientAuth, "ratelimit")
	gcert, gkey := p.issue("grpc-server", x509.ExtKeyUsageServerAuth, "localhost")
	envoyCert, envoyKey := p.issue("envoy", x509.ExtKeyUsageClientAuth, "envoy.mesh")
	otherCert, otherKey := p.issue("other", x509.ExtKeyUsageClientAuth, "other.mesh")

	b := backend{"tls", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=127.0.0.1:" + strconv.Itoa(tlsPort),
		"REDIS_TLS=true", "REDIS_TLS_CACERT=" + p.caFile(), "REDIS_TLS_CLIENT_CERT=" + rcert, "REDIS_TLS_CLIENT_KEY=" + rkey},
		rs.Client(t)}
	s := start(t, b, map[string]string{"t.yaml": tlsConfig},
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+gcert, "GRPC_SERVER_TLS_KEY="+gkey,
		"GRPC_CLIENT_TLS_CACERT="+p.caFile(), "GRPC_CLIENT_TLS_SAN=envoy.mesh")

	s.rls = dialTLS(t, s, p, envoyCert, envoyKey)
	check(t, s.call("tls", 0, desc("k=v")), OK, ok(2, HOUR, 1))
	check(t, s.call("tls", 0, desc("k=v")), OK, ok(2, HOUR, 0))
	check(t, s.call("tls", 0, desc("k=v")), OVER, over(2, HOUR))
	require.EqualValues(t, 0, s.metric("spillway_rls_degraded_total"), "every call decided by Redis over TLS")
	require.EqualValues(t, 1, b.keyCount(t), "the count is in Redis")

	call := func(cl pb.RateLimitServiceClient) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cl.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "tls", Descriptors: ds(desc("k=v"))})
		return err
	}
	// no client certificate, a certificate for another name, one from
	// another CA: refused at the handshake, and the server logs why
	stranger := newPKI(t)
	strangerCert, strangerKey := stranger.issue("stranger", x509.ExtKeyUsageClientAuth, "envoy.mesh")
	for _, tc := range []struct{ cert, key, log string }{
		{"", "", "the client sent no certificate"},
		{otherCert, otherKey, `the client certificate \"CN=other\" is not valid for \"envoy.mesh\"`},
		{strangerCert, strangerKey, `the client certificate \"CN=stranger\": x509: certificate signed by unknown authority`},
	} {
		err := call(dialTLS(t, s, p, tc.cert, tc.key))
		require.Equal(t, codes.Unavailable, status.Code(err), tc.log)
		redistest.WaitFor(t, tc.log, 20*time.Millisecond, func() bool { return strings.Contains(s.log(), tc.log) })
	}
	// plaintext to a TLS listener: refused
	_, err := pb.NewRateLimitServiceClient(s.conn).ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "tls", Descriptors: ds(desc("k=v"))})
	require.Error(t, err)
}

// TestTLSRediss: a rediss:// REDIS_URL turns TLS on by itself; the gRPC
// listener serves TLS without client certificates when
// GRPC_CLIENT_TLS_CACERT is not set.
func TestTLSRediss(t *testing.T) {
	p := newPKI(t)
	rs, tlsPort := tlsRedis(t, p)
	rcert, rkey := p.issue("ratelimit-client", x509.ExtKeyUsageClientAuth, "ratelimit")
	gcert, gkey := p.issue("grpc-server", x509.ExtKeyUsageServerAuth, "localhost")
	b := backend{"rediss", []string{"REDIS_TYPE=single", "REDIS_URL=rediss://localhost:" + strconv.Itoa(tlsPort),
		"REDIS_TLS_CACERT=" + p.caFile(), "REDIS_TLS_CLIENT_CERT=" + rcert, "REDIS_TLS_CLIENT_KEY=" + rkey}, rs.Client(t)}
	s := start(t, b, map[string]string{"t.yaml": tlsConfig},
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+gcert, "GRPC_SERVER_TLS_KEY="+gkey)
	s.rls = dialTLS(t, s, p, "", "")
	check(t, s.call("tls", 0, desc("k=v")), OK, ok(2, HOUR, 1))
	check(t, s.call("tls", 0, desc("k=v")), OK, ok(2, HOUR, 0))
	check(t, s.call("tls", 0, desc("k=v")), OVER, over(2, HOUR))
	require.EqualValues(t, 0, s.metric("spillway_rls_degraded_total"))
	require.EqualValues(t, 1, b.keyCount(t))
}

// TestTLSBadSettings: TLS asked for without what it needs exits at start
// naming the variable.
func TestTLSBadSettings(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"},
		{"REDIS_TLS_CACERT=/nonexistent/ca.pem", "REDIS_TLS_CACERT"},
	} {
		dir := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "config"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config", "t.yaml"), []byte(tlsConfig), 0o644))
		cmd := exec.Command(binary)
		cmd.Env = []string{"RUNTIME_ROOT=" + dir, "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(t), "HOST=127.0.0.1", "PORT=" + port(t),
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:1", "REDIS_TLS=true", tc.env}
		out, err := cmd.CombinedOutput()
		require.Error(t, err, tc.env)
		require.Contains(t, string(out), tc.want, tc.env)
	}
}

func ds(d ...*rlv3.RateLimitDescriptor) []*rlv3.RateLimitDescriptor { return d }

// TestTLSSkipHostname: a Redis whose certificate does not name the
// address it is reached at is refused (every call decided by the local
// share) unless REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true, which still
// verifies the chain.
func TestTLSSkipHostname(t *testing.T) {
	p := newPKI(t)
	rs, tlsPort := tlsRedis(t, p, "redis.internal")
	rcert, rkey := p.issue("ratelimit-client", x509.ExtKeyUsageClientAuth, "ratelimit")
	env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=127.0.0.1:" + strconv.Itoa(tlsPort), "REDIS_TLS=true",
		"REDIS_TLS_CACERT=" + p.caFile(), "REDIS_TLS_CLIENT_CERT=" + rcert, "REDIS_TLS_CLIENT_KEY=" + rkey}

	strict := start(t, backend{"strict", env, rs.Client(t)}, map[string]string{"t.yaml": tlsConfig}, "SPILLWAY_BUDGET=300ms")
	strict.call("tls", 0, desc("k=v"))
	require.EqualValues(t, 1, strict.metric("spillway_rls_degraded_total"), "the name does not match: not Redis's answer")

	skip := start(t, backend{"skip", env, rs.Client(t)}, map[string]string{"t.yaml": tlsConfig}, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true")
	check(t, skip.call("tls", 0, desc("k=v")), OK, ok(2, HOUR, 1))
	check(t, skip.call("tls", 0, desc("k=v")), OK, ok(2, HOUR, 0))
	require.EqualValues(t, 0, skip.metric("spillway_rls_degraded_total"))
}
