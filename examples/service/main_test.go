package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/examples/internal/demotest"
	"github.com/spillway-go/spillway/internal/redistest"
)

type client struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func (c client) do(method, path, key string) (int, string, time.Duration) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, nil)
	require.NoError(c.t, err)
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	start := time.Now()
	resp, err := c.hc.Do(req)
	require.NoError(c.t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), time.Since(start)
}

// parallel runs n requests at once and returns their statuses.
func (c client) parallel(n int, method string, path func(i int) string, key func(i int) string) []int {
	st := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st[i], _, _ = c.do(method, path(i), key(i))
		}()
	}
	wg.Wait()
	return st
}

func count(st []int, code int) (n int) {
	for _, s := range st {
		if s == code {
			n++
		}
	}
	return n
}

// The whole service on a real redis-server: a 429 from the rate limit, a
// 429 from concurrency, a 503 shed while Critical work is served, the
// database never above its in-flight cap during a burst, the Prometheus
// endpoint, and, with Redis stopped by SIGSTOP, every request answered
// within the budget + 20 ms with none denied that a lone server's full
// limits admit.
func TestService(t *testing.T) {
	srv := redistest.Start(t)
	s := demotest.Start(t, run, "-redis", srv.Addr)
	c := client{t: t, base: "http://" + s.Addr, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	t.Cleanup(c.hc.CloseIdleConnections)

	// Rate: 5 orders a minute per API key; the 6th is a 429 naming the rule.
	for i := range 5 {
		st, body, _ := c.do("POST", "/api/orders", "rate")
		require.Equal(t, 200, st, "order %d: %s", i, body)
	}
	st, body, _ := c.do("POST", "/api/orders", "rate")
	require.Equal(t, 429, st, body)
	require.Contains(t, body, `"reason":"rate_limited"`)
	require.Contains(t, body, `"limiter":"/api/orders:api_key"`)

	// Concurrency: 6 slow reports at once from one key, 5 may run.
	sts := c.parallel(6, "GET", func(int) string { return "/api/report?ms=300" }, func(int) string { return "conc" })
	require.Equal(t, 5, count(sts, 200), "%v", sts)
	require.Equal(t, 1, count(sts, 429), "%v", sts)

	// Shedding: 16 slow Sheddable reports (4 keys) fill the fleet's
	// Sheddable room (80% of 20); one more is shed with a 503 while a
	// Critical order is served.
	var wg sync.WaitGroup
	var fill []int
	wg.Add(1)
	go func() {
		defer wg.Done()
		fill = c.parallel(16, "GET", func(int) string { return "/api/report?ms=600" }, func(i int) string { return fmt.Sprintf("fill-%d", i%4) })
	}()
	time.Sleep(200 * time.Millisecond)
	st, body, _ = c.do("GET", "/api/report", "extra")
	require.Equal(t, 503, st, body)
	require.Contains(t, body, `"reason":"shed"`)
	st, body, _ = c.do("POST", "/api/orders", "critical")
	require.Equal(t, 200, st, body)
	wg.Wait()
	require.Equal(t, 16, count(fill, 200), "%v", fill)

	// The database: a burst of 30 orders (30 keys) never has more than 4
	// calls in flight; the others are refused (503), none waits.
	burst := c.parallel(30, "POST", func(int) string { return "/api/orders?ms=100" }, func(i int) string { return fmt.Sprintf("db-%d", i) })
	require.Equal(t, 30, count(burst, 200)+count(burst, 503), "%v", burst)
	require.GreaterOrEqual(t, count(burst, 200), 1, "%v", burst)
	_, body, _ = c.do("GET", "/debug/db", "")
	var dbst map[string]int64
	require.NoError(t, json.Unmarshal([]byte(body), &dbst))
	require.LessOrEqual(t, dbst["max_in_flight"], int64(4), body)

	// Prometheus.
	_, body, _ = c.do("GET", "/metrics", "")
	require.Contains(t, body, "spillway_decisions_total")

	// Redis stopped: every request answered within the budget + 20 ms,
	// none denied (each key within its limits, a lone server keeps them).
	require.NoError(t, srv.Pause())
	defer func() { _ = srv.Resume() }()
	var slowest time.Duration
	for i := range 40 {
		method, path := "GET", "/api/report"
		if i%2 == 1 {
			method, path = "POST", "/api/orders"
		}
		st, body, el := c.do(method, path, fmt.Sprintf("outage-%d", i))
		require.Equal(t, 200, st, "request %d during the outage: %s", i, body)
		slowest = max(slowest, el)
	}
	// One key's whole rate limit (5 orders a minute) is admitted: the
	// server's fleet shedder saw it alone, so its local share is 1.
	for i := range 5 {
		st, body, el := c.do("POST", "/api/orders", "whole-limit")
		require.Equal(t, 200, st, "order %d of a key during the outage: %s", i, body)
		slowest = max(slowest, el)
	}
	st, body, _ = c.do("POST", "/api/orders", "whole-limit")
	require.Equal(t, 429, st, body)
	t.Logf("Redis stopped: slowest of 46 requests %v", slowest)
	require.LessOrEqual(t, slowest, spillway.DefaultBudget+20*time.Millisecond)
}
