package main

import (
	"context"
	"flag"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/examples/grpcserver/greeterpb"
	"github.com/spillway-go/spillway/examples/internal/demotest"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

func start(t *testing.T, args ...string) *demotest.Server {
	t.Helper()
	return demotest.Start(t, run, append([]string{"-metrics-addr", ""}, args...)...)
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func greet(ctx context.Context, conn *grpc.ClientConn, key string) (*greeterpb.GreetReply, metadata.MD, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
	var hdr metadata.MD
	reply, err := greeterpb.NewGreeterClient(conn).Greet(ctx, &greeterpb.GreetRequest{Name: "ann"}, grpc.Header(&hdr))
	return reply, hdr, err
}

// services lists the services through server reflection, as grpcurl list
// does.
func services(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	require.NoError(t, err)
	require.NoError(t, stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := stream.Recv()
	require.NoError(t, err)
	require.NoError(t, stream.CloseSend())
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	slices.Sort(names)
	return names
}

func smoke(t *testing.T, addr string) {
	ctx := context.Background()
	conn := dial(t, addr)

	require.Equal(t, []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
		"grpc.reflection.v1alpha.ServerReflection", "spillway.demo.v1.Greeter"}, services(t, conn))

	// Health checks and reflection are never limited.
	for range 3 {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
	}

	// Greet: 1/second, burst 5 per API key.
	for i := 1; i <= 5; i++ {
		reply, hdr, err := greet(ctx, conn, "k1")
		require.NoError(t, err, "greet %d", i)
		require.Equal(t, "hello, ann", reply.GetMessage())
		require.Equal(t, []string{"5"}, hdr.Get("x-ratelimit-limit"))
		require.Equal(t, []string{string(rune('0' + 5 - i))}, hdr.Get("x-ratelimit-remaining"))
	}
	_, hdr, err := greet(ctx, conn, "k1")
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, `spillway: rate_limited by "greet_per_key"`, st.Message())
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
			require.Len(t, d.GetViolations(), 1)
			require.Equal(t, "greet_per_key", d.GetViolations()[0].GetSubject())
		}
	}
	require.True(t, sawRetry)
	require.True(t, sawQuota)

	// A client with grpcx's interceptor waits the RetryInfo delay and
	// retries: the same call succeeds.
	retrying := dial(t, addr, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(
		&clientside.Client{Backoff: clientside.Backoff{Jitter: -1}, MaxRetries: clientside.DefaultMaxRetries}, grpcx.ClientSettings{})))
	reply, _, err := greet(ctx, retrying, "k1")
	require.NoError(t, err)
	require.Equal(t, "hello, ann", reply.GetMessage())
}

func TestSmokeMemory(t *testing.T) {
	s := start(t)
	require.Contains(t, s.Out.String(), "listening on "+s.Addr+" (store: memory")
	smoke(t, s.Addr)
	generateSeq(t, s.Addr)
}

func TestSmokeRedis(t *testing.T) {
	rs := redistest.Start(t)
	s := demotest.Start(t, run, "-redis", rs.Addr, "-redis-budget", "300ms", "-metrics-addr", "127.0.0.1:0") // decisions from Redis even on a loaded machine
	require.Contains(t, s.Out.String(), "store: redis "+rs.Addr)
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(s.Out.String())
	require.NotNil(t, m, s.Out.String())
	smoke(t, s.Addr)
	generateSeq(t, s.Addr)
	require.Contains(t, metrics(t, m[1]), `spillway_breaker="redis"} 0`) // closed

	// Redis stalls: calls are still answered, from the local share, and
	// K = 5 failures seen by the chain's blocks open the one breaker of
	// that Redis for all of them.
	require.NoError(t, rs.Pause())
	defer rs.Resume()
	conn := dial(t, s.Addr)
	for i := range 8 {
		reply, _, err := greet(context.Background(), conn, "paused-"+strconv.Itoa(i))
		require.NoError(t, err, "call %d while Redis is paused", i)
		require.Equal(t, "hello, ann", reply.GetMessage())
	}
	body := metrics(t, m[1])
	// open, or half-open when its probe (OpenTimeout after it opened) is
	// already under way on a loaded machine: not closed either way
	require.Regexp(t, `spillway_breaker="redis"} [12]\n`, body)
	require.Contains(t, body, `spillway_degraded="true",spillway_limiter="grpc",spillway_outcome="allowed"`)
}

// metrics reads the Prometheus endpoint.
func metrics(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	return string(b)
}

// The per-IP concurrency limit (20) answers ResourceExhausted while 20
// slow calls from the same IP are in flight.
func TestConcurrency(t *testing.T) {
	s := start(t)
	conn := dial(t, s.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 20)
	for i := range 20 {
		go func() {
			// Distinct keys: the per-key rate rule (burst 5) has room.
			ctx := metadata.AppendToOutgoingContext(ctx, "x-api-key", "slow-"+strconv.Itoa(i))
			_, err := greeterpb.NewGreeterClient(conn).Greet(ctx, &greeterpb.GreetRequest{Name: "slow", WorkMs: 10000})
			errc <- err
		}()
	}
	// Wait until the 21st call is refused: the 20 slow ones hold every slot.
	// (A call that finds a free slot is admitted and answers at once.)
	var st *status.Status
	n := 0
	require.Eventually(t, func() bool {
		n++ // a fresh key each time: its rate rule always has room
		_, _, err := greet(context.Background(), conn, "fast-"+strconv.Itoa(n))
		st = status.Convert(err)
		return st.Code() == codes.ResourceExhausted
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, `spillway: concurrency by "per_ip_concurrency"`, st.Message())
	cancel()
	for range 20 {
		require.Equal(t, codes.Canceled, status.Code(<-errc))
	}
}

func TestMetrics(t *testing.T) {
	s := demotest.Start(t, run, "-metrics-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(s.Out.String())
	require.NotNil(t, m, s.Out.String())
	conn := dial(t, s.Addr)
	for range 6 {
		greet(context.Background(), conn, "k1")
	}
	resp, err := http.Get(m[1])
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, string(b), `spillway_decisions_total{otel_scope_name="github.com/spillway-go/spillway/telemetry",otel_scope_schema_url="",otel_scope_version="",spillway_degraded="false",spillway_limiter="grpc",spillway_outcome="allowed",spillway_priority="critical",spillway_reason="none"} 5`)
	require.Contains(t, string(b), `spillway_outcome="denied",spillway_priority="critical",spillway_reason="rate_limited"} 1`)
}

func TestHelp(t *testing.T) {
	var out demotest.Buffer
	err := run(context.Background(), []string{"-h"}, &out, io.Discard, nil)
	require.ErrorIs(t, err, flag.ErrHelp)
	for _, want := range []string{"spillway.demo.v1.Greeter/Greet", "spillway.demo.v1.Greeter/Generate", "-tokens", "grpc.health.v1.Health", "x-api-key", "x-user-id", "-metrics-addr", "-redis"} {
		require.Contains(t, out.String(), want)
	}
}

func TestBadFlags(t *testing.T) {
	err := run(context.Background(), []string{"-otel", "otlp"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, `-otel "otlp": want stdout or none`)
	err = run(context.Background(), []string{"-otel-interval", "-1s"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, "-otel-interval -1s: must be positive")
	err = run(context.Background(), []string{"-metrics-addr", "256.0.0.1:1"}, io.Discard, io.Discard, nil)
	require.ErrorContains(t, err, "-metrics-addr")
}

// The stdout SDK prints the denied call's span, with its decision event, and
// counts every decision; the flush on exit exports the last interval.
func TestTelemetryStdout(t *testing.T) {
	s := start(t, "-otel", "stdout", "-otel-interval", "1h") // one export: the flush on exit
	ctx := context.Background()
	conn := dial(t, s.Addr)
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	for i := 1; i <= 6; i++ {
		_, _, err := greet(ctx, conn, "k1")
		if i <= 5 {
			require.NoError(t, err, "greet %d", i)
		} else {
			require.Equal(t, codes.ResourceExhausted, status.Code(err))
		}
	}
	s.Stop()

	spans, metrics := demotest.DecodeOTel(t, s.OTel.String())
	ev, retry, latency := demotest.Decision(t, spans, greeterpb.Greeter_Greet_FullMethodName, "spillway-grpcserver")
	require.Equal(t, map[string]any{
		"spillway.limiter":    "grpc",
		"spillway.decided_by": "greet_per_key",
		"spillway.outcome":    "denied",
		"spillway.reason":     "rate_limited",
		"spillway.limit":      float64(5),
		"spillway.remaining":  float64(0),
		"spillway.degraded":   false,
		"spillway.priority":   "critical",
	}, ev)
	require.Greater(t, retry, float64(0)) // one token a second
	require.LessOrEqual(t, retry, float64(1000))
	require.GreaterOrEqual(t, latency, float64(0))

	require.Len(t, metrics, 1)
	require.Equal(t, map[string]float64{
		`{"spillway.degraded":false,"spillway.limiter":"grpc","spillway.outcome":"allowed","spillway.priority":"critical","spillway.reason":"none"}`:        5,
		`{"spillway.degraded":false,"spillway.limiter":"grpc","spillway.outcome":"denied","spillway.priority":"critical","spillway.reason":"rate_limited"}`: 1,
	}, demotest.SumPoints(t, metrics, "spillway.decisions"))
	require.Equal(t, map[string]float64{
		`{"spillway.degraded":false,"spillway.limiter":"grpc","spillway.outcome":"allowed"}`: 5,
		`{"spillway.degraded":false,"spillway.limiter":"grpc","spillway.outcome":"denied"}`:  1,
	}, demotest.SumPoints(t, metrics, "spillway.decision.duration"))
}

// Without -otel stdout nothing is printed.
func TestTelemetryOffByDefault(t *testing.T) {
	s := start(t)
	conn := dial(t, s.Addr)
	for range 6 {
		greet(context.Background(), conn, "k1")
	}
	s.Stop()
	require.Empty(t, s.OTel.String())
	require.Equal(t, 1, strings.Count(s.Out.String(), "\n"), s.Out.String()) // the listening line only
}
