package httpx_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway/internal/block"
)

// Real blocks end to end: a Redis token bucket, then a per-IP concurrency
// limit of 1, then a shedder that denies. The concurrency slot taken for a
// shed request must be given back, or the next request would get 429.
func TestRealChainOverRedis(t *testing.T) {
	rs := redistest.Start(t)
	rl, err := ratelimit.New(mustRedisStore(rs.Client(t)), ratelimit.Policy{Limit: 3, Period: time.Minute}, ratelimit.Settings{Scope: "per_ip"})
	require.NoError(t, err)
	conc, err := concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), 1, concurrency.Settings{Name: "inflight"})
	require.NoError(t, err)
	shed := true
	shedder := block.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
		if shed {
			return spillway.Decision{Reason: spillway.ReasonShed, Limiter: "worker", RetryAfter: 2 * time.Second}, spillway.Noop, nil
		}
		return spillway.Decision{Allowed: true, Limiter: "worker"}, spillway.Noop, nil
	})
	chain := spillway.Chain(ratelimit.PerKey(rl, spillway.DimIP), concurrency.PerKey(conc, spillway.DimIP), shedder)
	srv := serve(t, httpx.Middleware(chain, httpx.Settings{IETFHeaders: true})(okHandler()))

	resp, _ := get(t, srv.URL, nil)
	require.Equal(t, 503, resp.StatusCode)
	require.Equal(t, "2", resp.Header.Get("Retry-After"))
	shed = false
	resp, _ = get(t, srv.URL, nil) // the slot was released: admitted
	require.Equal(t, 200, resp.StatusCode)
	// The headers describe the rate limit, not the concurrency limit (1,
	// none left while this request runs, so lower). The rate limit ran
	// first, so the shed request was charged too: 3 − 2 = 1 left.
	require.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "1", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, `"per_ip:ip";q=3;w=60`, resp.Header.Get("RateLimit-Policy"))
	require.Equal(t, `"per_ip:ip";r=1;t=40`, resp.Header.Get("RateLimit"))
	resp, _ = get(t, srv.URL, nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	resp, _ = get(t, srv.URL, nil)
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "20", resp.Header.Get("Retry-After")) // 3/minute: a token every 20 s
}

// A real Redis that is down: the store error follows the fail mode.
func TestRedisDownFailOpenAndClosed(t *testing.T) {
	rs := redistest.Start(t)
	opt := &redis.Options{Addr: rs.Addr}
	fallback.TuneOptions(opt) // fail fast instead of go-redis's patient retries
	client := redis.NewClient(opt)
	t.Cleanup(func() { client.Close() })
	rl, err := ratelimit.New(mustRedisStore(client), ratelimit.Policy{Limit: 10, Period: time.Minute}, ratelimit.Settings{Scope: "per_ip"})
	require.NoError(t, err)
	lim := ratelimit.PerKey(rl, spillway.DimIP)

	var errs int
	onErr := func(*http.Request, error) { errs++ }
	open := serve(t, httpx.Middleware(lim, httpx.Settings{OnError: onErr})(okHandler()))
	closed := serve(t, httpx.Middleware(lim, httpx.Settings{OnError: onErr, FailMode: spillway.FailClosed})(okHandler()))

	resp, _ := get(t, open.URL, nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "9", resp.Header.Get("X-RateLimit-Remaining"))
	require.Zero(t, errs)

	rs.Stop()
	resp, body := get(t, open.URL, nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "ok", body)
	require.Empty(t, resp.Header.Get("X-RateLimit-Limit"))
	resp, _ = get(t, closed.URL, nil)
	require.Equal(t, 503, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Equal(t, 2, errs)
}

// mustRedisStore is ratelimit.NewRedisStore for a client and settings that
// are valid.
func mustRedisStore(c redis.UniversalClient, set ...ratelimit.RedisSettings) *ratelimit.RedisStore {
	s, err := ratelimit.NewRedisStore(c, append(set, ratelimit.RedisSettings{})[0])
	if err != nil {
		panic(err)
	}
	return s
}
