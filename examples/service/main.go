// Command service is a whole net/http service behind spillway, in one
// file: Stripe's four limiters (a request-rate limit from a tiers YAML, a
// per-API-key concurrency limit in Redis, the fleet usage shedder and the
// worker utilization shedder), an in-flight cap in front of its database
// calls, the one health of its Redis client, and a Prometheus endpoint.
//
//	go -C examples run ./service -redis 127.0.0.1:6379
//
// Routes: GET /api/report?ms=N (Sheddable: works N ms), POST /api/orders?ms=N
// (Critical: a database call of N ms behind the in-flight cap), GET
// /metrics (Prometheus), GET /debug/db (the most database calls seen in
// flight at once). A client is its X-API-Key; every request also carries
// its IP. What it wires is all a service must do: the client's health,
// once, and the blocks; each Redis block falls back by itself while Redis
// is away, at this server's share of the fleet it last saw (a lone server
// keeps its whole limits), and a request's admissions share one budget.
package main

import (
	"context"
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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

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

// The rate limits: per API key on orders, per IP on everything.
const rules = `
limits:
  - endpoint: /api/orders
    by: api_key
    bucket: 5/minute
  - endpoint: /api/*
    by: ip
    bucket: 6000/minute
`

const (
	perKeyInFlight = 5  // concurrency: requests in flight per API key, fleet-wide
	fleetCapacity  = 20 // fleet shedder: requests in flight across the fleet (Sheddable work stops at 80%)
	workers        = 40 // worker shedder: this server's workers
	dbInFlight     = 4  // at most this many database calls in flight across the fleet
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, io.Discard, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run serves until ctx ends; ready, when not nil, gets the address it
// listens on.
func run(ctx context.Context, args []string, out, _ io.Writer, ready func(string)) error {
	fs := flag.NewFlagSet("service", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	if err := fs.Parse(args); err != nil {
		return err
	}

	// Redis: the client as go-redis's docs build it, and its one health,
	// attached before the blocks are built. Nothing else to wire.
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
	defer rdb.Close()
	if _, err := fallback.NewHealth(rdb, fallback.HealthSettings{}); err != nil {
		return err
	}

	// Metrics to Prometheus, on a registry of its own.
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer mp.Shutdown(context.Background())

	// 1. Request rate: the tiers YAML over the Redis store.
	cfg, err := tiers.Parse("rules.yaml", []byte(rules))
	if err != nil {
		return err
	}
	rstore, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{})
	if err != nil {
		return err
	}
	store, err := fallback.NewStore(rstore, fallback.Settings{})
	if err != nil {
		return err
	}
	rate, err := tiers.New(cfg, store, tiers.Settings{Name: "rate"})
	if err != nil {
		return err
	}
	// 2. Concurrent requests per API key, fleet-wide.
	cstore, err := concurrency.NewRedisStore(rdb, concurrency.RedisSettings{})
	if err != nil {
		return err
	}
	conc, err := concurrency.New(cstore, perKeyInFlight, concurrency.Settings{Name: "per_key_concurrency"})
	if err != nil {
		return err
	}
	// 3. Fleet usage: Sheddable work is shed first.
	fleet, err := shedder.NewFleet(rdb, "fleet", fleetCapacity, shedder.FleetSettings{})
	if err != nil {
		return err
	}
	defer fleet.Close(context.Background())
	// 4. This server's workers.
	worker, err := shedder.NewWorker(workers, shedder.WorkerSettings{Name: "workers"})
	if err != nil {
		return err
	}
	chain := telemetry.Instrument(spillway.Chain(rate, concurrency.PerKey(conc, spillway.DimAPIKey), fleet, worker),
		"api", telemetry.Settings{MeterProvider: mp})

	// The database, behind at most dbInFlight calls in flight fleet-wide.
	inflight, err := concurrency.NewInFlight(rdb, dbInFlight, concurrency.Settings{Name: "db_inflight"})
	if err != nil {
		return err
	}
	guard, err := globalceiling.NewGuard(inflight)
	if err != nil {
		return err
	}
	db := &database{}

	// The middleware goes around each route, so that the request's
	// endpoint is the route's pattern (what the tiers rules match).
	mw := httpx.Middleware(chain, httpx.Settings{APIKeyHeader: "X-API-Key", Priority: priority})
	mux := http.NewServeMux()
	mux.Handle("GET /api/report", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sleep(r.Context(), ms(r))
		fmt.Fprintln(w, "report")
	})))
	mux.Handle("POST /api/orders", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := guard.Do(r.Context(), nil, func(ctx context.Context) error { return db.call(ctx, ms(r)) })
		var rej *globalceiling.RejectedError
		if errors.As(err, &rej) {
			w.Header().Set("Retry-After", strconv.FormatInt(max(int64(rej.Decision.RetryAfter/time.Second), 1), 10))
			http.Error(w, rej.Error(), http.StatusServiceUnavailable)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ordered")
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/db", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]int64{"max_in_flight": db.max()})
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintln(out, "listening on", ln.Addr())
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
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// priority: reads are Sheddable, everything else Critical.
func priority(r *http.Request) spillway.Priority {
	if r.Method == http.MethodGet {
		return spillway.Sheddable
	}
	return spillway.Critical
}

func ms(r *http.Request) time.Duration {
	n, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	return time.Duration(max(n, 0)) * time.Millisecond
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// database stands in for the real one: a call takes its time, and the
// most calls seen in flight at once is recorded.
type database struct {
	mu           sync.Mutex
	now, highest int64
}

func (db *database) call(ctx context.Context, d time.Duration) error {
	db.mu.Lock()
	db.now++
	db.highest = max(db.highest, db.now)
	db.mu.Unlock()
	sleep(ctx, d)
	db.mu.Lock()
	db.now--
	db.mu.Unlock()
	return ctx.Err()
}

func (db *database) max() int64 {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.highest
}
