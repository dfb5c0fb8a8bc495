package ratelimit

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/testclock"
)

// holdFactories lists the Reservers the hold suite runs against: a fresh,
// empty store whose clock is now. The Redis store adds itself from
// hold_redis_test.go.
var holdFactories = []storeFactory{
	{name: "memory", new: func(t *testing.T, now func() time.Time) Store {
		return NewMemoryStore(MemorySettings{Clock: now})
	}},
}

func forEachReserver(t *testing.T, f func(t *testing.T, s reserver, clock *testclock.Clock)) {
	for _, fac := range holdFactories {
		t.Run(fac.name, func(t *testing.T) {
			clock := newConfClock()
			s, ok := fac.new(t, clock.Now).(reserver)
			if !ok {
				t.Fatalf("%s store is not a reserver", fac.name)
			}
			f(t, s, clock)
		})
	}
}

// peek returns the decision of a cost-0 Allow on key.
func peek(t *testing.T, l *Limiter, key string) spillway.Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func wantDecision(t *testing.T, what string, d spillway.Decision, allowed bool, remaining int64, reset, retry time.Duration) {
	t.Helper()
	if d.Allowed != allowed || d.Remaining != remaining || d.ResetAfter != reset || d.RetryAfter != retry {
		t.Fatalf("%s: got allowed=%v remaining=%d reset=%v retry=%v, want %v %d %v %v (%+v)",
			what, d.Allowed, d.Remaining, d.ResetAfter, d.RetryAfter, allowed, remaining, reset, retry, d)
	}
}

func mustReserve(t *testing.T, l *Limiter, key string, estimate int64) *Hold {
	t.Helper()
	h, err := l.Reserve(context.Background(), key, estimate)
	if err != nil {
		t.Fatalf("reserve %d: %v", estimate, err)
	}
	return h
}

func mustSettle(t *testing.T, h *Hold, actual int64, want SettleResult) {
	t.Helper()
	got, err := h.Settle(context.Background(), actual)
	if err != nil || got != want {
		t.Fatalf("settle %d: %v %v, want %v", actual, got, err, want)
	}
}

// TestHoldSteps pins the arithmetic of reserve, settle (refund, extra
// charge, debt and its bound) on every reserver.
func TestHoldSteps(t *testing.T) {
	forEachReserver(t, func(t *testing.T, s reserver, clock *testclock.Clock) {
		ctx := context.Background()
		// T = 100ms, τ = 500ms
		l := mustLimiter(t, s, Policy{Limit: 10, Period: time.Second, Burst: 5}, Settings{Scope: "steps", HoldTTL: 2 * time.Second})
		h := mustReserve(t, l, "k", 3)
		wantDecision(t, "reserve 3", h.Decision(), true, 2, ms(300), 0)
		if h.Decision().Window != l.policy.window() || h.Decision().Limit != 5 || h.id == "" || h.ttl != 2*time.Second {
			t.Fatalf("hold %+v id %q ttl %v", h.Decision(), h.id, h.ttl)
		}
		mustSettle(t, h, 1, SettleApplied) // refund 2
		wantDecision(t, "after refund", peek(t, l, "k"), true, 4, ms(100), 0)
		mustSettle(t, h, 1, SettleAlreadySettled)
		if _, err := h.settleEach(ctx, []int64{1, 2}); err == nil {
			t.Fatal("SettleEach with 2 costs for 1 item: no error")
		}

		// an extra charge puts the key into debt: TAT = 500ms + 5·100ms
		h = mustReserve(t, l, "k", 4)
		wantDecision(t, "reserve 4", h.Decision(), true, 0, ms(500), 0)
		mustSettle(t, h, 9, SettleApplied)
		wantDecision(t, "in debt", peek(t, l, "k"), true, 0, ms(1000), 0)
		d, _ := l.Allow(ctx, "k", 1)
		wantDecision(t, "allow in debt", d, false, 0, ms(1000), ms(600))
		clock.Set(confT0.Add(ms(600)))
		d, _ = l.Allow(ctx, "k", 1)
		wantDecision(t, "allow after the debt", d, true, 0, ms(500), 0)

		// the debt is bounded at one Burst: TAT ≤ now + 2τ
		h = mustReserve(t, l, "k", 0)
		wantDecision(t, "reserve 0", h.Decision(), true, 0, ms(500), 0)
		mustSettle(t, h, math.MaxInt64, SettleApplied)
		wantDecision(t, "debt bound", peek(t, l, "k"), true, 0, ms(1000), 0)
		d, _ = l.Allow(ctx, "k", 5)
		wantDecision(t, "allow 5 at the bound", d, false, 0, ms(1000), ms(1000))

		// denied and exceeding reservations hold nothing
		h = mustReserve(t, l, "k", 1)
		wantDecision(t, "reserve in debt", h.Decision(), false, 0, ms(1000), ms(600))
		if _, err := h.Settle(ctx, 1); !errors.Is(err, errNotHeld) {
			t.Fatalf("settle of a denied hold: %v", err)
		}
		h = mustReserve(t, l, "k", 6)
		if d := h.Decision(); d.Allowed || d.Reason != spillway.ReasonCostExceedsLimit || d.RetryAfter != 0 {
			t.Fatalf("reserve 6 > burst 5: %+v", d)
		}
		wantDecision(t, "nothing held", peek(t, l, "k"), true, 0, ms(1000), 0)
	})
}

// TestHoldFixedZeroKeepsMark: a reservation whose only item on a key is a
// fixed one of cost 0 changes nothing on that key, as a plain decision of
// cost 0 does: a key marked by a debt that now no longer proves (TAT −
// now ≤ τ) stays marked, so after the clock steps back its clamp is
// still TAT − 2τ. (The Redis hold script rewrote the key, which dropped
// the mark: the clamp became TAT − τ and the bucket looked τ emptier.)
func TestHoldFixedZeroKeepsMark(t *testing.T) {
	forEachReserver(t, func(t *testing.T, s reserver, clock *testclock.Clock) {
		ctx := context.Background()
		// T = 100ms, τ = 500ms
		l := mustLimiter(t, s, Policy{Limit: 10, Period: time.Second, Burst: 5}, Settings{Scope: "fz", HoldTTL: 2 * time.Second})
		for _, key := range []string{"fixed", "plain"} {
			h := mustReserve(t, l, key, 0)
			mustSettle(t, h, 9, SettleApplied) // a debt: TAT = 900ms, marked
		}
		clock.Set(confT0.Add(ms(500))) // TAT − now = 400ms ≤ τ: the debt is paid, the mark stays
		h, err := s.Reserve(ctx, []Item{{Scope: "fz", Key: "fixed", Policy: l.policy, Cost: 0, Fixed: true}}, time.Second)
		if err != nil || !h.allowed {
			t.Fatalf("fixed reserve of 0: %v %v", h, err)
		}
		wantDecision(t, "fixed 0", h.Decision(), true, 1, ms(400), 0)
		wantDecision(t, "plain 0", peek(t, l, "plain"), true, 1, ms(400), 0)
		clock.Set(confT0.Add(0)) // backwards: the clamp is TAT − 2τ = 0 on both keys
		for _, key := range []string{"fixed", "plain"} {
			wantDecision(t, key+" peek after the step back", peek(t, l, key), true, 0, ms(900), 0)
			d, err := l.Allow(ctx, key, 1)
			if err != nil {
				t.Fatal(err)
			}
			wantDecision(t, key+" allow after the step back", d, false, 0, ms(900), ms(500))
		}
	})
}

// TestHoldExpires: a hold not settled within its TTL is released by the
// next touch of its key (a plain decision included), and settling it then
// reports SettleExpired and charges nothing.
func TestHoldExpires(t *testing.T) {
	forEachReserver(t, func(t *testing.T, s reserver, clock *testclock.Clock) {
		// T = 1s, τ = 10s: a charge drains far slower than the hold expires
		l := mustLimiter(t, s, Policy{Limit: 10, Period: 10 * time.Second}, Settings{Scope: "exp", HoldTTL: 2 * time.Second})
		h := mustReserve(t, l, "k", 6)
		wantDecision(t, "reserve 6", h.Decision(), true, 4, ms(6000), 0)
		kept := mustReserve(t, l, "k", 1) // settled in time: not released
		clock.Set(confT0.Add(ms(1999)))
		wantDecision(t, "before the TTL", peek(t, l, "k"), true, 4, ms(5001), 0)
		mustSettle(t, kept, 1, SettleApplied)
		clock.Set(confT0.Add(ms(2000)))
		// 6 given back: TAT = 7s − 6s = 1s < now: full but for the settled 1
		wantDecision(t, "at the TTL", peek(t, l, "k"), true, 10, 0, 0)
		mustSettle(t, h, 3, SettleExpired)
		wantDecision(t, "expired settle charges nothing", peek(t, l, "k"), true, 10, 0, 0)
		mustSettle(t, h, 3, SettleExpired)

		// Reset forgets holds: a settle finds none, which before the
		// hold's end reads as settled already, and charges nothing
		h = mustReserve(t, l, "r", 2)
		if err := l.Reset(context.Background(), "r"); err != nil {
			t.Fatal(err)
		}
		mustSettle(t, h, 5, SettleAlreadySettled)
		wantDecision(t, "after reset", peek(t, l, "r"), true, 10, 0, 0)
		h = mustReserve(t, l, "r", 2)
		if err := l.Reset(context.Background(), "r"); err != nil {
			t.Fatal(err)
		}
		clock.Set(confT0.Add(ms(4000))) // the hold's end: its settle reports expired
		mustSettle(t, h, 5, SettleExpired)
		wantDecision(t, "after reset and the end", peek(t, l, "r"), true, 10, 0, 0)
	})
}

// TestHoldBatch: a batch reserves all or nothing and settles per item.
func TestHoldBatch(t *testing.T) {
	forEachReserver(t, func(t *testing.T, s reserver, clock *testclock.Clock) {
		ctx := context.Background()
		a := Policy{Limit: 10, Period: time.Second, Burst: 5} // T = 100ms
		b := Policy{Limit: 2, Period: time.Second}            // T = 500ms, τ = 1s
		items := func(n int64) []Item {
			return []Item{{Scope: "a", Key: "u", Policy: a, Cost: n}, {Scope: "b", Key: "u", Policy: b, Cost: n}}
		}
		h, err := s.Reserve(ctx, items(3), time.Second)
		if err != nil || h.allowed {
			t.Fatalf("3 > b's burst: %v %v", h, err)
		}
		if d := h.dec; !d[0].Allowed || d[1].Reason != spillway.ReasonCostExceedsLimit {
			t.Fatalf("decisions %+v", d)
		}
		h, err = s.Reserve(ctx, items(2), time.Second)
		if err != nil || !h.allowed {
			t.Fatalf("reserve 2: %v %v", h, err)
		}
		res, err := h.settleEach(ctx, []int64{1, 4})
		if err != nil || res[0] != SettleApplied || res[1] != SettleApplied {
			t.Fatalf("settle: %v %v", res, err)
		}
		out := make([]spillway.Decision, 2)
		if _, err := s.Decide(ctx, items(0), out); err != nil {
			t.Fatal(err)
		}
		wantDecision(t, "a after refund", out[0], true, 4, ms(100), 0)
		wantDecision(t, "b in debt", out[1], true, 0, ms(2000), 0)
		if got := h.estimates(nil); len(got) != 2 || got[0] != 2 || got[1] != 2 {
			t.Fatalf("estimates %v", got)
		}
		res, _ = h.settleEach(ctx, []int64{0, 0})
		if res[0] != SettleAlreadySettled || res[1] != SettleAlreadySettled {
			t.Fatalf("second settle: %v", res)
		}
	})
}

// TestHoldBadInput: hostile estimates, actual costs, TTLs and algorithms
// give clear errors or a denial, and change nothing.
func TestHoldBadInput(t *testing.T) {
	forEachReserver(t, func(t *testing.T, s reserver, clock *testclock.Clock) {
		ctx := context.Background()
		p := Policy{Limit: 10, Period: time.Second, Burst: 5}
		l := mustLimiter(t, s, p, Settings{Scope: "bad"})
		for _, est := range []int64{-1, math.MinInt64} {
			if _, err := l.Reserve(ctx, "k", est); !errors.Is(err, ErrInvalidCost) {
				t.Fatalf("estimate %d: %v", est, err)
			}
		}
		for _, est := range []int64{6, 1<<53 + 1, math.MaxInt64} {
			h := mustReserve(t, l, "k", est)
			if d := h.Decision(); d.Allowed || d.Reason != spillway.ReasonCostExceedsLimit || d.Remaining != 5 {
				t.Fatalf("estimate %d: %+v", est, d)
			}
		}
		h := mustReserve(t, l, "k", 2)
		for _, a := range []int64{-1, math.MinInt64} {
			if _, err := h.Settle(ctx, a); !errors.Is(err, ErrInvalidCost) {
				t.Fatalf("actual %d: %v", a, err)
			}
		}
		wantDecision(t, "still held", peek(t, l, "k"), true, 3, ms(200), 0)
		mustSettle(t, h, 1<<53+1, SettleApplied) // capped: 2 + 2·5 → debt bound
		wantDecision(t, "huge actual", peek(t, l, "k"), true, 0, ms(1000), 0)
		h = mustReserve(t, l, "k2", 2)
		mustSettle(t, h, 0, SettleApplied) // all given back
		wantDecision(t, "actual 0", peek(t, l, "k2"), true, 5, 0, 0)
		h = mustReserve(t, l, "k2", 1)
		mustSettle(t, h, 1<<62, SettleApplied)
		wantDecision(t, "actual 2^62", peek(t, l, "k2"), true, 0, ms(1000), 0)

		w := mustLimiter(t, s, Policy{Algorithm: SlidingWindowLog, Limit: 3, Period: time.Second})
		if _, err := w.Reserve(ctx, "k", 1); !errors.Is(err, ErrHoldUnsupported) {
			t.Fatalf("window: %v", err)
		}
		for _, alg := range []Algorithm{FixedWindow, SlidingWindowCounter} {
			if _, err := s.Reserve(ctx, []Item{{Scope: "w", Key: "k", Policy: Policy{Algorithm: alg, Limit: 3, Period: time.Second}, Cost: 1}}, 0); !errors.Is(err, ErrHoldUnsupported) {
				t.Fatalf("%s: %v", alg, err)
			}
		}
		// a span too long for holds
		long := Policy{Limit: 1, Period: time.Duration(1<<51+1) * time.Microsecond}
		if _, err := s.Reserve(ctx, []Item{{Scope: "l", Key: "k", Policy: long, Cost: 1}}, 0); !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("long span: %v", err)
		}
		for _, ttl := range []time.Duration{-1, time.Microsecond, MaxHoldTTL + time.Microsecond} {
			if _, err := s.Reserve(ctx, []Item{{Scope: "t", Key: "k", Policy: p, Cost: 1}}, ttl); err == nil {
				t.Fatalf("ttl %v: no error", ttl)
			}
		}
		if _, err := New(s, p, Settings{HoldTTL: time.Microsecond}); err == nil {
			t.Fatal("HoldTTL 1µs: no error")
		}
		if _, err := mustLimiter(t, wrappedStore{NewMemoryStore(MemorySettings{})}, p).Reserve(ctx, "k", 1); !errors.Is(err, ErrHoldUnsupported) {
			t.Fatalf("store without holds: %v", err)
		}
	})
}

// TestSettleResultString pins the names.
func TestSettleResultString(t *testing.T) {
	for r, want := range map[SettleResult]string{SettleApplied: "applied", SettleAlreadySettled: "already_settled", SettleExpired: "expired", 0: "settle_result(0)", 9: "settle_result(9)"} {
		if r.String() != want {
			t.Errorf("%d: %q, want %q", r, r.String(), want)
		}
	}
}
