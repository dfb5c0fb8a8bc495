package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for the server goroutine and the test.
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

func startDemo(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), out, func(a string) { addrc <- a })
	}()
	select {
	case a := <-addrc:
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-errc)
		})
		return "http://" + a, out
	case err := <-errc:
		cancel()
		t.Fatalf("run: %v\n%s", err, out.String())
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("server did not start")
	}
	return "", nil
}

func do(t *testing.T, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
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

// smoke runs the same requests against a freshly started demo.
func smoke(t *testing.T, base string) {
	resp, body := do(t, "GET", base+"/healthz", nil)
	require.Equal(t, 200, resp.StatusCode)
	require.JSONEq(t, `{"ok":true,"degraded":false}`, body)
	require.Empty(t, resp.Header.Get("X-RateLimit-Limit"))

	// Login: 5 per minute per user (and 10 per minute per IP).
	for i := 1; i <= 5; i++ {
		resp, _ = do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
		require.Equal(t, 200, resp.StatusCode, "login %d", i)
		require.Equal(t, "5", resp.Header.Get("X-RateLimit-Limit"))
		require.Equal(t, []string{string(rune('0' + 5 - i))}, resp.Header.Values("X-RateLimit-Remaining"))
	}
	resp, body = do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "12", resp.Header.Get("Retry-After")) // 5/minute: one token every 12 s
	require.Equal(t, "5", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	require.NotEmpty(t, resp.Header.Get("X-RateLimit-Reset"))
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	require.Equal(t, float64(429), p["status"])
	require.Equal(t, "rate_limited", p["reason"])
	require.Equal(t, float64(12), p["retry_after"])

	// Another user from the same IP still gets in (the IP rule has 4 left).
	resp, _ = do(t, "POST", base+"/api/v1/login", map[string]string{"X-User-ID": "bob"})
	require.Equal(t, 200, resp.StatusCode)

	// Search: 1000/minute, burst 200 per API key (199 left); the headers
	// show the most restrictive limit, here the per-IP concurrency limit
	// (20 in flight, 19 left while this one runs).
	resp, body = do(t, "GET", base+"/api/v1/search?q=go", map[string]string{"X-API-Key": "k1"})
	require.Equal(t, 200, resp.StatusCode)
	require.JSONEq(t, `{"query":"go","results":[]}`, body)
	require.Equal(t, "20", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "19", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, `"per_ip_concurrency";q=20`, resp.Header.Get("RateLimit-Policy"))

	resp, body = do(t, "POST", base+"/api/v1/posts", map[string]string{"X-API-Key": "k1"})
	require.Equal(t, 201, resp.StatusCode)
	require.JSONEq(t, `{"id":1}`, body)
	require.Equal(t, "20", resp.Header.Get("X-RateLimit-Limit"))

	resp, _ = do(t, "GET", base+"/api/v1/posts", nil)
	require.Equal(t, 405, resp.StatusCode)
}

func TestSmokeMemory(t *testing.T) {
	base, out := startDemo(t)
	require.Contains(t, out.String(), "listening on "+base+" ")
	require.Contains(t, out.String(), "store: memory")
	smoke(t, base)
}

func TestSmokeRedis(t *testing.T) {
	rs := redistest.Start(t)
	// A budget well above a Redis call on a loaded test machine, so that
	// the exact headers below come from Redis, not the local share.
	base, out := startDemo(t, "-redis", rs.Addr, "-redis-budget", "300ms")
	require.Contains(t, out.String(), "store: redis "+rs.Addr)
	smoke(t, base)

	// Redis stalls: requests are still answered, from the local share.
	require.NoError(t, rs.Pause())
	defer rs.Resume()
	for i := range 8 {
		resp, _ := do(t, "GET", base+"/api/v1/search", map[string]string{"X-API-Key": "k2"})
		require.Equal(t, 200, resp.StatusCode, "search %d while Redis is paused", i)
	}
	resp, body := do(t, "GET", base+"/healthz", nil)
	require.Equal(t, 200, resp.StatusCode)
	require.JSONEq(t, `{"ok":true,"degraded":true}`, body)
}

func TestBadConfig(t *testing.T) {
	err := run(context.Background(), []string{"-config", "/nonexistent/limits.yaml"}, io.Discard, nil)
	require.ErrorContains(t, err, "/nonexistent/limits.yaml")
	err = run(context.Background(), []string{"-redis", "127.0.0.1:1"}, io.Discard, nil)
	require.ErrorContains(t, err, "redis 127.0.0.1:1")
}
