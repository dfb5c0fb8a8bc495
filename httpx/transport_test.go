package httpx_test

import (
	"context"

	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/shedder"
	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway/internal/clienthook"
)

// inProcess is a RoundTripper that serves requests with h directly, so that
// tests inside a synctest bubble (fake time) need no network.
type inProcess struct {
	h http.Handler
}

func (p inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	p.h.ServeHTTP(rec, req)
	if req.Body != nil {
		req.Body.Close()
	}
	return rec.Result(), nil
}

// flaky answers the first n requests with status and Retry-After ra, then
// 200 with the body it read. It records every request's time and body.
type flaky struct {
	mu     sync.Mutex
	n      int
	status int
	ra     string
	times  []time.Time
	bodies []string
	prios  []string
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b []byte
	if r.Body != nil {
		b, _ = io.ReadAll(r.Body)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.times = append(f.times, time.Now())
	f.bodies = append(f.bodies, string(b))
	f.prios = append(f.prios, r.Header.Get(spillway.PriorityHeader))
	if len(f.times) <= f.n {
		if f.ra != "" {
			w.Header().Set("Retry-After", f.ra)
		}
		w.WriteHeader(f.status)
		return
	}
	io.WriteString(w, "ok:"+string(b))
}

func (f *flaky) hits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.times)
}

func noJitter() clientside.Backoff { return clientside.Backoff{Jitter: -1} }

func TestTransportRetriesOverLoopback(t *testing.T) {
	f := &flaky{n: 1, status: 429, ra: "1"}
	srv := serve(t, f)
	client := &http.Client{Transport: &httpx.Transport{Client: &clientside.Client{MaxRetries: clientside.DefaultMaxRetries, Backoff: noJitter()}}}
	resp, err := client.Get(srv.URL)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "ok:", string(body))
	require.Equal(t, 2, f.hits())
	require.GreaterOrEqual(t, f.times[1].Sub(f.times[0]), time.Second)
}

func TestTransportWaitsRetryAfterWithJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 2, status: 503, ra: "2"}
		tr := &httpx.Transport{Base: inProcess{f}, Client: &clientside.Client{MaxRetries: clientside.DefaultMaxRetries, Backoff: clientside.Backoff{Jitter: 0.5, Rand: func() float64 { return 0.5 }}}}
		req, _ := http.NewRequest(http.MethodGet, "http://svc/x", nil)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, 3, f.hits())
		// 2s + 0.5·0.5·2s each time.
		require.Equal(t, 2500*time.Millisecond, f.times[1].Sub(f.times[0]))
		require.Equal(t, 2500*time.Millisecond, f.times[2].Sub(f.times[1]))
	})
}

func TestTransportGivesUpAfterMaxRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 10, status: 429, ra: "1"}
		tr := &httpx.Transport{Base: inProcess{f}, Client: &clientside.Client{Backoff: noJitter(), MaxRetries: 3}}
		req, _ := http.NewRequest(http.MethodGet, "http://svc/x", nil)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		require.Equal(t, 4, f.hits())

		// 0 means no retries, as does a negative count; so does the zero
		// Transport.
		for _, n := range []int{0, -1} {
			f2 := &flaky{n: 10, status: 429, ra: "1"}
			tr2 := &httpx.Transport{Base: inProcess{f2}, Client: &clientside.Client{MaxRetries: n}}
			resp, err = tr2.RoundTrip(req)
			require.NoError(t, err)
			require.Equal(t, 429, resp.StatusCode)
			require.Equal(t, 1, f2.hits(), "MaxRetries %d", n)
		}
		// clientside.NewClient retries DefaultMaxRetries times.
		f3 := &flaky{n: 10, status: 429, ra: "1"}
		c3 := clientside.NewClient()
		c3.Throttle, c3.Budget, c3.Backoff = nil, nil, noJitter()
		require.Equal(t, clientside.DefaultMaxRetries, c3.MaxRetries)
		tr3 := &httpx.Transport{Base: inProcess{f3}, Client: c3}
		resp, err = tr3.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, 1+clientside.DefaultMaxRetries, f3.hits())
	})
}

func TestTransportOnlyRetriesIdempotentOrReplayable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 1, status: 429, ra: "1"}
		tr := &httpx.Transport{Base: inProcess{f}, Client: &clientside.Client{MaxRetries: clientside.DefaultMaxRetries, Backoff: noJitter()}}
		req, _ := http.NewRequest(http.MethodPost, "http://svc/x", strings.NewReader("payload"))
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, 1, f.hits())

		// With an Idempotency-Key the body is replayed via GetBody.
		f = &flaky{n: 1, status: 429, ra: "1"}
		tr.Base = inProcess{f}
		req, _ = http.NewRequest(http.MethodPost, "http://svc/x", strings.NewReader("payload"))
		req.Header.Set("Idempotency-Key", "abc")
		resp, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, []string{"payload", "payload"}, f.bodies)

		// A body without GetBody cannot be replayed.
		f = &flaky{n: 1, status: 429, ra: "1"}
		tr.Base = inProcess{f}
		req, _ = http.NewRequest(http.MethodPut, "http://svc/x", io.NopCloser(strings.NewReader("once")))
		require.Nil(t, req.GetBody)
		resp, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, 1, f.hits())
	})
}

func TestTransportRetryBudgetAndDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		budget, err := clientside.NewRetryBudget(clientside.RetryBudgetSettings{MaxTokens: 1, Ratio: -1, MinRetriesPerSecond: -1})
		require.NoError(t, err)
		f := &flaky{n: 100, status: 503, ra: "1"}
		tr := &httpx.Transport{Base: inProcess{f}, Client: &clientside.Client{MaxRetries: clientside.DefaultMaxRetries, Backoff: noJitter(), Budget: budget}}
		req, _ := http.NewRequest(http.MethodGet, "http://svc/x", nil)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode)
		require.Equal(t, 2, f.hits()) // one retry, then the budget is empty
		resp, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode)
		require.Equal(t, 3, f.hits()) // no retry at all

		// A deadline shorter than Retry-After: answer at once.
		f = &flaky{n: 1, status: 429, ra: "5"}
		tr = &httpx.Transport{Base: inProcess{f}, Client: &clientside.Client{MaxRetries: clientside.DefaultMaxRetries, Backoff: noJitter()}}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://svc/x", nil)
		start := time.Now()
		resp, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, 1, f.hits())
		require.Zero(t, time.Since(start))

		// Retry-After beyond Backoff.MaxRetryAfter: not retried.
		f = &flaky{n: 1, status: 429, ra: "120"}
		tr = &httpx.Transport{Base: inProcess{f}, Client: &clientside.Client{MaxRetries: clientside.DefaultMaxRetries}}
		req, _ = http.NewRequest(http.MethodGet, "http://svc/x", nil)
		resp, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, 1, f.hits())

		// No Retry-After: exponential backoff (Base 100ms: first wait in [50ms, 100ms)).
		f = &flaky{n: 1, status: 503}
		tr = &httpx.Transport{Base: inProcess{f}, Client: &clientside.Client{MaxRetries: clientside.DefaultMaxRetries, Backoff: clientside.Backoff{Rand: func() float64 { return 0 }}}}
		resp, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, 50*time.Millisecond, f.times[1].Sub(f.times[0]))
	})
}

type recThrottle struct {
	allow           bool
	allows, accepts int
}

func (r *recThrottle) Allow() bool { r.allows++; return r.allow }
func (r *recThrottle) Accepted()   { r.accepts++ }

// throttledClient is a Client whose throttle is th.
func throttledClient(th clienthook.Throttler) *clientside.Client {
	c := &clientside.Client{MaxRetries: clientside.DefaultMaxRetries, Backoff: noJitter()}
	clienthook.SetThrottle(c, th)
	return c
}

// onceThrottle allows only the first request.
type onceThrottle struct{ n int }

func (o *onceThrottle) Allow() bool { o.n++; return o.n == 1 }
func (o *onceThrottle) Accepted()   {}

func TestTransportThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 1, status: 429, ra: "1"}
		th := &recThrottle{allow: true}
		tr := &httpx.Transport{Base: inProcess{f}, Client: throttledClient(th)}
		req, _ := http.NewRequest(http.MethodGet, "http://svc/x", nil)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, 2, th.allows)  // each attempt counts as a request
		require.Equal(t, 1, th.accepts) // only the 200 was accepted

		th.allow = false
		resp, err = tr.RoundTrip(req)
		require.ErrorIs(t, err, clientside.ErrThrottled)
		require.Nil(t, resp)
		require.Equal(t, 2, f.hits()) // not sent

		// A retry the throttle refuses: the caller gets the server's 429.
		f = &flaky{n: 1, status: 429, ra: "1"}
		once := &onceThrottle{}
		tr = &httpx.Transport{Base: inProcess{f}, Client: throttledClient(once)}
		resp, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, 1, f.hits())
	})
}

func TestTransportPropagatesPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{}
		tr := &httpx.Transport{Base: inProcess{f}}
		ctx := spillway.ContextWithPriority(context.Background(), spillway.Sheddable)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc/x", nil)
		_, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Empty(t, req.Header.Get(spillway.PriorityHeader)) // the caller's request is untouched
		req2, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc/x", nil)
		req2.Header.Set(spillway.PriorityHeader, "critical")
		_, err = tr.RoundTrip(req2)
		require.NoError(t, err)
		tr.NoPriority = true
		_, err = tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, []string{"sheddable", "critical", ""}, f.prios)
	})
}

// The served request's priority reaches a downstream service through
// Middleware → handler → Transport, over loopback.
func TestPriorityEndToEnd(t *testing.T) {
	down := &flaky{}
	downstream := serve(t, down)
	client := &http.Client{Transport: &httpx.Transport{Client: clientside.NewClient()}}
	front := serve(t, httpx.Middleware(fixed(spillway.Decision{Allowed: true}, nil), httpx.Settings{Priority: shedder.ClassifyHTTP})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, downstream.URL, nil)
			resp, err := client.Do(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			resp.Body.Close()
		})))
	resp, _ := get(t, front.URL+"/search", nil)
	require.Equal(t, 200, resp.StatusCode)
	resp, err := http.Post(front.URL+"/posts", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, []string{"sheddable_plus", "critical"}, down.prios)
}
