// Command loadbench measures the latency the httpx middleware adds with a
// Redis-backed limiter on loopback. It starts its own redis-server (via
// internal/redistest) and two HTTP servers on 127.0.0.1 serving the same
// handler, one bare and one behind httpx.Middleware, and drives both at the
// same time with an open-loop schedule (requests are sent at their planned
// times whatever the answers do, and latency counts from the planned time,
// so queueing is not hidden). It prints p50/p90/p99/p99.9 of both, client-
// side (send to last body byte) and server-side (handler entry to exit,
// which for the middleware server includes the admission and Done).
//
//	go run ./httpx/internal/loadbench -rate 5000 -duration 20s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"

	"github.com/spillway-go/spillway/internal/block"
)

func main() {
	rate := flag.Int("rate", 5000, "requests per second to EACH server")
	duration := flag.Duration("duration", 20*time.Second, "measured duration")
	warmup := flag.Duration("warmup", 3*time.Second, "unmeasured warm-up")
	keys := flag.Int("keys", 10000, "distinct API keys")
	conns := flag.Int("conns", 128, "connections per server")
	budget := flag.Duration("budget", 50*time.Millisecond, "fallback time budget per Redis call (tiers); larger keeps decisions on Redis on a starved machine")
	limiterKind := flag.String("limiter", "tiers", "tiers (the example's limits.yaml over fallback(RedisStore)) or ratelimit (one token bucket on RedisStore)")
	flag.Parse()

	dir, err := os.MkdirTemp("", "loadbench")
	check(err)
	defer os.RemoveAll(dir)
	rs, err := redistest.StartServer(dir)
	check(err)
	defer rs.Stop()
	opt := &redis.Options{Addr: rs.Addr, PoolSize: 64}
	if *budget > fallback.ClientIOTimeout {
		opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = *budget, *budget, *budget
	}
	fallback.TuneOptions(opt)
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	var lim spillway.Limiter
	switch *limiterKind {
	case "tiers":
		_, src, _, _ := runtime.Caller(0)
		cfg, err := tiers.ParseFile(filepath.Join(filepath.Dir(src), "..", "..", "..", "examples", "httpserver", "limits.yaml"))
		check(err)
		inner, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{})
		check(err)
		store, err := fallback.NewStore(inner, fallback.Settings{Budget: *budget})
		check(err)
		lim, err = tiers.New(cfg, store, tiers.Settings{})
		check(err)
	case "ratelimit":
		store, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{})
		check(err)
		rl, err := ratelimit.New(store, ratelimit.Policy{Limit: 1000, Period: time.Minute, Burst: 200}, ratelimit.Settings{})
		check(err)
		lim = ratelimit.PerKey(rl, spillway.DimAPIKey)
	default:
		log.Fatalf("unknown -limiter %q", *limiterKind)
	}

	var errs sync.Map
	var total, degraded atomic.Int64
	inner := lim
	lim = block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		d, done, err := inner.Admit(ctx, r)
		total.Add(1)
		if d.Degraded {
			degraded.Add(1) // decided by the fallback's local share: Redis was too slow or out
		}
		return d, done, err
	})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"results":[]}`) })
	mw := httpx.Middleware(lim, httpx.Settings{
		APIKeyHeader: "X-API-Key",
		OnError:      func(r *http.Request, err error) { errs.Store(err.Error(), true) },
	})

	bare := newTarget("bare", handler)
	limited := newTarget("middleware", mw(handler))
	for _, t := range []*target{bare, limited} {
		t.start()
		defer t.srv.Close()
	}

	// Enough descriptors for the connections, a bounded pool of them.
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *conns, MaxConnsPerHost: *conns, IdleConnTimeout: time.Minute}}
	ctx := context.Background()
	fmt.Fprintf(os.Stderr, "loadbench: redis %s, %d req/s to each server for %v after %v warm-up, %d keys, limiter %s\n",
		rs.Addr, *rate, *duration, *warmup, *keys, *limiterKind)

	var wg sync.WaitGroup
	for _, t := range []*target{bare, limited} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.drive(ctx, client, *rate, *warmup, *duration, *keys)
		}()
	}
	wg.Wait()

	fmt.Printf("%-11s %8s %8s %8s %8s | %-33s | %-33s\n", "", "req/s", "sent", "non-200", "errors", "client p50 / p90 / p99 / p99.9 µs", "server p50 / p90 / p99 / p99.9 µs")
	for _, t := range []*target{bare, limited} {
		t.report()
	}
	fmt.Printf("added (middleware − bare): client p50 %+d µs, p99 %+d µs; server p50 %+d µs, p99 %+d µs\n",
		pct(limited.client, 50)-pct(bare.client, 50), pct(limited.client, 99)-pct(bare.client, 99),
		pct(limited.server, 50)-pct(bare.server, 50), pct(limited.server, 99)-pct(bare.server, 99))
	fmt.Printf("decisions: %d, degraded (local share, not Redis): %d\n", total.Load(), degraded.Load())
	errs.Range(func(k, _ any) bool { fmt.Println("limiter error:", k); return true })
}

type target struct {
	name    string
	h       http.Handler
	srv     *http.Server
	url     string
	mu      sync.Mutex
	measure bool
	client  []int64 // µs
	server  []int64 // µs
	non200  int
	errors  int
	sent    int
	lagMax  time.Duration // how far the sender fell behind its schedule
	elapsed time.Duration // measured phase, first planned send to last answer
}

func newTarget(name string, h http.Handler) *target { return &target{name: name, h: h} }

func (t *target) start() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	t.url = "http://" + ln.Addr().String() + "/api/v1/search"
	mux := http.NewServeMux()
	// The outer timer sees the whole wrapped handler; for the bare server
	// that is the handler alone.
	mux.Handle("GET /api/v1/search", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		t.h.ServeHTTP(w, r)
		el := time.Since(start).Microseconds()
		t.mu.Lock()
		if t.measure {
			t.server = append(t.server, el)
		}
		t.mu.Unlock()
	}))
	t.srv = &http.Server{Handler: mux}
	go t.srv.Serve(ln)
}

func (t *target) drive(ctx context.Context, c *http.Client, rate int, warmup, duration time.Duration, keys int) {
	interval := time.Second / time.Duration(rate)
	begin := time.Now()
	total := int((warmup + duration) / interval)
	var wg sync.WaitGroup
	for i := 0; i < total; i++ {
		planned := begin.Add(time.Duration(i) * interval)
		if d := time.Until(planned); d > 0 {
			time.Sleep(d)
		} else if -d > t.lagMax {
			t.lagMax = -d
		}
		measured := planned.Sub(begin) >= warmup
		if i == int(warmup/interval) {
			t.mu.Lock()
			t.measure = true
			t.mu.Unlock()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
			req.Header.Set("X-API-Key", "key-"+strconv.Itoa(rand.IntN(keys)))
			resp, err := c.Do(req)
			var status int
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			el := time.Since(planned).Microseconds()
			if !measured {
				return
			}
			t.mu.Lock()
			t.sent++
			switch {
			case err != nil:
				t.errors++
			case status != 200:
				t.non200++
			default:
				t.client = append(t.client, el)
			}
			t.mu.Unlock()
		}()
	}
	wg.Wait()
	t.elapsed = time.Since(begin.Add(warmup))
}

func (t *target) report() {
	slices.Sort(t.client)
	slices.Sort(t.server)
	fmt.Printf("%-11s %8.0f %8d %8d %8d | %6d / %6d / %6d / %7d     | %6d / %6d / %6d / %7d   (sender lag max %v)\n", t.name,
		float64(t.sent)/t.elapsed.Seconds(), t.sent, t.non200, t.errors,
		pct(t.client, 50), pct(t.client, 90), pct(t.client, 99), pct(t.client, 99.9),
		pct(t.server, 50), pct(t.server, 90), pct(t.server, 99), pct(t.server, 99.9), t.lagMax.Round(time.Millisecond))
}

func pct(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
