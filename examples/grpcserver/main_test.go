package main

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func startDemo(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), out, func(a string) { addrc <- a })
	}()
	select {
	case a := <-addrc:
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-errc)
		})
		return a, out
	case err := <-errc:
		cancel()
		t.Fatalf("run: %v\n%s", err, out.String())
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("server did not start")
	}
	return "", nil
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(JSONCodec{}.Name())),
	}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func greet(ctx context.Context, conn *grpc.ClientConn, key string) (*GreetReply, metadata.MD, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
	var reply GreetReply
	var hdr metadata.MD
	err := conn.Invoke(ctx, GreetMethod, &GreetRequest{Name: "ann"}, &reply, grpc.Header(&hdr))
	return &reply, hdr, err
}

func smoke(t *testing.T, addr string) {
	ctx := context.Background()
	conn := dial(t, addr)

	// Health checks are never limited.
	for range 3 {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
	}

	// Greet: 1/second, burst 5 per API key.
	for i := 1; i <= 5; i++ {
		reply, hdr, err := greet(ctx, conn, "k1")
		require.NoError(t, err, "greet %d", i)
		require.Equal(t, "hello, ann", reply.Message)
		require.NotEmpty(t, hdr.Get("x-ratelimit-limit"))
	}
	_, hdr, err := greet(ctx, conn, "k1")
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, []string{"5"}, hdr.Get("x-ratelimit-limit"))
	require.Equal(t, []string{"0"}, hdr.Get("x-ratelimit-remaining"))
	var sawRetry, sawQuota bool
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			sawRetry = true
			// One token a second: the wait is what is left of that second.
			require.Greater(t, d.GetRetryDelay().AsDuration(), time.Duration(0))
			require.LessOrEqual(t, d.GetRetryDelay().AsDuration(), time.Second)
		case *errdetails.QuotaFailure:
			sawQuota = true
			require.Equal(t, "greet_per_key", d.GetViolations()[0].GetSubject())
		}
	}
	require.True(t, sawRetry)
	require.True(t, sawQuota)

	// A client with grpcx's interceptor waits the RetryInfo delay and
	// retries: the same call succeeds.
	retrying := dial(t, addr, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(
		grpcx.WithoutThrottle(), grpcx.WithBackoff(clientside.Backoff{Jitter: -1}))))
	reply, _, err := greet(ctx, retrying, "k1")
	require.NoError(t, err)
	require.Equal(t, "hello, ann", reply.Message)
}

func TestSmokeMemory(t *testing.T) {
	addr, out := startDemo(t)
	require.Contains(t, out.String(), "listening on "+addr+" (store: memory")
	smoke(t, addr)
}

func TestSmokeRedis(t *testing.T) {
	rs := redistest.Start(t)
	addr, out := startDemo(t, "-redis", rs.Addr, "-redis-budget", "300ms") // decisions from Redis even on a loaded machine
	require.Contains(t, out.String(), "store: redis "+rs.Addr)
	smoke(t, addr)
}
