package chains

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
	"github.com/spillway-go/spillway/tiers"

	"github.com/spillway-go/spillway/internal/block"
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
	// Options of the full chain that only the newer scenarios turn on
	// (the others' full chain stays as it was measured): Tenant gives the
	// pool fair shares between the values of this dimension
	// (shedder.QueueSettings.Tenant); Deadlines makes the servers read the
	// clients' timeout into the context (httpx.Settings.DeadlineHeader), which
	// the pool uses; StuckTimeout is the learned limit's Timeout
	// (concurrency.LatencyConfig.Timeout).
	Tenant       string
	Deadlines    bool
	StuckTimeout time.Duration
}

// ServerChain is one server's limiters and its probes.
type ServerChain struct {
	Limiter     spillway.Limiter // the database routes'; nil: no limiter
	Export      spillway.Limiter // the export route's (no database); nil: no limiter
	BreakerOpen func() bool      // nil: no breaker
	Close       func()           // nil: nothing to close
	// Deadlines: the servers read the clients' timeout into the request
	// context (Env.Deadlines).
	Deadlines bool
	// Learned reads the learned limit and the pool's slots; nil: none.
	Learned func() (limit int, slots int64)
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
	return tiers.New(cfg, store, tiers.Settings{})
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
	store, err := ratelimit.NewRedisStore(client, ratelimit.RedisSettings{Prefix: env.Prefix})
	if err != nil {
		client.Close()
		return ServerChain{}, err
	}
	perKey, err := rateTiers(store)
	if err != nil {
		client.Close()
		return ServerChain{}, err
	}
	// A fleet-wide rate ceiling in front of the database, at its capacity.
	capRPS := int64(env.System.CapacityRPS())
	global, err := ratelimit.New(store, ratelimit.Policy{Limit: capRPS, Period: time.Second, Burst: int64(env.System.Capacity)}, ratelimit.Settings{Scope: "db_ceiling"})
	if err != nil {
		client.Close()
		return ServerChain{}, err
	}
	ceiling := block.LimiterFunc(func(ctx context.Context, _ *spillway.Request) (spillway.Decision, spillway.Done, error) {
		d, err := global.Allow(ctx, "db", 1)
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

// fallbackBudget is the time one request's admission may wait on Redis,
// in all (the chains' budget, spillway.ChainBudget, which every
// Redis-backed block spends: the rate store, the concurrency limiter,
// the ceiling): milliseconds, not go-redis's seconds, but above the tail
// latency of a healthy call through the proxy on a busy two-core machine
// (at 100 ms the breakers tripped on a healthy Redis there).
const fallbackBudget = 250 * time.Millisecond

// newClient returns a server's Redis client with its health attached, as
// the README wires it: fallback.NewHealth on the client once, before the
// blocks; every block built on the client then falls back by itself (five
// failures in a row open the breaker for a second, three successful
// probes close it: the health's defaults). share fixes the local share of
// every limit while Redis is away (0: the library's default, this
// server's share of the fleet the fleet shedder last saw).
func newClient(env *Env, share float64) (*redis.Client, *fallback.Health, error) {
	client := redis.NewClient(&redis.Options{
		Addr: env.Redis,
		// Deadlines come from the budget (the context); the client's own
		// timeouts are only a backstop.
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		PoolTimeout:           fallbackBudget,
		MaxRetries:            -1,
		PoolSize:              64,
	})
	health, err := fallback.NewHealth(client, fallback.HealthSettings{
		Share: share,
		OnStateChange: func(name string, from, to fallback.State) {
			env.Debug.Add("health:"+from.String()+"->"+to.String(), 1)
		},
	})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, health, nil
}

// rateStore returns the rate limits' store on client: the Redis store
// behind fallback.NewStore, as the README wires it (the breaker is the
// client's health).
func rateStore(env *Env, client *redis.Client) (ratelimit.Store, error) {
	redisStore, err := ratelimit.NewRedisStore(client, ratelimit.RedisSettings{Prefix: env.Prefix})
	if err != nil {
		return nil, err
	}
	return fallback.NewStore(redisStore, fallback.Settings{
		Name:   "rate",
		Budget: fallbackBudget,
		OnDegraded: func(e fallback.DegradedEvent) {
			cause := "other"
			switch {
			case errors.Is(e.Cause, fallback.ErrOpen):
				cause = "breaker_open"
			case errors.Is(e.Cause, context.DeadlineExceeded):
				cause = "budget"
			}
			env.Debug.Add("rate:"+cause+":"+fmt.Sprint(e.Cause), 1)
		},
	})
}

// breakerOpen reports whether the client's health is not closed.
func breakerOpen(h *fallback.Health) func() bool {
	return func() bool { return h.State() != fallback.Closed }
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

// lifoAfter: where clients send their deadline (the deadlines feature),
// the pool serves the newest waiter first once its oldest has waited this
// long (QueueSettings.LIFO): under a standing queue the oldest waiters have
// the least time left, and a slot given to one whose query then ends
// after its client left is a slot lost.
const lifoAfter = 50 * time.Millisecond

// perKeyConcurrency is how many requests one API key may have in flight
// across the fleet.
const perKeyConcurrency = 10

// buildStatic is the chain before the fleet shedder and the learned
// limits earned their place, kept as the "static" configuration: cheapest
// first: the per-key rate limit
// and the per-key concurrency limit (both in Redis, each falling back by
// itself through the client's health to 1/N locally), this server's pool of
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
	// Every block's local share while Redis is away is 1/N: the chain is
	// sized from N in advance (and has no fleet shedder to count it).
	client, health, err := newClient(env, 1/float64(env.Servers))
	if err != nil {
		return ServerChain{}, err
	}
	fail := func(err error) (ServerChain, error) {
		client.Close()
		return ServerChain{}, err
	}

	// 1. Per-key rate limit; locally 1/N of the quota per server, so the
	// fleet keeps the whole quota while Redis is away.
	store, err := rateStore(env, client)
	if err != nil {
		return fail(err)
	}
	perKey, err := rateTiers(store)
	if err != nil {
		return fail(err)
	}

	// 2. Per-key concurrency; locally 1/N of it per server.
	cstore, err := concurrency.NewRedisStore(client, concurrency.RedisSettings{Prefix: env.Prefix})
	if err != nil {
		return fail(err)
	}
	cshared, err := concurrency.New(cstore, perKeyConcurrency, concurrency.Settings{Name: "per_key_concurrency", TTL: 5 * time.Second, ReleaseTimeout: fallbackBudget})
	if err != nil {
		return fail(err)
	}
	conc := concurrency.PerKey(cshared, spillway.DimAPIKey)

	// 3. This server's pool of database connections, C/N queries at once,
	// as a shedder.Queue: a request that finds the pool full waits up to
	// queueWait for a slot, and a freed slot goes to the waiter of the
	// highest priority. Critical work therefore waits only for the next
	// slot, and no slot stays idle while work waits. (A pool that rejects
	// at once, with a Worker keeping one slot of ten for Critical work,
	// lost about 10% of the backend's throughput to idle slots and still
	// denied 1–2% of Critical requests; see docs/loadtest.md.)
	poolSize := int64(env.System.Capacity / env.Servers)
	pool, err := shedder.NewQueue(poolSize, shedder.QueueSettings{Name: "db_pool", MaxWait: queueWait})
	if err != nil {
		return fail(err)
	}

	// 5. Global ceiling in front of the database: a fleet-wide rate
	// backstop at 1.2× the backend's throughput per second (10% kept for
	// Critical work), one round trip per admission (Cached mode). While
	// Redis is away each server admits 1/N of it by itself.
	ceilingLimit := int64(math.Ceil(1.2 * env.System.CapacityRPS()))
	ceil, err := globalceiling.New(client, "db", ceilingLimit, time.Second,
		globalceiling.Settings{Mode: globalceiling.Cached, Prefix: env.Prefix})
	if err != nil {
		return fail(err)
	}

	return ServerChain{
		Limiter:     spillway.ChainBudget(fallbackBudget, tagged{"rate", perKey}, tagged{"concurrency", conc}, tagged{"pool", pool}, tagged{"ceiling", ceil}),
		Export:      spillway.ChainBudget(fallbackBudget, tagged{"rate", perKey}, tagged{"concurrency", conc}),
		BreakerOpen: breakerOpen(health),
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

// Features are the options of the full chain that newer scenarios turn
// on (Env.Tenant, Env.Deadlines, Env.StuckTimeout); the ablation of a
// scenario that uses one also runs the full chain without it.
var Features = []string{"fair", "deadlines", "stuck"}

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
	"fair":        "fair shares between tenants in the pool (shedder.QueueSettings.Tenant)",
	"deadlines":   "clients' deadlines in the context (httpx.Settings.DeadlineHeader), adaptive LIFO in the pool (shedder.QueueSettings.LIFO)",
	"stuck":       "the learned limit's Timeout (latency that stays bad)",
}

// fleetReserve is the share of the fleet's capacity the fleet shedder
// keeps for Critical and CriticalPlus work: none (a negative
// FleetSettings.Reserve; zero is the default 20%). The learned pool caps
// itself at the Sheddable allowance, so a reserve of 3% (one slot of 30)
// held every server's pool below the capacity in every overload phase;
// the queue's priority order and criticalWait keep Critical work served
// without it (100% in the runs in docs/loadtest.md).
const fleetReserve = -1

// fleetInterval is how often each server reports to the fleet shedder.
const fleetInterval = 50 * time.Millisecond

// fleetTTL is how long a server's report to the fleet shedder counts: a
// server that crashed stops holding its part of the fleet's capacity this
// long after its last report (ten intervals).
const fleetTTL = 10 * fleetInterval

// Full returns the builder of the full spillway chain without the
// block named removed ("" for the whole chain), built from the library's
// blocks only. Cheapest first:
//
//  1. rate: per-key rate tiers in Redis, over fallback.NewStore;
//  2. concurrency: per-key concurrent requests in Redis;
//  3. worker: shedder.Worker over this server's own workers, when the
//     server has a bounded number of them (Env.Workers, the workers
//     scenario): a request holds its worker from here until it is
//     answered, its wait for a database slot included;
//  4. pool: shedder.Pool, this server's limit on database queries, learned
//     from their latency (concurrency.LatencyLimit: grows while windows of
//     queries keep their usual latency, backs off when they do not or
//     fail, and takes at once the room the database's gauge reports
//     idle), capped by what the fleet shedder allows this server now, and
//  5. queue: a request that finds the learned limit used waits up to
//     queueWait (criticalWait for Critical work) for one of its slots, and
//     a freed slot goes to the highest priority waiting;
//  6. fleet: shedder.Fleet over the whole fleet's database work, sized
//     once for the fleet (the database's pool, 30) and lowered to the
//     capacity the database's utilization gauge shows
//     (shedder.CapacityWatcher), shedding the lower priorities first and
//     deciding on the fleet's measured usage;
//  7. ceiling: the global ceiling, a fleet-wide rate backstop in Redis.
//
// Wired as the README wires a service: fallback.NewHealth on the client,
// the rate store in fallback.NewStore, and every other Redis block (the
// concurrency limiter, the fleet shedder, the ceiling) falling back by
// itself, no local twin and no wrapper; one budget per request
// (fallbackBudget, through the chain).
// The export route (no database) runs rate, concurrency and worker only.
// Nothing is sized from the number of servers or from a per-server share
// of the database worked out in advance: the fleet-wide numbers (the
// shedder's capacity, the ceiling) are set once for the fleet, and what a
// server may do is learned (the pool) or derived at run time: from the
// servers the Fleet last counted (every Redis block's local share while
// Redis is away) and from the database's gauge (the fleet's capacity now).
func Full(removed string) func(env *Env, server int) (ServerChain, error) {
	return func(env *Env, server int) (ServerChain, error) { return buildFull(env, server, removed) }
}

func buildFull(env *Env, server int, removed string) (ServerChain, error) {
	client, health, err := newClient(env, 0)
	if err != nil {
		return ServerChain{}, err
	}
	var closers []func()
	fail := func(err error) (ServerChain, error) {
		for _, c := range closers {
			c()
		}
		client.Close()
		return ServerChain{}, err
	}
	blocks := map[string]spillway.Limiter{}
	add := func(block string, l spillway.Limiter) { blocks[block] = tagged{block: block, inner: l} }

	if removed != "rate" {
		store, err := rateStore(env, client)
		if err != nil {
			return fail(err)
		}
		perKey, err := rateTiers(store)
		if err != nil {
			return fail(err)
		}
		add("rate", perKey)
	}
	if removed != "concurrency" {
		cstore, err := concurrency.NewRedisStore(client, concurrency.RedisSettings{Prefix: env.Prefix})
		if err != nil {
			return fail(err)
		}
		cshared, err := concurrency.New(cstore, perKeyConcurrency, concurrency.Settings{Name: "per_key_concurrency", TTL: 5 * time.Second, ReleaseTimeout: fallbackBudget})
		if err != nil {
			return fail(err)
		}
		add("concurrency", concurrency.PerKey(cshared, spillway.DimAPIKey))
	}
	if removed != "worker" && env.Workers > 0 {
		// The server's own workers: a request holds one from its admission
		// here until it is answered, waiting for a database slot included,
		// as a server thread does. Sheddable work goes first as they fill
		// up; a fifth of them is kept for Critical work.
		w, err := shedder.NewWorker(int64(env.Workers), shedder.WorkerSettings{Name: "worker"})
		if err != nil {
			return fail(err)
		}
		add("worker", w)
	}
	var fleet *shedder.Fleet
	if removed != "fleet" {
		f, err := shedder.NewFleet(client, "db", int64(env.System.Capacity), shedder.FleetSettings{
			Prefix: env.Prefix, ServerID: "server-" + strconv.Itoa(server),
			Reserve: fleetReserve, Timeout: 100 * time.Millisecond, Interval: fleetInterval,
			Reservations: true, TTL: fleetTTL})
		if err != nil {
			return fail(err)
		}
		// A server reads the fleet's usage before it takes traffic: until
		// its first refresh a Fleet decides on its local share alone, and a
		// server joining a busy fleet would add that share to a database
		// the others already fill (seen in elastic: 32 in flight at a
		// capacity of 30 as the new server joined).
		rctx, rcancel := context.WithTimeout(context.Background(), fallbackBudget)
		_ = f.Refresh(rctx)
		rcancel()
		fleet = f
		closers = append(closers, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_ = f.Close(ctx)
		})
	}
	var (
		pool    *shedder.Pool
		learned func() (int, int64)
	)
	if removed != "pool" {
		lcfg := concurrency.LatencyConfig{Initial: 4, OnChange: traceLimit(env)}
		if removed != "stuck" {
			lcfg.Timeout = env.StuckTimeout
		}
		lim, err := concurrency.NewLatencyLimit(lcfg)
		if err != nil {
			return fail(err)
		}
		if removed == "queue" {
			a, err := concurrency.NewAdaptive(lim, "db_pool")
			if err != nil {
				return fail(err)
			}
			add("pool", a)
			learned = func() (int, int64) { l := a.Limit(); return l, int64(l) }
		} else {
			set := shedder.QueueSettings{Name: "db_pool", MaxWait: criticalWait,
				PriorityWait: map[spillway.Priority]time.Duration{spillway.SheddablePlus: queueWait, spillway.Sheddable: queueWait},
				Depth:        64}
			if env.Tenant != "" && removed != "fair" {
				set.Tenant = env.Tenant
			}
			if env.Deadlines && removed != "deadlines" {
				set.LIFO = lifoAfter
			}
			p, err := shedder.NewPool(lim, fleet, set)
			if err != nil {
				return fail(err)
			}
			pool = p
			add("pool", p)
			learned = func() (int, int64) { s := p.Stats(); return s.Limit, s.Slots }
		}
	}
	if fleet != nil {
		add("fleet", fleet)
		w, err := shedder.NewCapacityWatcher(dbGauge(env), fleet, pool, shedder.WatcherSettings{Interval: capacityPoll})
		if err != nil {
			return fail(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { _ = w.Run(ctx) }()
		closers = append(closers, cancel)
		if env.Debug.On() {
			closers = append(closers, debugFleet(ctx, env.Debug, fleet, pool))
		}
	}
	if removed != "ceiling" {
		// A fleet-wide rate backstop at 1.2× the database's throughput per
		// second (10% kept for Critical work), one round trip per admission
		// (Cached mode). While Redis is away each server admits its share of
		// it by itself: its share of the fleet its Fleet last counted (a
		// third each on a fleet of three).
		ceilingLimit := int64(math.Ceil(1.2 * env.System.CapacityRPS()))
		ceil, err := globalceiling.New(client, "db", ceilingLimit, time.Second,
			globalceiling.Settings{Mode: globalceiling.Cached, Prefix: env.Prefix})
		if err != nil {
			return fail(err)
		}
		closers = append(closers, func() { _ = ceil.Close() })
		add("ceiling", ceil)
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
		Limiter:     spillway.ChainBudget(fallbackBudget, chain...),
		Export:      spillway.ChainBudget(fallbackBudget, export...),
		Deadlines:   env.Deadlines && removed != "deadlines",
		Learned:     learned,
		BreakerOpen: breakerOpen(health),
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

// dbGauge is the database's utilization gauge as the capacity input of the
// full chain (shedder.CapacityWatcher): busy and idle workers, and the
// queries in flight (those waiting for a worker included), on average
// over its last window.
//
// Latency alone cannot tell a database that has room for one more query
// from one that has none: below its capacity every query takes as long,
// so a learned limit finds the capacity only by passing it. The gauge
// says where the capacity is without passing it.
func dbGauge(env *Env) shedder.Gauge {
	return shedder.Gauge(func(context.Context) (shedder.Reading, error) {
		g := env.DBGauge()
		if env.Trace != nil && !g.To.IsZero() {
			fmt.Fprintf(env.Trace, "gauge %s active %.1f busy %.1f idle %.1f\n", g.To.Format("15:04:05.000"), g.Active, g.Busy, g.Idle)
		}
		return shedder.Reading{Since: g.From, At: g.To, Busy: g.Busy, Idle: g.Idle, Active: g.Active}, nil
	})
}

// traceLimit prints every change of a learned limit when env.Trace is
// set (-trace).
func traceLimit(env *Env) func(concurrency.LatencyChange) {
	if env.Trace == nil {
		return nil
	}
	return func(c concurrency.LatencyChange) {
		fmt.Fprintf(env.Trace, "trace %s limit %.1f -> %.1f cap %d baseline %v %s\n", c.At.Format("15:04:05.000"), c.From, c.To, c.Cap, c.Baseline, c.Cause)
	}
}

// debugFleet samples, every 20 ms until ctx ends, the fleet shedder's view
// and the pool's limit into dbg (-debug); it returns a func that stops it.
func debugFleet(ctx context.Context, dbg *sim.Debug, f *shedder.Fleet, pool *shedder.Pool) func() {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			st := f.Stats()
			var local int64
			for _, v := range st.Local {
				local += v
			}
			if local > 5 {
				dbg.Add("fleet:usage_sum", st.Usage)
				dbg.Add("fleet:fleet_sum", st.Fleet[0]+st.Fleet[1]+st.Fleet[2]+st.Fleet[3])
				dbg.Add("fleet:local_sum", local)
				dbg.Add("fleet:n", 1)
			}
			if pool != nil {
				ps := pool.Stats()
				dbg.Add("pool:limit_sum", int64(ps.Limit))
				dbg.Add("pool:limit_n", 1)
			}
		}
	}()
	return cancel
}

// tagged names a block's denials after the block, so the summary counts
// rejections per block (rejected_by_limiter) whatever name the block's
// own decisions carry. It decides nothing: it hands every request to the
// block.
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
