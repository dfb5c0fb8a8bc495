package concurrency

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

func TestLimiterDecisions(t *testing.T) {
	clock := newFakeClock()
	for _, f := range []struct {
		name string
		new  storeFactory
	}{{"memory", memoryFactory}, {"redis", redisFactory}} {
		t.Run(f.name, func(t *testing.T) {
			lim, err := New(f.new(t, clock), 2, Settings{Name: "api", TTL: 10 * time.Second, RetryAfter: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			d1, done1, err := lim.Acquire(ctx, "u1", 1)
			if err != nil {
				t.Fatal(err)
			}
			if want := (spillway.Decision{Allowed: true, Limiter: "api", Limit: 2, Remaining: 1}); d1 != want {
				t.Fatalf("first: %+v, want %+v", d1, want)
			}
			d2, done2, _ := lim.Acquire(ctx, "u1", 1)
			if want := (spillway.Decision{Allowed: true, Limiter: "api", Limit: 2, Remaining: 0}); d2 != want {
				t.Fatalf("second: %+v, want %+v", d2, want)
			}
			d3, done3, _ := lim.Acquire(ctx, "u1", 1)
			want := spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "api", Limit: 2, RetryAfter: 500 * time.Millisecond}
			if d3 != want {
				t.Fatalf("third: %+v, want %+v", d3, want)
			}
			done3(spillway.Success) // Noop of a denial: harmless
			// Near the TTL the reap comes sooner than the hint.
			clock.Advance(9800 * time.Millisecond)
			d3, _, _ = lim.Acquire(ctx, "u1", 1)
			if d3.Allowed || d3.RetryAfter != 200*time.Millisecond {
				t.Fatalf("near ttl: %+v, want denied with RetryAfter 200ms", d3)
			}
			// done twice releases one slot, not two.
			done1(spillway.Success)
			done1(spillway.Success)
			lim.WaitReleases() // done hands the release to the background
			d4, done4, _ := lim.Acquire(ctx, "u1", 1)
			if !d4.Allowed || d4.Remaining != 0 {
				t.Fatalf("after done: %+v, want allowed with 0 remaining", d4)
			}
			if d, _, _ := lim.Acquire(ctx, "u1", 1); d.Allowed {
				t.Fatalf("double done freed a second slot: %+v", d)
			}
			done2(spillway.Dropped)
			done4(spillway.Ignored)
			if d, _, _ := lim.Acquire(ctx, "u2", 1); !d.Allowed || d.Remaining != 1 {
				t.Fatalf("other key: %+v", d)
			}
		})
	}
}

func TestPerKey(t *testing.T) {
	lim, err := New(NewMemoryStore(MemorySettings{}), 1, Settings{})
	if err != nil {
		t.Fatal(err)
	}
	l := PerKey(lim, spillway.DimUser)
	ctx := context.Background()
	r := &spillway.Request{Priority: spillway.Critical}
	r.Set(spillway.DimUser, "alice")
	d, done, err := l.Admit(ctx, r)
	if err != nil || !d.Allowed {
		t.Fatalf("alice: %+v %v", d, err)
	}
	if d, _, _ := l.Admit(ctx, r); d.Allowed || d.Reason != spillway.ReasonConcurrency {
		t.Fatalf("alice again: %+v, want concurrency denial", d)
	}
	bob := &spillway.Request{Priority: spillway.Critical}
	bob.Set(spillway.DimUser, "bob")
	if d, _, _ := l.Admit(ctx, bob); !d.Allowed {
		t.Fatalf("bob: %+v", d)
	}
	// A missing dimension is not limited by the block (spillway.DimIP):
	// admitted, holding nothing, named "<name>:absent".
	anon := &spillway.Request{Priority: spillway.Critical}
	for i := 0; i < 3; i++ {
		d, done, err := l.Admit(ctx, anon)
		if err != nil || d != (spillway.Decision{Allowed: true, Limiter: "concurrency:absent"}) {
			t.Fatalf("anonymous %d: %+v %v", i, d, err)
		}
		done(spillway.Success)
	}
	if d, _, _ := l.Admit(ctx, &spillway.Request{Cost: -1}); d.Allowed || d.Reason != spillway.ReasonInvalid {
		t.Fatalf("malformed: %+v, want ReasonInvalid", d)
	}
	if d, _, _ := l.Admit(ctx, nil); d.Allowed || d.Reason != spillway.ReasonInvalid {
		t.Fatalf("nil request: %+v, want ReasonInvalid", d)
	}
	done(spillway.Success)
	if d, _, _ := l.Admit(ctx, r); !d.Allowed {
		t.Fatalf("alice after done: %+v", d)
	}
}

func TestNewValidates(t *testing.T) {
	s := NewMemoryStore(MemorySettings{})
	// The key is the field the error must name.
	for field, c := range map[string]struct {
		store Store
		limit int64
		set   Settings
	}{
		"store":           {nil, 0, Settings{}},
		"limit 0":         {s, 0, Settings{}},
		"limit -1":        {s, -1, Settings{}},
		"ttl -1s":         {s, 1, Settings{TTL: -time.Second}},
		"retry after":     {s, 1, Settings{RetryAfter: -1}},
		"release timeout": {s, 1, Settings{ReleaseTimeout: -1}},
	} {
		l, err := New(c.store, c.limit, c.set)
		if err == nil || l != nil || !strings.HasPrefix(err.Error(), "concurrency: ") || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: New = %v, %v; want a concurrency: error naming %q", field, l, err, field)
		}
	}
	// A fleet-wide cap is named by its settings: no default name.
	if _, err := NewInFlight(redis.NewClient(&redis.Options{}), 10, Settings{}); err == nil || !strings.Contains(err.Error(), "name is empty") {
		t.Errorf("NewInFlight without a name: err = %v, want one naming the name", err)
	}
	if _, err := NewRedisStore(nil, RedisSettings{}); err == nil || !strings.Contains(err.Error(), "client is nil") {
		t.Errorf("NewRedisStore(nil, RedisSettings{}): err = %v, want one naming the client", err)
	}
	if _, err := NewRedisStore(redis.NewClient(&redis.Options{}), RedisSettings{Prefix: "a{b"}); err == nil {
		t.Error("prefix with brace: no error")
	}
}

// countingStore counts the store calls, to show which decisions need none.
type countingStore struct {
	Store
	acquires, releases atomic.Int64
}

func (s *countingStore) acquire(ctx context.Context, scope, key, id string, cost, limit int64, ttl time.Duration) (result, error) {
	s.acquires.Add(1)
	return s.Store.acquire(ctx, scope, key, id, cost, limit, ttl)
}

func (s *countingStore) release(ctx context.Context, scope, key, id string, cost int64) error {
	s.releases.Add(1)
	return s.Store.release(ctx, scope, key, id, cost)
}

// TestPerKeyCost: a request holds its EffectiveCost in units of the limit,
// on both stores, through PerKey (as a chain calls it).
func TestPerKeyCost(t *testing.T) {
	for _, f := range []struct {
		name string
		new  storeFactory
	}{{"memory", memoryFactory}, {"redis", redisFactory}} {
		t.Run(f.name, func(t *testing.T) {
			clock := newFakeClock()
			store := &countingStore{Store: f.new(t, clock)}
			lim, err := New(store, 10, Settings{Name: "cc", TTL: 10 * time.Second, RetryAfter: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			l := PerKey(lim, spillway.DimUser)
			ctx := context.Background()
			req := func(cost int64) *spillway.Request {
				r := &spillway.Request{Priority: spillway.Critical, Cost: cost}
				r.Set(spillway.DimUser, "u")
				return r
			}
			admit := func(cost int64, want spillway.Decision) spillway.Done {
				t.Helper()
				d, done, err := l.Admit(ctx, req(cost))
				if err != nil {
					t.Fatal(err)
				}
				if d != want {
					t.Fatalf("cost %d: %+v, want %+v", cost, d, want)
				}
				return done
			}
			allowed := func(remaining int64) spillway.Decision {
				return spillway.Decision{Allowed: true, Limiter: "cc", Limit: 10, Remaining: remaining}
			}
			// A denial reports what is left, less than the request needs.
			denied := func(remaining int64) spillway.Decision {
				return spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "cc", Limit: 10, Remaining: remaining, RetryAfter: 500 * time.Millisecond}
			}
			doneA := admit(3, allowed(7))
			admit(3, allowed(4))
			admit(3, allowed(1))
			admit(2, denied(1))
			doneD := admit(1, allowed(0))
			admit(1, denied(0))
			// done of a cost-3 request frees exactly 3 units, once.
			doneA(spillway.Success)
			doneA(spillway.Success)
			lim.WaitReleases() // done hands the release to the background
			admit(4, denied(3))
			admit(3, allowed(0))
			admit(1, denied(0))
			// Cost 0 is 1 (EffectiveCost).
			doneD(spillway.Success)
			lim.WaitReleases()
			done0 := admit(0, allowed(0))
			admit(0, denied(0))
			done0(spillway.Success)
			// Above the limit: never admissible, so no RetryAfter and no
			// store call.
			before := store.acquires.Load()
			admit(11, spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "cc", Limit: 10})
			if n := store.acquires.Load() - before; n != 0 {
				t.Fatalf("cost 11 made %d store calls, want 0", n)
			}
			// A cost of exactly the limit fits an empty key.
			r := req(10)
			r.Set(spillway.DimUser, "other")
			if d, _, _ := l.Admit(ctx, r); d != allowed(0) {
				t.Fatalf("cost 10 on an empty key: %+v", d)
			}
			if d, done, err := lim.Acquire(ctx, "u", -1); err == nil || !strings.Contains(err.Error(), "cost -1") || d.Allowed {
				t.Fatalf("AcquireN(-1): %+v, %v; want an error naming the cost", d, err)
			} else {
				done(spillway.Success) // Noop
			}
			lim.WaitReleases()
			if got := store.releases.Load(); got != 3 {
				t.Fatalf("%d store releases, want 3 (doneA twice is one)", got)
			}
		})
	}
}

// TestRedis200GoroutinesLimit20 is the acceptance test: 200 goroutines
// hammer one key limited to 20 units on a real Redis (with Redis TIME),
// with costs 1 to 4; the handler counts the units in flight and they never
// exceed 20.
func TestRedis200GoroutinesLimit20(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 200})
	t.Cleanup(func() { rdb.Close() })
	store, err := NewRedisStore(rdb, RedisSettings{})
	if err != nil {
		t.Fatal(err)
	}
	var releaseErrs atomic.Int64
	var lastReleaseErr atomic.Value
	lim, err := New(store, 20, Settings{TTL: 30 * time.Second, ReleaseTimeout: 10 * time.Second, OnReleaseError: func(err error) { releaseErrs.Add(1); lastReleaseErr.Store(err) }})
	if err != nil {
		t.Fatal(err)
	}
	var inFlight, maxSeen, admitted, denied atomic.Int64
	var admittedUnits [5]atomic.Int64 // by cost
	var wg sync.WaitGroup
	ctx := context.Background()
	errc := make(chan error, 200)
	for g := 0; g < 200; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				cost := int64(1 + (g+i)%4)
				d, done, err := lim.Acquire(ctx, "hot", cost)
				if err != nil {
					errc <- err
					return
				}
				if !d.Allowed {
					denied.Add(1)
					continue
				}
				admitted.Add(1)
				admittedUnits[cost].Add(1)
				n := inFlight.Add(cost)
				for {
					m := maxSeen.Load()
					if n <= m || maxSeen.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Millisecond) // the work
				inFlight.Add(-cost)
				done(spillway.Success)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("admitted %d (cost 1..4: %d %d %d %d), denied %d, max units in flight %d", admitted.Load(),
		admittedUnits[1].Load(), admittedUnits[2].Load(), admittedUnits[3].Load(), admittedUnits[4].Load(), denied.Load(), maxSeen.Load())
	if maxSeen.Load() > 20 {
		t.Fatalf("max units in flight %d > 20", maxSeen.Load())
	}
	if admitted.Load()+denied.Load() != 2000 || admitted.Load() < 20 {
		t.Fatalf("admitted %d denied %d", admitted.Load(), denied.Load())
	}
	if releaseErrs.Load() != 0 {
		t.Fatalf("%d releases failed; last: %v", releaseErrs.Load(), lastReleaseErr.Load())
	}
	lim.WaitReleases()
	n, err := rdb.Exists(ctx, store.key("concurrency", "hot")).Result()
	if err != nil || n != 0 {
		t.Fatalf("after every done the set should be gone: exists=%d err=%v", n, err)
	}
}

// TestRedisCrashedServerBlocksOnlyUntilTTL: a "server" takes every slot and
// dies without calling done; another server is denied until the TTL (Redis
// TIME) reaps the leaked entries, then admitted again.
func TestRedisCrashedServerBlocksOnlyUntilTTL(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	// Long enough that the second server's first Acquire (a new client, a
	// script load) lands before the leaked entries expire even on a loaded
	// two-core machine under -race.
	const ttl = time.Second

	crashed := redis.NewClient(&redis.Options{Addr: srv.Addr})
	cs, _ := NewRedisStore(crashed, RedisSettings{})
	a, _ := New(cs, 3, Settings{TTL: ttl})
	for i := 0; i < 3; i++ {
		if d, _, err := a.Acquire(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("crashing server acquire %d: %+v %v", i, d, err)
		}
	}
	start := time.Now()
	crashed.Close() // it dies; its done functions are never called

	bs, _ := NewRedisStore(srv.Client(t), RedisSettings{})
	b, _ := New(bs, 3, Settings{TTL: ttl, RetryAfter: 10 * time.Second})
	d, _, err := b.Acquire(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Reason != spillway.ReasonConcurrency || d.RetryAfter <= 0 || d.RetryAfter > ttl {
		t.Fatalf("while leaked: %+v, want a denial with 0 < RetryAfter <= %v", d, ttl)
	}
	// Its key carries a TTL in Redis too.
	pttl, err := srv.Client(t).PTTL(ctx, bs.key("concurrency", "k")).Result()
	if err != nil || pttl <= 0 || pttl > ttl {
		t.Fatalf("PTTL = %v, %v; want in (0, %v]", pttl, err, ttl)
	}
	time.Sleep(time.Until(start.Add(ttl + 50*time.Millisecond)))
	for i := 0; i < 3; i++ {
		if d, _, err := b.Acquire(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("after ttl, acquire %d: %+v %v", i, d, err)
		}
	}
	if d, _, _ := b.Acquire(ctx, "k", 1); d.Allowed {
		t.Fatalf("fourth admitted: %+v", d)
	}
}

func TestRedisErrorsAreWrapped(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	store, _ := NewRedisStore(rdb, RedisSettings{})
	var releaseErr atomic.Value
	lim, _ := New(store, 5, Settings{OnReleaseError: func(err error) { releaseErr.Store(err) }})
	ctx := context.Background()
	d, done, err := lim.Acquire(ctx, "k", 1)
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	srv.Stop()
	done(spillway.Success)
	lim.WaitReleases()
	if e, _ := releaseErr.Load().(error); e == nil || !strings.HasPrefix(e.Error(), "concurrency: release: ") {
		t.Fatalf("release error = %v", e)
	}
	// Redis is gone: the limiter decides locally, Degraded, at the
	// client's share (0.2 of 5 = 1 while no fleet shedder has counted).
	d, done, err = lim.Acquire(ctx, "k", 1)
	if err != nil || !d.Allowed || !d.Degraded || d.Limit != 1 || d.Remaining != 0 {
		t.Fatalf("acquire on a dead Redis: %+v, %v; want a Degraded admission at the local share 1", d, err)
	}
	if d2, _, err := lim.Acquire(ctx, "k", 1); err != nil || d2.Allowed || !d2.Degraded || d2.Reason != spillway.ReasonConcurrency || d2.RetryAfter != time.Second {
		t.Fatalf("second acquire on a dead Redis: %+v, %v; want a Degraded concurrency denial", d2, err)
	}
	closed, err := New(lim.store, 1, Settings{Name: "login", FailMode: spillway.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	user := &spillway.Request{Priority: spillway.Critical}
	user.Set(spillway.DimUser, "ann")
	dc, _, err := PerKey(closed, spillway.DimUser).Admit(ctx, user)
	if err != nil || dc.Allowed || dc.Reason != spillway.ReasonFailClosed || !dc.Degraded || dc.Limiter != "login" {
		t.Fatalf("fail-closed limiter on a dead Redis: %+v %v", dc, err)
	}
	// A caller that canceled gets its cancellation back, nothing decided.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	var se *spillway.StoreError
	if _, _, err := lim.Acquire(cctx, "k", 1); !errors.As(err, &se) || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled acquire: %v", err)
	}
	if _, err := New(lim.store, 1, Settings{FailMode: 4}); err == nil || err.Error() != "concurrency: New: unknown fail mode 4 (want spillway.FailOpen or spillway.FailClosed)" {
		t.Fatalf("WithFailMode(4): %v", err)
	}
	done(spillway.Success)
}

func TestMemoryStoreSweepsOnCap(t *testing.T) {
	clock := newFakeClock()
	s := NewMemoryStore(MemorySettings{Clock: clock.Now, MaxKeys: 32})
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		// Every acquisition leaks; the TTL is 1 s and the clock moves 10 ms.
		if _, err := s.acquire(ctx, "s", "k"+string(rune('a'+i%26))+strings.Repeat("x", i/26), "id", 1, 1, time.Second); err != nil {
			t.Fatal(err)
		}
		clock.Advance(10 * time.Millisecond)
	}
	// At most 100 acquisitions are younger than the TTL; the cap sweeps
	// the rest (each shard holds up to 2 keys before sweeping).
	if n := s.size(); n > 100+64 {
		t.Fatalf("memory store holds %d keys; the sweep is not bounding it", n)
	}
}
