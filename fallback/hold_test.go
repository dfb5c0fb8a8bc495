package fallback_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/ratelimit"
)

// TestReserveHoldsOnTheLocalShareWhileRedisIsDown: with Redis up a
// reservation is held by Redis; while Redis refuses connections it is held
// by the local share (degraded) and settles there; a fail-closed item
// denies it; a hold Redis made settles on Redis once it is back; bad input
// is an error that never counts against the breaker.
func TestReserveHoldsOnTheLocalShareWhileRedisIsDown(t *testing.T) {
	b := newBed(t)
	b.warm(t)
	st := b.fallback(t, fallback.Settings{OpenTimeout: 2 * time.Second})
	ctx := context.Background()
	item := func(key string, est int64) []ratelimit.Item {
		return []ratelimit.Item{{Scope: "tokens", Key: key, Policy: hourly, Cost: est}}
	}

	// Redis up: Redis holds.
	h, err := st.Reserve(ctx, item("alice", 10), time.Minute)
	if err != nil || !rateHooks.Allowed(h) || h.Decision().Degraded || h.Decision().Remaining != 90 {
		t.Fatalf("reserve with Redis up: %v %+v", err, h)
	}
	if r, err := h.Settle(ctx, 4); err != nil || r != ratelimit.SettleApplied {
		t.Fatalf("settle with Redis up: %v %v", r, err)
	}
	if d := decide(t, b.directStore(t), "tokens", "alice", hourly, 0); d.Remaining != 96 {
		t.Fatalf("Redis after the settle: %+v, want 96 left", d)
	}
	onRedis, err := st.Reserve(ctx, item("carol", 7), time.Minute)
	if err != nil || !rateHooks.Allowed(onRedis) || onRedis.Decision().Degraded {
		t.Fatalf("reserve on Redis: %v %+v", err, onRedis)
	}

	// Redis down: the local share (20 of 100) holds and settles.
	b.setMode(t, faultproxy.Refuse)
	h, err = st.Reserve(ctx, item("bob", 15), time.Minute)
	if err != nil || !rateHooks.Allowed(h) || !h.Decision().Degraded || h.Decision().Remaining != 5 {
		t.Fatalf("reserve with Redis down: %v %+v", err, h.Decision())
	}
	if r, err := h.Settle(ctx, 3); err != nil || r != ratelimit.SettleApplied {
		t.Fatalf("local settle: %v %v", r, err)
	}
	if d := decide(t, st, "tokens", "bob", hourly, 0); !d.Degraded || d.Remaining != 17 {
		t.Fatalf("local share after the settle: %+v, want 17 left, degraded", d)
	}
	// more than the share but not than the limit: not "never"
	h, err = st.Reserve(ctx, item("dave", 30), time.Minute)
	if d := h.Decision(); err != nil || rateHooks.Allowed(h) || d.Reason != spillway.ReasonRateLimited || d.RetryAfter != 2*time.Second || !d.Degraded {
		t.Fatalf("estimate above the share: %v %+v", err, d)
	}
	// a fail-closed item denies the reservation; nothing is held
	closed := append(item("erin", 1), ratelimit.Item{Scope: "login", Key: "erin", Policy: hourly, Cost: 1, Fail: spillway.FailClosed})
	h, err = st.Reserve(ctx, closed, time.Minute)
	if err != nil || rateHooks.Allowed(h) || rateHooks.Decisions(h)[1].Reason != spillway.ReasonFailClosed || !rateHooks.Decisions(h)[0].Allowed || rateHooks.Decisions(h)[0].Remaining != 20 {
		t.Fatalf("fail-closed reservation: %v %+v", err, rateHooks.Decisions(h))
	}
	if _, err := h.Settle(ctx, 1); !errors.Is(err, rateHooks.ErrNotHeld) {
		t.Fatalf("settle of a denied reservation: %v", err)
	}
	// the hold Redis made cannot settle while Redis is down…
	if _, err := onRedis.Settle(ctx, 2); err == nil {
		t.Fatal("settle of a Redis hold with Redis down: no error")
	}
	// …and bad input is an error, not a backend failure
	state := st.State()
	if _, err := st.Reserve(ctx, item("bad", -1), time.Minute); !errors.Is(err, ratelimit.ErrInvalidCost) {
		t.Fatalf("negative estimate: %v", err)
	}
	if _, err := st.Reserve(ctx, []ratelimit.Item{{Scope: "w", Key: "k", Policy: ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: 5, Period: time.Minute}, Cost: 1}}, 0); !errors.Is(err, ratelimit.ErrHoldUnsupported) {
		t.Fatalf("window: %v", err)
	}
	if st.State() != state {
		t.Fatalf("bad input moved the breaker from %v to %v", state, st.State())
	}

	// Redis back: the Redis hold settles there (a retry of the failed settle).
	b.setMode(t, faultproxy.Pass)
	waitFor(t, "a settle on Redis", func() bool {
		r, err := onRedis.Settle(ctx, 2)
		return err == nil && r == ratelimit.SettleApplied
	})
	if d := decide(t, b.directStore(t), "tokens", "carol", hourly, 0); d.Remaining != 98 {
		t.Fatalf("Redis after the late settle: %+v, want 98 left", d)
	}
}
