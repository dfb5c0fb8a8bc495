package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TLS on both sides, with the reference's variables: to Redis
// (REDIS_TLS, REDIS_TLS_CLIENT_CERT/KEY, REDIS_TLS_CACERT,
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, or a rediss:// REDIS_URL) and on
// the gRPC listener (GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT/KEY,
// GRPC_CLIENT_TLS_CACERT for mTLS, GRPC_CLIENT_TLS_SAN).

// caPool is the system's roots plus the certificates of file, as the
// reference builds it.
func caPool(name, file string) (*x509.CertPool, error) {
	pool, _ := x509.SystemCertPool()
	if pool == nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("rls: %s: %w", name, err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("rls: %s: no PEM certificate in %s", name, file)
	}
	return pool, nil
}

// redisTLS is the client TLS config for Redis, nil when TLS is off.
func redisTLS(s Settings, rediss bool) (*tls.Config, error) {
	if !s.RedisTLS && !rediss {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if (s.RedisTLSClientCert == "") != (s.RedisTLSClientKey == "") {
		return nil, errors.New("rls: REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together")
	}
	if s.RedisTLSClientCert != "" {
		pair, err := tls.LoadX509KeyPair(s.RedisTLSClientCert, s.RedisTLSClientKey)
		if err != nil {
			return nil, fmt.Errorf("rls: REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if s.RedisTLSCACert != "" {
		pool, err := caPool("REDIS_TLS_CACERT", s.RedisTLSCACert)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if s.RedisTLSSkipHostnameVerification {
		// the chain is still verified against the roots; only the name is not
		c.InsecureSkipVerify = true
		roots := c.RootCAs
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("tls: Redis sent no certificate")
			}
			certs := make([]*x509.Certificate, len(raw))
			for i, r := range raw {
				cert, err := x509.ParseCertificate(r)
				if err != nil {
					return fmt.Errorf("tls: Redis's certificate: %w", err)
				}
				certs[i] = cert
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, cert := range certs[1:] {
				opts.Intermediates.AddCert(cert)
			}
			_, err := certs[0].Verify(opts)
			return err
		}
	}
	return c, nil
}

// tlsDialer dials Redis over TLS, naming each address's host as the
// server (every node of a Cluster, every sentinel and primary alike).
func tlsDialer(c *tls.Config, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cc := c.Clone()
		if cc.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				cc.ServerName = host
			}
		}
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}, Config: cc}
		return d.DialContext(ctx, network, addr)
	}
}

// grpcCreds is the gRPC listener's TLS, nil when GRPC_SERVER_USE_TLS is
// off. The certificate and key are read again when either file changes
// (a rotated certificate applies to new connections without a restart).
func grpcCreds(s Settings, log *slog.Logger) (grpc.ServerOption, error) {
	if !s.GrpcServerUseTLS {
		return nil, nil
	}
	if s.GrpcServerTLSCert == "" || s.GrpcServerTLSKey == "" {
		return nil, errors.New("rls: GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}
	kp := &keyPair{cert: s.GrpcServerTLSCert, key: s.GrpcServerTLSKey}
	if _, err := kp.get(nil); err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.get, ClientAuth: tls.NoClientCert}
	if s.GrpcClientTLSSAN != "" && s.GrpcClientTLSCACert == "" {
		return nil, errors.New("rls: GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT (client certificates are verified only with it)")
	}
	if s.GrpcClientTLSCACert != "" {
		pool, err := caPool("GRPC_CLIENT_TLS_CACERT", s.GrpcClientTLSCACert)
		if err != nil {
			return nil, err
		}
		// mTLS, verified here rather than by crypto/tls so that a refused
		// client is logged with the reason (the client, under TLS 1.3,
		// often sees only a closed connection)
		c.ClientAuth = tls.RequestClientCert
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			err := verifyClient(cs.PeerCertificates, pool, s.GrpcClientTLSSAN)
			if err != nil {
				log.Warn("rls: a gRPC client was refused", "err", err)
			}
			return err
		}
	}
	return grpc.Creds(credentials.NewTLS(c)), nil
}

// verifyClient verifies a client's chain against pool, for client
// authentication, and its name against san when set.
func verifyClient(certs []*x509.Certificate, pool *x509.CertPool, san string) error {
	if len(certs) == 0 {
		return errors.New("tls: the client sent no certificate (GRPC_CLIENT_TLS_CACERT requires one)")
	}
	opts := x509.VerifyOptions{Roots: pool, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("tls: the client certificate %q: %w", certs[0].Subject.String(), err)
	}
	if san != "" && certs[0].VerifyHostname(san) != nil {
		return fmt.Errorf("tls: the client certificate %q is not valid for %q (GRPC_CLIENT_TLS_SAN)", certs[0].Subject.String(), san)
	}
	return nil
}

// keyPair is a certificate and key read from files, read again when
// either file's modification time or size changes.
type keyPair struct {
	cert, key string
	mu        sync.Mutex
	stamp     [2]os.FileInfo
	pair      *tls.Certificate
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	ci, err1 := os.Stat(k.cert)
	ki, err2 := os.Stat(k.key)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := errors.Join(err1, err2); err != nil {
		if k.pair != nil {
			return k.pair, nil // mid-rotation: keep serving the last pair
		}
		return nil, fmt.Errorf("rls: GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY: %w", err)
	}
	if k.pair != nil && sameFile(k.stamp[0], ci) && sameFile(k.stamp[1], ki) {
		return k.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		if k.pair != nil {
			return k.pair, nil
		}
		return nil, fmt.Errorf("rls: GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY: %w", err)
	}
	k.pair, k.stamp = &pair, [2]os.FileInfo{ci, ki}
	return k.pair, nil
}

func sameFile(a, b os.FileInfo) bool {
	return a != nil && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}
