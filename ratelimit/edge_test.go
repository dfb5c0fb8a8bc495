package ratelimit

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/testclock"
)

// TestStoresAgreeAtTheEdge reproduces an edge-of-range bug. The
// policy {Limit: 1e6, Period: 1s, Burst: 2^53} used to be accepted, and a
// cost of 2^53+1 reached the Redis scripts as a Lua double rounded to
// 2^53: alone it was reported CostExceedsLimit while the bucket was
// drained; in a batch of buckets the batch was denied and the other item
// charged; in a mixed batch it was allowed over capacity. The memory store
// denied it and charged nothing.
//
// That policy is now rejected (Burst·T must stay within MaxSpanMicros =
// 2^52 µs, where every number the scripts form is exact), and at the new
// edge, Burst 2^52, both stores deny every cost above the burst without
// charging anything, alone and in both kinds of batch, and agree on every
// decision.
func TestStoresAgreeAtTheEdge(t *testing.T) {
	_, rdb := redisServer(t)
	ctx := context.Background()
	for _, burst := range []int64{1 << 53, MaxSpanMicros} {
		p := Policy{Limit: 1e6, Period: time.Second, Burst: burst}
		if burst == 1<<53 {
			if err := p.Validate(); err != nil {
				if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "burst 9007199254740992") {
					t.Fatalf("burst 2^53 rejected with %v, want an ErrInvalidPolicy naming the burst", err)
				}
				continue
			}
		}
		clk := testclock.New(rt0)
		mem := NewMemoryStore(MemorySettings{Clock: clk.Now})
		red := mustRedisStore(rdb, RedisSettings{Clock: clk.Now, Prefix: "edge:"})
		fw := Policy{Algorithm: FixedWindow, Limit: 5, Period: time.Second}
		for _, cost := range []int64{burst + 1, 1<<53 + 1, 1 << 62, math.MaxInt64} {
			batches := map[string][]Item{
				"alone":   {{Scope: "s", Key: "a", Policy: p, Cost: cost}},
				"buckets": {{Scope: "s", Key: "b", Policy: p, Cost: 1}, {Scope: "s", Key: "a", Policy: p, Cost: cost}},
				"mixed":   {{Scope: "w", Key: "c", Policy: fw, Cost: 1}, {Scope: "s", Key: "a", Policy: p, Cost: cost}},
			}
			for name, items := range batches {
				outs := [2][]spillway.Decision{make([]spillway.Decision, len(items)), make([]spillway.Decision, len(items))}
				for i, st := range []Store{mem, red} {
					ok, err := st.Decide(ctx, items, outs[i])
					if err != nil || ok {
						t.Fatalf("burst %d, cost %d, %s, store %d: allowed %v, err %v: %+v", burst, cost, name, i, ok, err, outs[i])
					}
					last := outs[i][len(items)-1]
					if last.Reason != spillway.ReasonCostExceedsLimit || last.Remaining != burst || last.RetryAfter != 0 {
						t.Fatalf("burst %d, cost %d, %s, store %d: %+v, want CostExceedsLimit with all %d remaining", burst, cost, name, i, last, burst)
					}
				}
				for j := range items {
					if outs[0][j] != outs[1][j] {
						t.Fatalf("burst %d, cost %d, %s, item %d: memory %+v, redis %+v", burst, cost, name, j, outs[0][j], outs[1][j])
					}
				}
			}
		}
		// Nothing was charged: every key is still full on both stores,
		// and Redis holds no key at all.
		if n, err := rdb.Keys(ctx, "edge:*").Result(); err != nil || len(n) != 0 {
			t.Fatalf("burst %d: Redis holds %v (%v) after denials only", burst, n, err)
		}
		for _, it := range []Item{{Scope: "s", Key: "a", Policy: p}, {Scope: "s", Key: "b", Policy: p}, {Scope: "w", Key: "c", Policy: fw}} {
			for i, st := range []Store{mem, red} {
				var out [1]spillway.Decision
				if _, err := st.Decide(ctx, []Item{it}, out[:]); err != nil || out[0].Remaining != it.Policy.Capacity() {
					t.Fatalf("burst %d: store %d, %s/%s after denials: %+v %v", burst, i, it.Scope, it.Key, out[0], err)
				}
			}
		}
		// The whole burst still fits in one request, on both.
		for i, st := range []Store{mem, red} {
			var out [1]spillway.Decision
			if ok, err := st.Decide(ctx, []Item{{Scope: "s", Key: "a", Policy: p, Cost: burst}}, out[:]); err != nil || !ok || out[0].Remaining != 0 {
				t.Fatalf("burst %d: store %d, cost = burst: %v %+v %v", burst, i, ok, out[0], err)
			}
		}
	}
}

// TestValidateAtTheExactEdges: the largest accepted numbers are accepted
// and one more is rejected with an error naming the field.
func TestValidateAtTheExactEdges(t *testing.T) {
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	cases := []struct {
		p    Policy
		want string // "" valid
	}{
		{Policy{Limit: 1e6, Period: time.Second, Burst: MaxSpanMicros}, ""},
		{Policy{Limit: 1e6, Period: time.Second, Burst: MaxSpanMicros + 1}, "burst 4503599627370497 × interval 1µs exceeds 2^52"},
		{Policy{Algorithm: GCRA, Limit: 3, Period: us(10), Burst: MaxSpanMicros / 4}, ""}, // T = 4
		{Policy{Algorithm: GCRA, Limit: 3, Period: us(10), Burst: MaxSpanMicros/4 + 1}, "exceeds 2^52"},
		{Policy{Algorithm: LeakyBucket, Limit: 1, Period: us(MaxSpanMicros)}, ""},
		{Policy{Algorithm: LeakyBucket, Limit: 1, Period: us(MaxSpanMicros + 1)}, "period"},
		{Policy{Algorithm: FixedWindow, Limit: 2, Period: us(MaxSpanMicros)}, ""},                 // L·P = 2^53
		{Policy{Algorithm: SlidingWindowCounter, Limit: 3, Period: us(MaxSpanMicros)}, "limit 3"}, // L·P > 2^53
		{Policy{Algorithm: SlidingWindowLog, Limit: 100000, Period: 24 * time.Hour}, ""},
		{Policy{Limit: math.MaxInt64, Period: time.Second}, "more than one per microsecond"},
		{Policy{Limit: 1, Period: time.Second, Burst: math.MaxInt64}, "exceeds 2^52"},
	}
	for _, c := range cases {
		err := c.p.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v, want valid", c.p, err)
		case c.want != "" && (err == nil || !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want an ErrInvalidPolicy containing %q", c.p, err, c.want)
		}
	}
}
