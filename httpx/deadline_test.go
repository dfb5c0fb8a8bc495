package httpx_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/shedder"
)

// Settings.DeadlineHeader: the client's Spillway-Timeout becomes the request
// context's deadline, which the chain and the handler see; a queue
// refuses at once a request it could not serve in time (503); a
// malformed value is answered 400; without the option the header is
// ignored.
func TestDeadlineHeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := shedder.NewQueue(1, shedder.QueueSettings{MaxWait: time.Second, Name: "db_pool"})
		require.NoError(t, err)
		// Work holds the slot 100 ms.
		_, done, _ := q.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
		time.Sleep(100 * time.Millisecond)
		done(spillway.Success)
		var seen []time.Duration
		lim := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
			dl, ok := ctx.Deadline()
			if ok {
				seen = append(seen, time.Until(dl))
			} else {
				seen = append(seen, -1)
			}
			return q.Admit(ctx, r)
		})
		var inHandler time.Duration
		h := httpx.Middleware(lim, httpx.Settings{DeadlineHeader: spillway.TimeoutHeader})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			dl, _ := r.Context().Deadline()
			inHandler = time.Until(dl)
		}))
		serve := func(h http.Handler, timeout string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodGet, "/x", nil)
			if timeout != "" {
				req.Header.Set(spillway.TimeoutHeader, timeout)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}
		// A free slot: admitted; the handler sees the deadline.
		require.Equal(t, http.StatusOK, serve(h, "300").Code)
		require.Equal(t, 300*time.Millisecond, inHandler)
		// The slot held: the expected wait is 100 ms; 50 ms left is
		// refused at once.
		_, held, _ := q.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
		rec := serve(h, "50")
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.Equal(t, "1", rec.Header().Get("Retry-After"))
		require.Equal(t, []time.Duration{300 * time.Millisecond, 50 * time.Millisecond}, seen)
		require.Equal(t, int64(1), q.Stats().Late)
		held(spillway.Success)
		for _, bad := range []string{"0", "-5", "1.5", "abc", "3600001", " "} {
			require.Equal(t, http.StatusBadRequest, serve(h, bad).Code, "value %q", bad)
		}
		require.Len(t, seen, 2) // malformed values never reach the chain
		// No header: no deadline. Without the option, the header means nothing.
		require.Equal(t, http.StatusOK, serve(h, "").Code)
		plain := httpx.Middleware(lim, httpx.Settings{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		require.Equal(t, http.StatusOK, serve(plain, "abc").Code)
		require.Equal(t, []time.Duration{300 * time.Millisecond, 50 * time.Millisecond, -1, -1}, seen)
	})
}

func TestParseTimeout(t *testing.T) {
	for v, want := range map[string]time.Duration{"1": time.Millisecond, " 300 ": 300 * time.Millisecond, "3600000": time.Hour} {
		got, err := spillway.ParseTimeout(v)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := spillway.ParseTimeout("12ms")
	require.EqualError(t, err, `spillway: timeout "12ms": want whole milliseconds from 1 to 3600000`)
	for _, v := range []string{"", "0", "3600001", "+5", "-5", "99999999999999999999"} {
		_, err := spillway.ParseTimeout(v)
		require.Error(t, err, v)
	}
}

// A request whose own deadline (the client's header) passes while it is
// served ends Ignored: the client gave up, which says nothing of the
// server's load, so a learned limit does not halve on it. A deadline the
// server set itself, earlier than the client's, still ends Dropped, as does
// a 5xx within the client's time.
func TestDeadlineHeaderOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var outs []spillway.Outcome
		lim := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
			return spillway.Decision{Allowed: true}, func(o spillway.Outcome) { outs = append(outs, o) }, nil
		})
		h := httpx.Middleware(lim, httpx.Settings{DeadlineHeader: spillway.TimeoutHeader})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
				w.WriteHeader(http.StatusServiceUnavailable)
			case <-time.After(200 * time.Millisecond):
				if r.URL.Path == "/fail" {
					w.WriteHeader(http.StatusBadGateway)
				}
			}
		}))
		serve := func(path, timeout string, serverTimeout time.Duration) int {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			if serverTimeout > 0 {
				ctx, cancel := context.WithTimeout(req.Context(), serverTimeout)
				defer cancel()
				req = req.WithContext(ctx)
			}
			if timeout != "" {
				req.Header.Set(spillway.TimeoutHeader, timeout)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec.Code
		}
		require.Equal(t, http.StatusServiceUnavailable, serve("/x", "100", 0))                   // the client's 100 ms pass
		require.Equal(t, http.StatusOK, serve("/x", "300", 0))                                   // in time
		require.Equal(t, http.StatusBadGateway, serve("/fail", "300", 0))                        // a 5xx in time
		require.Equal(t, http.StatusServiceUnavailable, serve("/x", "300", 50*time.Millisecond)) // the server's own 50 ms, earlier
		require.Equal(t, http.StatusServiceUnavailable, serve("/x", "", 50*time.Millisecond))    // no header
		require.Equal(t, []spillway.Outcome{spillway.Ignored, spillway.Success, spillway.Dropped, spillway.Dropped, spillway.Dropped}, outs)
	})
}
