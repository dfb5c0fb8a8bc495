package tiers

import (
	"context"
	"errors"
	"fmt"
	"github.com/redis/go-redis/v9"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

// diffConfig has rules of several algorithms that overlap on the same
// requests, so batches mix algorithms and dimensions. The store runs on a
// fake clock but Redis expires keys in real time, so no rate refills
// faster than one unit per 7.5 s: no key can expire (in real time) before
// its state is full (in fake time, which runs far faster).
const diffConfig = `
plans:
  free: {api: 6/minute}
  pro: {api: "8/minute, burst 4"}
default_plan: free
limits:
  - id: login-ip
    endpoint: POST /login
    by: ip
    bucket: 5/minute
  - id: login-user
    endpoint: /login
    by: user
    bucket: 3/minute
    algorithm: fixed_window
  - id: api
    endpoint: /api/*
    by: api_key
    plan: api
    algorithm: gcra
  - id: search
    endpoint: /api/search
    by: [api_key, ip]
    bucket: 4/30s
    algorithm: sliding_window_counter
  - id: all-ip
    by: ip
    bucket: 12/minute
    algorithm: sliding_window_log
  - id: dark
    by: user
    bucket: 2/minute
    shadow: true
`

// randomRequest draws from a small population so that limits bind.
func randomRequest(rng *rand.Rand) *spillway.Request {
	eps := []string{"/login", "/api/search", "/api/items", "/other"}
	methods := []string{"POST", "GET"}
	r := req(methods[rng.IntN(2)], eps[rng.IntN(len(eps))])
	if rng.IntN(4) > 0 {
		r.Set("ip", "10.0.0."+strconv.Itoa(rng.IntN(3)))
	}
	if rng.IntN(3) > 0 {
		r.Set("user", "u"+strconv.Itoa(rng.IntN(3)))
	}
	if rng.IntN(3) > 0 {
		r.Set("api_key", "k"+strconv.Itoa(rng.IntN(3)))
	}
	if rng.IntN(5) == 0 {
		r.Set(DimPlan, "pro")
	}
	if rng.IntN(6) == 0 {
		r.Cost = 2
	}
	return r
}

// The same random sequence against the memory store (the oracle) and a
// real redis-server gives the same decisions, step by step.
func TestRedisMatchesMemory(t *testing.T) {
	srv := redistest.Start(t)
	clk := newClock()
	mem := mustLimiter(t, diffConfig, ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now}))
	red := mustLimiter(t, diffConfig, mustRedisStore(srv.Client(t), ratelimit.RedisSettings{Clock: clk.Now}))
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	denied := 0
	for i := 0; i < 600; i++ {
		r := randomRequest(rng)
		dm, _, err := mem.Admit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		dr, _, err := red.Admit(ctx, r)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if dm != dr {
			t.Fatalf("step %d %s %s %v cost %d:\nmemory %+v\nredis  %+v", i, r.Method, r.Endpoint, r.Dims, r.Cost, dm, dr)
		}
		if !dm.Allowed {
			denied++
		}
		clk.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
	}
	if denied < 50 || denied > 550 {
		t.Fatalf("%d of 600 denied: the sequence does not exercise both outcomes", denied)
	}
	if !mapsEqual(mem.stats(), red.stats()) {
		t.Fatalf("stats differ:\nmemory %v\nredis  %v", mem.stats(), red.stats())
	}
}

func mapsEqual(a, b map[string]ruleCounts) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// clusterConfig: one request about a login carries three entities (ip,
// user, api_key), so its items live in up to three slots. The tests pass
// the store a fake clock, but Redis expires keys in real time: rates are
// slow enough that no key's TTL runs out during a test.
const clusterConfig = `
limits:
  - id: login-ip
    endpoint: /api/v1/login
    by: ip
    bucket: 3/minute
  - id: login-user
    endpoint: /api/v1/login
    by: user
    bucket: 2/minute
  - id: api
    endpoint: /api/v1/*
    by: api_key
    bucket: 1/minute, burst 5
`

// slotsOf returns the Cluster slot of every item r produces, asked of the
// cluster itself (CLUSTER KEYSLOT).
func slotsOf(t *testing.T, c *redistest.Cluster, l *Limiter, r *spillway.Request) map[string]int {
	t.Helper()
	ms, err := l.matches(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	slots := map[string]int{}
	for _, m := range ms {
		s, err := c.KeySlot(context.Background(), keys.Key("spillway:", m.Item.Scope, m.Item.Key))
		if err != nil {
			t.Fatal(err)
		}
		slots[m.Rule] = s
	}
	return slots
}

// spread finds a user name that puts the login's three items on three
// different primaries, so that every batch really is split.
func spread(t *testing.T, c *redistest.Cluster, l *Limiter, ip, key string) (string, map[string]int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		user := "user-" + strconv.Itoa(i)
		slots := slotsOf(t, c, l, req("POST", "/api/v1/login", "ip", ip, "user", user, "api_key", key))
		owners := map[string]bool{}
		for _, s := range slots {
			o, err := c.Owner(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			owners[o.Addr] = true
		}
		if len(slots) == 3 && len(owners) == 3 {
			return user, slots
		}
	}
	t.Fatal("no user name spreads the login over three primaries")
	return "", nil
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	cc := c.Client(t)
	clk := newClock()
	store := mustRedisStore(cc, ratelimit.RedisSettings{Clock: clk.Now})
	l := mustLimiter(t, clusterConfig, store)
	ctx := context.Background()

	t.Run("decisions across slots", func(t *testing.T) {
		// Find a client whose three items sit on three primaries
		// (asserted with CLUSTER KEYSLOT), then check exact decisions.
		user, slots := spread(t, c, l, "10.1.0.1", "key-1")
		if slots["login-ip"] == slots["login-user"] || slots["login-user"] == slots["api"] || slots["login-ip"] == slots["api"] {
			t.Fatalf("slots %v do not differ", slots)
		}
		login := func() *spillway.Request {
			return req("POST", "/api/v1/login", "ip", "10.1.0.1", "user", user, "api_key", "key-1")
		}
		run(t, l, []step{
			{login(), spillway.Decision{Allowed: true, Limiter: "login-user", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
			{login(), spillway.Decision{Allowed: true, Limiter: "login-user", Limit: 2, Remaining: 0, ResetAfter: time.Minute}},
		})
		if got := peek(t, l, store, login()); got["login-ip"] != 1 || got["login-user"] != 0 || got["api"] != 3 {
			t.Fatalf("after two logins: %v", got)
		}
		// The user's group denies while the ip and api_key groups, on
		// other primaries, charged in parallel: they are refunded.
		run(t, l, []step{
			{login(), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "login-user", Limit: 2, ResetAfter: time.Minute, RetryAfter: 30 * time.Second}},
			{login(), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "login-user", Limit: 2, ResetAfter: time.Minute, RetryAfter: 30 * time.Second}},
		})
		if got := peek(t, l, store, login()); got["login-ip"] != 1 || got["login-user"] != 0 || got["api"] != 3 {
			t.Fatalf("after two partial denials the charged groups were not refunded: %v", got)
		}
		// Another user from the same IP uses the last IP token; the next
		// is denied by the IP rule, and its user and key are refunded.
		run(t, l, []step{
			{req("POST", "/api/v1/login", "ip", "10.1.0.1", "user", "other", "api_key", "key-1"), spillway.Decision{Allowed: true, Limiter: "login-ip", Limit: 3, Remaining: 0, ResetAfter: time.Minute}},
			{req("POST", "/api/v1/login", "ip", "10.1.0.1", "user", "third", "api_key", "key-1"), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "login-ip", Limit: 3, ResetAfter: time.Minute, RetryAfter: 20 * time.Second}},
		})
		got := peek(t, l, store, req("POST", "/api/v1/login", "ip", "10.1.0.1", "user", "third", "api_key", "key-1"))
		if got["login-ip"] != 0 || got["login-user"] != 2 || got["api"] != 2 {
			t.Fatalf("after the IP denial: %v", got)
		}
	})

	t.Run("concurrent batches never overshoot", func(t *testing.T) {
		// 40 concurrent logins of one IP (limit 3) with distinct users:
		// exactly 3 are admitted, and after the refunds every denied
		// user's counter is full again.
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := 0; i < 40; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, _, err := l.Admit(ctx, req("POST", "/api/v1/login", "ip", "10.2.0.1", "user", "c"+strconv.Itoa(i), "api_key", "ck"+strconv.Itoa(i)))
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("admit: %v", err)
		}
		if admitted.Load() != 3 {
			t.Fatalf("admitted %d, want 3", admitted.Load())
		}
		full := 0
		for i := 0; i < 40; i++ {
			got := peek(t, l, store, req("POST", "/api/v1/login", "ip", "10.2.0.1", "user", "c"+strconv.Itoa(i), "api_key", "ck"+strconv.Itoa(i)))
			if got["login-user"] == 2 && got["api"] == 5 {
				full++
			} else if got["login-user"] != 1 || got["api"] != 4 {
				t.Fatalf("user c%d: %v (neither refunded nor charged once)", i, got)
			}
		}
		if full != 37 {
			t.Fatalf("%d users refunded, want 37", full)
		}
	})

	t.Run("cost: response across slots", func(t *testing.T) { responseAcrossSlots(t, c, store) })

	t.Run("failover", func(t *testing.T) { failover(t, c, l, store, false) })
}

// responseAcrossSlots: a "cost: response" rule keyed by API key, a
// request count keyed by IP (both held, in two slots on two primaries)
// and a window keyed by user (decided after the hold). A denial by the
// IP's group gives back the key's hold made in parallel; a denial by the
// window gives back both holds; a settle reaches both slots.
func responseAcrossSlots(t *testing.T, c *redistest.Cluster, store ratelimit.Store) {
	const yml = `
limits:
  - id: tokens
    endpoint: /api/v1/gen
    by: api_key
    bucket: 600/minute
    cost: response
    estimate: 100
  - id: per-ip
    endpoint: /api/v1/gen
    by: ip
    bucket: 2/minute
  - id: per-user
    endpoint: /api/v1/gen
    by: user
    bucket: 2/minute
    algorithm: fixed_window
`
	l := mustLimiter(t, yml, store)
	ctx := context.Background()
	gen := func(ip string) *spillway.Request {
		r := req("POST", "/api/v1/gen", "ip", ip, "user", "gen-user", "api_key", "gen-key")
		r.Usage = new(spillway.Usage)
		return r
	}
	// Two IPs whose slot is on another primary than the key's.
	var ips []string
	for i := 0; len(ips) < 2 && i < 200; i++ {
		ip := "10.9.0." + strconv.Itoa(i)
		slots := slotsOf(t, c, l, gen(ip))
		if !sameOwner(t, c, slots["tokens"], slots["per-ip"]) {
			ips = append(ips, ip)
		}
	}
	if len(ips) < 2 {
		t.Fatal("no IP lands on another primary than the API key")
	}
	left := func(ip string, want map[string]int64) {
		t.Helper()
		if got := peek(t, l, store, gen(ip)); !mapsEqualInt(got, want) {
			t.Fatalf("left %v, want %v", got, want)
		}
	}
	r := gen(ips[0])
	d, done, err := l.Admit(ctx, r)
	if want := (spillway.Decision{Allowed: true, Limiter: "per-ip", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second, Window: time.Minute}); err != nil || d != want {
		t.Fatalf("first: %+v %v, want %+v", d, err, want)
	}
	if err := r.Usage.Set(30); err != nil {
		t.Fatal(err)
	}
	done(spillway.Success)
	left(ips[0], map[string]int64{"tokens": 570, "per-ip": 1, "per-user": 1})
	_, done, _ = l.Admit(ctx, gen(ips[0]))
	done(spillway.Success) // nothing reported: 100
	left(ips[0], map[string]int64{"tokens": 470, "per-ip": 0, "per-user": 0})
	// The IP's group denies: the key's hold, made in parallel, is
	// cancelled; the window is only peeked.
	d, _, err = l.Admit(ctx, gen(ips[0]))
	if err != nil || d.Allowed || d.Limiter != "per-ip" || d.Reason != spillway.ReasonRateLimited {
		t.Fatalf("IP spent: %+v %v", d, err)
	}
	left(ips[0], map[string]int64{"tokens": 470, "per-ip": 0, "per-user": 0})
	// Another IP: both holds are made, the user's window denies, both
	// are given back.
	d, _, err = l.Admit(ctx, gen(ips[1]))
	if err != nil || d.Allowed || d.Limiter != "per-user" || d.Reason != spillway.ReasonRateLimited {
		t.Fatalf("window spent: %+v %v", d, err)
	}
	left(ips[1], map[string]int64{"tokens": 470, "per-ip": 2, "per-user": 0})
}

// With cluster-require-full-coverage no, the shards that did not fail
// keep answering during the failover, so the refunds of their charged
// groups succeed: no counter of a live shard leaks.
func TestClusterFailoverPartialCoverage(t *testing.T) {
	c := redistest.StartCluster(t, "--cluster-require-full-coverage", "no")
	clk := newClock()
	store := mustRedisStore(c.Client(t), ratelimit.RedisSettings{Clock: clk.Now})
	l := mustLimiter(t, clusterConfig, store)
	failover(t, c, l, store, true)
}

// failover exhausts an IP whose slot lives on one primary, kills that
// primary under traffic of that IP (with fresh users and one API key on
// other primaries), and checks that no request is allowed during the
// window (each fails with a StoreError or is denied), that decisions
// resume after the promotion with the same Limiter, store and client, and
// that the exhausted IP's state survived. strict: the other shards stay
// up (full coverage not required), so every charge of the API key on a
// live shard was refunded and nothing but the IP rule ever denies.
func failover(t *testing.T, c *redistest.Cluster, l *Limiter, store ratelimit.Store, strict bool) {
	ctx := context.Background()
	_, slots := spread(t, c, l, "10.3.0.1", "key-3")
	for i := 0; i < 3; i++ {
		if d, _, err := l.Admit(ctx, req("POST", "/api/v1/login", "ip", "10.3.0.1")); err != nil || !d.Allowed {
			t.Fatalf("warm-up %d: %+v %v", i, d, err)
		}
	}
	if err := c.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	victim, err := c.Owner(ctx, slots["login-ip"])
	if err != nil {
		t.Fatal(err)
	}

	var (
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		mu       sync.Mutex
		errCount int
		denied   = map[string]int{}
		allowed  []spillway.Decision
		sawError = make(chan struct{}, 1)
	)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// The exhausted IP with a fresh user: denied, or failed;
				// never allowed.
				r := req("POST", "/api/v1/login", "ip", "10.3.0.1", "user", fmt.Sprintf("f%d-%d", g, i), "api_key", "key-3")
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				d, _, err := l.Admit(rctx, r)
				cancel()
				mu.Lock()
				switch {
				case err != nil:
					var se *spillway.StoreError
					if !errors.As(err, &se) {
						t.Errorf("error is not a StoreError: %v", err)
					}
					errCount++
					select {
					case sawError <- struct{}{}:
					default:
					}
				case d.Allowed:
					allowed = append(allowed, d)
				default:
					denied[d.Limiter]++
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	c.Kill(victim)
	select {
	case <-sawError:
	case <-time.After(10 * time.Second):
		t.Error("no request failed while the primary was down")
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	// Decisions resume without restarting anything: the same Limiter,
	// store and client admit a fresh IP on the promoted replica.
	fresh := ""
	for i := 0; fresh == ""; i++ {
		ip := "10.4.0." + strconv.Itoa(i)
		if s := slotsOf(t, c, l, req("POST", "/api/v1/login", "ip", ip)); sameOwner(t, c, s["login-ip"], slots["login-ip"]) {
			fresh = ip
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		d, _, err := l.Admit(ctx, req("POST", "/api/v1/login", "ip", fresh))
		if err == nil {
			want := spillway.Decision{Allowed: true, Limiter: "login-ip", Limit: 3, Remaining: 2, ResetAfter: 20 * time.Second, Window: time.Minute}
			if d != want {
				t.Fatalf("after failover: %+v, want %+v", d, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("decisions did not resume after failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("during the failover window: %d store errors, denials by rule %v", errCount, denied)
	if len(allowed) > 0 {
		t.Fatalf("%d requests of an exhausted IP were allowed during failover, first %+v", len(allowed), allowed[0])
	}
	// The replicated state survived: the exhausted IP is still denied.
	d, _, err := l.Admit(ctx, req("POST", "/api/v1/login", "ip", "10.3.0.1"))
	if err != nil || d.Allowed || d.Limiter != "login-ip" {
		t.Fatalf("exhausted IP after failover: %+v %v", d, err)
	}
	if strict {
		if len(denied) != 1 || denied["login-ip"] == 0 {
			t.Fatalf("denials by rule %v, want login-ip only", denied)
		}
		if got := peek(t, l, store, req("POST", "/api/v1/login", "api_key", "key-3")); got["api"] != 5 {
			t.Fatalf("API key on a live shard has %d of 5 left: a charge was not refunded", got["api"])
		}
	}
}

func sameOwner(t *testing.T, c *redistest.Cluster, a, b int) bool {
	t.Helper()
	oa, err := c.Owner(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := c.Owner(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	return oa == ob
}

// mustRedisStore is ratelimit.NewRedisStore for a client and settings that
// are valid.
func mustRedisStore(c redis.UniversalClient, set ...ratelimit.RedisSettings) *ratelimit.RedisStore {
	s, err := ratelimit.NewRedisStore(c, append(set, ratelimit.RedisSettings{})[0])
	if err != nil {
		panic(err)
	}
	return s
}
