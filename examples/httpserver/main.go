// Command httpserver is a demo API behind the whole spillway chain: rate
// tiers from a YAML file, a per-client concurrency limit, the fleet and
// worker load shedders and, with Redis, a global ceiling in front of the
// (pretend) database. With -redis the Redis-backed blocks are wrapped in the
// fallback, so a stalled Redis degrades to a local share of every limit
// instead of failing.
//
//	go run ./examples/httpserver                        # in-memory
//	go run ./examples/httpserver -redis 127.0.0.1:6379  # shared state in Redis
//	go run ./examples/httpserver -otel none             # no telemetry output
//
// Telemetry (otel.go): an OpenTelemetry SDK with the stdout exporters prints,
// as one JSON line each (-otel-pretty indents them), every denied request's
// span with its spillway.decision event and, every 10 s (-otel-interval)
// when there was traffic, the spillway.decisions counter and the
// spillway.decision.duration histogram of that interval.
//
// Routes: POST /api/v1/login, GET /api/v1/search, POST /api/v1/posts,
// GET /healthz (never limited). Identity: user from X-User-ID, API key from
// X-API-Key, IP from the peer. Try:
//
//	for i in $(seq 7); do curl -si -XPOST -H 'X-User-ID: ann' localhost:8080/api/v1/login | head -1; done
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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/tiers"
)

// defaultLimits is limits.yaml beside this file, so that `go run
// ./examples/httpserver` works from any directory.
//
//go:embed limits.yaml
var defaultLimits []byte

// Demo sizes: small enough to see every block answer from a shell loop.
const (
	perIPConcurrency = 20   // requests in flight per client IP
	fleetCapacity    = 512  // requests in flight across the fleet
	workerCapacity   = 128  // requests in flight in this server
	dbCeiling        = 2000 // database calls per second across the fleet
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "httpserver:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, printing messages to out and telemetry to
// otelOut. ready, when set, receives the address it listens on (tests pass
// -addr 127.0.0.1:0).
func run(ctx context.Context, args []string, out, otelOut io.Writer, ready func(addr string)) (err error) {
	fs := flag.NewFlagSet("httpserver", flag.ContinueOnError)
	fs.SetOutput(out)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	redisAddr := fs.String("redis", "", "Redis address (host:port); empty keeps every limit in memory")
	config := fs.String("config", "", "rate-limit rules (YAML, see docs/tiers.md); empty uses examples/httpserver/limits.yaml, embedded")
	budget := fs.Duration("redis-budget", 50*time.Millisecond, "time one Redis call may take before the fallback decides locally")
	otelMode := fs.String("otel", "stdout", "telemetry exporter: stdout (denied requests' spans, metrics every -otel-interval) or none")
	otelInterval := fs.Duration("otel-interval", 10*time.Second, "how often metrics are exported")
	otelPretty := fs.Bool("otel-pretty", false, "indent the telemetry JSON (about 140 lines per span) instead of one line per document")
	if err := fs.Parse(args); err != nil {
		return err
	}

	otelp, err := setupOTel(*otelMode, otelOut, *otelInterval, *otelPretty)
	if err != nil {
		return err
	}
	defer func() {
		// Flush what is left: the spans and the last interval's metrics.
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = errors.Join(err, otelp.shutdown(c))
	}()
	tel := []telemetry.Option{telemetry.WithTracerProvider(otelp.tp), telemetry.WithMeterProvider(otelp.mp)}

	var cfg *tiers.Config
	if *config == "" {
		cfg, err = tiers.Parse("limits.yaml", defaultLimits)
	} else {
		cfg, err = tiers.ParseFile(*config)
	}
	if err != nil {
		return err
	}

	b, err := build(ctx, cfg, *redisAddr, *budget, tel)
	if err != nil {
		return err
	}
	defer b.close()

	mw := httpx.Middleware(b.chain,
		httpx.WithPriority(shedder.ClassifyHTTP),
		httpx.WithUser(func(r *http.Request) string { return r.Header.Get("X-User-ID") }),
		httpx.WithAPIKeyHeader("X-API-Key"),
		httpx.WithIETFHeaders(),
	)
	mux := http.NewServeMux()
	tracer := otelp.tp.Tracer("github.com/spillway-go/spillway/examples/httpserver")
	api := func(route string, h http.HandlerFunc) { mux.Handle(route, traced(tracer, route, mw(h))) }
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
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "degraded": b.degraded()})
	})

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

// blocks is the assembled chain and what must be closed.
type blocks struct {
	chain    spillway.Limiter
	describe string
	degraded func() bool
	closers  []func()
}

func (b *blocks) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

func build(ctx context.Context, cfg *tiers.Config, redisAddr string, budget time.Duration, tel []telemetry.Option) (*blocks, error) {
	b := &blocks{degraded: func() bool { return false }}
	worker, err := shedder.NewWorker(workerCapacity, shedder.WithName("worker"))
	if err != nil {
		return nil, err
	}

	if redisAddr == "" {
		rate, err := tiers.New(cfg, ratelimit.NewMemoryStore(), tiers.WithName("tiers"))
		if err != nil {
			return nil, err
		}
		conc, err := concurrency.New(concurrency.NewMemoryStore(), perIPConcurrency, concurrency.WithName("per_ip_concurrency"))
		if err != nil {
			return nil, err
		}
		// The fleet shedder and the global ceiling share state across
		// servers through Redis; a single in-memory server has neither.
		b.chain = telemetry.Instrument(spillway.Chain(rate, concurrency.PerKey(conc, spillway.DimIP), worker), "api", tel...)
		b.describe = "store: memory; chain: tiers → per-IP concurrency → worker shedder (the fleet shedder and the global ceiling need -redis)"
		return b, nil
	}

	opt := &redis.Options{Addr: redisAddr}
	if budget > fallback.ClientIOTimeout {
		opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = budget, budget, budget
	}
	fallback.TuneOptions(opt) // millisecond timeouts: a slow Redis costs a budget, not seconds
	rdb := redis.NewClient(opt)
	b.closers = append(b.closers, func() { rdb.Close() })
	pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		b.close()
		return nil, fmt.Errorf("redis %s: %w", redisAddr, err)
	}

	gauge := telemetry.NewBreakerGauge(tel...)
	settings := func(name string) fallback.Settings {
		return fallback.Settings{Name: name, Budget: budget, OnStateChange: func(name string, _, to fallback.State) {
			gauge.Record(context.Background(), name, telemetry.BreakerState(to))
		}}
	}

	// Rate tiers: Redis store inside the fallback (budget, breaker, 20%
	// local share); rules marked "fail: closed" deny while Redis is out
	// (their store items say so).
	rateStore, err := fallback.NewStore(ratelimit.NewRedisStore(rdb), settings("rate"))
	if err != nil {
		b.close()
		return nil, err
	}
	rate, err := tiers.New(cfg, rateStore, tiers.WithName("tiers"))
	if err != nil {
		b.close()
		return nil, err
	}

	// Per-IP concurrency: Stripe's sorted-set limiter in Redis, a local
	// limiter with a fifth of the slots while Redis is out.
	cstore, err := concurrency.NewRedisStore(rdb)
	if err != nil {
		b.close()
		return nil, err
	}
	cshared, err := concurrency.New(cstore, perIPConcurrency, concurrency.WithName("per_ip_concurrency"), concurrency.WithReleaseTimeout(budget))
	if err != nil {
		b.close()
		return nil, err
	}
	clocal, err := concurrency.New(concurrency.NewMemoryStore(), perIPConcurrency/5, concurrency.WithName("per_ip_concurrency"))
	if err != nil {
		b.close()
		return nil, err
	}
	conc, err := fallback.NewLimiter(concurrency.PerKey(cshared, spillway.DimIP), concurrency.PerKey(clocal, spillway.DimIP), settings("concurrency"))
	if err != nil {
		b.close()
		return nil, err
	}

	// Fleet shedder: degrades on its own (its share of the capacity) when
	// Redis is out, so it needs no fallback wrapper.
	fleet, err := shedder.NewFleet(rdb, "demo-api", fleetCapacity, shedder.WithName("fleet"), shedder.WithTimeout(budget))
	if err != nil {
		b.close()
		return nil, err
	}
	b.closers = append(b.closers, func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		fleet.Close(c)
	})

	// Global ceiling in front of the database, behind a Guard that falls
	// back to a local fifth of the ceiling.
	ceiling, err := globalceiling.New(rdb, "demo-db", dbCeiling, time.Second, globalceiling.WithMode(globalceiling.Cached))
	if err != nil {
		b.close()
		return nil, err
	}
	b.closers = append(b.closers, func() { ceiling.Close() })
	local, err := globalceiling.NewLocalBucket(dbCeiling/5, time.Second)
	if err != nil {
		b.close()
		return nil, err
	}
	guard, err := globalceiling.NewGuard(ceiling, globalceiling.WithFallback(local), globalceiling.WithGuardName("db_ceiling"))
	if err != nil {
		b.close()
		return nil, err
	}

	b.chain = telemetry.Instrument(spillway.Chain(rate, conc, fleet, worker, guard), "api", tel...)
	b.degraded = func() bool { return rateStore.State() != fallback.Closed || conc.State() != fallback.Closed }
	b.describe = "store: redis " + redisAddr + "; chain: tiers → per-IP concurrency → fleet shedder → worker shedder → global ceiling, Redis blocks behind the fallback"
	return b, nil
}
