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
	allow := spillway.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{Allowed: true, Limiter: "l", Limit: 100, Remaining: 99, ResetAfter: time.Second}, spillway.Noop, nil
	})
	rs := redistest.Start(b)
	rl, err := ratelimit.New(ratelimit.NewRedisStore(rs.Client(b)), ratelimit.Policy{Limit: 1_000_000, Period: time.Second})
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
		{"allow", mux(httpx.Middleware(allow, httpx.WithAPIKeyHeader("X-API-Key"))(handler))},
		{"redis", mux(httpx.Middleware(ratelimit.PerKey(rl, spillway.DimAPIKey), httpx.WithAPIKeyHeader("X-API-Key"))(handler))},
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
