package grpcx_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/clienthook"
)

var t0 = time.Unix(1_800_000_000, 0)

const checkMethod = "/grpc.health.v1.Health/Check"

// recorder admits according to decide and records the requests and the
// outcomes of Done.
type recorder struct {
	mu       sync.Mutex
	decide   func(n int) (spillway.Decision, error)
	reqs     []spillway.Request
	inflight int
	outcomes []spillway.Outcome
}

func (r *recorder) Admit(_ context.Context, req *spillway.Request) (spillway.Decision, spillway.Done, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cp := *req
	cp.Dims = append([]spillway.Dimension(nil), req.Dims...)
	r.reqs = append(r.reqs, cp)
	d, err := r.decide(len(r.reqs))
	if err != nil || !d.Allowed {
		return d, spillway.Noop, err
	}
	r.inflight++
	return d, block.Once(func(o spillway.Outcome) {
		r.mu.Lock()
		r.inflight--
		r.outcomes = append(r.outcomes, o)
		r.mu.Unlock()
	}), nil
}

func (r *recorder) snapshot() ([]spillway.Request, int, []spillway.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]spillway.Request(nil), r.reqs...), r.inflight, append([]spillway.Outcome(nil), r.outcomes...)
}

func always(d spillway.Decision, err error) func(int) (spillway.Decision, error) {
	return func(int) (spillway.Decision, error) { return d, err }
}

// start runs a real gRPC server with the health service on 127.0.0.1 and
// returns a client connection to it.
func start(t *testing.T, lim spillway.Limiter, set grpcx.ServerSettings, dialOpts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpcx.UnaryServerInterceptor(lim, set)),
		grpc.ChainStreamInterceptor(grpcx.StreamServerInterceptor(lim, set)),
	)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dialOpts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func check(ctx context.Context, conn *grpc.ClientConn) (metadata.MD, error) {
	var hdr metadata.MD
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	return hdr, err
}

func fixedClock() time.Time { return t0 }

func TestUnaryAllowedAndDenied(t *testing.T) {
	rec := &recorder{decide: func(n int) (spillway.Decision, error) {
		if n == 1 {
			return spillway.Decision{Allowed: true, Limiter: "per_ip", Limit: 2, Remaining: 1, ResetAfter: 500 * time.Millisecond}, nil
		}
		return spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "per_ip", Limit: 2, ResetAfter: 2500 * time.Millisecond, RetryAfter: 1500 * time.Millisecond}, nil
	}}
	conn := start(t, rec, grpcx.ServerSettings{Clock: fixedClock})
	ctx := context.Background()

	hdr, err := check(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, []string{"2"}, hdr.Get("x-ratelimit-limit"))
	require.Equal(t, []string{"1"}, hdr.Get("x-ratelimit-remaining"))
	require.Equal(t, []string{strconv.FormatInt(t0.Unix()+1, 10)}, hdr.Get("x-ratelimit-reset"))

	hdr, err = check(ctx, conn)
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, `spillway: rate_limited by "per_ip"`, st.Message())
	require.Equal(t, []string{"2"}, hdr.Get("x-ratelimit-limit"))
	require.Equal(t, []string{"0"}, hdr.Get("x-ratelimit-remaining"))
	require.Equal(t, []string{strconv.FormatInt(t0.Unix()+3, 10)}, hdr.Get("x-ratelimit-reset"))
	details := st.Details()
	require.Len(t, details, 3)
	ei := details[0].(*errdetails.ErrorInfo)
	require.Equal(t, "RATE_LIMITED", ei.GetReason())
	require.Equal(t, "spillway", ei.GetDomain())
	require.Equal(t, map[string]string{"limiter": "per_ip"}, ei.GetMetadata())
	qf := details[1].(*errdetails.QuotaFailure)
	require.Len(t, qf.GetViolations(), 1)
	require.Equal(t, "per_ip", qf.GetViolations()[0].GetSubject())
	require.Equal(t, "rate_limited", qf.GetViolations()[0].GetDescription())
	ri := details[2].(*errdetails.RetryInfo)
	require.Equal(t, 1500*time.Millisecond, ri.GetRetryDelay().AsDuration())
	d, ok := grpcx.RetryDelay(err)
	require.True(t, ok)
	require.Equal(t, 1500*time.Millisecond, d)

	reqs, inflight, outs := rec.snapshot()
	require.Len(t, reqs, 2)
	require.Equal(t, checkMethod, reqs[0].Endpoint)
	require.Equal(t, "", reqs[0].Method)
	require.Equal(t, spillway.Critical, reqs[0].Priority)
	require.Equal(t, []spillway.Dimension{{Name: "ip", Value: "127.0.0.1"}}, reqs[0].Dims)
	require.Equal(t, 0, inflight)
	require.Equal(t, []spillway.Outcome{spillway.Success}, outs)
}

func TestUnaryCodes(t *testing.T) {
	storeDown := errors.New("redis: connection refused")
	cases := []struct {
		name  string
		d     spillway.Decision
		err   error
		set   grpcx.ServerSettings
		code  codes.Code
		retry time.Duration // 0: no RetryInfo
	}{
		{"shed", spillway.Decision{Reason: spillway.ReasonShed, Limiter: "fleet", RetryAfter: 3 * time.Second}, nil, grpcx.ServerSettings{}, codes.Unavailable, 3 * time.Second},
		{"ceiling without retry", spillway.Decision{Reason: spillway.ReasonCeiling, Limiter: "db"}, nil, grpcx.ServerSettings{}, codes.Unavailable, time.Second},
		{"concurrency", spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "inflight", RetryAfter: 20 * time.Millisecond}, nil, grpcx.ServerSettings{}, codes.ResourceExhausted, 20 * time.Millisecond},
		{"cost exceeds", spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "bulk"}, nil, grpcx.ServerSettings{}, codes.ResourceExhausted, 0},
		{"invalid", spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: "request"}, nil, grpcx.ServerSettings{}, codes.InvalidArgument, 0},
		{"store down open", spillway.Decision{}, storeDown, grpcx.ServerSettings{}, codes.OK, 0},
		{"store down closed", spillway.Decision{}, storeDown, grpcx.ServerSettings{FailMode: spillway.FailClosed}, codes.Unavailable, time.Second},
		{"store down, fail-closed tiers rule", spillway.Decision{}, &spillway.StoreError{Fail: spillway.FailClosed, Err: storeDown}, grpcx.ServerSettings{}, codes.Unavailable, time.Second},
		{"invalid cost", spillway.Decision{Allowed: true}, nil, grpcx.ServerSettings{Cost: func(context.Context, string) int64 { return -2 }}, codes.InvalidArgument, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var errs []error
			set := tc.set
			set.OnError = func(_ context.Context, m string, err error) { errs = append(errs, err) }
			conn := start(t, &recorder{decide: always(tc.d, tc.err)}, set)
			_, err := check(context.Background(), conn)
			require.Equal(t, tc.code, status.Code(err))
			d, ok := grpcx.RetryDelay(err)
			require.Equal(t, tc.retry != 0, ok)
			require.Equal(t, tc.retry, d)
			if tc.err != nil {
				require.Len(t, errs, 1)
				require.ErrorIs(t, errs[0], storeDown)
			}
		})
	}
}

func TestIdentityPriorityAndSkip(t *testing.T) {
	rec := &recorder{decide: always(spillway.Decision{Allowed: true}, nil)}
	conn := start(t, rec, grpcx.ServerSettings{
		APIKeyMetadata: "X-API-Key",
		UserMetadata:   "x-user-id",
		Skip:           grpcx.SkipMethods("/grpc.health.v1.Health/List"),
	})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1", "x-user-id", "u1", spillway.PriorityMetadataKey, "critical_plus")
	_, err := check(ctx, conn)
	require.NoError(t, err)
	// Priority metadata can lower…
	ctx = metadata.AppendToOutgoingContext(context.Background(), spillway.PriorityMetadataKey, "sheddable")
	_, err = check(ctx, conn)
	require.NoError(t, err)
	// …and a skipped method is not admitted at all.
	_, err = healthpb.NewHealthClient(conn).List(context.Background(), &healthpb.HealthListRequest{})
	require.NoError(t, err)

	reqs, _, _ := rec.snapshot()
	require.Len(t, reqs, 2)
	require.Equal(t, spillway.Critical, reqs[0].Priority) // not raised by the client's claim
	require.Equal(t, []spillway.Dimension{{Name: "ip", Value: "127.0.0.1"}, {Name: "user", Value: "u1"}, {Name: "api_key", Value: "k1"}}, reqs[0].Dims)
	require.Equal(t, spillway.Sheddable, reqs[1].Priority)

	rec2 := &recorder{decide: always(spillway.Decision{Allowed: true}, nil)}
	conn2 := start(t, rec2, grpcx.ServerSettings{TrustPriorityMetadata: true, Skip: grpcx.SkipMethods("/grpc.health.v1.Health/")})
	_, err = check(metadata.AppendToOutgoingContext(context.Background(), spillway.PriorityMetadataKey, "critical_plus"), conn2)
	require.NoError(t, err)
	reqs, _, _ = rec2.snapshot()
	require.Empty(t, reqs) // health checks skipped

	rec3 := &recorder{decide: always(spillway.Decision{Allowed: true}, nil)}
	conn3 := start(t, rec3, grpcx.ServerSettings{TrustPriorityMetadata: true})
	_, err = check(metadata.AppendToOutgoingContext(context.Background(), spillway.PriorityMetadataKey, "critical_plus"), conn3)
	require.NoError(t, err)
	reqs, _, _ = rec3.snapshot()
	require.Equal(t, spillway.CriticalPlus, reqs[0].Priority)
}

func TestStream(t *testing.T) {
	rec := &recorder{decide: func(n int) (spillway.Decision, error) {
		if n == 1 {
			return spillway.Decision{Allowed: true, Limiter: "streams", Limit: 1, Remaining: 0}, nil
		}
		return spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "streams", Limit: 1, RetryAfter: 250 * time.Millisecond}, nil
	}}
	conn := start(t, rec, grpcx.ServerSettings{})
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	resp, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
	hdr, err := w.Header()
	require.NoError(t, err)
	require.Equal(t, []string{"1"}, hdr.Get("x-ratelimit-limit"))

	w2, err := hc.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = w2.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	d, ok := grpcx.RetryDelay(err)
	require.True(t, ok)
	require.Equal(t, 250*time.Millisecond, d)

	cancel() // the client ends the first stream: released, Ignored
	require.Eventually(t, func() bool { _, n, _ := rec.snapshot(); return n == 0 }, 5*time.Second, time.Millisecond)
	_, _, outs := rec.snapshot()
	require.Equal(t, []spillway.Outcome{spillway.Ignored}, outs)
}

func TestChainReleasesWhenLaterLimiterDenies(t *testing.T) {
	counting := &recorder{decide: always(spillway.Decision{Allowed: true, Limiter: "inflight", Limit: 10, Remaining: 9}, nil)}
	shed := &recorder{decide: always(spillway.Decision{Reason: spillway.ReasonShed, Limiter: "worker", RetryAfter: time.Second}, nil)}
	conn := start(t, spillway.Chain(counting, shed), grpcx.ServerSettings{})
	_, err := check(context.Background(), conn)
	require.Equal(t, codes.Unavailable, status.Code(err))
	reqs, inflight, outs := counting.snapshot()
	require.Len(t, reqs, 1)
	require.Equal(t, 0, inflight)
	require.Equal(t, []spillway.Outcome{spillway.Ignored}, outs)
}

func TestDoneOnPanicAndOutcomes(t *testing.T) {
	rec := &recorder{decide: always(spillway.Decision{Allowed: true}, nil)}
	icpt := grpcx.UnaryServerInterceptor(rec, grpcx.ServerSettings{})
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
	func() {
		defer func() { require.Equal(t, "boom", recover()) }()
		icpt(context.Background(), nil, info, func(context.Context, any) (any, error) { panic("boom") })
	}()
	for _, err := range []error{nil, status.Error(codes.NotFound, "x"), status.Error(codes.Unavailable, "x"),
		status.Error(codes.DeadlineExceeded, "x"), status.Error(codes.Canceled, "x"), errors.New("plain")} {
		_, _ = icpt(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, err })
	}
	_, inflight, outs := rec.snapshot()
	require.Equal(t, 0, inflight)
	require.Equal(t, []spillway.Outcome{spillway.Ignored, spillway.Success, spillway.Success, spillway.Dropped,
		spillway.Dropped, spillway.Ignored, spillway.Dropped}, outs)

	srec := &recorder{decide: always(spillway.Decision{Allowed: true}, nil)}
	sicpt := grpcx.StreamServerInterceptor(srec, grpcx.ServerSettings{})
	func() {
		defer func() { require.Equal(t, "boom", recover()) }()
		sicpt(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/svc/S"}, func(any, grpc.ServerStream) error { panic("boom") })
	}()
	_, inflight, outs = srec.snapshot()
	require.Equal(t, 0, inflight)
	require.Equal(t, []spillway.Outcome{spillway.Ignored}, outs)
}

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context    { return context.Background() }
func (fakeStream) SetHeader(metadata.MD) error { return nil }

func TestClientRetriesRetryInfo(t *testing.T) {
	rec := &recorder{decide: func(n int) (spillway.Decision, error) {
		if n == 1 {
			return spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "per_ip", Limit: 1, RetryAfter: 30 * time.Millisecond}, nil
		}
		return spillway.Decision{Allowed: true, Limiter: "per_ip", Limit: 1}, nil
	}}
	conn := start(t, rec, grpcx.ServerSettings{}, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(&clientside.Client{Backoff: clientside.Backoff{Jitter: -1}, MaxRetries: clientside.DefaultMaxRetries}, grpcx.ClientSettings{})))
	start := time.Now()
	_, err := check(spillway.ContextWithPriority(context.Background(), spillway.SheddablePlus), conn)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	reqs, _, _ := rec.snapshot()
	require.Len(t, reqs, 2)
	// The client interceptor sent the context's priority; the server read it.
	require.Equal(t, spillway.SheddablePlus, reqs[0].Priority)
	require.Equal(t, spillway.SheddablePlus, reqs[1].Priority)
}

func TestClientRetryLimits(t *testing.T) {
	denyAll := func() *recorder {
		return &recorder{decide: always(spillway.Decision{Reason: spillway.ReasonShed, Limiter: "fleet", RetryAfter: time.Millisecond}, nil)}
	}
	// MaxRetries caps.
	rec := denyAll()
	conn := start(t, rec, grpcx.ServerSettings{}, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(&clientside.Client{MaxRetries: 3}, grpcx.ClientSettings{})))
	_, err := check(context.Background(), conn)
	require.Equal(t, codes.Unavailable, status.Code(err))
	reqs, _, _ := rec.snapshot()
	require.Len(t, reqs, 4)

	// MaxRetries 0 and a negative count turn retries off, and so does a
	// nil Client; NewClient retries DefaultMaxRetries times.
	def := clientside.NewClient()
	def.Throttle, def.Budget = nil, nil
	for _, tc := range []struct {
		c     *clientside.Client
		calls int
	}{
		{&clientside.Client{MaxRetries: 0}, 1},
		{&clientside.Client{MaxRetries: -1}, 1},
		{nil, 1},
		{def, 1 + clientside.DefaultMaxRetries},
	} {
		rec = denyAll()
		conn = start(t, rec, grpcx.ServerSettings{}, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(tc.c, grpcx.ClientSettings{})))
		_, err = check(context.Background(), conn)
		require.Equal(t, codes.Unavailable, status.Code(err))
		reqs, _, _ = rec.snapshot()
		require.Len(t, reqs, tc.calls, "client %+v", tc.c)
	}

	// The budget caps: one token, no refill.
	budget, err := clientside.NewRetryBudget(clientside.RetryBudgetSettings{MaxTokens: 1, Ratio: -1, MinRetriesPerSecond: -1})
	require.NoError(t, err)
	rec = denyAll()
	conn = start(t, rec, grpcx.ServerSettings{}, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(&clientside.Client{Budget: budget, MaxRetries: clientside.DefaultMaxRetries}, grpcx.ClientSettings{})))
	_, err = check(context.Background(), conn)
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = check(context.Background(), conn)
	require.Equal(t, codes.Unavailable, status.Code(err))
	reqs, _, _ = rec.snapshot()
	require.Len(t, reqs, 3) // 2 + 1

	// A retryable filter and a status without RetryInfo: not retried.
	rec = denyAll()
	conn = start(t, rec, grpcx.ServerSettings{}, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(clientside.NewClient(), grpcx.ClientSettings{Retryable: func(string) bool { return false }})))
	_, err = check(context.Background(), conn)
	require.Equal(t, codes.Unavailable, status.Code(err))
	reqs, _, _ = rec.snapshot()
	require.Len(t, reqs, 1)
}

type recThrottle struct {
	mu              sync.Mutex
	allow           bool
	allows, accepts int
}

func (r *recThrottle) Allow() bool { r.mu.Lock(); defer r.mu.Unlock(); r.allows++; return r.allow }
func (r *recThrottle) Accepted()   { r.mu.Lock(); defer r.mu.Unlock(); r.accepts++ }

func TestClientThrottle(t *testing.T) {
	rec := &recorder{decide: func(n int) (spillway.Decision, error) {
		if n == 2 {
			return spillway.Decision{Reason: spillway.ReasonShed, Limiter: "fleet"}, nil
		}
		return spillway.Decision{Allowed: true}, nil
	}}
	th := &recThrottle{allow: true}
	conn := start(t, rec, grpcx.ServerSettings{},
		grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(throttled(&clientside.Client{}, th), grpcx.ClientSettings{})),
		grpc.WithChainStreamInterceptor(grpcx.StreamClientInterceptor(throttled(&clientside.Client{}, th), grpcx.ClientSettings{})))
	_, err := check(context.Background(), conn)
	require.NoError(t, err)
	_, err = check(context.Background(), conn)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, 2, th.allows)
	require.Equal(t, 1, th.accepts)

	w, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = w.Recv()
	require.NoError(t, err)
	require.Equal(t, 3, th.allows)
	require.Equal(t, 2, th.accepts)

	th.allow = false
	_, err = check(context.Background(), conn)
	require.ErrorIs(t, err, clientside.ErrThrottled)
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	require.ErrorIs(t, err, clientside.ErrThrottled)
	reqs, _, _ := rec.snapshot()
	require.Len(t, reqs, 3)
}

type onceThrottle struct {
	mu sync.Mutex
	n  int
}

func (o *onceThrottle) Allow() bool { o.mu.Lock(); defer o.mu.Unlock(); o.n++; return o.n == 1 }
func (o *onceThrottle) Accepted()   {}

// throttled makes c ask th instead of its Throttle.
func throttled(c *clientside.Client, th clienthook.Throttler) *clientside.Client {
	clienthook.SetThrottle(c, th)
	return c
}

// A retry the throttle refuses returns the server's status, not ErrThrottled.
func TestClientThrottleRefusesRetry(t *testing.T) {
	rec := &recorder{decide: always(spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "per_ip", RetryAfter: time.Millisecond}, nil)}
	conn := start(t, rec, grpcx.ServerSettings{}, grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(throttled(&clientside.Client{Budget: defaultBudget(t), MaxRetries: clientside.DefaultMaxRetries}, &onceThrottle{}), grpcx.ClientSettings{})))
	_, err := check(context.Background(), conn)
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.NotErrorIs(t, err, clientside.ErrThrottled)
	reqs, _, _ := rec.snapshot()
	require.Len(t, reqs, 1)
}

func TestForwardedForOnlyFromTrustedProxies(t *testing.T) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.1.1.1")
	for _, tc := range []struct {
		trusted []netip.Prefix
		want    string
	}{
		{nil, "127.0.0.1"},
		{[]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, "127.0.0.1"}, // the peer itself is not trusted
		{[]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}, "203.0.113.9"},
	} {
		rec := &recorder{decide: always(spillway.Decision{Allowed: true}, nil)}
		conn := start(t, rec, grpcx.ServerSettings{TrustedProxies: tc.trusted})
		_, err := check(ctx, conn)
		require.NoError(t, err)
		reqs, _, _ := rec.snapshot()
		require.Equal(t, []spillway.Dimension{{Name: "ip", Value: tc.want}}, reqs[0].Dims)
	}
}

// A call whose client's deadline (the incoming context's, from
// grpc-timeout) passed ends Ignored: the client gave up, which says
// nothing of the server's load. A DeadlineExceeded of the handler's own
// (an outgoing call's deadline) while the client still waits is Dropped.
func TestClientDeadlineOutcome(t *testing.T) {
	rec := &recorder{decide: always(spillway.Decision{Allowed: true}, nil)}
	icpt := grpcx.UnaryServerInterceptor(rec, grpcx.ServerSettings{})
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	deadlineErr := status.Error(codes.DeadlineExceeded, "x")
	_, _ = icpt(expired, nil, info, func(context.Context, any) (any, error) { return nil, deadlineErr })
	_, _ = icpt(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, deadlineErr })
	_, _ = icpt(expired, nil, info, func(context.Context, any) (any, error) { return "ok", nil })
	_, inflight, outs := rec.snapshot()
	require.Equal(t, 0, inflight)
	require.Equal(t, []spillway.Outcome{spillway.Ignored, spillway.Dropped, spillway.Success}, outs)
}

func defaultBudget(t *testing.T) *clientside.RetryBudget {
	t.Helper()
	b, err := clientside.NewRetryBudget(clientside.RetryBudgetSettings{})
	require.NoError(t, err)
	return b
}
