package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/lua"
)

// redisServer starts one redis-server for the test and returns a client.
func redisServer(t testing.TB) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, srv.Client(t)
}

var rt0 = time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)

func TestRedisStoreTokenBucketSteps(t *testing.T) {
	_, c := redisServer(t)
	clk := testclock.New(rt0)
	s := mustRedisStore(c, RedisSettings{Clock: clk.Now})
	// T = 100s, tau = 300s: Redis expires keys in real time, and no TTL
	// may end during the test, however loaded the machine
	p := Policy{Limit: 10, Period: 1000 * time.Second, Burst: 3}
	ctx := context.Background()
	steps := []struct {
		at        time.Duration
		n         int64
		allowed   bool
		reason    spillway.Reason
		remaining int64
		reset     time.Duration
		retry     time.Duration
	}{
		{0, 1, true, 0, 2, 100 * time.Second, 0},
		{0, 2, true, 0, 0, 300 * time.Second, 0},
		{0, 1, false, spillway.ReasonRateLimited, 0, 300 * time.Second, 100 * time.Second},
		{0, 0, true, 0, 0, 300 * time.Second, 0},
		{0, 4, false, spillway.ReasonCostExceedsLimit, 0, 300 * time.Second, 0},
		{150 * time.Second, 1, true, 0, 0, 250 * time.Second, 0},
		// the clock goes back 50s: now is clamped to TAT − τ (t+100s), where the bucket is empty
		{100 * time.Second, 1, false, spillway.ReasonRateLimited, 0, 300 * time.Second, 100 * time.Second},
		{1000 * time.Second, 3, true, 0, 0, 300 * time.Second, 0},
	}
	for i, st := range steps {
		clk.Set(rt0.Add(st.at))
		var out [1]spillway.Decision
		ok, err := s.Decide(ctx, []Item{{Scope: "s", Key: "k", Policy: p, Cost: st.n}}, out[:])
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want := spillway.Decision{Allowed: st.allowed, Reason: st.reason, Limiter: "s", Limit: 3, Remaining: st.remaining, ResetAfter: st.reset, RetryAfter: st.retry}
		if ok != st.allowed || out[0] != want {
			t.Errorf("step %d (t+%v, n=%d): got %v %+v, want %+v", i, st.at, st.n, ok, out[0], want)
		}
	}
}

func TestRedisStoreBatchAllOrNothing(t *testing.T) {
	_, c := redisServer(t)
	clk := testclock.New(rt0)
	s := mustRedisStore(c, RedisSettings{Clock: clk.Now})
	ctx := context.Background()
	tb := Policy{Limit: 5, Period: time.Second}
	fw := Policy{Algorithm: FixedWindow, Limit: 2, Period: time.Second}
	items := []Item{{Scope: "a", Key: "u", Policy: tb, Cost: 1}, {Scope: "b", Key: "u", Policy: fw, Cost: 1}}
	out := make([]spillway.Decision, 2)
	for i := 0; i < 2; i++ {
		if ok, err := s.Decide(ctx, items, out); err != nil || !ok {
			t.Fatalf("call %d: %v %v %+v", i, ok, err, out)
		}
	}
	ok, err := s.Decide(ctx, items, out)
	if err != nil || ok {
		t.Fatalf("third call: %v %v", ok, err)
	}
	if !out[0].Allowed || out[0].Remaining != 2 || out[1].Allowed || out[1].Reason != spillway.ReasonRateLimited {
		t.Fatalf("third call decisions %+v", out)
	}
	// the denial charged nothing: the token bucket still has 3 left
	ok, err = s.Decide(ctx, items[:1], out)
	if err != nil || !ok || out[0].Remaining != 2 {
		t.Fatalf("after denial: %v %v %+v, want allowed with 2 remaining", ok, err, out[0])
	}
}

// TestRedisStoreDifferential replays random sequences on the memory store
// and on Redis (both on one fake clock) and compares every decision.
func TestRedisStoreDifferential(t *testing.T) {
	srv, _ := redisServer(t)
	hook := &freezeHook{raw: srv.Client(t)}
	c := srv.Client(t)
	c.AddHook(hook)
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			differential(t, c, hook, seed, 600, anyFamily)
		})
	}
	for seed := uint64(7); seed <= 8; seed++ {
		t.Run(fmt.Sprint("buckets", seed), func(t *testing.T) {
			differential(t, c, hook, seed, 600, bucketFamily)
		})
	}
	for seed := uint64(9); seed <= 10; seed++ {
		t.Run(fmt.Sprint("fixed", seed), func(t *testing.T) {
			differential(t, c, hook, seed, 600, fixedFamily)
		})
	}
}

// family restricts the policies of a differential test.
type family uint8

const (
	anyFamily    family = iota
	bucketFamily        // token bucket, GCRA, leaky bucket: lua/ratelimit_buckets.lua
	fixedFamily         // fixed windows: lua/ratelimit_fixed.lua
)

func (f family) has(a Algorithm) bool {
	switch f {
	case bucketFamily:
		return a == TokenBucket || a == GCRA || a == LeakyBucket
	case fixedFamily:
		return a == FixedWindow
	}
	return true
}

func randomPolicy(r *rand.Rand) Policy {
	alg := Algorithm(r.IntN(int(numAlgorithms)))
	limit := int64(1 + r.IntN(8))
	var period time.Duration
	switch r.IntN(3) {
	case 0:
		period = time.Duration(limit*int64(1+r.IntN(50))) * time.Millisecond
	case 1:
		period = time.Duration(1+r.IntN(3)) * time.Second
	default:
		period = time.Duration(int64(r.IntN(2_000_000))+limit) * time.Microsecond
	}
	p := Policy{Algorithm: alg, Limit: limit, Period: period}
	switch alg {
	case TokenBucket, GCRA, LeakyBucket:
		if r.IntN(2) == 0 {
			p.Burst = int64(1 + r.IntN(10))
		}
	case SlidingWindowBuckets:
		p.Buckets = []int64{0, 1, 2, 3, 4, 7, 10}[r.IntN(7)]
		p.Mode = WindowMode(r.IntN(2))
		N := p.effectiveBuckets()
		us := (p.Period.Microseconds() + N - 1) / N * N // a multiple of N, ≥ limit
		p.Period = time.Duration(us) * time.Microsecond
	}
	return p
}

var debugKey = ""

// differential runs steps random batches on a RedisStore over c (whose
// freezeHook is hook) and on a MemoryStore, and compares every decision.
// With fam other than anyFamily, every policy is of that family (the
// bucket family: the path of lua/ratelimit_buckets.lua; fixed windows:
// lua/ratelimit_fixed.lua), there are fewer scopes (so that items of one
// batch often share a key) and batches have 2-4 items. One step in three is a
// round of 2-4 batches that Redis decides coalesced into one call per slot
// group (as batches queued behind a call in flight are) and the memory
// store one after the other.
func differential(t *testing.T, c redis.UniversalClient, hook *freezeHook, seed uint64, steps int, fam family) {
	buckets := fam != anyFamily
	r := rand.New(rand.NewPCG(seed, 99))
	clk := testclock.New(rt0.Add(time.Duration(r.Int64N(int64(time.Hour)))))
	prefix := fmt.Sprintf("diff%d:", seed)
	rs := mustRedisStore(c, RedisSettings{Clock: clk.Now, Prefix: prefix})
	ms := NewMemoryStore(MemorySettings{Clock: clk.Now})
	ctx := context.Background()

	type scope struct {
		name string
		p    Policy
	}
	scopes := make([]scope, 6)
	if buckets {
		scopes = scopes[:3]
	}
	for i := range scopes {
		p := randomPolicy(r)
		for !fam.has(p.Algorithm) {
			p = randomPolicy(r)
		}
		scopes[i] = scope{fmt.Sprintf("s%d", i), p}
	}
	entities := []string{"alice", "bob", "{x}"}
	coalesced := 0 // rounds of several batches decided in one flush
	for step := 0; step < steps; step++ {
		switch x := r.IntN(20); {
		case x < 12:
			clk.Advance(time.Duration(r.Int64N(int64(300 * time.Millisecond))))
		case x < 14:
			clk.Advance(time.Duration(r.Int64N(int64(3 * time.Second))))
		case x < 15:
			clk.Advance(-time.Duration(r.Int64N(int64(500 * time.Millisecond)))) // backwards
		case x < 16:
			clk.Advance(time.Duration(r.Int64N(1000)) * time.Microsecond)
		}
		round := make([][]Item, 1)
		if r.IntN(3) == 0 {
			round = make([][]Item, 2+r.IntN(3))
		}
		for b := range round {
			n := 1 + r.IntN(3)
			if buckets {
				n = 2 + r.IntN(3)
			}
			items := make([]Item, n)
			round[b] = items
			// in a round, half the batches are of one entity (one slot),
			// as the coalescer needs on a Cluster or a Ring
			entity := -1
			if len(round) > 1 && r.IntN(2) == 0 {
				entity = r.IntN(len(entities))
			}
			for i := range items {
				sc := scopes[r.IntN(len(scopes))]
				cp := sc.p.Capacity()
				var cost int64
				switch x := r.IntN(10); {
				case x == 0:
					cost = 0
				case x == 1:
					cost = cp + 1 + r.Int64N(2)
				case x < 5:
					cost = 1 + r.Int64N(cp)
				default:
					cost = 1
				}
				e := entity
				if e < 0 {
					e = r.IntN(len(entities))
				}
				items[i] = Item{Scope: sc.name, Key: entities[e], Policy: sc.p, Cost: cost}
			}
		}
		if r.IntN(40) == 0 {
			it := round[0][0]
			if err := rs.Reset(ctx, it.Scope, it.Key, it.Policy); err != nil {
				t.Fatal(err)
			}
			if err := ms.Reset(ctx, it.Scope, it.Key, it.Policy); err != nil {
				t.Fatal(err)
			}
		}
		rounds := [][][]Item{round}
		if !coalescible(rs, round) {
			// a batch over several slots is never coalesced: one round each
			rounds = rounds[:0]
			for _, b := range round {
				rounds = append(rounds, [][]Item{b})
			}
		}
		for _, round := range rounds {
			if len(round) > 1 {
				coalesced++
			}
			hook.take()
			outsR, oksR, errs := decideRound(ctx, rs, round)
			var charged []Item
			var chargedOut []spillway.Decision
			for b, items := range round {
				if errs[b] != nil {
					t.Fatalf("step %d batch %d of %d: redis: %v", step, b, len(round), errs[b])
				}
				if oksR[b] {
					charged = append(charged, items...)
					chargedOut = append(chargedOut, outsR[b]...)
				}
			}
			if len(charged) > 0 {
				checkTTLs(t, hook, prefix, charged, chargedOut)
			}
			for b, items := range round {
				okR, outR := oksR[b], outsR[b]
				outM := make([]spillway.Decision, len(items))
				okM, err := ms.Decide(ctx, items, outM)
				if err != nil {
					t.Fatalf("step %d: memory: %v", step, err)
				}
				if okR != okM {
					t.Fatalf("step %d at %v batch %d of %d: batch allowed: redis %v, memory %v; items %+v", step, clk.Now().Sub(rt0), b, len(round), okR, okM, items)
				}
				if debugKey != "" {
					for i := range items {
						if items[i].Scope+"/"+items[i].Key == debugKey {
							t.Logf("step %d at %v: %+v -> %v %+v", step, clk.Now().Sub(rt0), items, okM, outM[:len(items)])
							break
						}
					}
				}
				for i := range items {
					if outR[i] != outM[i] {
						t.Fatalf("step %d at %v batch %d of %d item %d (%+v):\n redis  %+v\n memory %+v", step, clk.Now().Sub(rt0), b, len(round), i, items[i], outR[i], outM[i])
					}
				}
			}
		}
	}
	if coalesced < steps/50 {
		t.Fatalf("%d rounds of several batches were coalesced, want at least %d", coalesced, steps/50)
	}
}

// coalescible reports whether the coalescer would put every batch of round
// in one flush: each batch on one slot (hash tag).
func coalescible(s *RedisStore, round [][]Item) bool {
	for _, items := range round {
		if !new(waiter).prepare(s, items) {
			return false
		}
	}
	return true
}

// decideRound decides the batches of round on s: one batch with Decide;
// several (each on one slot, see coalescible) coalesced into one flush
// (one script call per slot group), as the coalescer sends batches queued
// behind a call in flight.
func decideRound(ctx context.Context, s *RedisStore, round [][]Item) ([][]spillway.Decision, []bool, []error) {
	outs := make([][]spillway.Decision, len(round))
	oks := make([]bool, len(round))
	errs := make([]error, len(round))
	ws := make([]*waiter, len(round))
	for b, items := range round {
		outs[b] = make([]spillway.Decision, len(items))
		ws[b] = &waiter{ctx: ctx, done: make(chan struct{}, 1)}
		ws[b].prepare(s, items)
	}
	if len(round) == 1 {
		oks[0], errs[0] = s.Decide(ctx, round[0], outs[0])
		return outs, oks, errs
	}
	s.flush(ws)
	for b, w := range ws {
		<-w.done
		copy(outs[b], w.res)
		oks[b], errs[b] = w.allowed, w.err
	}
	return outs, oks, errs
}

// freezeHook runs every script call in MULTI … EXEC followed by PTTL and
// PERSIST of its keys (a bucket key's holds live in its value). Redis expires keys in real time, which the fake
// clock of a differential test does not follow; removing the TTLs
// atomically with the write keeps the states for the fake clock to judge,
// and the PTTLs read in the same transaction are checked against the
// decisions (a TTL is ceil(reset) in ms).
type freezeHook struct {
	raw redis.UniversalClient // the same server(s), without the hook

	mu   sync.Mutex
	ttls map[string]time.Duration // PTTL of each key since the last take
}

// take returns the PTTLs seen since the last call and forgets them.
func (h *freezeHook) take() map[string]time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.ttls
	h.ttls = nil
	return m
}

func (h *freezeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *freezeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	// each command on its own, script calls as ProcessHook runs them
	process := h.ProcessHook(func(ctx context.Context, cmd redis.Cmder) error {
		return next(ctx, []redis.Cmder{cmd})
	})
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var first error
		for _, cmd := range cmds {
			if err := process(ctx, cmd); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
}
func (h *freezeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		if name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		args := cmd.Args()
		nkeys := args[2].(int)
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = args[3+i].(string)
		}
		pipe := h.raw.TxPipeline()
		_ = pipe.Process(ctx, cmd)
		ttls := map[string]*redis.DurationCmd{}
		for _, k := range keys {
			if ttls[k] == nil {
				ttls[k] = pipe.PTTL(ctx, k)
				pipe.Persist(ctx, k)
			}
		}
		_, _ = pipe.Exec(ctx)
		h.mu.Lock()
		if h.ttls == nil {
			h.ttls = map[string]time.Duration{}
		}
		for k, c := range ttls {
			h.ttls[k] = c.Val()
		}
		h.mu.Unlock()
		return cmd.Err()
	}
}

// checkTTLs checks that every key an allowed batch wrote had a TTL of
// ceil(ResetAfter) (the largest of the items on that key), less the time
// between SET and PTTL within one EXEC (which, on a loaded box, the server
// can spend descheduled: 100ms of slack).
func checkTTLs(t *testing.T, h *freezeHook, prefix string, items []Item, out []spillway.Decision) {
	t.Helper()
	maxReset := map[string]time.Duration{}
	for i := range items {
		if items[i].Cost > 0 {
			k := redisKey(prefix, &items[i])
			maxReset[k] = max(maxReset[k], out[i].ResetAfter)
		}
	}
	ttls := h.take()
	for k, reset := range maxReset {
		ttl, ok := ttls[k]
		if !ok || ttl > reset || ttl < reset-100*time.Millisecond || ttl < 0 {
			t.Fatalf("PTTL %s = %v (seen %v), want %v; items %+v out %+v", k, ttl, ok, reset, items, out[:len(items)])
		}
	}
}

// TestRedisStoreContention: 64 goroutines over 4 clients on one key with no
// refill admit exactly the burst.
func TestRedisStoreContention(t *testing.T) {
	srv, _ := redisServer(t)
	for _, alg := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			const burst = 100
			p := Policy{Algorithm: alg, Limit: burst, Period: time.Hour} // no meaningful refill during the test
			clk := testclock.New(rt0)                                    // frozen: no refill at all
			var stores [4]*RedisStore
			for i := range stores {
				stores[i] = mustRedisStore(srv.Client(t), RedisSettings{Clock: clk.Now})
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for g := 0; g < 64; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[g%4]
					var out [2]spillway.Decision
					for j := 0; j < 5; j++ {
						// half single items, half two-item batches with a peek
						items := []Item{{Scope: "hot", Key: "k", Policy: p, Cost: 1}}
						if g%2 == 1 {
							items = append(items, Item{Scope: "peek", Key: "k", Policy: p, Cost: 0})
						}
						ok, err := s.Decide(context.Background(), items, out[:])
						if err != nil {
							errs <- err
							return
						}
						if ok {
							admitted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != burst {
				t.Fatalf("admitted %d of 320, want exactly %d", got, burst)
			}
		})
	}
}

func TestRedisStoreScriptReloadAfterFlush(t *testing.T) {
	srv, c := redisServer(t)
	s := mustRedisStore(c)
	ctx := context.Background()
	out := make([]spillway.Decision, 2)
	// Redis TIME is the clock here (the default path), so the bucket refills
	// in real time: an hour period keeps a refill (one token per 6 minutes)
	// out of the count below however slowly a loaded machine runs the rounds
	// (with a second it refilled one token in 1 of 18 runs, 6 at a time).
	p := Policy{Limit: 10, Period: time.Hour}
	w := Policy{Algorithm: SlidingWindowLog, Limit: 10, Period: time.Hour}
	single := []Item{{Scope: "s", Key: "k", Policy: p, Cost: 1}}
	batch := []Item{{Scope: "s", Key: "k", Policy: p, Cost: 1}, {Scope: "w", Key: "k", Policy: w, Cost: 1}}
	for round := 0; round < 3; round++ {
		if _, err := srv.Do(ctx, "SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Decide(ctx, single, out); err != nil || !ok {
			t.Fatalf("round %d single: %v %v", round, ok, err)
		}
		if ok, err := s.Decide(ctx, batch, out); err != nil || !ok {
			t.Fatalf("round %d batch: %v %v", round, ok, err)
		}
	}
	// 3 rounds × 2 charges on the bucket: 4 left
	if _, err := s.Decide(ctx, []Item{{Scope: "s", Key: "k", Policy: p}}, out); err != nil || out[0].Remaining != 4 {
		t.Fatalf("peek: %v %+v, want 4 remaining", err, out[0])
	}
	for _, sha := range []string{lua.Script("ratelimit_batch").Hash(), lua.Script("ratelimit_token_bucket").Hash()} {
		v, err := srv.Do(ctx, "SCRIPT", "EXISTS", sha)
		if err != nil || fmt.Sprint(v) != "[1]" {
			t.Fatalf("SCRIPT EXISTS %s = %v %v, want loaded", sha, v, err)
		}
	}
}

// TestRedisStoreTTLOnEveryKey runs every algorithm (Redis TIME, the default
// clock) and asserts that every key has a TTL no longer than its period.
func TestRedisStoreTTLOnEveryKey(t *testing.T) {
	_, c := redisServer(t)
	s := mustRedisStore(c)
	ctx := context.Background()
	var items []Item
	for a := Algorithm(0); a < numAlgorithms; a++ {
		items = append(items, Item{Scope: "s", Key: "k", Policy: Policy{Algorithm: a, Limit: 50, Period: 2 * time.Second}, Cost: 1})
	}
	out := make([]spillway.Decision, len(items))
	for i := 0; i < 20; i++ {
		if _, err := s.Decide(ctx, items, out); err != nil {
			t.Fatal(err)
		}
		for j := range items { // and singly, through the lean script
			if _, err := s.Decide(ctx, items[j:j+1], out); err != nil {
				t.Fatal(err)
			}
		}
	}
	ks, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	// the three bucket algorithms share one key (one layout)
	if len(ks) != 5 {
		t.Fatalf("keys %v, want 5 (bucket, fixed, counter, log, bucketed window)", ks)
	}
	for _, k := range ks {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		limit := 2 * time.Second
		if strings.HasSuffix(k, ":swc") {
			limit *= 2 // the current window weighs until the end of the next
		}
		if strings.HasSuffix(k, ":swb") {
			limit += limit / DefaultBuckets // the newest sub-window counts until it is the oldest
		}
		if ttl <= 0 || ttl > limit {
			t.Errorf("PTTL %s = %v, want in (0, %v]", k, ttl, limit)
		}
	}
}

func TestRedisStoreReset(t *testing.T) {
	_, c := redisServer(t)
	s := mustRedisStore(c, RedisSettings{Prefix: "rs:"})
	ctx := context.Background()
	for a := Algorithm(0); a < numAlgorithms; a++ {
		p := Policy{Algorithm: a, Limit: 2, Period: time.Minute}
		it := []Item{{Scope: "s", Key: "k", Policy: p, Cost: 2}}
		out := make([]spillway.Decision, 1)
		if ok, err := s.Decide(ctx, it, out); err != nil || !ok {
			t.Fatalf("%v: first: %v %v", a, ok, err)
		}
		if ok, _ := s.Decide(ctx, it, out); ok {
			t.Fatalf("%v: second allowed, want denied", a)
		}
		if err := s.Reset(ctx, "s", "k", p); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Decide(ctx, it, out); err != nil || !ok {
			t.Fatalf("%v: after reset: %v %v %+v", a, ok, err, out[0])
		}
		if err := s.Reset(ctx, "s", "k", p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisStoreLogMembersUnique: many units admitted in the same
// microsecond each get their own member (never the timestamp alone).
func TestRedisStoreLogMembersUnique(t *testing.T) {
	_, c := redisServer(t)
	clk := testclock.New(rt0)
	s1 := mustRedisStore(c, RedisSettings{Clock: clk.Now})
	s2 := mustRedisStore(c, RedisSettings{Clock: clk.Now})
	p := Policy{Algorithm: SlidingWindowLog, Limit: 3000, Period: time.Minute}
	ctx := context.Background()
	out := make([]spillway.Decision, 1)
	for _, s := range []*RedisStore{s1, s2, s1} {
		if ok, err := s.Decide(ctx, []Item{{Scope: "l", Key: "k", Policy: p, Cost: 1}}, out); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if ok, err := s.Decide(ctx, []Item{{Scope: "l", Key: "k", Policy: p, Cost: 999}}, out); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	k := redisKey("spillway:", &Item{Scope: "l", Key: "k", Policy: p})
	if n, err := c.ZCard(ctx, k).Result(); err != nil || n != 3000 {
		t.Fatalf("ZCARD = %d %v, want 3000", n, err)
	}
	if out[0].Remaining != 0 {
		t.Fatalf("remaining %d, want 0", out[0].Remaining)
	}
}

// TestRedisStoreForeignState: a key written under another algorithm of
// the same layout family, or garbage, reads as empty instead of failing.
func TestRedisStoreForeignState(t *testing.T) {
	_, c := redisServer(t)
	s := mustRedisStore(c)
	ctx := context.Background()
	for a := Algorithm(0); a < numAlgorithms; a++ {
		p := Policy{Algorithm: a, Limit: 3, Period: time.Minute}
		it := Item{Scope: "f" + a.String(), Key: "k", Policy: p, Cost: 1}
		it2 := Item{Scope: "g" + a.String(), Key: "k", Policy: p, Cost: 1}
		k := redisKey("spillway:", &it)
		// each shape meets the junk: a lone item (the lean script), and
		// two (the buckets or batch script)
		for _, items := range [][]Item{{it}, {it, it2}} {
			for _, junk := range []func() error{
				func() error { return c.Set(ctx, k, "garbage", time.Minute).Err() },
				func() error { return c.HSet(ctx, k, "a", "b").Err() },
			} {
				c.Del(ctx, k, redisKey("spillway:", &it2))
				if err := junk(); err != nil {
					t.Fatal(err)
				}
				ok, err := s.Decide(ctx, items, make([]spillway.Decision, len(items)))
				if err != nil || !ok {
					t.Fatalf("%v over foreign state: %v %v", a, ok, err)
				}
				switch a {
				case TokenBucket, GCRA, LeakyBucket:
					// the charge overwrote the foreign key with a TAT
					if typ, err := c.Type(ctx, k).Result(); err != nil || typ != "string" {
						t.Fatalf("%v over foreign state: TYPE %q %v after a charge, want string", a, typ, err)
					}
				}
			}
		}
	}
}

// replyHook replaces every script reply, to check that replies of an
// unexpected shape become errors, not panics.
type replyHook struct{ val any }

func (h replyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h replyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h replyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil && strings.HasPrefix(strings.ToLower(cmd.Name()), "eval") {
			c.SetVal(h.val)
		}
		return err
	}
}

func TestRedisStoreUnexpectedReply(t *testing.T) {
	srv, _ := redisServer(t)
	ctx := context.Background()
	p := Policy{Limit: 10, Period: time.Second}
	w := Policy{Algorithm: FixedWindow, Limit: 10, Period: time.Second}
	for _, val := range []any{nil, "OK", int64(-1), int64(1 << 60), []any{}, []any{int64(1), "x", int64(0), int64(0)}, []any{int64(1), int64(1), int64(1), int64(1)}, []any{[]any{}, int64(1), int64(1), int64(1)},
		// the shape of the buckets script's reply for two items {now, wait, wait} (no TATs
		// on one server): a negative now, waits out of range, values not integers, too
		// short, the TATs' length
		[]any{int64(-1), int64(0), int64(0)}, []any{int64(0), int64(-1), int64(0)},
		[]any{int64(0), int64(0), int64(1 << 60)}, []any{int64(0), int64(0), "x"},
		[]any{int64(-1), int64(0)}, []any{int64(0), int64(0), int64(0), int64(0), int64(0)}} {
		c := srv.Client(t)
		c.AddHook(replyHook{val})
		s := mustRedisStore(c)
		out := make([]spillway.Decision, 2)
		for _, items := range [][]Item{{{Scope: "s", Key: "k", Policy: p, Cost: 1}}, {{Scope: "s", Key: "k", Policy: p, Cost: 1}, {Scope: "w", Key: "k", Policy: w, Cost: 1}}, {{Scope: "s", Key: "k", Policy: p, Cost: 1}, {Scope: "t", Key: "k", Policy: p, Cost: 1}}} {
			ok, err := s.Decide(ctx, items, out)
			if err == nil || ok || !strings.HasPrefix(err.Error(), "ratelimit: redis: ") {
				t.Errorf("reply %#v: got %v, %v; want an error", val, ok, err)
			}
		}
	}
}

func TestRedisStoreBadInput(t *testing.T) {
	_, c := redisServer(t)
	ctx := context.Background()
	out := make([]spillway.Decision, 1)
	it := []Item{{Scope: "s", Key: "k", Policy: Policy{Limit: 1, Period: time.Second}, Cost: 1}}
	var nilClient *redis.Client
	var nilCluster *redis.ClusterClient
	for _, c := range []redis.UniversalClient{nil, nilClient, nilCluster} {
		if s, err := NewRedisStore(c, RedisSettings{}); s != nil || err == nil || err.Error() != "ratelimit: NewRedisStore: client is nil" {
			t.Errorf("nil client %T: %v, %v", c, s, err)
		}
	}
	if s, err := NewRedisStore(c, RedisSettings{Prefix: "a{b}"}); s != nil || err == nil || !strings.Contains(err.Error(), "prefix") {
		t.Errorf("bad prefix: %v, %v", s, err)
	}
	s := mustRedisStore(c)
	if _, err := s.Decide(ctx, []Item{{Scope: "s", Key: "k", Policy: Policy{Limit: 1, Period: time.Second}, Cost: -1}}, out); err == nil {
		t.Error("negative cost: no error")
	}
	if _, err := s.Decide(ctx, []Item{{Scope: "s", Key: "k", Policy: Policy{Limit: 0, Period: time.Second}, Cost: 1}}, out); err == nil {
		t.Error("zero limit: no error")
	}
	if _, err := s.Decide(ctx, it, nil); err == nil {
		t.Error("short out: no error")
	}
}

func TestSlotMatchesCluster(t *testing.T) {
	// CLUSTER KEYSLOT works on a single node started in cluster mode.
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		b := make([]byte, r.IntN(20))
		for j := range b {
			b[j] = "ab{}:xyz0123"[r.IntN(12)]
		}
		k := string(b)
		v, err := srv.Do(ctx, "CLUSTER", "KEYSLOT", k)
		if err != nil {
			t.Fatal(err)
		}
		if int64(slot(k)) != v.(int64) {
			t.Fatalf("slot(%q) = %d, CLUSTER KEYSLOT = %d", k, slot(k), v)
		}
	}
}

// TestRedisStoreServerTime decides with Redis TIME (no Clock): a
// policy of 1 per hour, burst 3, admits three and then reports a retry of
// about an hour and a reset of about three, whatever the client's clock says.
func TestRedisStoreServerTime(t *testing.T) {
	_, c := redisServer(t)
	s := mustRedisStore(c)
	ctx := context.Background()
	p := Policy{Limit: 1, Period: time.Hour, Burst: 3}
	out := make([]spillway.Decision, 1)
	for i := 0; i < 3; i++ {
		ok, err := s.Decide(ctx, []Item{{Scope: "t", Key: "k", Policy: p, Cost: 1}}, out)
		if err != nil || !ok || out[0].Remaining != int64(2-i) {
			t.Fatalf("call %d: %v %v %+v", i, ok, err, out[0])
		}
	}
	ok, err := s.Decide(ctx, []Item{{Scope: "t", Key: "k", Policy: p, Cost: 1}}, out)
	if err != nil || ok || out[0].Reason != spillway.ReasonRateLimited {
		t.Fatalf("fourth call: %v %v %+v", ok, err, out[0])
	}
	// The batch script reads TIME too: a two-item batch sees the same state.
	out2 := make([]spillway.Decision, 2)
	ok, err = s.Decide(ctx, []Item{{Scope: "t", Key: "k", Policy: p}, {Scope: "u", Key: "k", Policy: p, Cost: 1}}, out2)
	if err != nil || !ok || out2[0].Remaining != 0 || out2[1].Remaining != 2 {
		t.Fatalf("batch: %v %v %+v", ok, err, out2)
	}
	// Three hours of TAT were charged within this test's few seconds.
	for _, d := range []time.Duration{out[0].RetryAfter, out2[0].ResetAfter - 2*time.Hour} {
		if d < time.Hour-time.Minute || d > time.Hour {
			t.Fatalf("retry/reset %v, want just under an hour (reset: three)", d)
		}
	}
}

// TestRedisStoreRing: on a *redis.Ring over two servers the batch is
// grouped by hash tag (one script per shard) and decides like the memory
// store.
func TestRedisStoreRing(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	opts := &redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}}
	ring := redis.NewRing(opts)
	raw := redis.NewRing(opts)
	t.Cleanup(func() { _ = ring.Close(); _ = raw.Close() })
	hook := &freezeHook{raw: raw}
	ring.AddHook(hook)
	differential(t, ring, hook, 21, 300, anyFamily)
	differential(t, ring, hook, 22, 300, bucketFamily)
	differential(t, ring, hook, 23, 300, fixedFamily)
	// the entities of the differential test landed on both shards
	ctx := context.Background()
	for _, s := range []*redistest.Server{a, b} {
		n, err := s.Do(ctx, "DBSIZE")
		if err != nil || n.(int64) == 0 {
			t.Fatalf("shard %s holds %v keys (%v), want some", s.Addr, n, err)
		}
	}
}

// memTAT is the TAT the memory store holds for a bucket-family item (0:
// none).
func memTAT(s *MemoryStore, it *Item) int64 {
	k := s.prepare(it.Scope, it.Key, it.Policy.Algorithm)
	sh := &s.shards[k.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.find(&k); e != nil {
		return e.a
	}
	return 0
}

// With Redis TIME the bucket family's TAT is kept compact (the key's
// expiry in ms and the µs left over as a small integer: lua/
// ratelimit_holds.lua). Random batches of bucket items, run by the
// buckets script and, with a fixed-window item added, by the batch
// script, on real time: every TAT a script saw equals, to the µs, the
// one the memory store holds when it is still in the future (one at or
// before now may have expired: it means a full bucket either way), and
// the memory store, its clock set to the time each script call decided
// at, makes the same decisions.
func TestRedisStoreCompactTATDifferential(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	rs := mustRedisStore(c, RedisSettings{Coalescing: -1}) // Redis TIME
	memClk := testclock.New(time.UnixMicro(0))
	ms := NewMemoryStore(MemorySettings{Clock: memClk.Now})
	policies := []Policy{
		{Algorithm: GCRA, Limit: 7, Period: 3 * time.Millisecond, Burst: 3},                            // T = 429 µs
		{Algorithm: TokenBucket, Limit: 1000, Period: time.Second, Burst: 5},                           // T = 1 ms
		{Algorithm: LeakyBucket, Limit: 3, Period: 10*time.Millisecond + 7*time.Microsecond, Burst: 2}, // T = 3336 µs
		{Algorithm: GCRA, Limit: 10, Period: time.Hour + 123*time.Microsecond, Burst: 4},               // keys that stay
	}
	fw := Policy{Algorithm: FixedWindow, Limit: 1000, Period: time.Hour}
	r := rand.New(rand.NewPCG(7, 13))
	seenLive, batches := 0, 0
	for step := range 600 {
		// distinct keys in a batch: the memory store's state before the
		// batch is then what each item sees
		perm := r.Perm(len(policies) * 2)
		items := make([]Item, 1+r.IntN(3))
		for i := range items {
			p := policies[perm[i]%len(policies)]
			cost := int64(1)
			switch r.IntN(8) {
			case 0:
				cost = 0
			case 1:
				cost = p.Capacity()
			case 2:
				cost = p.Capacity() + 1
			}
			items[i] = Item{Scope: fmt.Sprintf("s%d", perm[i]%len(policies)), Key: fmt.Sprintf("e%d", perm[i]/len(policies)), Policy: p, Cost: cost}
		}
		batch := r.IntN(4) == 0
		if batch {
			items = append(items, Item{Scope: "w", Key: "e0", Policy: fw, Cost: 0})
		}
		g := &group{old: make([][3]int64, len(items)), uids: make([]string, len(items))}
		outR := make([]spillway.Decision, len(items))
		var okR bool
		var err error
		if batch {
			okR, _, err = rs.runBatch(ctx, items, outR, g)
			batches++
		} else {
			okR, err = rs.runBuckets(ctx, items, outR, g)
		}
		if err != nil {
			t.Fatal(err)
		}
		memClk.Set(time.UnixMicro(g.now))
		for i := range items {
			if items[i].Policy.Algorithm == FixedWindow {
				continue
			}
			want, seen := memTAT(ms, &items[i]), g.old[i][0]
			if want > g.now {
				seenLive++
				if seen != want {
					t.Fatalf("step %d item %d (%+v): the script saw TAT %d, the memory store holds %d (now %d)", step, i, items[i], seen, want, g.now)
				}
			} else if seen != 0 && seen != want {
				t.Fatalf("step %d item %d (%+v): the script saw TAT %d, want 0 or the expired %d (now %d)", step, i, items[i], seen, want, g.now)
			}
		}
		outM := make([]spillway.Decision, len(items))
		okM, err := ms.Decide(ctx, items, outM)
		if err != nil {
			t.Fatal(err)
		}
		if okR != okM {
			t.Fatalf("step %d: allowed: redis %v, memory %v; items %+v", step, okR, okM, items)
		}
		for i := range items {
			if outR[i] != outM[i] {
				t.Fatalf("step %d item %d (%+v):\n redis  %+v\n memory %+v", step, i, items[i], outR[i], outM[i])
			}
		}
		if r.IntN(50) == 0 {
			it := items[0]
			if err := rs.Reset(ctx, it.Scope, it.Key, it.Policy); err != nil {
				t.Fatal(err)
			}
			if err := ms.Reset(ctx, it.Scope, it.Key, it.Policy); err != nil {
				t.Fatal(err)
			}
		}
	}
	if seenLive < 300 || batches < 100 {
		t.Fatalf("%d live TATs seen, %d batch-script calls: too few to say anything", seenLive, batches)
	}
	// the keys are compact: a small integer, shared (no value object)
	k := redisKey("spillway:", &Item{Scope: "s3", Key: "e0", Policy: policies[3]})
	if v, err := c.Get(ctx, k).Int64(); err == nil && (v < 0 || v > 999) {
		t.Fatalf("%s = %d, want the compact remainder in [0, 999]", k, v)
	}
}

// mustRedisStore is NewRedisStore for a client and settings that are valid.
func mustRedisStore(c redis.UniversalClient, set ...RedisSettings) *RedisStore {
	s, err := NewRedisStore(c, append(set, RedisSettings{})[0])
	if err != nil {
		panic(err)
	}
	return s
}
