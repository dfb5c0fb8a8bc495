// Command dbpool shows a global ceiling guarding a database pool: three
// simulated app servers, each with its own database/sql pool, share one
// database that takes at most -db-max-conns connections and -service per
// statement, and one fleet-wide ceiling of -ceiling statements per second
// in Redis (8 shard keys). Requests over the ceiling are rejected at once
// with globalceiling.ErrCeilingReached and a RetryAfter, before they touch
// a pool.
//
// It needs nothing but Go: the database is an in-process database/sql
// driver (fakedb.go), and Redis is -redis if given, else a redis-server
// started from PATH on a free loopback port, else none — then the guards
// run degraded on local token buckets (a ratelimit memory store, local.go)
// holding each server's share of the ceiling, as they do when Redis is
// down.
//
//	go -C examples run ./dbpool
//	go -C examples run ./dbpool -redis 127.0.0.1:6379 -mode cached -duration 5s
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/internal/redistest"
)

func main() {
	var (
		redisAddr  = flag.String("redis", "", "Redis address; empty: start redis-server from PATH, or run degraded without Redis")
		ceiling    = flag.Int64("ceiling", 600, "fleet-wide ceiling, statements per second")
		modeName   = flag.String("mode", "exact", "exact, cached or local_aggregation")
		servers    = flag.Int("servers", 3, "simulated app servers")
		workers    = flag.Int("workers", 16, "request goroutines per server")
		pause      = flag.Duration("pause", 10*time.Millisecond, "pause between a worker's requests")
		poolSize   = flag.Int("pool", 8, "MaxOpenConns of each server's pool")
		dbMaxConns = flag.Int64("db-max-conns", 30, "connections the database accepts")
		service    = flag.Duration("service", 5*time.Millisecond, "time per statement")
		duration   = flag.Duration("duration", 3*time.Second, "how long to run")
	)
	flag.Parse()
	if _, err := run(*redisAddr, *ceiling, *modeName, *servers, *workers, *pause, *poolSize, *dbMaxConns, *service, *duration); err != nil {
		log.Fatal(err)
	}
}

// summary is what a run observed.
type summary struct {
	perWindow []int64 // admitted in each printed window (by the ticker)
	// bySecond counts the admissions whose whole call (admission, statement)
	// fell inside one second of the clock — one window of the ceiling, which
	// counts windows on the client clock. Calls that straddle a boundary
	// are counted in straddled instead.
	bySecond                map[int64]int64
	straddled               int64
	admitted, rejected      int64
	degraded, failed        int64
	peakConns, refusedConns int64
}

func run(redisAddr string, ceiling int64, modeName string, servers, workers int, pause time.Duration,
	poolSize int, dbMaxConns int64, service, duration time.Duration) (summary, error) {
	var sum summary
	mode, err := parseMode(modeName)
	if err != nil {
		return sum, err
	}
	if redisAddr == "" {
		if _, err := redistest.ServerBinary(); err == nil {
			dir, err := os.MkdirTemp("", "dbpool-redis")
			if err != nil {
				return sum, err
			}
			defer os.RemoveAll(dir)
			srv, err := redistest.StartServer(dir)
			if err != nil {
				return sum, err
			}
			defer srv.Stop()
			redisAddr = srv.Addr
			fmt.Printf("started redis-server on %s\n", redisAddr)
		} else {
			fmt.Println("no Redis given and no redis-server on PATH: guards run degraded on local token buckets")
		}
	}

	db := &fakeDB{maxConns: dbMaxConns, service: service}
	// Start on a second boundary so that the per-second lines below are
	// the ceiling's windows.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	var admitted, rejected, degraded, failed atomic.Int64
	var secMu sync.Mutex
	sum.bySecond = map[int64]int64{}
	var retryAfter atomic.Int64 // the last RetryAfter seen, ns
	ctx, cancel := context.WithTimeout(context.Background(), duration+50*time.Millisecond)
	defer cancel()

	var wg sync.WaitGroup
	for s := 0; s < servers; s++ {
		// Each server: its own Redis client, ceiling, guard and pool.
		var lim spillway.Limiter = spillway.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
			return spillway.Decision{}, spillway.Noop, errors.New("no redis")
		})
		if redisAddr != "" {
			rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond})
			defer rdb.Close()
			c, err := globalceiling.New(rdb, "orders-db", ceiling, time.Second, globalceiling.WithMode(mode))
			if err != nil {
				return sum, err
			}
			defer c.Close()
			lim = c
		}
		// Degraded mode: this server's share of the ceiling.
		local, err := newMemoryShare(max(ceiling/int64(servers), 1))
		if err != nil {
			return sum, err
		}
		guard, err := globalceiling.NewGuard(lim, globalceiling.WithFallback(local),
			globalceiling.WithDegradedHandler(func(error) { degraded.Add(1) }))
		if err != nil {
			return sum, err
		}
		pool := sql.OpenDB(db)
		pool.SetMaxOpenConns(poolSize)
		pool.SetMaxIdleConns(poolSize)
		defer pool.Close()
		gdb := globalceiling.WrapDB(pool, guard)

		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					t0 := time.Now()
					_, err := gdb.ExecContext(ctx, "UPDATE orders SET state = 'paid' WHERE id = $1", 42)
					var rej *globalceiling.RejectedError
					switch {
					case err == nil:
						admitted.Add(1)
						secMu.Lock()
						if s0, s1 := t0.Unix(), time.Now().Unix(); s0 == s1 {
							sum.bySecond[s0]++
						} else {
							sum.straddled++
						}
						secMu.Unlock()
					case errors.As(err, &rej):
						rejected.Add(1)
						retryAfter.Store(int64(rej.RetryAfter()))
					case ctx.Err() != nil:
					default:
						failed.Add(1)
					}
					select {
					case <-time.After(pause):
					case <-ctx.Done():
					}
				}
			}()
		}
	}

	start := time.Now()
	tick := time.NewTicker(time.Second)
	var mu sync.Mutex
	tickerDone := make(chan struct{})
	go func() {
		defer close(tickerDone)
		var lastA, lastR int64
		for {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
			a, r := admitted.Load(), rejected.Load()
			fmt.Printf("window %d  admitted %5d  rejected %5d  db connections now %2d\n",
				int(time.Since(start).Seconds()+0.5), a-lastA, r-lastR, db.open.Load())
			mu.Lock()
			sum.perWindow = append(sum.perWindow, a-lastA)
			mu.Unlock()
			lastA, lastR = a, r
		}
	}()
	wg.Wait()
	tick.Stop()
	<-tickerDone
	secs := time.Since(start).Seconds()
	sum.admitted, sum.rejected, sum.degraded, sum.failed = admitted.Load(), rejected.Load(), degraded.Load(), failed.Load()
	sum.peakConns, sum.refusedConns = db.peak.Load(), db.refused.Load()
	fmt.Printf("\nmode %s, ceiling %d/s, %d servers × %d workers\n", mode, ceiling, servers, workers)
	fmt.Printf("admitted %d (%.0f/s), rejected %d (last RetryAfter %v), degraded decisions %d, other errors %d\n",
		sum.admitted, float64(sum.admitted)/secs, sum.rejected, time.Duration(retryAfter.Load()).Round(time.Millisecond),
		sum.degraded, sum.failed)
	fmt.Printf("database: %d statements, peak %d of %d connections, %d connections refused\n",
		db.statements.Load(), sum.peakConns, db.maxConns, sum.refusedConns)
	return sum, nil
}

func parseMode(s string) (globalceiling.Mode, error) {
	for _, m := range []globalceiling.Mode{globalceiling.Exact, globalceiling.Cached, globalceiling.LocalAggregation} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("dbpool: unknown -mode %q (want exact, cached or local_aggregation)", s)
}
