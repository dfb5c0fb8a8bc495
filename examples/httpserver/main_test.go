package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
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

// demo is a running httpserver: out gets its messages, otel its telemetry.
type demo struct {
	base      string
	out, otel *syncBuffer
	stop      func() // stops the server and waits for run to return nil
}

func startDemo(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	d := startDemoOTel(t, args...)
	return d.base, d.out
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
		d.base = "http://" + a
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
	err := run(context.Background(), []string{"-config", "/nonexistent/limits.yaml"}, io.Discard, io.Discard, nil)
	require.ErrorContains(t, err, "/nonexistent/limits.yaml")
	err = run(context.Background(), []string{"-redis", "127.0.0.1:1"}, io.Discard, io.Discard, nil)
	require.ErrorContains(t, err, "redis 127.0.0.1:1")
	err = run(context.Background(), []string{"-otel", "otlp"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, `-otel "otlp": want stdout or none`)
	err = run(context.Background(), []string{"-otel-interval", "0s"}, io.Discard, io.Discard, nil)
	require.EqualError(t, err, "-otel-interval 0s: must be positive")
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

// The stdout SDK prints the denied request's span, with its decision event,
// and counts every decision; the flush on exit exports the last interval.
func TestTelemetryStdout(t *testing.T) {
	d := startDemoOTel(t, "-otel-interval", "1h") // one export: the flush on exit
	for i := 1; i <= 6; i++ {
		resp, _ := do(t, "POST", d.base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
		require.Equal(t, map[bool]int{true: 200, false: 429}[i <= 5], resp.StatusCode, "login %d", i)
	}
	resp, _ := do(t, "GET", d.base+"/healthz", nil)
	require.Equal(t, 200, resp.StatusCode)
	d.stop()

	spans, metrics := decodeOTel(t, d.otel.String())
	require.Len(t, spans, 1, "only the denied request's span is printed")
	sp := spans[0]
	require.Equal(t, "POST /api/v1/login", sp.Name)
	require.Equal(t, 2, sp.SpanKind) // server
	require.Equal(t, map[string]any{"service.name": "spillway-httpserver"}, attrMap(sp.Resource))
	require.Len(t, sp.Events, 1)
	require.Equal(t, "spillway.decision", sp.Events[0].Name)
	ev := attrMap(sp.Events[0].Attributes)
	retry, latency := ev["spillway.retry_after_ms"], ev["spillway.latency_us"]
	delete(ev, "spillway.retry_after_ms")
	delete(ev, "spillway.latency_us")
	require.Equal(t, map[string]any{
		"spillway.limiter":    "api",
		"spillway.decided_by": "/api/v1/login:user",
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
	}, sumPoints(t, metrics, "spillway.decisions"))
	require.Equal(t, map[string]float64{
		`{"spillway.degraded":false,"spillway.limiter":"api","spillway.outcome":"allowed"}`: 5,
		`{"spillway.degraded":false,"spillway.limiter":"api","spillway.outcome":"denied"}`:  1,
	}, sumPoints(t, metrics, "spillway.decision.duration"))
}

func TestTelemetryNone(t *testing.T) {
	d := startDemoOTel(t, "-otel", "none")
	for i := 1; i <= 6; i++ {
		do(t, "POST", d.base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
	}
	resp, _ := do(t, "POST", d.base+"/api/v1/login", map[string]string{"X-User-ID": "ann"})
	require.Equal(t, 429, resp.StatusCode)
	d.stop()
	require.Empty(t, d.otel.String())
}
