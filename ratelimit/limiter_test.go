package ratelimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

func TestNewValidates(t *testing.T) {
	st := NewMemoryStore(MemorySettings{})
	cases := []struct {
		name  string
		store Store
		p     Policy
		want  string
	}{
		{"nil store", nil, Policy{Limit: 1, Period: time.Second}, "ratelimit: store is nil"},
		{"zero limit", st, Policy{Period: time.Second}, "limit 0 must be positive"},
		{"negative limit", st, Policy{Limit: -1, Period: time.Second}, "limit -1 must be positive"},
		{"zero period", st, Policy{Limit: 1}, "period 0s must be positive"},
		{"negative period", st, Policy{Limit: 1, Period: -time.Second}, "period -1s must be positive"},
		{"sub-µs period", st, Policy{Limit: 1, Period: 1500 * time.Nanosecond}, "whole number of microseconds"},
		{"negative burst", st, Policy{Limit: 1, Period: time.Second, Burst: -1}, "burst -1 must not be negative"},
		{"unknown algorithm", st, Policy{Algorithm: 42, Limit: 1, Period: time.Second}, "unknown algorithm 42"},
		{"burst on a window", st, Policy{Algorithm: FixedWindow, Limit: 1, Period: time.Second, Burst: 2}, "burst 2 is not supported by fixed_window"},
		{"more than one per µs", st, Policy{Limit: 2, Period: time.Microsecond}, "more than one per microsecond"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := New(c.store, c.p, Settings{})
			if err == nil || l != nil {
				t.Fatalf("New accepted it: %v", l)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ratelimit: ") {
				t.Fatalf("error %q, want it to contain %q", err, c.want)
			}
			if c.store != nil && !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("error %q does not wrap ErrInvalidPolicy", err)
			}
		})
	}
}

func TestLimiterDefaults(t *testing.T) {
	p := Policy{Limit: 100, Period: time.Second, Burst: 50}
	l := mustLimiter(t, NewMemoryStore(MemorySettings{}), p)
	if l.scope != "QmCX23" || l.scope != defaultScope(p) || l.policy != p {
		t.Fatalf("scope %q policy %v", l.scope, l.policy)
	}
	d, err := l.Allow(context.Background(), "k", 1)
	// The key's scope is the digest; the decision names the policy.
	if err != nil || d.Limiter != "token_bucket 100/1s burst 50" || d.Limit != 50 || d.Remaining != 49 {
		t.Fatalf("%+v %v", d, err)
	}
	r := &spillway.Request{Priority: spillway.Critical}
	r.Set(spillway.DimIP, "192.0.2.7")
	if d, _, err := PerKey(l, spillway.DimIP).Admit(context.Background(), r); err != nil || d.Limiter != "token_bucket 100/1s burst 50:ip" {
		t.Fatalf("by dimension: %+v %v", d, err)
	}
	named := mustLimiter(t, NewMemoryStore(MemorySettings{}), p, Settings{Scope: "login"})
	if d, _ := named.Allow(context.Background(), "k", 1); d.Limiter != "login" {
		t.Fatalf("Limiter %q, want login", d.Limiter)
	}
	if d, _, _ := PerKey(named, spillway.DimIP).Admit(context.Background(), r); d.Limiter != "login:ip" {
		t.Fatalf("Limiter %q, want login:ip", d.Limiter)
	}
}

func TestAllowNNegative(t *testing.T) {
	l := mustLimiter(t, NewMemoryStore(MemorySettings{}), Policy{Limit: 1, Period: time.Second})
	_, err := l.Allow(context.Background(), "k", -3)
	if !errors.Is(err, ErrInvalidCost) || !strings.Contains(err.Error(), "n = -3 is negative") {
		t.Fatalf("err = %v", err)
	}
	// The generic path (a store that is not a *MemoryStore) too.
	g := mustLimiter(t, wrappedStore{NewMemoryStore(MemorySettings{})}, Policy{Limit: 1, Period: time.Second})
	if _, err := g.Allow(context.Background(), "k", -1); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("err = %v", err)
	}
}

// wrappedStore hides the *MemoryStore so the Limiter takes its generic path.
type wrappedStore struct{ Store }

// failingStore fails every call.
type failingStore struct{}

var errBackend = errors.New("backend down")

func (failingStore) Decide(context.Context, []Item, []spillway.Decision) (bool, error) {
	return false, errBackend
}
func (failingStore) Reset(context.Context, string, string, Policy) error { return errBackend }

func TestLimiterGenericPathMatchesFastPath(t *testing.T) {
	clock := newConfClock()
	p := Policy{Limit: 3, Period: time.Second}
	fast := mustLimiter(t, NewMemoryStore(MemorySettings{Clock: clock.Now}), p)
	slow := mustLimiter(t, wrappedStore{NewMemoryStore(MemorySettings{Clock: clock.Now})}, p)
	ctx := context.Background()
	for i, n := range []int64{1, 0, 2, 1, 4} {
		clock.Set(confT0.Add(time.Duration(i) * ms(90)))
		a, err1 := fast.Allow(ctx, "k", n)
		b, err2 := slow.Allow(ctx, "k", n)
		if a != b || err1 != nil || err2 != nil {
			t.Fatalf("step %d: fast %+v %v, generic %+v %v", i, a, err1, b, err2)
		}
	}
}

func TestLimiterStoreErrors(t *testing.T) {
	l := mustLimiter(t, failingStore{}, Policy{Limit: 1, Period: time.Second}, Settings{Scope: "s"})
	ctx := context.Background()
	if _, err := l.Allow(ctx, "k", 1); !errors.Is(err, errBackend) || err.Error() != "ratelimit: s: backend down" {
		t.Fatalf("Allow: %v", err)
	}
	if err := l.Reset(ctx, "k"); !errors.Is(err, errBackend) || err.Error() != "ratelimit: s: reset: backend down" {
		t.Fatalf("Reset: %v", err)
	}
	d, done, err := PerKey(l, spillway.DimIP).Admit(ctx, &spillway.Request{Dims: []spillway.Dimension{{Name: "ip", Value: "1"}}})
	var se *spillway.StoreError
	if !errors.Is(err, errBackend) || !errors.As(err, &se) || se.Fail != spillway.FailOpen || d != (spillway.Decision{}) || done == nil || err.Error() != "spillway: store unavailable (s:ip, fail open): backend down" {
		t.Fatalf("Admit: %+v %v", d, err)
	}
	closed := mustLimiter(t, failingStore{}, Policy{Limit: 1, Period: time.Second}, Settings{Scope: "login", FailMode: spillway.FailClosed})
	if closed.fail != spillway.FailClosed {
		t.Fatalf("FailMode() = %v", closed.fail)
	}
	_, _, err = PerKey(closed, spillway.DimIP).Admit(ctx, &spillway.Request{Dims: []spillway.Dimension{{Name: "ip", Value: "1"}}})
	if block.FailModeOf(err, spillway.FailOpen) != spillway.FailClosed || err.Error() != "spillway: store unavailable (login:ip, fail closed): backend down" {
		t.Fatalf("fail-closed Admit: %v", err)
	}
	if _, err := New(failingStore{}, Policy{Limit: 1, Period: time.Second}, Settings{FailMode: 5}); err == nil || err.Error() != "ratelimit: unknown fail mode 5 (want spillway.FailOpen or spillway.FailClosed)" {
		t.Fatalf("FailMode 5: %v", err)
	}
}

// TestErrorsSayRatelimitOnce: an error of this package wrapping another of
// its errors (a sentinel, a RedisStore error) says "ratelimit:" once, keeps
// the item index or the scope, and still matches the sentinel.
func TestErrorsSayRatelimitOnce(t *testing.T) {
	ctx := context.Background()
	p := Policy{Limit: 1, Period: time.Second}
	// A client that fails (closed): the Redis error keeps its own "redis:".
	closed := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	l := mustLimiter(t, mustRedisStore(closed), p, Settings{Scope: "s"})
	if err := l.Reset(ctx, "k"); err == nil || err.Error() != `ratelimit: s: reset: redis: reset "spillway:s;{k}": redis: client is closed` {
		t.Fatalf("Reset over a closed client: %v", err)
	}
	d := PerKey(l, spillway.DimIP)
	if _, _, err := d.Admit(ctx, &spillway.Request{Dims: []spillway.Dimension{{Name: "ip", Value: "1"}}}); err == nil || err.Error() != "spillway: store unavailable (s:ip, fail open): ratelimit: redis: token bucket script: redis: client is closed" {
		t.Fatalf("Admit over a closed client: %v", err)
	}
	// A store whose errors are ratelimit's own validation errors.
	wl := mustLimiter(t, wrappedStore{NewMemoryStore(MemorySettings{})}, p, Settings{Scope: "w"})
	wl.policy.Limit = 0 // as if the store rejected the policy
	_, err := wl.Allow(ctx, "k", 1)
	if err == nil || err.Error() != "ratelimit: w: item 0: invalid policy: limit 0 must be positive" || !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("invalid item through a limiter: %v", err)
	}
	cl := mustLimiter(t, mustRedisStore(closed), p, Settings{Scope: "s"})
	if _, err := cl.Allow(ctx, "k", 1); err == nil || err.Error() != "ratelimit: s: redis: token bucket script: redis: client is closed" || !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Allow over a closed client: %v", err)
	}
	for _, st := range []Store{NewMemoryStore(MemorySettings{}), mustRedisStore(closed)} {
		out := make([]spillway.Decision, 1)
		_, err := st.Decide(ctx, []Item{{Scope: "s", Key: "k", Policy: p, Cost: -1}}, out)
		if err == nil || err.Error() != "ratelimit: item 0: invalid cost: cost -1 is negative" || !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("%T: negative cost: %v", st, err)
		}
	}
}

func TestPerKey(t *testing.T) {
	clock := newConfClock()
	l := mustLimiter(t, NewMemoryStore(MemorySettings{Clock: clock.Now}), Policy{Limit: 2, Period: time.Second}, Settings{Scope: "api"})
	byIP := PerKey(l, spillway.DimIP)
	byUser := PerKey(l, spillway.DimUser)
	ctx := context.Background()
	req := func(cost int64, dims ...string) *spillway.Request {
		r := &spillway.Request{Cost: cost}
		for i := 0; i+1 < len(dims); i += 2 {
			r.Set(dims[i], dims[i+1])
		}
		return r
	}
	admit := func(lim spillway.Limiter, r *spillway.Request) spillway.Decision {
		t.Helper()
		d, done, err := lim.Admit(ctx, r)
		if err != nil || done == nil {
			t.Fatalf("Admit: %v", err)
		}
		done(spillway.Success)
		return d
	}
	if d := admit(byIP, req(0, "ip", "10.0.0.1")); !d.Allowed || d.Limiter != "api:ip" || d.Remaining != 1 || d.Limit != 2 {
		t.Fatalf("first: %+v", d)
	}
	if d := admit(byIP, req(1, "ip", "10.0.0.1")); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("second: %+v", d)
	}
	if d := admit(byIP, req(1, "ip", "10.0.0.1")); d.Allowed || d.Reason != spillway.ReasonRateLimited || d.RetryAfter != ms(500) {
		t.Fatalf("third: %+v", d)
	}
	// Another IP, and the same value under another dimension, are separate.
	if d := admit(byIP, req(2, "ip", "10.0.0.2")); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("other ip: %+v", d)
	}
	if d := admit(byUser, req(1, "user", "10.0.0.1")); !d.Allowed || d.Limiter != "api:user" || d.Remaining != 1 {
		t.Fatalf("user: %+v", d)
	}
	// Cost above capacity, a negative cost, a missing dimension.
	if d := admit(byUser, req(3, "user", "u")); d.Allowed || d.Reason != spillway.ReasonCostExceedsLimit || d.RetryAfter != 0 {
		t.Fatalf("cost 3: %+v", d)
	}
	if d := admit(byUser, req(-1, "user", "u")); d.Allowed || d.Reason != spillway.ReasonInvalid || d.Limiter != "api:user" {
		t.Fatalf("negative cost: %+v", d)
	}
	if d := admit(byIP, req(1, "user", "u")); !d.Allowed || d.Limiter != "api:ip:absent" || d.Limit != 0 {
		t.Fatalf("no ip: %+v", d)
	}
	// The adapter's state lives under "<scope>:<dim>".
	if err := l.store.Reset(ctx, "api:ip", "10.0.0.1", l.policy); err != nil {
		t.Fatal(err)
	}
	if d := admit(byIP, req(2, "ip", "10.0.0.1")); !d.Allowed {
		t.Fatalf("after reset: %+v", d)
	}
	// In a chain: the most restrictive decision wins, denial stops it.
	chain := spillway.Chain(byIP, byUser)
	d, _, _ := chain.Admit(ctx, req(1, "ip", "10.0.0.3", "user", "10.0.0.1"))
	if !d.Allowed || d.Limiter != "api:user" || d.Remaining != 0 {
		t.Fatalf("chain: %+v", d)
	}
	d, _, _ = chain.Admit(ctx, req(1, "ip", "10.0.0.3", "user", "10.0.0.1"))
	if d.Allowed || d.Limiter != "api:user" {
		t.Fatalf("chain: %+v", d)
	}
}

func TestPerKeyAllocations(t *testing.T) {
	l := mustLimiter(t, NewMemoryStore(MemorySettings{}), Policy{Limit: 1000, Period: time.Millisecond})
	lim := PerKey(l, spillway.DimIP)
	r := &spillway.Request{Dims: []spillway.Dimension{{Name: spillway.DimIP, Value: "10.0.0.1"}}}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { lim.Admit(ctx, r) }); n != 0 {
		t.Fatalf("%v allocations per Admit, want 0", n)
	}
}

func TestSchedule(t *testing.T) {
	clock := newConfClock()
	p := Policy{Algorithm: LeakyBucket, Limit: 10, Period: time.Second, Burst: 3} // one per 100ms, queue of 3
	for _, st := range []Store{NewMemoryStore(MemorySettings{Clock: clock.Now}), wrappedStore{NewMemoryStore(MemorySettings{Clock: clock.Now})}} {
		clock.Set(confT0.Add(0))
		l := mustLimiter(t, st, p)
		ctx := context.Background()
		for i, want := range []time.Duration{0, ms(100), ms(200)} {
			d, delay, err := l.Schedule(ctx, "k", 1)
			if err != nil || !d.Allowed || delay != want {
				t.Fatalf("slot %d: %+v %v %v, want delay %v", i, d, delay, err, want)
			}
		}
		d, delay, err := l.Schedule(ctx, "k", 1)
		if err != nil || d.Allowed || delay != 0 || d.RetryAfter != ms(100) {
			t.Fatalf("full queue: %+v %v %v", d, delay, err)
		}
		// 250ms later the first two have left: the next slot is at 300ms.
		clock.Set(confT0.Add(ms(250)))
		if d, delay, _ := l.Schedule(ctx, "k", 1); !d.Allowed || delay != ms(50) {
			t.Fatalf("after 250ms: %+v %v", d, delay)
		}
		// Sub-millisecond slots: the delay is never early, < 1ms late.
		clock.Set(confT0.Add(ms(1000)))
		l3 := mustLimiter(t, st, Policy{Algorithm: LeakyBucket, Limit: 3, Period: time.Second}, Settings{Scope: "thirds"})
		l3.Schedule(ctx, "k", 1)
		if d, delay, _ := l3.Schedule(ctx, "k", 1); delay != 333666*time.Microsecond { // exact 333334µs
			t.Fatalf("thirds: %+v %v", d, delay)
		}
	}
	w := mustLimiter(t, NewMemoryStore(MemorySettings{}), Policy{Algorithm: SlidingWindowLog, Limit: 1, Period: time.Second})
	if _, _, err := w.Schedule(context.Background(), "k", 1); !errors.Is(err, ErrInvalidPolicy) || err.Error() != "ratelimit: invalid policy: sliding_window_log has no smoothing delay" {
		t.Fatalf("window Schedule: %v", err)
	}
	if _, err := w.Wait(context.Background(), "k", 1); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("window Wait: %v", err)
	}
}

func TestWaitSmoothsABurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The store's default clock reads the bubble's fake time.
		l := mustLimiter(t, NewMemoryStore(MemorySettings{}), Policy{Algorithm: LeakyBucket, Limit: 10, Period: time.Second, Burst: 5})
		ctx := context.Background()
		start := time.Now()
		var at []time.Duration
		for i := 0; i < 5; i++ {
			d, err := l.Wait(ctx, "k", 1)
			if err != nil || !d.Allowed {
				t.Fatalf("wait %d: %+v %v", i, d, err)
			}
			at = append(at, time.Since(start))
		}
		// Each Wait returns at its slot; the queue never filled because
		// each waited for the previous one.
		for i, got := range at {
			if want := time.Duration(i) * ms(100); got != want {
				t.Fatalf("request %d left at %v, want %v", i, got, want)
			}
		}
		// Cancellation during the sleep: the error wraps ctx.Err().
		for i := 0; i < 4; i++ {
			l.Schedule(ctx, "j", 1)
		}
		cctx, cancel := context.WithTimeout(ctx, ms(50))
		defer cancel()
		d, err := l.Wait(cctx, "j", 1) // slot at 400ms
		if !errors.Is(err, context.DeadlineExceeded) || !d.Allowed {
			t.Fatalf("cancelled wait: %+v %v", d, err)
		}
		// A full queue returns the denial at once.
		before := time.Now()
		d, err = l.Wait(ctx, "j", 1)
		if err != nil || d.Allowed || time.Since(before) != 0 {
			t.Fatalf("full queue: %+v %v after %v", d, err, time.Since(before))
		}
	})
}
