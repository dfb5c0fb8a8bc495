package sim

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
	dbg := r.rec.Debug
	d, done, err := r.inner.Admit(ctx, req)
	if dbg.On() {
		dbg.Add("timing:admit_us", time.Since(t0).Microseconds())
		dbg.Add("timing:admit_n", 1)
		if done != nil && d.Allowed {
			inner := done
			done = func(o spillway.Outcome) {
				t1 := time.Now()
				inner(o)
				dbg.Add("timing:done_us", time.Since(t1).Microseconds())
				dbg.Add("timing:done_n", 1)
			}
		}
	}
	r.rec.Decision(d, err)
	if dbg.On() && err == nil && !d.Allowed {
		dbg.Add("deny:"+req.Priority.String()+":"+d.Limiter+":"+d.Reason.String(), 1)
	}
	if err != nil {
		// The middleware's fail mode decides; the configurations that
		// reach here fail open, so count it as admitted.
		r.rec.FailOpen()
	}
	return d, done, err
}

// APIServer is one server of the fleet: an HTTP server on a free loopback
// port whose two database routes run the chain (through the middleware)
// and then one backend query each, and whose export route runs its own
// chain and then holds a worker for a long time without the database.
type APIServer struct {
	URL string
	srv *http.Server
	ln  net.Listener
}

// ServerOptions shape a server beyond its chains.
type ServerOptions struct {
	// Workers bounds the requests the server handles at once, as a
	// server's worker pool does: a request waits for a free worker (at
	// most WorkerWait) before its chain runs, and holds it until it is
	// answered. 0: no bound (a goroutine per request).
	Workers int
	// Export is the chain of the export route (nil: no limiter).
	Export spillway.Limiter
	// Deadlines makes the middleware read the client's timeout
	// (spillway.TimeoutHeader) into the request's context deadline.
	Deadlines bool
}

// The export route: a report built in the server itself (CPU, a remote
// call, a large response), no database query; it holds its worker this
// long.
const (
	ExportPath = "/api/v1/export"
	ExportHold = 2 * time.Second
	// WorkerWait is how long a request waits for a free worker before the
	// server answers 503 (its accept queue is full).
	WorkerWait = 2 * time.Second
)

// StartAPIServer starts a server whose database routes are guarded by lim
// (nil: no limiter at all).
func StartAPIServer(lim spillway.Limiter, db *Backend, rec *Recorder, opt ServerOptions) (*APIServer, error) {
	mux := http.NewServeMux()
	work := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		dbg := rec.Debug
		defer func() {
			if dbg.On() {
				dbg.Add("timing:handler_us", time.Since(t0).Microseconds())
				dbg.Add("timing:handler_n", 1)
			}
		}()
		if err := db.Query(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	export := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(ExportHold)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	guard := func(l spillway.Limiter, h http.Handler) http.Handler {
		if l == nil {
			return h
		}
		s := httpx.Settings{
			Priority:     priorityFromHeader,
			APIKeyHeader: "X-API-Key",
			FailMode:     spillway.FailOpen,
			User:         func(r *http.Request) string { return r.Header.Get(TenantHeader) },
		}
		if opt.Deadlines {
			s.DeadlineHeader = spillway.TimeoutHeader
		}
		return httpx.Middleware(l, s)(h)
	}
	var h http.Handler = work
	if lim != nil {
		h = guard(recording{inner: lim, rec: rec}, work)
	}
	mux.Handle("GET /api/v1/search", h)
	mux.Handle("POST /api/v1/posts", h)
	mux.Handle("GET "+ExportPath, guard(opt.Export, export))
	var root http.Handler = mux
	if opt.Workers > 0 {
		root = workerPool(opt.Workers, mux)
	}
	inner := root
	root = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// When the client states its timeout, the database learns when it
		// gave up, to count the work done after it (whatever the chain
		// does with the header).
		if v := r.Header.Get(spillway.TimeoutHeader); v != "" {
			if d, err := spillway.ParseTimeout(v); err == nil {
				r = r.WithContext(WithGiveUp(r.Context(), time.Now().Add(d)))
			}
		}
		inner.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("loadtest: listen: %w", err)
	}
	s := &APIServer{
		URL: "http://" + ln.Addr().String(),
		srv: &http.Server{Handler: root, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second},
		ln:  ln,
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("loadtest: server %s: %v\n", s.URL, err)
		}
	}()
	return s, nil
}

// workerPool lets at most n requests into h at once: the others wait, in
// no particular order, up to WorkerWait for a worker, then get 503. A
// client that gave up does not free its place: the server does not notice.
func workerPool(n int, h http.Handler) http.Handler {
	slots := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(WorkerWait)
		defer t.Stop()
		select {
		case slots <- struct{}{}:
		case <-t.C:
			http.Error(w, "no worker free", http.StatusServiceUnavailable)
			return
		case <-r.Context().Done():
			return
		}
		defer func() { <-slots }()
		h.ServeHTTP(w, r)
	})
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
