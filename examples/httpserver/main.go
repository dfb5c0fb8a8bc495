// Command httpserver is a demo API behind the whole spillway chain: rate
// tiers from a YAML file, a per-client concurrency limit, the worker load
// shedder and, with Redis, the fleet shedder and a global ceiling in front
// of the (pretend) database. With -redis the Redis-backed blocks are
// wrapped in the fallback, so a stalled Redis degrades to a local share of
// every limit instead of failing.
//
//	go -C examples run ./httpserver                        # in-memory
//	go -C examples run ./httpserver -redis 127.0.0.1:6379  # shared state in Redis
//	go -C examples run ./httpserver -h                     # routes, headers, flags
//
// GET /api/v1/report?ms=N works N milliseconds, so concurrent requests pile
// up: past 10 in flight per client the concurrency limit answers 429, past
// 32 GETs in flight in the server the worker shedder answers 503 (POSTs,
// which are Critical, still get in up to 40). The README shows the shell
// loops.
//
// Telemetry: Prometheus metrics on GET /metrics (-metrics=false turns them
// off); -otel stdout also prints denied requests' spans and the metrics as
// JSON.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/examples/internal/demo"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/tiers"
)

// defaultLimits is limits.yaml beside this file, embedded so that the
// program finds it whatever its working directory.
//
//go:embed limits.yaml
var defaultLimits []byte

// Demo sizes: small enough to see every block answer from a shell loop.
const (
	fleetCapacity = 512  // requests in flight across the fleet
	dbCeiling     = 2000 // database calls per second across the fleet
)

// dimClient is the dimension the rate rules and the concurrency limit key
// on: the API key when the request carries one, else the client IP.
const dimClient = "client"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stdout, nil)
	switch {
	case errors.Is(err, flag.ErrHelp):
		// -h: the usage is printed; asking for it is not an error.
	case err != nil:
		fmt.Fprintln(os.Stderr, "httpserver:", err)
		os.Exit(1)
	}
}

const usage = `Usage: go -C examples run ./httpserver [flags]

A demo API behind the spillway chain: rate tiers → per-client concurrency →
worker shedder (with -redis: → fleet shedder → global ceiling).

Routes (rates from the embedded limits.yaml; -config replaces them):
  POST /api/v1/login          5/minute per user, 10/minute per IP
  GET  /api/v1/search?q=Q     60/minute, burst 20 per client
  POST /api/v1/posts          100/second, burst 50 per client
  GET  /api/v1/report?ms=N    works N ms (default 100, at most 10000);
                              120/minute, burst 60 per client
  POST /api/v1/generate?seed=N
                              "generates" 50 to 500 tokens (drawn from
                              seed N); 2000 tokens per minute per client
                              (-tokens): 250 are held when admitted, the
                              tokens used are charged when it ends
                              (X-Tokens-Used), going into debt when more
  GET  /healthz               never limited
  GET  /metrics               Prometheus metrics (-metrics), never limited

Identity headers:
  X-API-Key: KEY              the client is the API key; without it, the
                              client is its IP (the peer address)
  X-User-ID: USER             the user, for the login rule
  Spillway-Priority: P        lowers a request's priority (sheddable,
                              sheddable_plus, critical, critical_plus);
                              GETs are sheddable_plus, POSTs critical
  X-Spillway-Test-Mode: 1     marks test traffic, shed first

Answers: 429 for rate and concurrency limits, 503 for shedding, both with
Retry-After and an application/problem+json body naming the limiter.

Flags:
`

// run serves until ctx ends, printing messages to out and telemetry to
// otelOut. ready, when set, receives the address it listens on (tests pass
// -addr 127.0.0.1:0).
func run(ctx context.Context, args []string, out, otelOut io.Writer, ready func(addr string)) (err error) {
	fs := flag.NewFlagSet("httpserver", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	redisAddr := fs.String("redis", "", "Redis address (host:port); empty keeps every limit in memory")
	config := fs.String("config", "", "rate-limit rules (YAML, see docs/tiers.md); empty uses examples/httpserver/limits.yaml, embedded")
	budget := fs.Duration("redis-budget", 50*time.Millisecond, "time a request's admission may wait on Redis in total before the blocks decide locally")
	tokens := fs.Int64("tokens", 0, "tokens per minute per client on POST /api/v1/generate: the rate of the config's generate_tokens rule (0: as the config says, 2000 in the embedded one)")
	perClient := fs.Int64("concurrency", 10, "requests in flight per client (-redis: a fifth of it while Redis is out)")
	workerCap := fs.Int64("worker", 40, "requests in flight in this server; GETs (sheddable_plus) get 80% of it")
	metrics := fs.Bool("metrics", true, "serve Prometheus metrics on GET /metrics")
	otelFlags := demo.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}

	tel, err := demo.Setup("spillway-httpserver", otelFlags, *metrics, otelOut)
	if err != nil {
		return err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = errors.Join(err, tel.Shutdown(c))
	}()

	var cfg *tiers.Config
	if *config == "" {
		cfg, err = tiers.Parse("limits.yaml", defaultLimits)
	} else {
		cfg, err = tiers.ParseFile(*config)
	}
	if err != nil {
		return err
	}
	if *tokens != 0 {
		if err := demo.SetRate(cfg, "generate_tokens", *tokens, time.Minute); err != nil {
			return fmt.Errorf("-tokens: %w", err)
		}
	}

	b, err := build(ctx, cfg, sizes{*perClient, *workerCap}, *redisAddr, *budget, tel)
	if err != nil {
		return err
	}
	defer b.close()

	mw := httpx.Middleware(b.chain, httpx.Settings{
		Priority:     shedder.ClassifyHTTP,
		User:         func(r *http.Request) string { return r.Header.Get("X-User-ID") },
		APIKeyHeader: "X-API-Key",
		IETFHeaders:  true,
	})
	// The generate route meters its cost: its tiers rule (cost: response)
	// holds its estimate at admission, and the X-Tokens-Used header the
	// handler sets is the actual cost it settles to.
	mwGenerate := httpx.Middleware(b.chain, httpx.Settings{
		Priority:     shedder.ClassifyHTTP,
		User:         func(r *http.Request) string { return r.Header.Get("X-User-ID") },
		APIKeyHeader: "X-API-Key",
		IETFHeaders:  true,
		UsageHeader:  "X-Tokens-Used",
	})
	mux := http.NewServeMux()
	tracer := tel.TracerProvider.Tracer("github.com/spillway-go/spillway/examples/httpserver")
	api := func(route string, h http.HandlerFunc) { mux.Handle(route, demo.TraceHTTP(tracer, route, mw(h))) }
	var posts atomic.Int64
	api("POST /api/v1/login", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"token": "demo-token-for-" + r.Header.Get("X-User-ID")})
	})
	api("GET /api/v1/search", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"query": r.URL.Query().Get("q"), "results": []string{}})
	})
	api("POST /api/v1/posts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, map[string]int64{"id": posts.Add(1)})
	})
	api("GET /api/v1/report", func(w http.ResponseWriter, r *http.Request) {
		ms := int64(100)
		if v := r.URL.Query().Get("ms"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || n > demo.MaxWork.Milliseconds() {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("ms=%q: want 0 to %d", v, demo.MaxWork.Milliseconds())})
				return
			}
			ms = n
		}
		start := time.Now()
		demo.Work(r.Context(), time.Duration(ms)*time.Millisecond)
		writeJSON(w, http.StatusOK, map[string]int64{"worked_ms": time.Since(start).Milliseconds()})
	})
	var seq atomic.Uint64
	mux.Handle(generateRoute, demo.TraceHTTP(tracer, generateRoute, mwGenerate(generate(&seq))))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		body := map[string]any{"ok": true, "degraded": b.degraded()}
		if b.redis != nil {
			body["redis"] = b.redis()
		}
		writeJSON(w, http.StatusOK, body)
	})
	if tel.Metrics != nil {
		mux.Handle("GET /metrics", tel.Metrics)
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(out, "spillway demo API listening on http://%s (%s)\n", ln.Addr(), b.describe)
	if ready != nil {
		ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// withClient sets the "client" dimension before next decides: "key:" and
// the API key when the request has one, else "ip:" and the client IP. The
// rules keyed by client (limits.yaml) and the concurrency limit thus limit
// anonymous requests per IP, and requests with a key per key. The caller's
// Request is not modified.
func withClient(next spillway.Limiter) spillway.Limiter { return clientDim{next} }

type clientDim struct{ next spillway.Limiter }

func (l clientDim) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r == nil {
		return l.next.Admit(ctx, r)
	}
	c := *r
	c.Dims = append(make([]spillway.Dimension, 0, len(r.Dims)+1), r.Dims...)
	if k, ok := r.Get(spillway.DimAPIKey); ok {
		c.Set(dimClient, "key:"+k)
	} else if ip, ok := r.Get(spillway.DimIP); ok {
		c.Set(dimClient, "ip:"+ip)
	}
	return l.next.Admit(ctx, &c)
}

// sizes are the in-flight limits (flags).
type sizes struct {
	perClient, worker int64
}

// blocks is the assembled chain and what must be closed.
type blocks struct {
	chain    spillway.Limiter
	describe string
	degraded func() bool
	redis    func() any // the shared Redis health, nil without Redis
	closers  []func()
}

func (b *blocks) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

func build(ctx context.Context, cfg *tiers.Config, sz sizes, redisAddr string, budget time.Duration, tel *demo.Telemetry) (*blocks, error) {
	b := &blocks{degraded: func() bool { return false }}
	worker, err := shedder.NewWorker(sz.worker, shedder.WorkerSettings{Name: "worker"})
	if err != nil {
		return nil, err
	}

	if redisAddr == "" {
		store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{})
		rate, err := tiers.New(cfg, store, tiers.Settings{Name: "tiers", HoldObserver: telemetry.NewHoldMetrics("api", tel.MeterProvider)})
		if err != nil {
			return nil, err
		}
		conc, err := concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), sz.perClient, concurrency.Settings{Name: "per_client_concurrency"})
		if err != nil {
			return nil, err
		}
		// The fleet shedder and the global ceiling share state across
		// servers through Redis; a single in-memory server has neither.
		b.chain = telemetry.Instrument(withClient(spillway.Chain(rate, concurrency.PerKey(conc, dimClient), worker)), "api", tel.Settings())
		b.describe = "store: memory; chain: tiers → per-client concurrency → worker shedder (the fleet shedder and the global ceiling need -redis)"
		return b, nil
	}

	// One health for the one Redis: K failures seen by any block (or by
	// the fleet's reports, the ceiling's sync) stop every block from
	// calling it; go-redis's own dial errors are logged once per 10 s.
	conn, err := demo.ConnectRedis(ctx, redisAddr, budget, tel.MeterProvider)
	if err != nil {
		b.close()
		return nil, err
	}
	b.closers = append(b.closers, conn.Close)
	rdb, health := conn.Client, conn.Health
	settings := func(name string) fallback.Settings { return conn.Settings(name, budget) }

	// Rate tiers: Redis store inside the fallback (budget, breaker, 20%
	// local share); rules marked "fail: closed" deny while Redis is out
	// (their store items say so).
	redisStore, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{})
	if err != nil {
		b.close()
		return nil, err
	}
	rateStore, err := fallback.NewStore(redisStore, settings("rate"))
	if err != nil {
		b.close()
		return nil, err
	}
	rate, err := tiers.New(cfg, rateStore, tiers.Settings{Name: "tiers", HoldObserver: telemetry.NewHoldMetrics("api", tel.MeterProvider)})
	if err != nil {
		b.close()
		return nil, err
	}

	// Per-client concurrency: Stripe's sorted-set limiter in Redis; while
	// Redis is out it decides by itself at this server's share.
	cstore, err := concurrency.NewRedisStore(rdb, concurrency.RedisSettings{})
	if err != nil {
		b.close()
		return nil, err
	}
	cshared, err := concurrency.New(cstore, sz.perClient, concurrency.Settings{Name: "per_client_concurrency", ReleaseTimeout: budget})
	if err != nil {
		b.close()
		return nil, err
	}
	conc := concurrency.PerKey(cshared, dimClient)

	// Fleet shedder: degrades on its own (its share of the capacity) when
	// Redis is out, so it needs no fallback wrapper.
	fleet, err := shedder.NewFleet(rdb, "demo-api", fleetCapacity, shedder.FleetSettings{Timeout: budget})
	if err != nil {
		b.close()
		return nil, err
	}
	b.closers = append(b.closers, func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		fleet.Close(c)
	})

	// Global ceiling in front of the database; while Redis is out it
	// decides by itself at this server's share.
	ceiling, err := globalceiling.New(rdb, "db_ceiling", dbCeiling, time.Second, globalceiling.Settings{Mode: globalceiling.Cached})
	if err != nil {
		b.close()
		return nil, err
	}
	b.closers = append(b.closers, func() { ceiling.Close() })

	// One budget per request: the whole admission waits on Redis for at
	// most -redis-budget, however many blocks call it.
	b.chain = telemetry.Instrument(withClient(spillway.ChainBudget(budget, rate, conc, fleet, worker, ceiling)), "api", tel.Settings())
	b.degraded = func() bool { return health.State() != fallback.Closed }
	b.redis = func() any {
		st := health.Stats()
		h := map[string]any{"state": st.State.String(), "since": st.Since.UTC().Format(time.RFC3339Nano),
			"consecutive_failures": st.ConsecutiveFailures, "successes": st.Successes, "failures": st.Failures,
			"rejected": st.Rejected, "opened": st.Opened}
		if st.LastError != nil {
			h["last_error"] = st.LastError.Error()
		}
		return h
	}
	b.describe = "store: redis " + redisAddr + "; chain: tiers → per-client concurrency → fleet shedder → worker shedder → global ceiling, each Redis block falls back by itself"
	return b, nil
}
