package httpx_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

// BenchmarkMiddleware compares a bare handler with the same handler behind
// Middleware, with an always-allow limiter (the middleware's own cost) and
// with a token bucket on a real redis-server over loopback (one round
// trip per request). Run side by side:
//
//	go test -run '^$' -bench Middleware -benchtime 20000x ./httpx
func BenchmarkMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	allow := block.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{Allowed: true, Limiter: "l", Limit: 100, Remaining: 99, ResetAfter: time.Second}, spillway.Noop, nil
	})
	rs := redistest.Start(b)
	rl, err := ratelimit.New(mustRedisStore(rs.Client(b)), ratelimit.Policy{Limit: 1_000_000, Period: time.Second}, ratelimit.Settings{})
	if err != nil {
		b.Fatal(err)
	}
	mux := func(h http.Handler) http.Handler {
		m := http.NewServeMux()
		m.Handle("GET /api/v1/search", h)
		return m
	}
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", mux(handler)},
		{"allow", mux(httpx.Middleware(allow, httpx.Settings{APIKeyHeader: "X-API-Key"})(handler))},
		{"redis", mux(httpx.Middleware(ratelimit.PerKey(rl, spillway.DimAPIKey), httpx.Settings{APIKeyHeader: "X-API-Key"})(handler))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/api/v1/search", nil)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req.Header.Set("X-API-Key", "key-"+strconv.Itoa(i%10000))
				i++
				rec := httptest.NewRecorder()
				bc.h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}

// holdPerKey reserves r.Cost on the API key's bucket at admission and
// settles it to the reported usage in done: what a "cost: response" rule
// does, with nothing else around it.
type holdPerKey struct{ l *ratelimit.Limiter }

func (h holdPerKey) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	key, _ := r.Get(spillway.DimAPIKey)
	hold, err := h.l.Reserve(ctx, key, r.EffectiveCost())
	if err != nil {
		return spillway.Decision{}, nil, err
	}
	if !hold.Decision().Allowed {
		return hold.Decision(), spillway.Noop, nil
	}
	u := r.Usage
	return hold.Decision(), func(spillway.Outcome) {
		actual, ok := u.Total()
		if !ok {
			actual = r.EffectiveCost()
		}
		_, _ = hold.Settle(context.Background(), actual)
	}, nil
}

// BenchmarkMiddlewareReserveSettle puts side by side, on one
// redis-server over loopback started by the benchmark: a plain decision
// (Allow of the cost) and a reserve+settle (Reserve of the estimate,
// Settle to the actual), each called on the store and through Middleware
// (the actual read from a response header the handler sets). 10k keys.
//
//	go test -run '^$' -bench MiddlewareReserveSettle -benchtime 20000x ./httpx
func BenchmarkMiddlewareReserveSettle(b *testing.B) {
	rs := redistest.Start(b)
	rl, err := ratelimit.New(mustRedisStore(rs.Client(b)), ratelimit.Policy{Limit: 1_000_000, Period: time.Second}, ratelimit.Settings{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Tokens-Used", "17")
		io.WriteString(w, "ok")
	})
	serve := func(h http.Handler) func(b *testing.B, i int) {
		m := http.NewServeMux()
		m.Handle("POST /api/v1/generate", h)
		req := httptest.NewRequest(http.MethodPost, "/api/v1/generate", nil)
		req.Header.Set("X-Estimate", "10")
		return func(b *testing.B, i int) {
			req.Header.Set("X-API-Key", keys[i%len(keys)])
			rec := httptest.NewRecorder()
			m.ServeHTTP(rec, req)
			if rec.Code != 200 {
				b.Fatalf("status %d", rec.Code)
			}
		}
	}
	for _, bc := range []struct {
		name string
		op   func(b *testing.B, i int)
	}{
		{"store/plain", func(b *testing.B, i int) {
			if d, err := rl.Allow(ctx, keys[i%len(keys)], 10); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}},
		{"store/reserve+settle", func(b *testing.B, i int) {
			h, err := rl.Reserve(ctx, keys[i%len(keys)], 10)
			if err != nil || !h.Decision().Allowed {
				b.Fatal(h, err)
			}
			if res, err := h.Settle(ctx, 17); err != nil || res != ratelimit.SettleApplied {
				b.Fatal(res, err)
			}
		}},
		{"middleware/plain", serve(httpx.Middleware(ratelimit.PerKey(rl, spillway.DimAPIKey), httpx.Settings{
			APIKeyHeader:   "X-API-Key",
			EstimateHeader: "X-Estimate",
		})(handler))},
		{"middleware/reserve+settle", serve(httpx.Middleware(holdPerKey{rl}, httpx.Settings{
			APIKeyHeader:   "X-API-Key",
			EstimateHeader: "X-Estimate",
			UsageHeader:    "X-Tokens-Used",
		})(handler))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				bc.op(b, i)
				i++
			}
		})
	}
}
