package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway/examples/internal/demo"
	"github.com/stretchr/testify/require"
)

// tokensEstimate is the estimate of the generate_tokens rule (limits.yaml).
const tokensEstimate = 250

func TestTokensFor(t *testing.T) {
	got := make([]int64, 0, 8)
	for seed := uint64(1); seed <= 8; seed++ {
		got = append(got, tokensFor(seed))
	}
	require.Equal(t, []int64{166, 204, 357, 351, 399, 265, 337, 162}, got)
	for seed := range uint64(10000) {
		n := tokensFor(seed)
		require.True(t, n >= demo.MinTokens && n <= demo.MaxTokens, "seed %d: %d", seed, n)
	}
}

// generateSeq spends a fresh key's 2000 tokens/minute with seeds 1 to 7
// (166+204+357+351+399+265+337 = 2079 tokens, 79 more than the bucket):
// seven 200s — each holding 250 at admission, so Remaining is what is left
// after the hold — then a 429 whose wait covers the debt. Refill is 2000
// tokens a minute, so between requests a few tokens come back: the
// expected headers are bounded by the time the test took.
func generateSeq(t *testing.T, base string) {
	t.Helper()
	key := map[string]string{"X-API-Key": "gen-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	const perSec = 2000.0 / 60
	start := time.Now()
	refill := func() int64 { return int64(math.Ceil(time.Since(start).Seconds() * perSec)) }
	spent := int64(0)
	for seed := uint64(1); seed <= 7; seed++ {
		resp, body := do(t, "POST", fmt.Sprintf("%s/api/v1/generate?seed=%d", base, seed), key)
		require.Equal(t, 200, resp.StatusCode, "seed %d: %s", seed, body)
		tokens := tokensFor(seed)
		var got map[string]any
		require.NoError(t, json.Unmarshal([]byte(body), &got))
		require.Equal(t, map[string]any{"seed": float64(seed), "tokens_used": float64(tokens)}, got)
		require.Equal(t, strconv.FormatInt(tokens, 10), resp.Header.Get("X-Tokens-Used"))
		require.Equal(t, "2000", resp.Header.Get("X-RateLimit-Limit"))
		require.Equal(t, `"generate_tokens";q=2000;w=60`, resp.Header.Get("RateLimit-Policy"))
		remaining, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Remaining"), 10, 64)
		require.NoError(t, err)
		want := 2000 - spent - tokensEstimate // what is left once the estimate is held
		if seed == 1 {
			require.Equal(t, want, remaining) // a fresh bucket: nothing to refill
		} else {
			require.True(t, remaining >= want && remaining <= want+refill(), "seed %d: remaining %d, want %d + refill ≤ %d", seed, remaining, want, refill())
		}
		spent += tokens
	}
	// 79 tokens in debt: the next request needs 329 to come back, about 10 s.
	resp, body := do(t, "POST", base+"/api/v1/generate?seed=8", key)
	require.Equal(t, 429, resp.StatusCode)
	p := problem(t, resp, body)
	require.Equal(t, "generate_tokens", p["limiter"])
	require.Equal(t, "rate_limited", p["reason"])
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	require.Empty(t, resp.Header.Get("X-Tokens-Used"))
	retry, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
	require.NoError(t, err)
	need := float64(tokensEstimate + spent - 2000)
	maxRetry := int64(math.Ceil(need / perSec))
	minRetry := int64(math.Ceil((need - float64(refill())) / perSec))
	require.True(t, retry >= minRetry && retry <= maxRetry, "Retry-After %d, want %d to %d", retry, minRetry, maxRetry)
	require.Equal(t, int64(10), maxRetry)

	resp, body = do(t, "POST", base+"/api/v1/generate?seed=x", map[string]string{"X-API-Key": "gen-bad-seed"})
	require.Equal(t, 400, resp.StatusCode)
	require.JSONEq(t, `{"error":"seed=\"x\": want an unsigned integer"}`, body)
}

// The generate route's holds are on /metrics: every hold settled, none
// outstanding, the tokens charged.
func TestGenerateHoldMetrics(t *testing.T) {
	base, _ := start(t)
	key := map[string]string{"X-API-Key": "gen-metrics"}
	for seed := uint64(1); seed <= 3; seed++ {
		resp, _ := do(t, "POST", fmt.Sprintf("%s/api/v1/generate?seed=%d", base, seed), key)
		require.Equal(t, 200, resp.StatusCode)
	}
	resp, body := do(t, "GET", base+"/metrics", nil)
	require.Equal(t, 200, resp.StatusCode)
	const scope = `otel_scope_name="github.com/spillway-go/spillway/telemetry",otel_scope_schema_url="",otel_scope_version="",spillway_limiter="api",spillway_rule="generate_tokens"`
	require.Contains(t, body, "\nspillway_holds_outstanding{"+scope+"} 0\n")
	require.Contains(t, body, "\nspillway_holds_settles_total{"+scope+`,spillway_settle_result="applied"} 3`+"\n")
	require.Contains(t, body, "\nspillway_holds_settled_units_total{"+scope+"} 727\n") // 166 + 204 + 357
	require.NotContains(t, body, "spillway_holds_expired")
}
