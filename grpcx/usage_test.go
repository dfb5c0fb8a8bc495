package grpcx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/usagestep"
)

// spentError is what holdLimiter's steps return: it carries the decision.
type spentError struct{ d spillway.Decision }

func (e *spentError) Error() string               { return fmt.Sprintf("limit %d spent", e.d.Limit) }
func (e *spentError) Decision() spillway.Decision { return e.d }

// holdLimiter reserves the estimate on a ratelimit memory store, refuses a
// step whose total is above what the key had left, and settles the total
// (or the estimate) in done: what a "cost: response" rule does.
type holdLimiter struct {
	lim     *ratelimit.Limiter
	mu      sync.Mutex
	settled []int64
}

func (h *holdLimiter) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	est := max(r.Cost, 1)
	hold, err := h.lim.Reserve(ctx, "k", est)
	if err != nil {
		return spillway.Decision{}, nil, err
	}
	d := hold.Decision()
	if !hold.Decision().Allowed {
		return d, spillway.Noop, nil
	}
	avail := d.Remaining + est
	u := r.Usage
	if u != nil {
		usagestep.OnStep(u, func(total int64) error {
			if total > avail {
				return &spentError{spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "tokens", Limit: d.Limit, RetryAfter: time.Second}}
			}
			return nil
		})
	}
	return d, block.Once(func(spillway.Outcome) {
		actual := est
		if u != nil {
			if t, ok := u.Total(); ok {
				actual = t
			}
		}
		_, _ = hold.Settle(context.Background(), actual)
		h.mu.Lock()
		h.settled = append(h.settled, actual)
		h.mu.Unlock()
	}), nil
}

var generateDesc = grpc.StreamDesc{StreamName: "Generate", ServerStreams: true}

// generate streams one message per 100 tokens, reporting each, until the
// request's count of chunks is sent or the limit refuses a step.
func generate(_ any, ss grpc.ServerStream) error {
	var in healthpb.HealthCheckRequest
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	var chunks int
	fmt.Sscan(in.GetService(), &chunks)
	for range chunks {
		if err := spillway.ReportUsage(ss.Context(), 100); err != nil {
			return grpcx.UsageStatus(err).Err()
		}
		if err := ss.SendMsg(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
			return err
		}
	}
	return nil
}

func startGenerate(t *testing.T, l spillway.Limiter, set grpcx.ServerSettings) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(grpcx.StreamServerInterceptor(l, set)))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.Gen", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Generate", ServerStreams: true, Handler: generate}},
	}, struct{}{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// callGenerate asks for chunks messages with the estimate in metadata and
// returns how many arrived and the error that ended the stream (nil: EOF).
func callGenerate(t *testing.T, conn *grpc.ClientConn, chunks int, estimate string) (int, error) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-estimate", estimate)
	s, err := conn.NewStream(ctx, &generateDesc, "/test.Gen/Generate")
	require.NoError(t, err)
	require.NoError(t, s.SendMsg(&healthpb.HealthCheckRequest{Service: fmt.Sprint(chunks)}))
	require.NoError(t, s.CloseSend())
	n := 0
	for {
		var out healthpb.HealthCheckResponse
		if err := s.RecvMsg(&out); err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
		n++
	}
}

func TestStreamSettlesInSteps(t *testing.T) {
	lim, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Algorithm: ratelimit.TokenBucket, Limit: 1000, Period: time.Hour}, ratelimit.Settings{})
	require.NoError(t, err)
	hl := &holdLimiter{lim: lim}
	conn := startGenerate(t, hl, grpcx.ServerSettings{EstimateMetadata: "X-Estimate"})

	// 3 chunks of 100 on an estimate of 200: all sent, settled to 300.
	n, err := callGenerate(t, conn, 3, "200")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	// 700 left: a stream asking for 10 chunks gets 7, then the step to 800
	// is refused and the stream ends ResourceExhausted with the details.
	n, err = callGenerate(t, conn, 10, "100")
	require.Equal(t, 7, n)
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, `spillway: rate_limited by "tokens"`, st.Message())
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if e, ok := d.(*errdetails.ErrorInfo); ok {
			info = e
		}
	}
	require.NotNil(t, info)
	require.Equal(t, "RATE_LIMITED", info.GetReason())
	d, ok := grpcx.RetryDelay(err)
	require.True(t, ok)
	require.Equal(t, time.Second, d)

	// Bad estimates: InvalidArgument, the handler never runs.
	for _, bad := range []string{"-5", "9223372036854775808", "ten"} {
		n, err = callGenerate(t, conn, 1, bad)
		require.Equal(t, 0, n, bad)
		require.Equal(t, codes.InvalidArgument, status.Code(err), bad)
	}
	hl.mu.Lock()
	defer hl.mu.Unlock()
	// The refused step is reported too (Usage.Add adds, then asks).
	require.Equal(t, []int64{300, 800}, hl.settled)
}

func TestUsageStatusWithoutDecision(t *testing.T) {
	require.Nil(t, grpcx.UsageStatus(nil))
	st := grpcx.UsageStatus(errors.New("quota gone"))
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, "spillway: usage refused: quota gone", st.Message())
	require.Len(t, st.Details(), 1)
	require.Equal(t, grpcx.ReasonUsageSpent, st.Details()[0].(*errdetails.ErrorInfo).GetReason())
}
