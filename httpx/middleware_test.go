package httpx_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/httpx"
	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway/internal/block"
)

var t0 = time.Unix(1_800_000_000, 0)

func fixedClock() time.Time { return t0 }

// keyLimiter admits n requests per identity key (ip|user|api_key), then
// denies with RetryAfter 1.5s. It records the keys it saw.
type keyLimiter struct {
	mu   sync.Mutex
	n    int64
	used map[string]int64
	keys []string
	reqs []spillway.Request
	name string
}

func newKeyLimiter(n int64) *keyLimiter {
	return &keyLimiter{n: n, used: map[string]int64{}, name: "per_ip"}
}

func (l *keyLimiter) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	ip, _ := r.Get(spillway.DimIP)
	user, _ := r.Get(spillway.DimUser)
	key, _ := r.Get(spillway.DimAPIKey)
	k := ip + "|" + user + "|" + key
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys = append(l.keys, k)
	cp := *r
	cp.Dims = append([]spillway.Dimension(nil), r.Dims...)
	l.reqs = append(l.reqs, cp)
	if l.used[k] >= l.n {
		return spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: l.name, Limit: l.n, Remaining: 0,
			ResetAfter: 2500 * time.Millisecond, RetryAfter: 1500 * time.Millisecond}, spillway.Noop, nil
	}
	l.used[k]++
	return spillway.Decision{Allowed: true, Limiter: l.name, Limit: l.n, Remaining: l.n - l.used[k],
		ResetAfter: time.Duration(l.used[k]) * 500 * time.Millisecond}, spillway.Noop, nil
}

func (l *keyLimiter) lastKey() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys[len(l.keys)-1]
}

// countingLimiter admits everything, counts in-flight work and records
// the outcomes its Done saw.
type countingLimiter struct {
	mu       sync.Mutex
	inflight int
	outcomes []spillway.Outcome
	doneCh   chan spillway.Outcome
}

func newCounting() *countingLimiter { return &countingLimiter{doneCh: make(chan spillway.Outcome, 16)} }

func (l *countingLimiter) Admit(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
	l.mu.Lock()
	l.inflight++
	l.mu.Unlock()
	return spillway.Decision{Allowed: true, Limiter: "inflight", Limit: 10, Remaining: 9}, block.Once(func(o spillway.Outcome) {
		l.mu.Lock()
		l.inflight--
		l.outcomes = append(l.outcomes, o)
		l.mu.Unlock()
		l.doneCh <- o
	}), nil
}

func (l *countingLimiter) state() (int, []spillway.Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight, append([]spillway.Outcome(nil), l.outcomes...)
}

func fixed(d spillway.Decision, err error) spillway.Limiter {
	return block.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return d, spillway.Noop, err
	})
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
}

func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // panics in handlers are expected in some tests
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
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

func TestAllowedThenRateLimited(t *testing.T) {
	lim := newKeyLimiter(2)
	srv := serve(t, httpx.Middleware(lim, httpx.Settings{Clock: fixedClock})(okHandler()))

	resp, body := get(t, srv.URL, nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "ok", body)
	require.Equal(t, "2", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "1", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, strconv.FormatInt(t0.Unix()+1, 10), resp.Header.Get("X-RateLimit-Reset")) // 0.5s rounds up
	require.Empty(t, resp.Header.Get("Retry-After"))

	resp, _ = get(t, srv.URL, nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, strconv.FormatInt(t0.Unix()+1, 10), resp.Header.Get("X-RateLimit-Reset")) // exactly 1s

	resp, body = get(t, srv.URL, nil)
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "2", resp.Header.Get("Retry-After")) // 1.5s rounds up
	require.Equal(t, "2", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, strconv.FormatInt(t0.Unix()+3, 10), resp.Header.Get("X-RateLimit-Reset")) // 2.5s rounds up
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p httpx.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	require.Equal(t, httpx.Problem{Type: "about:blank", Title: "Too Many Requests", Status: 429,
		Detail: `rate limit "per_ip" exceeded; retry in 2 s`, RetryAfter: 2, Limiter: "per_ip", Reason: "rate_limited"}, p)
}

func TestDenialStatuses(t *testing.T) {
	storeDown := errors.New("redis: connection refused")
	cases := []struct {
		name       string
		lim        spillway.Limiter
		settings   httpx.Settings
		status     int
		retryAfter string
		reason     string
		limitHdr   string
	}{
		{"concurrency", fixed(spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "inflight", Limit: 5, RetryAfter: 10 * time.Millisecond}, nil), httpx.Settings{}, 429, "1", "concurrency", "5"},
		{"shed", fixed(spillway.Decision{Reason: spillway.ReasonShed, Limiter: "fleet", RetryAfter: 3 * time.Second}, nil), httpx.Settings{}, 503, "3", "shed", ""},
		{"ceiling", fixed(spillway.Decision{Reason: spillway.ReasonCeiling, Limiter: "db", Limit: 100, RetryAfter: 0}, nil), httpx.Settings{}, 503, "1", "ceiling", "100"},
		{"fail closed decision", fixed(spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: "login"}, nil), httpx.Settings{}, 503, "1", "fail_closed", ""},
		{"cost exceeds", fixed(spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "bulk", Limit: 10}, nil), httpx.Settings{}, 429, "", "cost_exceeds_limit", "10"},
		{"invalid", fixed(spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: "request"}, nil), httpx.Settings{}, 400, "", "invalid", ""},
		{"store down, closed", fixed(spillway.Decision{}, storeDown), httpx.Settings{FailMode: spillway.FailClosed}, 503, "1", "fail_closed", ""},
		{"store down, open", fixed(spillway.Decision{}, storeDown), httpx.Settings{}, 200, "", "", ""},
		{"store down, explicit open", fixed(spillway.Decision{}, storeDown), httpx.Settings{FailMode: spillway.FailOpen}, 200, "", "", ""},
		{"store down, fail-closed tiers rule", fixed(spillway.Decision{}, &spillway.StoreError{Fail: spillway.FailClosed, Rules: []string{"login"}, Err: storeDown}), httpx.Settings{}, 503, "1", "fail_closed", ""},
		{"store down, fail-open tiers rule", fixed(spillway.Decision{}, &spillway.StoreError{Fail: spillway.FailOpen, Rules: []string{"search"}, Err: storeDown}), httpx.Settings{}, 200, "", "", ""},
		{"invalid priority", fixed(spillway.Decision{Allowed: true}, nil), httpx.Settings{Priority: func(*http.Request) spillway.Priority { return 9 }}, 400, "", "invalid", ""},
		{"negative cost", fixed(spillway.Decision{Allowed: true}, nil), httpx.Settings{Cost: func(*http.Request) int64 { return -1 }}, 400, "", "invalid", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var errs []error
			s := tc.settings
			s.OnError = func(_ *http.Request, err error) { errs = append(errs, err) }
			srv := serve(t, httpx.Middleware(tc.lim, s)(okHandler()))
			resp, body := get(t, srv.URL, nil)
			require.Equal(t, tc.status, resp.StatusCode)
			require.Equal(t, tc.retryAfter, resp.Header.Get("Retry-After"))
			require.Equal(t, tc.limitHdr, resp.Header.Get("X-RateLimit-Limit"))
			if tc.status == 200 {
				require.Equal(t, "ok", body)
				require.Len(t, errs, 1)
				require.ErrorIs(t, errs[0], storeDown)
				return
			}
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			var p httpx.Problem
			require.NoError(t, json.Unmarshal([]byte(body), &p))
			require.Equal(t, tc.status, p.Status)
			require.Equal(t, tc.reason, p.Reason)
			require.Equal(t, http.StatusText(tc.status), p.Title)
			if tc.retryAfter != "" {
				require.Equal(t, tc.retryAfter, strconv.FormatInt(p.RetryAfter, 10))
			} else {
				require.Zero(t, p.RetryAfter)
			}
		})
	}
}

func TestSpoofedForwardedForIgnoredFromUntrustedPeer(t *testing.T) {
	lim := newKeyLimiter(100)
	// The test client connects from 127.0.0.1; only 10.0.0.0/8 is trusted.
	srv := serve(t, httpx.Middleware(lim, httpx.Settings{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})(okHandler()))
	resp, _ := get(t, srv.URL, map[string]string{"X-Forwarded-For": "203.0.113.7", "Forwarded": "for=203.0.113.8"})
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "127.0.0.1||", lim.lastKey())
}

func TestTrustedProxyForwardedFor(t *testing.T) {
	lim := newKeyLimiter(100)
	mw := httpx.Middleware(lim, httpx.Settings{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")},
	})
	srv := serve(t, mw(okHandler()))
	// client spoofs 1.1.1.1, the real client is 198.51.100.9, then an inner proxy 10.1.2.3.
	resp, _ := get(t, srv.URL, map[string]string{"X-Forwarded-For": "1.1.1.1, 198.51.100.9, 10.1.2.3"})
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "198.51.100.9||", lim.lastKey())

	// Forwarded is not read unless chosen.
	resp, _ = get(t, srv.URL, map[string]string{"Forwarded": "for=198.51.100.10"})
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "127.0.0.1||", lim.lastKey())

	srv2 := serve(t, httpx.Middleware(lim, httpx.Settings{
		TrustedProxies:  []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		ForwardedHeader: "Forwarded",
	})(okHandler()))
	resp, _ = get(t, srv2.URL, map[string]string{"Forwarded": `for=1.1.1.1, for="[2001:db8::7]:4711";proto=https`, "X-Forwarded-For": "5.5.5.5"})
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "2001:db8::7||", lim.lastKey())
}

func TestIdentityEndpointMethodPriority(t *testing.T) {
	lim := newKeyLimiter(100)
	type ctxKey struct{}
	mw := httpx.Middleware(lim, httpx.Settings{
		User:         func(r *http.Request) string { s, _ := r.Context().Value(ctxKey{}).(string); return s },
		APIKeyHeader: "x-api-key",
		Priority: func(r *http.Request) spillway.Priority {
			if r.Method == http.MethodGet {
				return spillway.SheddablePlus
			}
			return spillway.Critical
		},
		Cost: func(*http.Request) int64 { return 3 },
	})
	auth := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u := r.Header.Get("X-User-ID"); u != "" {
				r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, u))
			}
			h.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", auth(mw(okHandler())))
	srv := serve(t, mux)
	resp, _ := get(t, srv.URL+"/items/42", map[string]string{"X-User-ID": "u1", "X-API-Key": "k1"})
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "127.0.0.1|u1|k1", lim.lastKey())
	r := lim.reqs[len(lim.reqs)-1]
	require.Equal(t, "/items/{id}", r.Endpoint)
	require.Equal(t, "GET", r.Method)
	require.Equal(t, spillway.SheddablePlus, r.Priority)
	require.Equal(t, int64(3), r.Cost)
	require.Equal(t, []spillway.Dimension{{Name: "ip", Value: "127.0.0.1"}, {Name: "user", Value: "u1"}, {Name: "api_key", Value: "k1"}}, r.Dims)

	// Wrapped around the whole mux: the pattern comes from EndpointFromMux;
	// the default priority is Critical.
	lim2 := newKeyLimiter(100)
	mux2 := http.NewServeMux()
	mux2.Handle("POST /api/v1/posts", okHandler())
	srv2 := serve(t, httpx.Middleware(lim2, httpx.Settings{Endpoint: httpx.EndpointFromMux(mux2)})(mux2))
	resp, err := http.Post(srv2.URL+"/api/v1/posts", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "/api/v1/posts", lim2.reqs[0].Endpoint)
	require.Equal(t, spillway.Critical, lim2.reqs[0].Priority)
	require.Equal(t, []spillway.Dimension{{Name: "ip", Value: "127.0.0.1"}}, lim2.reqs[0].Dims)
}

func TestChainReleasesWhenLaterLimiterDenies(t *testing.T) {
	counting := newCounting()
	denier := fixed(spillway.Decision{Reason: spillway.ReasonShed, Limiter: "worker", RetryAfter: time.Second}, nil)
	srv := serve(t, httpx.Middleware(spillway.Chain(counting, denier), httpx.Settings{})(okHandler()))
	resp, _ := get(t, srv.URL, nil)
	require.Equal(t, 503, resp.StatusCode)
	inflight, outs := counting.state()
	require.Equal(t, 0, inflight)
	require.Equal(t, []spillway.Outcome{spillway.Ignored}, outs)

	counting2 := newCounting()
	srv2 := serve(t, httpx.Middleware(spillway.Chain(counting2, newKeyLimiter(5)), httpx.Settings{})(okHandler()))
	resp, _ = get(t, srv2.URL, nil)
	require.Equal(t, 200, resp.StatusCode)
	// The most restrictive decision (per_ip, 4 of 5 left vs inflight 9 of 10) is the header.
	require.Equal(t, "5", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "4", resp.Header.Get("X-RateLimit-Remaining"))
	inflight, outs = counting2.state()
	require.Equal(t, 0, inflight)
	require.Equal(t, []spillway.Outcome{spillway.Success}, outs)
}

func TestDoneOutcomes(t *testing.T) {
	counting := newCounting()
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/notfound", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) })
	mux.HandleFunc("/panic", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	started := make(chan struct{})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
	})
	srv := serve(t, httpx.Middleware(counting, httpx.Settings{})(mux))

	for _, tc := range []struct {
		path string
		want spillway.Outcome
	}{{"/ok", spillway.Success}, {"/notfound", spillway.Success}, {"/fail", spillway.Dropped}} {
		resp, _ := get(t, srv.URL+tc.path, nil)
		require.NotZero(t, resp.StatusCode)
		require.Equal(t, tc.want, <-counting.doneCh, tc.path)
	}

	// A panicking handler still releases; the panic reaches net/http,
	// which drops the connection.
	// (A fresh connection: the transport retries a GET whose reused
	// connection breaks.)
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	_, err := noReuse.Get(srv.URL + "/panic")
	require.Error(t, err)
	require.Equal(t, spillway.Ignored, <-counting.doneCh)

	// The client goes away: Ignored.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/slow", nil)
	go func() { <-started; cancel() }()
	_, err = http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, spillway.Ignored, <-counting.doneCh)

	inflight, outs := counting.state()
	require.Equal(t, 0, inflight)
	require.Len(t, outs, 5)
}

func TestSkipAndIETFHeaders(t *testing.T) {
	lim := newKeyLimiter(1)
	mw := httpx.Middleware(lim, httpx.Settings{
		Skip:                func(r *http.Request) bool { return r.URL.Path == "/healthz" },
		IETFHeaders:         true,
		NoXRateLimitHeaders: true,
	})
	srv := serve(t, mw(okHandler()))
	for range 3 {
		resp, _ := get(t, srv.URL+"/healthz", nil)
		require.Equal(t, 200, resp.StatusCode)
		require.Empty(t, resp.Header.Get("RateLimit"))
	}
	require.Empty(t, lim.keys)

	resp, _ := get(t, srv.URL+"/x", nil)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, `"per_ip";q=1`, resp.Header.Get("RateLimit-Policy"))
	require.Equal(t, `"per_ip";r=0;t=1`, resp.Header.Get("RateLimit"))
	require.Empty(t, resp.Header.Get("X-RateLimit-Limit"))
	resp, _ = get(t, srv.URL+"/x", nil)
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, `"per_ip";r=0;t=3`, resp.Header.Get("RateLimit"))
	require.Equal(t, "2", resp.Header.Get("Retry-After"))
}

func TestDeniedHandlerAndProblemType(t *testing.T) {
	d := spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "a", Limit: 1, RetryAfter: time.Second}
	srv := serve(t, httpx.Middleware(fixed(d, nil), httpx.Settings{
		Denied: func(w http.ResponseWriter, r *http.Request, d spillway.Decision) {
			w.WriteHeader(httpx.Status(d))
			io.WriteString(w, "slow down")
		},
	})(okHandler()))
	resp, body := get(t, srv.URL, nil)
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Equal(t, "slow down", body)

	srv2 := serve(t, httpx.Middleware(fixed(d, nil), httpx.Settings{ProblemTypeBase: "https://example.com/problems/"})(okHandler()))
	_, body = get(t, srv2.URL, nil)
	var p httpx.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	require.Equal(t, "https://example.com/problems/rate_limited", p.Type)
}

func TestPatternPath(t *testing.T) {
	for in, want := range map[string]string{
		"POST /api/v1/login":         "/api/v1/login",
		"/static/":                   "/static/",
		"GET example.com/items/{id}": "/items/{id}",
		"example.com/":               "/",
		"":                           "",
	} {
		require.Equal(t, want, httpx.PatternPath(in), in)
	}
}
