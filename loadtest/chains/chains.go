package chains

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
	"github.com/spillway-go/spillway/tiers"

	"github.com/spillway-go/spillway/loadtest/sim"
)

// Env is what a configuration builds its servers' chains from.
type Env struct {
	Redis   string // the address the fleet dials
	Servers int
	System  sim.System
	Prefix  string // Redis key prefix of this configuration
	// DBGauge reads the database's utilization gauge (what it publishes
	// about its last window, as a metrics endpoint would).
	DBGauge func() sim.Gauge
	// Workers is how many requests one API server handles at once (its
	// worker pool), for the worker shedder.
	Workers int
	// Debug, when not nil, counts what -debug prints; Trace, when not
	// nil, receives every change of a learned limit (-trace).
	Debug *sim.Debug
	Trace io.Writer
}

// ServerChain is one server's limiters and its probes.
type ServerChain struct {
	Limiter     spillway.Limiter // the database routes'; nil: no limiter
	Export      spillway.Limiter // the export route's (no database); nil: no limiter
	BreakerOpen func() bool      // nil: no breaker
	Close       func()           // nil: nothing to close
}

// Configuration is one of the systems a scenario compares.
type Configuration struct {
	Name    string
	Title   string
	Build   func(env *Env, server int) (ServerChain, error)
	Removed string // ablation: the block the full chain runs without
}

// rateLimits are the rate tiers every limiting configuration applies, in
// the tiers config format: one bucket per API key. Well-behaved clients
// send about 1.5 req/s each at the spike, abusive ones about 19.
const rateLimits = `limits:
  - by: api_key
    bucket: 10/second, burst 20
`

// rateTiers returns the rate tiers over store.
func rateTiers(store ratelimit.Store) (spillway.Limiter, error) {
	cfg, err := tiers.Parse("limits.yaml", []byte(rateLimits))
	if err != nil {
		return nil, err
	}
	return tiers.New(cfg, store)
}

// Names are the configurations a scenario compares, in order.
var Names = []string{"none", "naive", "static", "full"}

// Configurations returns the systems the scenarios compare: the ones
// named in only (all four when empty), in the order none, naive, static,
// full.
func Configurations(only []string) []Configuration {
	all := []Configuration{
		{Name: "none", Title: "no limiter", Build: buildNone},
		{Name: "naive", Title: "naive fail-open (limits in Redis, no breaker, no local share, no shedding)", Build: buildNaive},
		{Name: "static", Title: "static chain (pools of C/N per server, no fleet shedder, no learning)", Build: buildStatic},
		{Name: "full", Title: "full spillway chain", Build: Full("")},
	}
	if len(only) == 0 {
		return all
	}
	var out []Configuration
	for _, c := range all {
		if slices.Contains(only, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

func buildNone(*Env, int) (ServerChain, error) { return ServerChain{}, nil }

// buildNaive is what many services run: the limits live in Redis, the
// client keeps go-redis's defaults (3 s read timeout, retries, a pool of 10
// per CPU), and any Redis error lets the request through.
func buildNaive(env *Env, _ int) (ServerChain, error) {
	client := redis.NewClient(&redis.Options{Addr: env.Redis})
	store := ratelimit.NewRedisStore(client, ratelimit.WithPrefix(env.Prefix))
	perKey, err := rateTiers(store)
	if err != nil {
		client.Close()
		return ServerChain{}, err
	}
	// A fleet-wide rate ceiling in front of the database, at its capacity.
	capRPS := int64(env.System.CapacityRPS())
	global, err := ratelimit.New(store, ratelimit.Policy{Limit: capRPS, Period: time.Second, Burst: int64(env.System.Capacity)}, ratelimit.WithScope("db_ceiling"))
	if err != nil {
		client.Close()
		return ServerChain{}, err
	}
	ceiling := spillway.LimiterFunc(func(ctx context.Context, _ *spillway.Request) (spillway.Decision, spillway.Done, error) {
		d, err := global.Allow(ctx, "db")
		if err == nil && !d.Allowed {
			d.Reason = spillway.ReasonCeiling
		}
		return d, spillway.Noop, err
	})
	return ServerChain{
		Limiter: spillway.Chain(tagged{"rate", perKey}, tagged{"ceiling", ceiling}),
		Export:  tagged{"rate", perKey},
		Close:   func() { client.Close() },
	}, nil
}

// fallbackBudget is the time one Redis call of the full chain may take:
// milliseconds, not go-redis's seconds, but above the tail latency of a
// healthy call through the proxy on a busy two-core machine (at 100 ms
// the breakers tripped on a healthy Redis there).
const fallbackBudget = 250 * time.Millisecond

// Settings of the full chain's fallback wrappers: a Redis call may take
// fallbackBudget; five failures in a row open the breaker for a second;
// three successful probes close it.
func fallbackSettings(env *Env, name string, share float64) fallback.Settings {
	return fallback.Settings{
		Name:        name,
		Budget:      fallbackBudget,
		Failures:    5,
		OpenTimeout: time.Second,
		Probes:      3,
		Share:       share,
		OnDegraded: func(e fallback.DegradedEvent) {
			cause := "other"
			switch {
			case errors.Is(e.Cause, fallback.ErrOpen):
				cause = "breaker_open"
			case errors.Is(e.Cause, context.DeadlineExceeded):
				cause = "budget"
			}
			env.Debug.Add(name+":"+cause+":"+fmt.Sprint(e.Cause), 1)
		},
	}
}

// queueWait is how long a request may wait for one of its server's
// database slots: half the backend's mean service time, far under the
// clients' 1 s timeout.
const queueWait = 100 * time.Millisecond

// criticalWait is how long a Critical or CriticalPlus request may wait
// for a slot of the full chain's learned pool; lower priorities wait
// queueWait. A freed slot goes to the highest priority waiting, so a
// Critical request waits only behind other Critical work: when that
// queue is long (the database's capacity halved, Critical work nearly
// half of it), a longer wait serves it rather than sending it back to
// retry after a second. A wait plus a slow query stays under the
// clients' 1 s timeout.
const criticalWait = 300 * time.Millisecond

// perKeyConcurrency is how many requests one API key may have in flight
// across the fleet.
const perKeyConcurrency = 10

// buildStatic is the chain before the fleet shedder and the learned
// limits earned their place, kept as the "static" configuration: cheapest
// first: the per-key rate limit
// and the per-key concurrency limit (both in Redis, each behind a
// fallback: time budget, breaker, local share), this server's pool of
// database slots (C/N, a shedder.Queue that gives freed slots to the
// highest priority waiting), and the global ceiling in front of the
// database.
//
// There is no Worker (shedder.Worker) and no fleet usage shedder
// (shedder.Fleet). Behind a pool of C/N the Worker's hard cap only turned
// work away while a slot was kept idle for Critical work, and its level
// cannot see more than the pool lets through. With each server's pool
// sized C/N the pools already bound the fleet to C, and the Fleet's
// estimate, which counts this server's changes since its last report once
// per server, errs towards full near the top: it was the main source of
// Critical denials (Critical threshold 1) and held the pools below what
// they could take (threshold 0.9); see docs/loadtest.md.
func buildStatic(env *Env, _ int) (ServerChain, error) {
	client := redis.NewClient(&redis.Options{
		Addr: env.Redis,
		// Deadlines come from the fallback's budget (the context); the
		// client's own timeouts are only a backstop.
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		PoolTimeout:           fallbackBudget,
		MaxRetries:            -1,
		PoolSize:              64,
	})
	fail := func(err error) (ServerChain, error) {
		client.Close()
		return ServerChain{}, err
	}
	n := float64(env.Servers)

	// 1. Per-key rate limit; locally 1/N of the quota per server, so the
	// fleet keeps the whole quota while Redis is away.
	rateStore, err := fallback.NewStore(ratelimit.NewRedisStore(client, ratelimit.WithPrefix(env.Prefix)), fallbackSettings(env, "rate", 1/n))
	if err != nil {
		return fail(err)
	}
	perKey, err := rateTiers(rateStore)
	if err != nil {
		return fail(err)
	}

	// 2. Per-key concurrency; locally 20% of it per server.
	cstore, err := concurrency.NewRedisStore(client, concurrency.WithPrefix(env.Prefix))
	if err != nil {
		return fail(err)
	}
	cshared, err := concurrency.New(cstore, perKeyConcurrency, concurrency.WithName("per_key_concurrency"), concurrency.WithTTL(5*time.Second), concurrency.WithReleaseTimeout(fallbackBudget))
	if err != nil {
		return fail(err)
	}
	clocal, err := concurrency.New(concurrency.NewMemoryStore(), max(1, perKeyConcurrency/5), concurrency.WithName("per_key_concurrency"))
	if err != nil {
		return fail(err)
	}
	conc, err := fallback.NewLimiter(concurrency.PerKey(cshared, spillway.DimAPIKey), concurrency.PerKey(clocal, spillway.DimAPIKey), fallbackSettings(env, "concurrency", 0.2))
	if err != nil {
		return fail(err)
	}

	// 3. This server's pool of database connections, C/N queries at once,
	// as a shedder.Queue: a request that finds the pool full waits up to
	// queueWait for a slot, and a freed slot goes to the waiter of the
	// highest priority. Critical work therefore waits only for the next
	// slot, and no slot stays idle while work waits. (A pool that rejects
	// at once, with a Worker keeping one slot of ten for Critical work,
	// lost about 10% of the backend's throughput to idle slots and still
	// denied 1–2% of Critical requests; see docs/loadtest.md.)
	poolSize := int64(env.System.Capacity / env.Servers)
	pool, err := shedder.NewQueue(poolSize, shedder.WithName("db_pool"), shedder.WithMaxWait(queueWait))
	if err != nil {
		return fail(err)
	}

	// 5. Global ceiling in front of the database: a fleet-wide rate
	// backstop at 1.2× the backend's throughput per second (10% kept for
	// Critical work), one round trip per admission (Cached mode). While
	// Redis is away each server admits 1/N of it from a local bucket.
	ceilingLimit := int64(math.Ceil(1.2 * env.System.CapacityRPS()))
	ceil, err := globalceiling.New(client, "db", ceilingLimit, time.Second,
		globalceiling.WithMode(globalceiling.Cached), globalceiling.WithPrefix(env.Prefix))
	if err != nil {
		return fail(err)
	}
	localCeil, err := ratelimit.New(ratelimit.NewMemoryStore(), ratelimit.Policy{
		Limit: max(1, ceilingLimit/int64(env.Servers)), Period: time.Second,
	}, ratelimit.WithScope("db_ceiling_local"))
	if err != nil {
		ceil.Close()
		return fail(err)
	}
	ceiling, err := fallback.NewLimiter(ceil, localCeil.ByDimension(spillway.DimEndpoint), fallbackSettings(env, "ceiling", 1/n))
	if err != nil {
		ceil.Close()
		return fail(err)
	}

	return ServerChain{
		Limiter: spillway.Chain(tagged{"rate", perKey}, tagged{"concurrency", conc}, tagged{"pool", pool}, tagged{"ceiling", ceiling}),
		Export:  spillway.Chain(tagged{"rate", perKey}, tagged{"concurrency", conc}),
		BreakerOpen: func() bool {
			return rateStore.State() != fallback.Closed || conc.State() != fallback.Closed || ceiling.State() != fallback.Closed
		},
		Close: func() {
			_ = ceil.Close()
			client.Close()
		},
	}, nil
}

// FullBlocks are the blocks of the full chain, in chain order; the ablation removes each
// in turn ("queue" is the pool's wait: without it the learned limit turns
// work away at once). The pool comes before the fleet shedder so that the
// fleet counts database work, not work waiting for a slot. (The ceiling
// first, before the pool, turned away work the pool would have queued;
// between the pool and the fleet it did no better; measured in uneven.)
var FullBlocks = []string{"rate", "concurrency", "worker", "pool", "queue", "fleet", "ceiling"}

// exportBlocks are the blocks of the full chain the export route runs
// (it does not use the database).
var exportBlocks = []string{"rate", "concurrency", "worker"}

// BlockTitles say what each block is, for the ablation table.
var BlockTitles = map[string]string{
	"rate":        "per-key rate tiers (Redis, fallback)",
	"concurrency": "per-key concurrent requests (Redis, fallback)",
	"worker":      "worker utilization shedder (this server's workers, by priority)",
	"pool":        "learned local limit (from database latency)",
	"queue":       "wait in priority order for the learned limit",
	"fleet":       "fleet usage shedder (Redis, by priority, sized by the database's gauge)",
	"ceiling":     "global ceiling (fleet-wide rate, Redis)",
}

// fleetReserve is the share of the fleet's capacity the fleet shedder
// keeps for Critical and CriticalPlus work: none. The learned pool caps
// itself at the Sheddable allowance, so a reserve of 3% (one slot of 30)
// held every server's pool below the capacity in every overload phase;
// the queue's priority order and criticalWait keep Critical work served
// without it (100% in the runs in docs/loadtest.md).
const fleetReserve = 0

// fleetInterval is how often each server reports to the fleet shedder.
const fleetInterval = 50 * time.Millisecond

// fleetTTL is how long a server's report to the fleet shedder counts: a
// server that crashed stops holding its part of the fleet's capacity this
// long after its last report (ten intervals).
const fleetTTL = 10 * fleetInterval

// Full returns the builder of the full spillway chain without the
// block named removed ("" for the whole chain). Cheapest first:
//
//  1. rate: per-key rate tiers in Redis, behind a fallback (time budget,
//     breaker, local share);
//  2. concurrency: per-key concurrent requests in Redis, behind a fallback;
//  3. pool: this server's limit on database queries, learned from their
//     latency (latencyLimit: grows while windows of queries keep their
//     usual latency, backs off when they do not or fail, and takes at once
//     the room the database's gauge reports idle), capped by what the
//     fleet shedder allows this server now, and
//  4. queue: a request that finds the learned limit used waits up to
//     queueWait in a shedder.Queue whose slots follow the limit, and a
//     freed slot goes to the highest priority waiting;
//  5. fleet: shedder.Fleet over the whole fleet's database work, sized
//     once for the fleet (the database's pool, 30) and lowered to the
//     capacity the database's utilization gauge shows (watchCapacity),
//     shedding the lower priorities first and deciding on the fleet's
//     measured usage;
//  6. ceiling: the global ceiling, a fleet-wide rate backstop in Redis.
//
// Nothing is sized from the number of servers or from a per-server share
// of the database worked out in advance: the fleet-wide numbers (the
// shedder's capacity, the ceiling) are set once for the fleet, and what a
// server may do is learned (the pool) or derived at run time from the
// share of the fleet's work the Fleet measures (the fallbacks of the
// fleet shedder and the ceiling) and from the database's gauge (the
// fleet's capacity now).
func Full(removed string) func(env *Env, server int) (ServerChain, error) {
	return func(env *Env, server int) (ServerChain, error) { return buildFull(env, server, removed) }
}

func buildFull(env *Env, server int, removed string) (ServerChain, error) {
	client := redis.NewClient(&redis.Options{
		Addr:                  env.Redis,
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		PoolTimeout:           fallbackBudget,
		MaxRetries:            -1,
		PoolSize:              64,
	})
	var closers []func()
	fail := func(err error) (ServerChain, error) {
		for _, c := range closers {
			c()
		}
		client.Close()
		return ServerChain{}, err
	}
	var (
		blocks   = map[string]spillway.Limiter{}
		breakers []func() bool
	)
	add := func(block string, l spillway.Limiter) { blocks[block] = tagged{block: block, inner: l} }

	if removed != "rate" {
		rateStore, err := fallback.NewStore(ratelimit.NewRedisStore(client, ratelimit.WithPrefix(env.Prefix)), fallbackSettings(env, "rate", 0))
		if err != nil {
			return fail(err)
		}
		perKey, err := rateTiers(rateStore)
		if err != nil {
			return fail(err)
		}
		add("rate", perKey)
		breakers = append(breakers, func() bool { return rateStore.State() != fallback.Closed })
	}
	if removed != "concurrency" {
		cstore, err := concurrency.NewRedisStore(client, concurrency.WithPrefix(env.Prefix))
		if err != nil {
			return fail(err)
		}
		cshared, err := concurrency.New(cstore, perKeyConcurrency, concurrency.WithName("per_key_concurrency"), concurrency.WithTTL(5*time.Second), concurrency.WithReleaseTimeout(fallbackBudget))
		if err != nil {
			return fail(err)
		}
		clocal, err := concurrency.New(concurrency.NewMemoryStore(), max(1, perKeyConcurrency/5), concurrency.WithName("per_key_concurrency"))
		if err != nil {
			return fail(err)
		}
		conc, err := fallback.NewLimiter(concurrency.PerKey(cshared, spillway.DimAPIKey), concurrency.PerKey(clocal, spillway.DimAPIKey), fallbackSettings(env, "concurrency", 0.2))
		if err != nil {
			return fail(err)
		}
		add("concurrency", conc)
		breakers = append(breakers, func() bool { return conc.State() != fallback.Closed })
	}
	if removed != "worker" && env.Workers > 0 {
		// The server's own workers: a request holds one from its admission
		// here until it is answered, waiting for a database slot included,
		// as a server thread does. Sheddable work goes first as they fill
		// up; a fifth of them is kept for Critical work.
		w, err := shedder.NewWorker(int64(env.Workers), shedder.WithName("worker"))
		if err != nil {
			return fail(err)
		}
		add("worker", w)
	}
	var pool *learnedPool
	if removed != "pool" {
		alg := newLatencyLimit(4)
		alg.trace = env.Trace
		if removed == "queue" {
			a, err := concurrency.NewAdaptive(alg, concurrency.WithAdaptiveName("db_pool"))
			if err != nil {
				return fail(err)
			}
			add("pool", a)
		} else {
			lp, err := newLearnedPool(alg)
			if err != nil {
				return fail(err)
			}
			lp.dbg, lp.trace = env.Debug, env.Trace
			pool = lp
			add("pool", lp)
		}
	}
	var fleet *shedder.Fleet
	if removed != "fleet" {
		f, err := shedder.NewFleet(client, "db", int64(env.System.Capacity),
			shedder.WithPrefix(env.Prefix), shedder.WithServerID("server-"+strconv.Itoa(server)),
			shedder.WithReserve(fleetReserve), shedder.WithTimeout(100*time.Millisecond), shedder.WithInterval(fleetInterval),
			shedder.WithReservations(), shedder.WithTTL(fleetTTL))
		if err != nil {
			return fail(err)
		}
		fleet = f
		if pool != nil {
			pool.fleet = f
		}
		if env.Debug.On() {
			stop := make(chan struct{})
			go func() {
				t := time.NewTicker(20 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
					}
					st := f.Stats()
					var local int64
					for _, v := range st.Local {
						local += v
					}
					if local > 5 {
						env.Debug.Add("fleet:usage_sum", st.Usage)
						env.Debug.Add("fleet:fleet_sum", st.Fleet[0]+st.Fleet[1]+st.Fleet[2]+st.Fleet[3])
						env.Debug.Add("fleet:local_sum", local)
						env.Debug.Add("fleet:n", 1)
					}
				}
			}()
			closers = append(closers, func() { close(stop) })
		}
		closers = append(closers, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_ = f.Close(ctx)
		})
		add("fleet", f)
		stop := make(chan struct{})
		go watchCapacity(env, f, pool, stop)
		closers = append(closers, func() { close(stop) })
	}
	if removed != "ceiling" {
		// A fleet-wide rate backstop at 1.2× the database's throughput per
		// second (10% kept for Critical work), one round trip per admission
		// (Cached mode). While Redis is away each server admits its share
		// of it, the share of the fleet's work its Fleet measured (a third
		// each on an even fleet of three), from a local bucket.
		ceilingLimit := int64(math.Ceil(1.2 * env.System.CapacityRPS()))
		ceil, err := globalceiling.New(client, "db", ceilingLimit, time.Second,
			globalceiling.WithMode(globalceiling.Cached), globalceiling.WithPrefix(env.Prefix))
		if err != nil {
			return fail(err)
		}
		closers = append(closers, func() { _ = ceil.Close() })
		local, err := ratelimit.New(ratelimit.NewMemoryStore(), ratelimit.Policy{Limit: ceilingLimit, Period: time.Second},
			ratelimit.WithScope("db_ceiling_local"))
		if err != nil {
			return fail(err)
		}
		share := func() float64 {
			if fleet == nil {
				return 0.2
			}
			if s := fleet.Stats(); s.Share > 0 {
				return s.Share
			}
			return 0.2
		}
		localCeil := spillway.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
			// Each local admission costs 1/share tokens of the fleet-wide
			// bucket: this server alone admits its share of the ceiling.
			n := int64(math.Round(float64(r.EffectiveCost()) / share()))
			d, err := local.AllowN(ctx, "db", max(1, min(n, ceilingLimit)))
			if err == nil && !d.Allowed {
				d.Reason = spillway.ReasonCeiling
			}
			return d, spillway.Noop, err
		})
		ceiling, err := fallback.NewLimiter(ceil, localCeil, fallbackSettings(env, "ceiling", 1))
		if err != nil {
			return fail(err)
		}
		add("ceiling", ceiling)
		breakers = append(breakers, func() bool { return ceiling.State() != fallback.Closed })
	}
	var chain, export []spillway.Limiter
	for _, b := range FullBlocks {
		if l, ok := blocks[b]; ok {
			chain = append(chain, l)
			if slices.Contains(exportBlocks, b) {
				export = append(export, l)
			}
		}
	}
	return ServerChain{
		Limiter: spillway.Chain(chain...),
		Export:  spillway.Chain(export...),
		BreakerOpen: func() bool {
			for _, b := range breakers {
				if b() {
					return true
				}
			}
			return false
		},
		Close: func() {
			for _, c := range closers {
				c()
			}
			client.Close()
		},
	}, nil
}

// capacityPoll is how often each server reads the database's
// utilization gauge.
const capacityPoll = 100 * time.Millisecond

// watchCapacity sizes the fleet shedder from the database's utilization
// gauge until stop closes: at every new reading, the fleet's capacity
// becomes the database's busy plus idle workers (its capacity, averaged
// over the last second), never more than the capacity the fleet was
// configured with. It hands the reading to the learned pool, which takes
// its share of the idle workers at once (latencyLimit.Raise).
//
// Latency alone cannot tell a database that has room for one more query
// from one that has none: below its capacity every query takes as long,
// so a learned limit finds the capacity only by passing it. The gauge
// says where the capacity is without passing it.
func watchCapacity(env *Env, fleet *shedder.Fleet, pool *learnedPool, stop <-chan struct{}) {
	if env.DBGauge == nil {
		return
	}
	t := time.NewTicker(capacityPoll)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		g := env.DBGauge()
		if g.To.IsZero() || g.To.Equal(last) {
			continue
		}
		last = g.To
		est := int64(math.Floor(g.Busy + g.Idle + 1e-6))
		_ = fleet.SetCapacity(min(int64(env.System.Capacity), max(1, est)))
		if pool != nil {
			pool.gauge.Store(&g)
		}
		if env.Trace != nil {
			fmt.Fprintf(env.Trace, "gauge %s active %.1f busy %.1f idle %.1f fleet capacity %d\n", g.To.Format("15:04:05.000"), g.Active, g.Busy, g.Idle, fleet.Capacity())
		}
	}
}

// tagged names a block's denials after the block, so the summary counts
// rejections per block (rejected_by_limiter) whatever name the block's
// own decisions carry.
type tagged struct {
	block string
	inner spillway.Limiter
}

func (t tagged) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	d, done, err := t.inner.Admit(ctx, r)
	if err == nil && !d.Allowed {
		d.Limiter = t.block
	}
	return d, done, err
}

// learnedPool is a shedder.Queue whose number of slots an adaptive
// algorithm learns from the latency and the outcome of the queries it
// admits: the queue decides who gets a slot (priority order, a short
// wait), the algorithm how many slots there are.
type learnedPool struct {
	q        *shedder.Queue
	mu       sync.Mutex
	alg      concurrency.Algorithm
	inFlight int
	starts   map[uint64]time.Time // start of each query in flight
	seq      uint64
	traced   time.Time
	// fleet, when set, caps the slots at what the fleet shedder allows
	// this server for Critical work now: its share of the fleet's
	// capacity, from the fleet's measured usage.
	fleet *shedder.Fleet
	// gauge is the database's last utilization reading (with fleet set).
	gauge atomic.Pointer[sim.Gauge]
	dbg   *sim.Debug
	trace io.Writer
}

// resize sets the queue's slots to the learned limit, capped by the
// fleet's allowance.
func (p *learnedPool) resize() {
	allowance := int64(math.MaxInt64)
	if p.fleet != nil {
		allowance = p.fleet.Allowance(spillway.SheddablePlus)
	}
	p.mu.Lock()
	if l, ok := p.alg.(*latencyLimit); ok {
		if p.fleet != nil {
			l.SetCap(float64(max(1, allowance)))
		}
		if len(p.starts) > 0 {
			l.Overdue(time.Now(), maps.Values(p.starts))
		}
		// The database reported idle workers in a window that began after
		// the last cut: take this server's share of them at once (not
		// while the fleet shedder is degraded: its share is a guess).
		if g := p.gauge.Load(); g != nil && p.fleet != nil {
			if st := p.fleet.Stats(); !st.Degraded {
				l.Raise(*g, st.Share, float64(max(1, allowance)), time.Now())
			}
		}
	}
	limit := min(int64(p.alg.Limit()), allowance)
	if p.trace != nil && time.Since(p.traced) > 100*time.Millisecond {
		p.traced = time.Now()
		st := p.q.Stats()
		fmt.Fprintf(p.trace, "pool %s %p learned %d allowance %d inflight %d waiting %d\n", p.traced.Format("15:04:05.000"), p, p.alg.Limit(), allowance, p.inFlight, st.Waiting)
	}
	p.mu.Unlock()
	_ = p.q.SetSlots(max(1, limit))
}

func newLearnedPool(alg concurrency.Algorithm) (*learnedPool, error) {
	q, err := shedder.NewQueue(int64(alg.Limit()), shedder.WithName("db_pool"), shedder.WithMaxWait(criticalWait), shedder.WithQueueDepth(64))
	if err != nil {
		return nil, err
	}
	return &learnedPool{q: q, alg: alg, starts: map[uint64]time.Time{}}, nil
}

func (p *learnedPool) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	p.resize()
	qctx := ctx
	if r.Priority < spillway.Critical {
		// The queue waits up to criticalWait; lower priorities end their
		// wait sooner through the context (a denial, as a wait that ran
		// out).
		var cancel context.CancelFunc
		qctx, cancel = context.WithTimeout(ctx, queueWait)
		defer cancel()
	}
	d, done, err := p.q.Admit(qctx, r)
	if err != nil || !d.Allowed {
		return d, done, err
	}
	start := time.Now()
	p.mu.Lock()
	p.inFlight++
	used := p.inFlight
	p.seq++
	id := p.seq
	p.starts[id] = start
	p.mu.Unlock()
	return d, spillway.Once(func(o spillway.Outcome) {
		rtt := time.Since(start)
		p.mu.Lock()
		used = max(used, p.inFlight)
		p.inFlight--
		delete(p.starts, id)
		if o == spillway.Success || o == spillway.Dropped {
			p.alg.Update(concurrency.Sample{Start: start, RTT: rtt, InFlight: used, Outcome: o})
		}
		limit := p.alg.Limit()
		p.mu.Unlock()
		p.resize()
		p.dbg.Add("pool:limit_sum", int64(limit))
		p.dbg.Add("pool:limit_n", 1)
		if o == spillway.Dropped {
			p.dbg.Add("pool:drop", 1)
		}
		done(o)
	}), nil
}
