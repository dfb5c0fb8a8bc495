package main

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway/examples/grpcserver/greeterpb"
	"github.com/spillway-go/spillway/examples/internal/demo"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// generate calls Generate and returns the chunks' tokens, the response
// headers and the error that ended the stream (nil: it completed).
func generate(t *testing.T, conn *grpc.ClientConn, key string, seed uint64) ([]int64, metadata.MD, error) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
	var hdr metadata.MD
	s, err := greeterpb.NewGreeterClient(conn).Generate(ctx, &greeterpb.GenerateRequest{Seed: seed}, grpc.Header(&hdr))
	require.NoError(t, err)
	var chunks []int64
	var total uint64
	for {
		c, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return chunks, hdr, nil
		}
		if err != nil {
			return chunks, hdr, err
		}
		total += uint64(c.GetTokens())
		require.Equal(t, total, c.GetTotal())
		chunks = append(chunks, int64(c.GetTokens()))
	}
}

func chunksOf(n int64) []int64 {
	var out []int64
	for ; n > 0; n -= chunkTokens {
		out = append(out, min(n, chunkTokens))
	}
	return out
}

// generateSeq spends a fresh key's 2000 tokens/minute with seeds 1 to 7
// (166+204+357+351+399+265 = 1742, then 337): six streams complete; the
// seventh is admitted with 258 left (plus what came back meanwhile),
// sends 5 chunks (250 tokens), and its sixth chunk (300 > 258) is refused:
// the stream ends RESOURCE_EXHAUSTED, settled at 300, 42 in debt. The next
// call is denied when it opens.
func generateSeq(t *testing.T, addr string) {
	t.Helper()
	conn := dial(t, addr)
	key := "gen-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const perSec = 2000.0 / 60
	start := time.Now()
	refill := func() float64 { return time.Since(start).Seconds() * perSec }
	for seed := uint64(1); seed <= 6; seed++ {
		chunks, _, err := generate(t, conn, key, seed)
		require.NoError(t, err, "seed %d", seed)
		require.Equal(t, chunksOf(demo.Tokens(seed)), chunks, "seed %d", seed)
	}
	chunks, _, err := generate(t, conn, key, 7)
	require.Less(t, refill(), 42.0, "the machine was too slow for this sequence")
	require.Equal(t, []int64{50, 50, 50, 50, 50}, chunks)
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	require.Equal(t, `spillway: rate_limited by "generate_tokens"`, st.Message())
	var reason string
	var retry time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	require.Equal(t, "RATE_LIMITED", reason)
	// The next estimate (250) and the debt (300 − what the key had, 258
	// plus refill) at 2000 a minute: at most 292 tokens, 8.76 s.
	require.LessOrEqual(t, retry, time.Duration(292/perSec*float64(time.Second)))
	require.Greater(t, retry, time.Duration((292-refill())/perSec*float64(time.Second))-time.Millisecond)

	chunks, hdr, err := generate(t, conn, key, 8)
	require.Empty(t, chunks)
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.Equal(t, []string{"2000"}, hdr.Get("x-ratelimit-limit"))
	require.Equal(t, []string{"0"}, hdr.Get("x-ratelimit-remaining"))
}
