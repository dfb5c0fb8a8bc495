package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/httpx"
)

// recording wraps the chain of one server so the harness sees every
// decision (allowed, reason, degraded, store error) without depending on
// what the middleware exposes.
type recording struct {
	inner spillway.Limiter
	rec   *Recorder
}

func (r recording) Admit(ctx context.Context, req *spillway.Request) (spillway.Decision, spillway.Done, error) {
	t0 := time.Now()
	d, done, err := r.inner.Admit(ctx, req)
	if debugDegraded {
		degradedCauses.Add("timing:admit_us", time.Since(t0).Microseconds())
		degradedCauses.Add("timing:admit_n", 1)
		if done != nil && d.Allowed {
			inner := done
			done = func(o spillway.Outcome) {
				t1 := time.Now()
				inner(o)
				degradedCauses.Add("timing:done_us", time.Since(t1).Microseconds())
				degradedCauses.Add("timing:done_n", 1)
			}
		}
	}
	r.rec.Decision(d, err)
	if debugDegraded && err == nil && !d.Allowed {
		degradedCauses.Add("deny:"+req.Priority.String()+":"+d.Limiter+":"+d.Reason.String(), 1)
	}
	if err != nil {
		// The middleware's fail mode decides; the configurations that
		// reach here fail open, so count it as admitted.
		r.rec.FailOpen()
	}
	return d, done, err
}

// APIServer is one server of the fleet: an HTTP server on a free loopback
// port whose two routes run the chain (through the middleware) and then
// one backend query each.
type APIServer struct {
	URL string
	srv *http.Server
	ln  net.Listener
}

// StartAPIServer starts a server whose routes are guarded by lim (nil: no
// limiter at all).
func StartAPIServer(lim spillway.Limiter, db *Backend, rec *Recorder) (*APIServer, error) {
	mux := http.NewServeMux()
	work := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		defer func() {
			if debugDegraded {
				degradedCauses.Add("timing:handler_us", time.Since(t0).Microseconds())
				degradedCauses.Add("timing:handler_n", 1)
			}
		}()
		if err := db.Query(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	var h http.Handler = work
	if lim != nil {
		h = httpx.Middleware(recording{inner: lim, rec: rec},
			httpx.WithPriority(priorityFromHeader),
			httpx.WithAPIKeyHeader("X-API-Key"),
			httpx.WithFailMode(spillway.FailOpen),
		)(work)
	}
	mux.Handle("GET /api/v1/search", h)
	mux.Handle("POST /api/v1/posts", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("loadtest: listen: %w", err)
	}
	s := &APIServer{
		URL: "http://" + ln.Addr().String(),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second},
		ln:  ln,
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("loadtest: server %s: %v\n", s.URL, err)
		}
	}()
	return s, nil
}

// Close stops the server, waiting briefly for requests in flight.
func (s *APIServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
}

// priorityFromHeader is the classifier the fleet uses: the load generator
// states each request's priority in a header (a real API would derive it
// from the route and the caller; see shedder's classifier).
func priorityFromHeader(r *http.Request) spillway.Priority {
	if p, err := spillway.ParsePriority(r.Header.Get(priorityHeader)); err == nil {
		return p
	}
	return spillway.Critical
}

// Kill stops the server at once, as a crash would: its listener and every
// connection close, so requests in flight fail at their clients. (Their
// handlers still run to the end in this process; the database does not
// notice either.)
func (s *APIServer) Kill() { _ = s.srv.Close() }
