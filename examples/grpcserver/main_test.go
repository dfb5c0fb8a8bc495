package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
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

// demo is a running grpcserver: out gets its messages, otel its telemetry.
type demo struct {
	addr      string
	out, otel *syncBuffer
	stop      func() // stops the server and waits for run to return nil
}

func startDemo(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	d := startDemoOTel(t, args...)
	return d.addr, d.out
}

func startDemoOTel(t *testing.T, args ...string) *demo {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &demo{out: &syncBuffer{}, otel: &syncBuffer{}}
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), d.out, d.otel, func(a string) { addrc <- a })
	}()
	select {
	case a := <-addrc:
		var once sync.Once
		d.stop = func() {
			once.Do(func() {
				cancel()
				require.NoError(t, <-errc)
			})
		}
		t.Cleanup(d.stop)
		d.addr = a
		return d
	case err := <-errc:
		cancel()
		t.Fatalf("run: %v\n%s", err, d.out.String())
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("server did not start")
	}
	return nil
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

func TestBadFlags(t *testing.T) {
	err := run(context.Background(), []string{"-otel", "otlp"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, `-otel "otlp": want stdout or none`)
	err = run(context.Background(), []string{"-otel-interval", "-1s"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, "-otel-interval -1s: must be positive")
}

// jsonAttr is an attribute as the stdout exporters print it.
type jsonAttr struct {
	Key   string
	Value struct{ Value any }
}

func attrMap(attrs []jsonAttr) map[string]any {
	m := make(map[string]any, len(attrs))
	for _, a := range attrs {
		m[a.Key] = a.Value.Value
	}
	return m
}

type jsonSpan struct {
	Name     string
	SpanKind int
	Events   []struct {
		Name       string
		Attributes []jsonAttr
	}
	Resource []jsonAttr
}

type jsonMetrics struct {
	ScopeMetrics []struct {
		Scope   struct{ Name string }
		Metrics []struct {
			Name string
			Data struct {
				Temporality string
				DataPoints  []struct {
					Attributes []jsonAttr
					Value      float64 // counter points
					Count      float64 // histogram points
				}
			}
		}
	}
}

// decodeOTel splits what the stdout exporters wrote into spans and metric
// exports.
func decodeOTel(t *testing.T, s string) ([]jsonSpan, []jsonMetrics) {
	t.Helper()
	var spans []jsonSpan
	var metrics []jsonMetrics
	dec := json.NewDecoder(strings.NewReader(s))
	for dec.More() {
		var raw map[string]json.RawMessage
		require.NoError(t, dec.Decode(&raw))
		b, err := json.Marshal(raw)
		require.NoError(t, err)
		if _, ok := raw["ScopeMetrics"]; ok {
			var m jsonMetrics
			require.NoError(t, json.Unmarshal(b, &m))
			metrics = append(metrics, m)
		} else {
			var sp jsonSpan
			require.NoError(t, json.Unmarshal(b, &sp))
			spans = append(spans, sp)
		}
	}
	return spans, metrics
}

// sumPoints adds up, across exports (delta temporality), the points of the
// named instrument by their attribute set.
func sumPoints(t *testing.T, exports []jsonMetrics, name string) map[string]float64 {
	t.Helper()
	sums := map[string]float64{}
	for _, e := range exports {
		for _, sm := range e.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name {
					continue
				}
				require.Equal(t, "github.com/spillway-go/spillway/telemetry", sm.Scope.Name)
				require.Equal(t, "DeltaTemporality", m.Data.Temporality)
				for _, p := range m.Data.DataPoints {
					k, err := json.Marshal(attrMap(p.Attributes)) // sorted keys
					require.NoError(t, err)
					sums[string(k)] += p.Value + p.Count
				}
			}
		}
	}
	return sums
}

// The stdout SDK prints the denied call's span, with its decision event, and
// counts every decision; the flush on exit exports the last interval.
func TestTelemetryStdout(t *testing.T) {
	d := startDemoOTel(t, "-otel-interval", "1h") // one export: the flush on exit
	ctx := context.Background()
	conn := dial(t, d.addr)
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
	d.stop()

	spans, metrics := decodeOTel(t, d.otel.String())
	require.Len(t, spans, 1, "only the denied call's span is printed")
	sp := spans[0]
	require.Equal(t, GreetMethod, sp.Name)
	require.Equal(t, 2, sp.SpanKind) // server
	require.Equal(t, map[string]any{"service.name": "spillway-grpcserver"}, attrMap(sp.Resource))
	require.Len(t, sp.Events, 1)
	require.Equal(t, "spillway.decision", sp.Events[0].Name)
	ev := attrMap(sp.Events[0].Attributes)
	retry, latency := ev["spillway.retry_after_ms"], ev["spillway.latency_us"]
	delete(ev, "spillway.retry_after_ms")
	delete(ev, "spillway.latency_us")
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
	}, sumPoints(t, metrics, "spillway.decisions"))
	require.Equal(t, map[string]float64{
		`{"spillway.degraded":false,"spillway.limiter":"grpc","spillway.outcome":"allowed"}`: 5,
		`{"spillway.degraded":false,"spillway.limiter":"grpc","spillway.outcome":"denied"}`:  1,
	}, sumPoints(t, metrics, "spillway.decision.duration"))
}

func TestTelemetryNone(t *testing.T) {
	d := startDemoOTel(t, "-otel", "none")
	conn := dial(t, d.addr)
	for range 5 {
		_, _, err := greet(context.Background(), conn, "k1")
		require.NoError(t, err)
	}
	_, _, err := greet(context.Background(), conn, "k1")
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	d.stop()
	require.Empty(t, d.otel.String())
}
