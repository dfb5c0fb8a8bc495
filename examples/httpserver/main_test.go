package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway/examples/internal/demotest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/stretchr/testify/require"
)

// start runs the demo; its Stop first closes the client's idle
// connections: the transport may have dialed one that never carried a
// request, which the server's graceful shutdown would wait 5 s for.
func start(t *testing.T, args ...string) (base string, s *demotest.Server) {
	t.Helper()
	s = demotest.Start(t, run, args...)
	stop := s.Stop
	s.Stop = func() {
		http.DefaultClient.CloseIdleConnections()
		stop()
	}
	t.Cleanup(s.Stop) // runs before demotest's: cleanups run last-in first-out
	return "http://" + s.Addr, s
}

func do(t *testing.T, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	return doCtx(t, context.Background(), method, url, hdr)
}

func doCtx(t *testing.T, ctx context.Context, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// problem decodes a denial's application/problem+json body.
func problem(t *testing.T, resp *http.Response, body string) map[string]any {
	t.Helper()
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	return p
}

// smoke runs the same requests against a freshly started demo.
func smoke(t *testing.T, base string) {
	var body string
	resp, h := healthz(t, base)
	require.Equal(t, true, h["ok"])
	require.Equal(t, false, h["degraded"])
	if r, ok := h["redis"].(map[string]any); ok {
		require.Equal(t, "closed", r["state"])
	}
	require.Empty(t, resp.Header.Get("X-RateLimit-Limit"))

	// Login: 5 per minute per user (and 10 per minute per IP).
	for i := 1; i <= 5; i++ {
		resp, _ = do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
		require.Equal(t, 200, resp.StatusCode, "login %d", i)
		require.Equal(t, "5", resp.Header.Get("X-RateLimit-Limit"))
		require.Equal(t, []string{strconv.Itoa(5 - i)}, resp.Header.Values("X-RateLimit-Remaining"))
		require.Equal(t, `"login_user";q=5;w=60`, resp.Header.Get("RateLimit-Policy"))
	}
	resp, body = do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "12", resp.Header.Get("Retry-After")) // 5/minute: one token every 12 s
	require.Equal(t, "5", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	require.NotEmpty(t, resp.Header.Get("X-RateLimit-Reset"))
	require.Equal(t, `"login_user";q=5;w=60`, resp.Header.Get("RateLimit-Policy"))
	require.Equal(t, `"login_user";r=0;t=60`, resp.Header.Get("RateLimit"))
	p := problem(t, resp, body)
	require.Equal(t, float64(429), p["status"])
	require.Equal(t, "rate_limited", p["reason"])
	require.Equal(t, "login_user", p["limiter"])
	require.Equal(t, float64(12), p["retry_after"])

	// Another user from the same IP still gets in (the IP rule has 4 left).
	resp, _ = do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "bob"})
	require.Equal(t, 200, resp.StatusCode)

	// Search with a key: 60/minute, burst 20 per key. The headers describe
	// that rate limit, not the per-client concurrency limit (10 in flight,
	// 9 left while this one runs, which is lower).
	resp, body = do(t, "GET", base+"/api/v1/search?q=go", map[string]string{"X-API-Key": "k1"})
	require.Equal(t, 200, resp.StatusCode)
	require.JSONEq(t, `{"query":"go","results":[]}`, body)
	require.Equal(t, "20", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "19", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, `"search";q=20;w=20`, resp.Header.Get("RateLimit-Policy"))
	require.Equal(t, `"search";r=19;t=1`, resp.Header.Get("RateLimit"))

	// Search without a key is limited per IP: 20 at once, then 429. The
	// key k1 above has its own bucket.
	for i := 1; i <= 20; i++ {
		resp, _ = do(t, "GET", base+"/api/v1/search?q=anon", nil)
		require.Equal(t, 200, resp.StatusCode, "anonymous search %d", i)
		require.Equal(t, strconv.Itoa(20-i), resp.Header.Get("X-RateLimit-Remaining"))
	}
	resp, body = do(t, "GET", base+"/api/v1/search?q=anon", nil)
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After")) // 60/minute: a token a second
	require.Equal(t, "search", problem(t, resp, body)["limiter"])

	resp, body = do(t, "POST", base+"/api/v1/posts", map[string]string{"X-API-Key": "k1"})
	require.Equal(t, 201, resp.StatusCode)
	require.JSONEq(t, `{"id":1}`, body)
	require.Equal(t, "50", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, `"posts";q=50;w=1`, resp.Header.Get("RateLimit-Policy"))

	resp, body = do(t, "GET", base+"/api/v1/report?ms=0", nil)
	require.Equal(t, 200, resp.StatusCode)
	// No work asked for; a loaded machine may still take a millisecond or
	// a few to answer (the handler measures wall time).
	var report struct {
		WorkedMS *int64 `json:"worked_ms"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &report))
	require.NotNil(t, report.WorkedMS, body)
	require.True(t, *report.WorkedMS >= 0 && *report.WorkedMS < 100, body)
	resp, body = do(t, "GET", base+"/api/v1/report?ms=10001", nil)
	require.Equal(t, 400, resp.StatusCode)
	require.JSONEq(t, `{"error":"ms=\"10001\": want 0 to 10000"}`, body)

	resp, _ = do(t, "GET", base+"/api/v1/posts", nil)
	require.Equal(t, 405, resp.StatusCode)
}

func TestSmokeMemory(t *testing.T) {
	base, s := start(t)
	require.Contains(t, s.Out.String(), "listening on "+base+" ")
	require.Contains(t, s.Out.String(), "store: memory")
	smoke(t, base)
	generateSeq(t, base)
}

func TestSmokeRedis(t *testing.T) {
	rs := redistest.Start(t)
	// A budget well above a Redis call on a loaded test machine, so that
	// the exact headers below come from Redis, not the local share.
	base, s := start(t, "-redis", rs.Addr, "-redis-budget", "300ms")
	require.Contains(t, s.Out.String(), "store: redis "+rs.Addr)
	smoke(t, base)
	generateSeq(t, base)

	// Redis stalls: requests are still answered, from the local share.
	require.NoError(t, rs.Pause())
	defer rs.Resume()
	// (posts: burst 50, so the local share is 10)
	for i := range 8 {
		resp, _ := do(t, "POST", base+"/api/v1/posts", map[string]string{"X-API-Key": "k2"})
		require.Equal(t, 201, resp.StatusCode, "post %d while Redis is paused", i)
	}
	// One health for the one Redis: K = 5 failures seen by the blocks
	// opened it for all of them.
	_, h := healthz(t, base)
	require.Equal(t, true, h["ok"])
	require.Equal(t, true, h["degraded"])
	r := h["redis"].(map[string]any)
	require.Equal(t, "open", r["state"])
	require.Equal(t, float64(1), r["opened"])
	require.GreaterOrEqual(t, r["failures"], float64(5))
}

// healthz decodes GET /healthz.
func healthz(t *testing.T, base string) (*http.Response, map[string]any) {
	t.Helper()
	resp, body := do(t, "GET", base+"/healthz", nil)
	require.Equal(t, 200, resp.StatusCode)
	var h map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &h))
	return resp, h
}

// allowed reads, from /metrics, how many requests the chain has admitted.
func allowed(t *testing.T, base string) int {
	t.Helper()
	_, body := do(t, "GET", base+"/metrics", nil)
	m := regexp.MustCompile(`(?m)^spillway_decisions_total\{[^}]*spillway_outcome="allowed"[^}]*\} (\d+)$`).FindAllStringSubmatch(body, -1)
	n := 0
	for _, g := range m {
		v, err := strconv.Atoi(g[1])
		require.NoError(t, err)
		n += v
	}
	return n
}

// slow starts n GET /api/v1/report?ms=10000 with the given API keys ("" for
// none) and waits until the chain has admitted them all (they hold their
// slots until cancel). It returns a func that cancels them and waits.
func slow(t *testing.T, base string, keys []string) (cancel func()) {
	t.Helper()
	before := allowed(t, base)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/report?ms=10000", nil)
			if k != "" {
				req.Header.Set("X-API-Key", k)
			}
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	require.Eventually(t, func() bool { return allowed(t, base) == before+len(keys) }, 30*time.Second, 10*time.Millisecond)
	return func() { stop(); wg.Wait() }
}

// Past 10 requests in flight per client the concurrency limit answers 429;
// past 32 GETs in flight in the server (80% of -worker 40) the worker
// shedder answers 503, while POSTs (Critical) still get in up to 40. The
// rate-limit headers of allowed responses keep describing the rate limits.
func TestConcurrencyAndShedding(t *testing.T) {
	base, _ := start(t)

	// Ten slow anonymous reports: the client (this IP) has no slot left.
	release := slow(t, base, make([]string, 10))
	defer release()
	resp, body := do(t, "GET", base+"/api/v1/report?ms=0", nil)
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	p := problem(t, resp, body)
	require.Equal(t, "concurrency", p["reason"])
	require.Equal(t, "per_client_concurrency", p["limiter"])
	// Another client (an API key) still gets in; its headers describe the
	// report rate limit (burst 60), not the worker's or the concurrency's.
	resp, _ = do(t, "GET", base+"/api/v1/report?ms=0", map[string]string{"X-API-Key": "other"})
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "60", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "59", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, `"report";q=60;w=30`, resp.Header.Get("RateLimit-Policy"))

	// 22 more slow GETs from 22 keys: 32 GETs in flight, the worker's cap
	// for sheddable_plus work.
	keys := make([]string, 22)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	releaseMore := slow(t, base, keys)
	defer releaseMore()
	resp, body = do(t, "GET", base+"/api/v1/report?ms=0", map[string]string{"X-API-Key": "one-more"})
	require.Equal(t, 503, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	p = problem(t, resp, body)
	require.Equal(t, "shed", p["reason"])
	require.Equal(t, "worker", p["limiter"])
	// A POST is Critical: the worker keeps 20% of its capacity for it.
	resp, _ = do(t, "POST", base+"/api/v1/posts", map[string]string{"X-API-Key": "one-more"})
	require.Equal(t, 201, resp.StatusCode)
	require.Equal(t, `"posts";q=50;w=1`, resp.Header.Get("RateLimit-Policy"))

	// The slots are released when the requests end (the server sees the
	// clients go away a moment after they do).
	releaseMore()
	release()
	require.Eventually(t, func() bool {
		resp, _ = do(t, "GET", base+"/api/v1/report?ms=0", nil)
		return resp.StatusCode == 200
	}, 5*time.Second, 100*time.Millisecond)
}

func TestMetricsOff(t *testing.T) {
	base, _ := start(t, "-metrics=false")
	resp, _ := do(t, "GET", base+"/metrics", nil)
	require.Equal(t, 404, resp.StatusCode)
}

func TestHelp(t *testing.T) {
	var out demotest.Buffer
	err := run(context.Background(), []string{"-h"}, &out, io.Discard, nil)
	require.ErrorIs(t, err, flag.ErrHelp)
	for _, want := range []string{"POST /api/v1/login", "GET  /api/v1/search", "POST /api/v1/posts", "GET  /api/v1/report?ms=N", "POST /api/v1/generate?seed=N", "-tokens",
		"GET  /healthz", "GET  /metrics", "X-API-Key", "X-User-ID", "Spillway-Priority", "-redis", "-otel"} {
		require.Contains(t, out.String(), want)
	}
}

func TestBadConfig(t *testing.T) {
	err := run(context.Background(), []string{"-config", "/nonexistent/limits.yaml"}, io.Discard, io.Discard, nil)
	require.ErrorContains(t, err, "/nonexistent/limits.yaml")
	err = run(context.Background(), []string{"-redis", "127.0.0.1:1"}, io.Discard, io.Discard, nil)
	require.ErrorContains(t, err, "redis 127.0.0.1:1")
	err = run(context.Background(), []string{"-otel", "otlp"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, `-otel "otlp": want stdout or none`)
	err = run(context.Background(), []string{"-otel-interval", "0s"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, "-otel-interval 0s: must be positive")
	err = run(context.Background(), []string{"-worker", "0"}, io.Discard, io.Discard, nil)
	require.ErrorContains(t, err, "capacity 0")
}

// -otel stdout prints the denied request's span, with its decision event,
// and counts every decision; the flush on exit exports the last interval.
func TestTelemetryStdout(t *testing.T) {
	base, s := start(t, "-otel", "stdout", "-otel-interval", "1h") // one export: the flush on exit
	for i := 1; i <= 6; i++ {
		resp, _ := do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
		require.Equal(t, map[bool]int{true: 200, false: 429}[i <= 5], resp.StatusCode, "login %d", i)
	}
	resp, _ := do(t, "GET", base+"/healthz", nil)
	require.Equal(t, 200, resp.StatusCode)
	s.Stop()

	spans, metrics := demotest.DecodeOTel(t, s.OTel.String())
	ev, retry, latency := demotest.Decision(t, spans, "POST /api/v1/login", "spillway-httpserver")
	require.Equal(t, map[string]any{
		"spillway.limiter":    "api",
		"spillway.decided_by": "login_user",
		"spillway.outcome":    "denied",
		"spillway.reason":     "rate_limited",
		"spillway.limit":      float64(5),
		"spillway.remaining":  float64(0),
		"spillway.degraded":   false,
		"spillway.priority":   "critical",
	}, ev)
	require.Greater(t, retry, float64(0)) // 5/minute: the next token in at most 12 s
	require.LessOrEqual(t, retry, float64(12000))
	require.GreaterOrEqual(t, latency, float64(0))

	require.Len(t, metrics, 1)
	require.Equal(t, map[string]float64{
		`{"spillway.degraded":false,"spillway.limiter":"api","spillway.outcome":"allowed","spillway.priority":"critical","spillway.reason":"none"}`:        5,
		`{"spillway.degraded":false,"spillway.limiter":"api","spillway.outcome":"denied","spillway.priority":"critical","spillway.reason":"rate_limited"}`: 1,
	}, demotest.SumPoints(t, metrics, "spillway.decisions"))
	require.Equal(t, map[string]float64{
		`{"spillway.degraded":false,"spillway.limiter":"api","spillway.outcome":"allowed"}`: 5,
		`{"spillway.degraded":false,"spillway.limiter":"api","spillway.outcome":"denied"}`:  1,
	}, demotest.SumPoints(t, metrics, "spillway.decision.duration"))
}

// By default nothing goes to stdout but the listening line; the metrics
// are on /metrics.
func TestTelemetryDefault(t *testing.T) {
	base, s := start(t)
	for range 6 {
		do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
	}
	resp, body := do(t, "GET", base+"/metrics", nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, body, `spillway_decisions_total{otel_scope_name="github.com/spillway-go/spillway/telemetry",otel_scope_schema_url="",otel_scope_version="",spillway_degraded="false",spillway_limiter="api",spillway_outcome="allowed",spillway_priority="critical",spillway_reason="none"} 5`)
	require.Contains(t, body, `spillway_outcome="denied",spillway_priority="critical",spillway_reason="rate_limited"} 1`)
	require.Contains(t, body, `spillway_decision_duration_seconds_count{`)
	s.Stop()
	require.Empty(t, s.OTel.String())
	require.Equal(t, 1, strings.Count(s.Out.String(), "\n"), s.Out.String())
}
