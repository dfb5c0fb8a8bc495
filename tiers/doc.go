// Package tiers turns a rate-limit config (YAML) into a spillway.Limiter.
//
// A config lists rules: which requests they select (endpoint, HTTP method),
// which identity dimensions key them (ip, user, api_key, endpoint or any
// dimension the caller sets) and their rate ("1000/minute, burst 200"), with
// an algorithm, a fail mode and a shadow flag per rule. Plans (free, pro,
// enterprise) are named bucket sets; a plan resolver (Settings.PlanResolver)
// maps an API key to its plan. For each request every rule that matches
// is decided in one ratelimit.Store.Decide call, all or nothing, so on
// Redis the whole check costs one round trip (per slot group, in
// parallel, on a Cluster).
//
// The shortest use:
//
//	import "github.com/redis/go-redis/v9"
//
//	cfg, err := tiers.ParseFile("limits.yaml")
//	if err != nil { return err } // "tiers: limits.yaml:7: bucket "10/minit": unknown unit "minit""
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	store, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{})
//	if err != nil { return err }
//	lim, err := tiers.New(cfg, store, tiers.Settings{})
//	r := &spillway.Request{Endpoint: "/api/v1/login", Method: "POST"}
//	r.Set("ip", clientIP)
//	d, done, err := lim.Admit(ctx, r)
//
// Keys: a rule's store scope is its id plus a digest of its policy, and the
// entity is "dimension=value" ("ip=10.0.0.1"), so dimensions and rules never
// share counters; internal/keys turns both into the Redis key, with the
// entity as the Cluster hash tag (all rules about one client share a slot,
// different clients spread) and braces escaped, long values hashed.
//
// A rule may charge what a request really cost, known only once the work
// ran (tokens a model generated, bytes streamed): "cost: response" with an
// "estimate: 250" holds the estimate when the request is admitted and
// settles it to spillway.Usage's total when done runs, going into debt
// when the work cost more (see Limiter.Admit). The store must hold (the
// memory, Redis and fallback stores do).
//
// A denial is a decision, never an error. Admit returns an error for a
// plan it cannot resolve (wrapping ErrUnknownPlan) and for a store that
// failed: a *spillway.StoreError whose Fail is FailClosed when a matched
// enforced rule says "fail: closed". Behind a fallback.Store, Redis's
// trouble never reaches Admit: the rules are decided at this server's
// share of each limit (marked Degraded), and fail-closed rules deny.
//
// Configuration is by a settings struct per call, in the style of
// package ratelimit: New takes Settings, Limiter.Watch WatchSettings; one
// passed to the other does not compile. The zero value means the defaults.
//
// A Limiter is safe for concurrent use. Swap replaces the config
// atomically; unchanged rules keep their counters. Watch follows a config
// file and reloads on change, keeping the last good config when a new one
// is rejected. See docs/tiers.md for the config reference.
package tiers
