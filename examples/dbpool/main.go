// Command dbpool shows the chain that guards a shared database pool, the
// one the load-test harness measures as its "full" chain: three simulated
// app servers share one database of -db-workers workers (statements
// beyond them wait, so latency grows past its capacity) that refuses
// connections past -db-max-conns. Each server admits a statement through
//
//  1. a shedder.Pool: its slots for the database, learned from the
//     statements' latency (concurrency.LatencyLimit), capped by what the
//     fleet shedder allows this server; a statement that finds them used
//     waits briefly, and a freed slot goes to the highest priority;
//  2. a shedder.Fleet: the fleet's statements in flight against the
//     database's capacity, by priority, counted in Redis;
//  3. a globalceiling.Ceiling: at most -ceiling statements per second
//     across the fleet, in Redis;
//
// before it asks its database/sql pool for a connection
// (globalceiling.DB). A shedder.CapacityWatcher reads the database's
// utilization gauge and sets the fleet's capacity and the pools from it:
// when the database loses half its workers (-halve-at), the fleet follows.
// Writes are Critical, reports (SELECTs) SheddablePlus: the reports are
// shed first.
//
// It needs nothing but Go: the database is an in-process database/sql
// driver (fakedb.go), and Redis is -redis if given, else a redis-server
// started from PATH on a free loopback port, else none — then the fleet
// shedders and the ceilings run degraded on local shares (each server a
// third of the capacity, and of the ceiling in a ratelimit memory-store
// bucket, local.go), as they do when Redis is down.
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/shedder"
)

// config is what a run is given (the flags).
type config struct {
	redisAddr  string
	ceiling    int64
	mode       string
	servers    int
	workers    int
	pause      time.Duration
	dbWorkers  int
	dbMaxConns int64
	service    time.Duration
	duration   time.Duration
	halveAt    time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.redisAddr, "redis", "", "Redis address; empty: start redis-server from PATH, or run degraded without Redis")
	flag.Int64Var(&c.ceiling, "ceiling", 400, "fleet-wide ceiling, statements per second")
	flag.StringVar(&c.mode, "mode", "exact", "the ceiling's mode: exact, cached or local_aggregation")
	flag.IntVar(&c.servers, "servers", 3, "simulated app servers")
	flag.IntVar(&c.workers, "workers", 16, "request goroutines per server")
	flag.DurationVar(&c.pause, "pause", 2*time.Millisecond, "pause between a goroutine's requests")
	flag.IntVar(&c.dbWorkers, "db-workers", 12, "statements the database runs at once at full speed")
	flag.Int64Var(&c.dbMaxConns, "db-max-conns", 60, "connections the database accepts")
	flag.DurationVar(&c.service, "service", 50*time.Millisecond, "time per statement on a database worker")
	flag.DurationVar(&c.duration, "duration", 4*time.Second, "how long to run")
	flag.DurationVar(&c.halveAt, "halve-at", 2*time.Second, "when the database loses half its workers; 0: never")
	flag.Parse()
	if _, err := run(c); err != nil {
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
	bySecond           map[int64]int64
	straddled          int64
	admitted, rejected [spillway.NumPriorities]int64
	rejectedBy         map[string]int64 // by the block that decided
	degraded, failed   int64
	peakConns          int64 // connections the database saw at once
	refusedConns       int64
	peakActive         int64   // statements running or waiting at the database at once
	slots              []int64 // each server's pool slots at the end
	capacities         []int64 // each server's fleet capacity at the end
}

// server is one app server's guarded pool.
type server struct {
	db      *globalceiling.DB
	pool    *shedder.Pool
	fleet   *shedder.Fleet
	closers []func()
}

func (s *server) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// newServer builds one server's chain in front of its database/sql pool.
// With redisAddr empty the fleet shedder and the ceiling see Redis down.
func newServer(c config, id int, db *fakeDB, mode globalceiling.Mode, degraded *atomic.Int64) (*server, error) {
	s := &server{}
	addr := c.redisAddr
	if addr == "" {
		addr = "127.0.0.1:1" // nothing listens: every call fails at once
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond, MaxRetries: -1})
	s.closers = append(s.closers, func() { rdb.Close() })
	fail := func(err error) (*server, error) {
		s.close()
		return nil, err
	}

	// 2. The fleet shedder, sized for the database's workers (the watcher
	// lowers it to what the gauge reports). Without Redis each server
	// decides on its share of the fleet it last saw (a third).
	fleet, err := shedder.NewFleet(rdb, "orders-db", int64(c.dbWorkers),
		shedder.FleetSettings{ServerID: fmt.Sprintf("app-%d", id), Reservations: true})
	if err != nil {
		return fail(err)
	}
	s.closers = append(s.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = fleet.Close(ctx)
	})
	// Read the fleet's usage before taking traffic: until its first
	// refresh a Fleet decides on its local share alone.
	rctx, rcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_ = fleet.Refresh(rctx)
	rcancel()
	s.fleet = fleet

	// 1. The learned pool: Critical statements wait up to 300 ms for a
	// slot, reports 100 ms.
	lim, err := concurrency.NewLatencyLimit(concurrency.LatencyConfig{})
	if err != nil {
		return fail(err)
	}
	pool, err := shedder.NewPool(lim, fleet, shedder.QueueSettings{Name: "db_pool",
		MaxWait: 300 * time.Millisecond,
		PriorityWait: map[spillway.Priority]time.Duration{
			spillway.SheddablePlus: 100 * time.Millisecond,
			spillway.Sheddable:     100 * time.Millisecond,
		}})
	if err != nil {
		return fail(err)
	}
	s.pool = pool

	// The capacity input: the database's gauge sizes the fleet and the
	// pool.
	watcher, err := shedder.NewCapacityWatcher(db.Gauge, fleet, pool, shedder.WatcherSettings{})
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = watcher.Run(ctx) }()
	s.closers = append(s.closers, cancel)

	// 3. The ceiling: while Redis is away it decides by itself at this
	// server's share of the fleet it last saw. Without Redis at all, a
	// local bucket of that share stands in for it.
	var ceil spillway.Limiter
	if c.redisAddr != "" {
		cl, err := globalceiling.New(rdb, "ceiling", c.ceiling, time.Second, globalceiling.Settings{Mode: mode})
		if err != nil {
			return fail(err)
		}
		s.closers = append(s.closers, func() { _ = cl.Close() })
		ceil = cl
	} else if ceil, err = newMemoryShare(max(c.ceiling/int64(c.servers), 1)); err != nil {
		return fail(err)
	}
	ceiling := countDegraded{ceil, degraded}

	// The chain, in front of the database/sql pool: a statement is
	// admitted before it asks for a connection, and how it ended
	// (success, timeout) teaches the learned pool.
	guard, err := globalceiling.NewGuard(spillway.Chain(pool, fleet, ceiling))
	if err != nil {
		return fail(err)
	}
	sqlPool := sql.OpenDB(db)
	sqlPool.SetMaxOpenConns(int(c.dbMaxConns) / c.servers)
	sqlPool.SetMaxIdleConns(int(c.dbMaxConns) / c.servers)
	s.closers = append(s.closers, func() { sqlPool.Close() })
	s.db = &globalceiling.DB{DB: sqlPool, Guard: guard}
	s.db.Request = func(_ context.Context, query string) *spillway.Request {
		if strings.HasPrefix(query, "SELECT") {
			return &spillway.Request{Priority: spillway.SheddablePlus} // a report
		}
		return &spillway.Request{Priority: spillway.Critical}
	}
	return s, nil
}

func run(c config) (summary, error) {
	var sum summary
	mode, err := parseMode(c.mode)
	if err != nil {
		return sum, err
	}
	if c.redisAddr == "" {
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
			c.redisAddr = srv.Addr
			fmt.Printf("started redis-server on %s\n", c.redisAddr)
		} else {
			fmt.Println("no Redis given and no redis-server on PATH: the fleet shedders and ceilings run degraded on local shares")
			redis.SetLogger(quiet{}) // not a line per failed dial
		}
	}

	db := newFakeDB(c.dbMaxConns, c.dbWorkers, c.service)
	var degraded, failed atomic.Int64
	var admitted, rejected [spillway.NumPriorities]atomic.Int64
	var mu sync.Mutex // guards sum.bySecond, sum.straddled, sum.rejectedBy
	sum.bySecond = map[int64]int64{}
	sum.rejectedBy = map[string]int64{}
	var servers []*server
	defer func() {
		for _, s := range servers {
			s.close()
		}
	}()
	for i := range c.servers {
		s, err := newServer(c, i, db, mode, &degraded)
		if err != nil {
			return sum, err
		}
		servers = append(servers, s)
	}

	// Start on a second boundary so that the per-second lines below are
	// the ceiling's windows.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	ctx, cancel := context.WithTimeout(context.Background(), c.duration+50*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range servers {
		for w := range c.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					// Two writes for every report.
					query, p := "UPDATE orders SET state = 'paid' WHERE id = $1", spillway.Critical
					if (i+w)%3 == 0 {
						query, p = "SELECT count(*) FROM orders WHERE id > $1", spillway.SheddablePlus
					}
					t0 := time.Now()
					_, err := s.db.ExecContext(ctx, query, 42)
					var rej *globalceiling.RejectedError
					switch {
					case err == nil:
						admitted[p].Add(1)
						mu.Lock()
						if s0, s1 := t0.Unix(), time.Now().Unix(); s0 == s1 {
							sum.bySecond[s0]++
						} else {
							sum.straddled++
						}
						mu.Unlock()
					case errors.As(err, &rej):
						rejected[p].Add(1)
						mu.Lock()
						sum.rejectedBy[rej.Decision.Limiter]++
						mu.Unlock()
					case ctx.Err() != nil:
					default:
						failed.Add(1)
					}
					select {
					case <-time.After(c.pause):
					case <-ctx.Done():
					}
				}
			}()
		}
	}

	total := func() (a, r int64) {
		for p := range admitted {
			a += admitted[p].Load()
			r += rejected[p].Load()
		}
		return a, r
	}
	start := time.Now()
	if c.halveAt > 0 {
		halve := time.AfterFunc(c.halveAt, func() {
			db.loseWorkers(c.dbWorkers / 2)
			fmt.Printf("(the database lost %d of its %d workers)\n", c.dbWorkers/2, c.dbWorkers)
		})
		defer halve.Stop()
	}
	tick := time.NewTicker(time.Second)
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
			a, r := total()
			var slots []string
			for _, s := range servers {
				slots = append(slots, fmt.Sprint(s.pool.Stats().Slots))
			}
			fmt.Printf("window %d  admitted %4d  rejected %4d  database: %2d of %2d workers, %2d statements in flight; fleet capacity %2d, pool slots %s\n",
				int(time.Since(start).Seconds()+0.5), a-lastA, r-lastR, db.capacity.Load(), c.dbWorkers, db.active.Load(),
				servers[0].fleet.Stats().Capacity, strings.Join(slots, " "))
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
	for p := range admitted {
		sum.admitted[p], sum.rejected[p] = admitted[p].Load(), rejected[p].Load()
	}
	sum.degraded, sum.failed = degraded.Load(), failed.Load()
	sum.peakConns, sum.refusedConns, sum.peakActive = db.peak.Load(), db.refused.Load(), db.peakActive.Load()
	for _, s := range servers {
		sum.slots = append(sum.slots, s.pool.Stats().Slots)
		sum.capacities = append(sum.capacities, s.fleet.Stats().Capacity)
	}
	a, _ := total()
	fmt.Printf("\nceiling %d/s (%s), %d servers × %d goroutines, database of %d workers\n", c.ceiling, mode, c.servers, c.workers, c.dbWorkers)
	fmt.Printf("admitted %d (%.0f/s): writes %d, reports %d; rejected: writes %d, reports %d, by block %v\n",
		a, float64(a)/secs, sum.admitted[spillway.Critical], sum.admitted[spillway.SheddablePlus],
		sum.rejected[spillway.Critical], sum.rejected[spillway.SheddablePlus], sum.rejectedBy)
	fmt.Printf("degraded decisions %d, other errors %d\n", sum.degraded, sum.failed)
	fmt.Printf("database: %d statements, at most %d in flight at once (%d workers), peak %d of %d connections, %d refused\n",
		db.statements.Load(), sum.peakActive, c.dbWorkers, sum.peakConns, c.dbMaxConns, sum.refusedConns)
	return sum, nil
}

// quiet is a go-redis logger that prints nothing.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func parseMode(s string) (globalceiling.Mode, error) {
	for _, m := range []globalceiling.Mode{globalceiling.Exact, globalceiling.Cached, globalceiling.LocalAggregation} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("dbpool: unknown -mode %q (want exact, cached or local_aggregation)", s)
}

// countDegraded counts the decisions of l made by a local fallback.
type countDegraded struct {
	l spillway.Limiter
	n *atomic.Int64
}

func (c countDegraded) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	d, done, err := c.l.Admit(ctx, r)
	if d.Degraded {
		c.n.Add(1)
	}
	return d, done, err
}
