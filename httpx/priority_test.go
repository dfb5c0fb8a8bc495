package httpx_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/shedder"
	"github.com/stretchr/testify/require"
)

// fullForSheddable returns a worker shedder of capacity 5 whose in-flight
// work (4 Critical units, held until the test ends) fills what Sheddable
// work may use (5 × (1 − 0.2 reserve) = 4) and leaves one unit for
// Critical work. The clock is frozen, so no tick moves the shed level.
func fullForSheddable(t *testing.T) *shedder.Worker {
	t.Helper()
	now := time.Unix(1_800_000_000, 0)
	w, err := shedder.NewWorker(5, shedder.WorkerSettings{Clock: func() time.Time { return now }})
	require.NoError(t, err)
	req := &spillway.Request{Priority: spillway.Critical, Cost: 4}
	d, done, err := w.Admit(context.Background(), req)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	t.Cleanup(func() { done(spillway.Success) })
	return w
}

// A custom classifier decides the priority of a request that carries none;
// a caller's lower propagated priority (Spillway-Priority: sheddable) still
// applies, so a shedder full for Sheddable work sheds it with 503 while a
// Critical request passes. Settings.IgnoreReceivedPriority turns that off.
func TestPropagatedPriorityUnderCustomClassifier(t *testing.T) {
	classify := func(*http.Request) spillway.Priority { return spillway.Critical }
	sheddable := map[string]string{spillway.PriorityHeader: "sheddable"}

	srv := serve(t, httpx.Middleware(fullForSheddable(t), httpx.Settings{Priority: classify})(okHandler()))
	resp, _ := get(t, srv.URL, sheddable)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp, body := get(t, srv.URL, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok", body)
	// A received priority never raises one (without a trusting classifier).
	low := func(*http.Request) spillway.Priority { return spillway.Sheddable }
	srv = serve(t, httpx.Middleware(fullForSheddable(t), httpx.Settings{Priority: low})(okHandler()))
	resp, _ = get(t, srv.URL, map[string]string{spillway.PriorityHeader: "critical_plus"})
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	// The default classifier (Critical) is lowered the same way.
	srv = serve(t, httpx.Middleware(fullForSheddable(t), httpx.Settings{})(okHandler()))
	resp, _ = get(t, srv.URL, sheddable)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)

	// Turned off by name: the classifier alone decides.
	srv = serve(t, httpx.Middleware(fullForSheddable(t), httpx.Settings{Priority: classify, IgnoreReceivedPriority: true})(okHandler()))
	resp, body = get(t, srv.URL, sheddable)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok", body)
}
