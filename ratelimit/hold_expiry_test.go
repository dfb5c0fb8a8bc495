package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// TestHoldExpiresUnsettled is the differential test of holds left
// unsettled past their TTL in real time, on the memory store, a
// redis-server and a 3×3 Cluster, the Redis stores on Redis TIME with no
// hook holding their keys' TTLs: every kind of touch of the key — a
// decision, a peek, a reservation, a settle of another hold — first gives
// back the expired hold's estimate, and a late settle of the expired hold
// reports SettleExpired and changes nothing. The stores must agree on
// every decision and every settle result.
func TestHoldExpiresUnsettled(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t)
	stores := []struct {
		name string
		s    Store
		c    redis.UniversalClient
	}{
		{"memory", NewMemoryStore(MemorySettings{}), nil},
		{"redis", mustRedisStore(srv.Client(t)), srv.Client(t)},
		{"cluster", mustRedisStore(cl.Client(t)), cl.Client(t)},
	}
	ctx := context.Background()
	// T = 36 s: nothing refills within the test, so every Remaining is exact.
	p := Policy{Limit: 100, Period: time.Hour}
	const ttl = 400 * time.Millisecond
	type run struct {
		l       *Limiter
		expired map[string]*Hold // the hold of 80 left to expire, per key
		other   *Hold            // the settle key's live hold of 10
		c       redis.UniversalClient
		rawKey  func(key string) string
	}
	runs := make([]*run, len(stores))
	keys := []string{"decision", "peek", "reserve", "settle"}
	for i, st := range stores {
		l, err := New(st.s, p, Settings{Scope: "exp", HoldTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		r := &run{l: l, expired: map[string]*Hold{}, c: st.c}
		r.rawKey = func(key string) string {
			return redisKey("spillway:", &Item{Scope: "exp", Key: key, Policy: p})
		}
		for _, k := range keys {
			h := mustReserve(t, l, k, 80)
			if !h.allowed || h.Decision().Remaining != 20 {
				t.Fatalf("%s: reserve 80 on %s: %+v", st.name, k, h.Decision())
			}
			r.expired[k] = h
		}
		lt, err := New(st.s, p, Settings{Scope: "exp", HoldTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		r.other = mustReserve(t, lt, "settle", 10)
		if !r.other.allowed || r.other.Decision().Remaining != 10 {
			t.Fatalf("%s: reserve 10 on settle: %+v", st.name, r.other.Decision())
		}
		runs[i] = r
	}
	time.Sleep(ttl + 500*time.Millisecond)

	for i, st := range stores {
		r := runs[i]
		see := func(what string, d spillway.Decision, allowed bool, remaining int64) {
			t.Helper()
			if d.Allowed != allowed || d.Remaining != remaining {
				t.Errorf("%s: %s: allowed %v remaining %d, want %v %d (%+v)", st.name, what, d.Allowed, d.Remaining, allowed, remaining, d)
			}
		}
		d, err := r.l.Allow(ctx, "decision", 100)
		if err != nil {
			t.Fatal(err)
		}
		see("AllowN(100) after the hold of 80 expired", d, true, 0)
		d, err = r.l.Allow(ctx, "peek", 0)
		if err != nil {
			t.Fatal(err)
		}
		see("peek after the hold expired", d, true, 100)
		h := mustReserve(t, r.l, "reserve", 100)
		see("Reserve(100) after the hold expired", h.Decision(), true, 0)
		if res, err := h.Settle(ctx, 0); err != nil || res != SettleApplied {
			t.Fatalf("%s: settle the new hold: %v %v", st.name, res, err)
		}
		see("peek after the new hold settled to 0", peek(t, r.l, "reserve"), true, 100)
		if res, err := r.other.Settle(ctx, 10); err != nil || res != SettleApplied {
			t.Fatalf("%s: settle the live hold: %v %v", st.name, res, err)
		}
		see("peek after settling the live hold (the expired one released)", peek(t, r.l, "settle"), true, 90)

		// A late settle of an expired hold changes nothing, the key's
		// bytes included.
		var before []any
		if r.c != nil {
			before = rawState(t, r.c, r.rawKey("decision"))
		}
		for _, k := range keys {
			if res, err := r.expired[k].Settle(ctx, 80); err != nil || res != SettleExpired {
				t.Errorf("%s: late settle on %s: %v %v, want expired", st.name, k, res, err)
			}
		}
		if r.c != nil {
			if after := rawState(t, r.c, r.rawKey("decision")); after[0] != before[0] || after[1] != before[1] {
				t.Errorf("%s: the late settle changed the key: %v, then %v", st.name, before, after)
			}
		}
		see("peek after the late settles", peek(t, r.l, "decision"), true, 0)
		see("peek after the late settles", peek(t, r.l, "settle"), true, 90)
	}
}

// rawState is a key's value and its expiry time (PEXPIRETIME), as bytes
// and ms.
func rawState(t *testing.T, c redis.UniversalClient, key string) []any {
	t.Helper()
	ctx := context.Background()
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	e, err := c.Do(ctx, "PEXPIRETIME", key).Int64()
	if err != nil {
		t.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	return []any{v, e}
}
