package main_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	confpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/spillway-go/spillway/internal/redistest"
)

// mgmt is an xDS management server built from go-control-plane's server
// and snapshot cache, serving RateLimitConfig resources over ADS.
type mgmt struct {
	t     *testing.T
	cache cachev3.SnapshotCache
	grpc  *grpc.Server
	addr  string
	nacks chan string
}

func startMgmt(t *testing.T, addr string, opts ...grpc.ServerOption) *mgmt {
	m := &mgmt{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), nacks: make(chan string, 16)}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoverygrpc.DiscoveryRequest) error {
		if r.GetErrorDetail() != nil {
			m.nacks <- r.GetErrorDetail().GetMessage()
		}
		return nil
	}}
	m.grpc = grpc.NewServer(opts...)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(m.grpc, serverv3.NewServer(context.Background(), m.cache, cb))
	var lis net.Listener
	var err error
	for range 50 { // the address of a stopped server: wait for the port
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, err)
	m.addr = lis.Addr().String()
	go func() { _ = m.grpc.Serve(lis) }()
	t.Cleanup(m.grpc.Stop)
	return m
}

// push sets the node's snapshot: one RateLimitConfig per config.
func (m *mgmt) push(version string, cs ...*confpb.RateLimitConfig) {
	rs := make([]types.Resource, len(cs))
	for i, c := range cs {
		rs[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	require.NoError(m.t, err)
	require.NoError(m.t, m.cache.SetSnapshot(context.Background(), "node-1", snap))
}

func xdsConfig(name string, limit uint32, unit confpb.RateLimitUnit) *confpb.RateLimitConfig {
	return &confpb.RateLimitConfig{Name: name, Domain: "xds", Descriptors: []*confpb.RateLimitDescriptor{
		{Key: "k", RateLimit: &confpb.RateLimitPolicy{Unit: unit, RequestsPerUnit: limit}},
		{Key: "tenant", Value: "t", Descriptors: []*confpb.RateLimitDescriptor{
			{Key: "user", RateLimit: &confpb.RateLimitPolicy{Unit: unit, RequestsPerUnit: limit}}}},
	}}
}

// TestXDS: CONFIG_TYPE=GRPC_XDS_SOTW against a go-control-plane management
// server: a pushed config is enforced within 1 s; a replacement applies; a
// config that does not load is NACKed with the error and the last good one
// stays; with the management server gone the config stays, and a new
// server at the address is reconnected to.
func TestXDS(t *testing.T) {
	m := startMgmt(t, "127.0.0.1:0")
	m.push("1", xdsConfig("one", 2, confpb.RateLimitUnit_HOUR))
	b := singleBackend(t)
	s := start(t, b, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+m.addr, "CONFIG_GRPC_XDS_NODE_ID=node-1",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=400ms", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=100ms")
	redistest.WaitFor(t, "the first config", 10*time.Millisecond, func() bool {
		return s.metric("ratelimit_service_config_load_success") == 1
	})
	check(t, s.call("xds", 0, desc("k=a")), OK, ok(2, HOUR, 1))
	check(t, s.call("xds", 0, desc("tenant=t", "user=u")), OK, ok(2, HOUR, 1))

	// the limit a peek reports (a descriptor's hits_addend 0 charges nothing)
	limit := func() uint32 {
		d := desc("k=a")
		d.HitsAddend = wrapperspb.UInt64(0)
		st := s.call("xds", 0, d).Statuses[0]
		if st.CurrentLimit == nil {
			return 0
		}
		return st.CurrentLimit.RequestsPerUnit
	}
	enforced := func(what string, want uint32, within time.Duration) {
		t.Helper()
		pushed := time.Now()
		for limit() != want {
			if time.Since(pushed) > within {
				t.Fatalf("%s: limit %d not enforced within %v:\n%s", what, want, within, s.log())
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("%s: enforced %v after the push", what, time.Since(pushed).Round(time.Millisecond))
	}

	m.push("2", xdsConfig("one", 5, confpb.RateLimitUnit_HOUR))
	enforced("a replacement", 5, time.Second)
	check(t, s.call("xds", 0, desc("k=a")), OK, ok(5, HOUR, 3)) // same unit: the count carries over

	// a config the reference refuses too: NACKed with the loader's error,
	// the last good config stays
	m.push("3", xdsConfig("bad", 9, confpb.RateLimitUnit_UNKNOWN))
	select {
	case msg := <-m.nacks:
		require.Contains(t, msg, "invalid rate limit unit 'UNKNOWN'")
	case <-time.After(5 * time.Second):
		t.Fatalf("no NACK:\n%s", s.log())
	}
	require.GreaterOrEqual(t, s.metric("ratelimit_service_config_load_error"), int64(1))
	check(t, s.call("xds", 0, desc("k=a")), OK, ok(5, HOUR, 2))
	require.Contains(t, s.log(), "xDS config not loaded (NACKed); the last good config stays")

	// two resources of two domains in one response
	other := xdsConfig("two", 1, confpb.RateLimitUnit_MINUTE)
	other.Domain = "xds2"
	m.push("4", xdsConfig("one", 6, confpb.RateLimitUnit_HOUR), other)
	enforced("two resources", 6, time.Second)
	check(t, s.call("xds2", 0, desc("k=a")), OK, ok(1, pb.RateLimitResponse_RateLimit_MINUTE, 0))

	// the management server goes away: the config stays
	m.grpc.Stop()
	check(t, s.call("xds", 0, desc("tenant=t", "user=u")), OK, ok(6, HOUR, 4))
	check(t, s.call("xds", 0, desc("tenant=t", "user=u")), OK, ok(6, HOUR, 3))
	// a new one at the same address: reconnected to, its config applies
	m2 := startMgmt(t, m.addr)
	m2.push("5", xdsConfig("one", 8, confpb.RateLimitUnit_HOUR))
	enforced("after reconnecting", 8, 10*time.Second)
	require.Contains(t, s.log(), "xDS stream to the management server ended; the last config stays")
}

// TestXDSTLS: CONFIG_GRPC_XDS_SERVER_USE_TLS with the management server's
// CA, a client certificate and the name to verify.
func TestXDSTLS(t *testing.T) {
	p := newPKI(t)
	mcert, mkey := p.issue("mgmt", x509.ExtKeyUsageServerAuth, "mgmt.internal")
	pair, err := tls.LoadX509KeyPair(mcert, mkey)
	require.NoError(t, err)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert})
	m := startMgmt(t, "127.0.0.1:0", grpc.Creds(creds))
	m.push("1", xdsConfig("one", 3, confpb.RateLimitUnit_MINUTE))
	ccert, ckey := p.issue("ratelimit", x509.ExtKeyUsageClientAuth, "ratelimit")
	s := start(t, singleBackend(t), nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+m.addr, "CONFIG_GRPC_XDS_NODE_ID=node-1",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT="+p.caFile(), "CONFIG_GRPC_XDS_SERVER_TLS_SAN=mgmt.internal",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+ccert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+ckey)
	redistest.WaitFor(t, "the config over TLS", 10*time.Millisecond, func() bool {
		return s.metric("ratelimit_service_config_load_success") == 1
	})
	check(t, s.call("xds", 0, desc("k=a")), OK, ok(3, pb.RateLimitResponse_RateLimit_MINUTE, 2))
}
