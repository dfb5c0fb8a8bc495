package main

import (
	"context"
	"errors"
	"expvar"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
	"github.com/spillway-go/spillway/tiers"
)

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

// configurations returns the systems the scenarios compare: the ones
// named in only (all three when empty), in the order none, naive, full.
func configurations(only []string) []Configuration {
	all := []Configuration{
		{Name: "none", Title: "no limiter", Build: buildNone},
		{Name: "naive", Title: "naive fail-open (limits in Redis, no breaker, no local share, no shedding)", Build: buildNaive},
		{Name: "full", Title: "full spillway chain", Build: buildFull},
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
	client := redis.NewClient(&redis.Options{Addr: env.Redis.Addr()})
	store := ratelimit.NewRedisStore(client, ratelimit.WithPrefix(env.Prefix))
	perKey, err := rateTiers(store)
	if err != nil {
		client.Close()
		return ServerChain{}, err
	}
	// A fleet-wide rate ceiling in front of the database, at its capacity.
	capRPS := int64(env.System.capacityRPS())
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
		Limiter: spillway.Chain(perKey, ceiling),
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
func fallbackSettings(name string, share float64) fallback.Settings {
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
			if debugDegraded {
				degradedCauses.Add(name+":"+cause+":"+fmt.Sprint(e.Cause), 1)
			}
		},
	}
}

var debugDegraded = os.Getenv("LOADTEST_DEBUG") != ""

var degradedCauses = expvar.NewMap("degraded_causes")

// queueWait is how long a request may wait for one of its server's
// database slots: half the backend's mean service time, far under the
// clients' 1 s timeout.
const queueWait = 100 * time.Millisecond

// perKeyConcurrency is how many requests one API key may have in flight
// across the fleet.
const perKeyConcurrency = 10

// buildFull is the spillway chain, cheapest first: the per-key rate limit
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
func buildFull(env *Env, _ int) (ServerChain, error) {
	client := redis.NewClient(&redis.Options{
		Addr: env.Redis.Addr(),
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
	rateStore, err := fallback.NewStore(ratelimit.NewRedisStore(client, ratelimit.WithPrefix(env.Prefix)), fallbackSettings("rate", 1/n))
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
	conc, err := fallback.NewLimiter(concurrency.PerKey(cshared, spillway.DimAPIKey), concurrency.PerKey(clocal, spillway.DimAPIKey), fallbackSettings("concurrency", 0.2))
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
	ceilingLimit := int64(math.Ceil(1.2 * env.System.capacityRPS()))
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
	ceiling, err := fallback.NewLimiter(ceil, localCeil.ByDimension(spillway.DimEndpoint), fallbackSettings("ceiling", 1/n))
	if err != nil {
		ceil.Close()
		return fail(err)
	}

	return ServerChain{
		Limiter: spillway.Chain(perKey, conc, pool, ceiling),
		BreakerOpen: func() bool {
			return rateStore.State() != fallback.Closed || conc.State() != fallback.Closed || ceiling.State() != fallback.Closed
		},
		Close: func() {
			_ = ceil.Close()
			client.Close()
		},
	}, nil
}
