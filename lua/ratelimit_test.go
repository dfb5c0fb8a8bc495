package lua

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

// The rate-limit scripts open with their contract and load on a real
// server under the SHA go-redis computes (so EVALSHA finds them).
func TestRateLimitScripts(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for name, sc := range map[string]struct {
		src    string
		script *redis.Script
	}{
		"ratelimit_batch.lua":        {ratelimitBatchSrc, RateLimitBatch},
		"ratelimit_token_bucket.lua": {ratelimitTokenBucketSrc, RateLimitTokenBucket},
		"ratelimit_buckets.lua":      {ratelimitBucketsSrc, RateLimitBuckets},
		"ratelimit_refund.lua":       {ratelimitRefundSrc, RateLimitRefund},
	} {
		if !strings.HasPrefix(sc.src, "-- "+name+":") {
			t.Errorf("%s does not open with its name and purpose", name)
		}
		head := sc.src[:strings.Index(sc.src, "\nlocal ")]
		for _, part := range []string{"KEYS[", "ARGV[", "Reply", "Writes"} {
			if !strings.Contains(head, part) {
				t.Errorf("%s: the opening contract does not mention %s", name, part)
			}
		}
		sha, err := sc.script.Load(ctx, c).Result()
		if err != nil {
			t.Fatalf("%s: SCRIPT LOAD: %v", name, err)
		}
		if sha != sc.script.Hash() {
			t.Errorf("%s: server SHA %s, go-redis %s", name, sha, sc.script.Hash())
		}
	}
}

// RateLimitBuckets replies its now, one wait per item and the TAT each item
// saw, lets an item see the charges of earlier items on its key, clamps a
// clock gone backwards, and writes only when every item has room.
func TestRateLimitBuckets(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T   = 100_000_000 // 100 s: the TTLs outlive any stall of the test
		tau = 5 * T
		now = 1_000_000_000_000
	)
	run := func(now string, keys []string, costs ...int64) []any {
		t.Helper()
		args := []any{now}
		for _, n := range costs {
			args = append(args, T, tau, n)
		}
		res, err := RateLimitBuckets.Run(ctx, c, keys, args...).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.([]any)
	}
	check := func(got []any, want ...int64) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("reply %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("reply %v, want %v", got, want)
			}
		}
	}
	state := func(key string, want string) {
		t.Helper()
		v, err := c.Get(ctx, key).Result()
		if want == "" {
			if err != redis.Nil {
				t.Fatalf("%s = %q (%v), want absent", key, v, err)
			}
			return
		}
		if err != nil || v != want {
			t.Fatalf("%s = %q (%v), want %q", key, v, err, want)
		}
	}
	if err := c.RPush(ctx, "k3", "x").Err(); err != nil {
		t.Fatal(err)
	}
	// k1 is charged 2 then 3 (the second item waits for the first), k2
	// peeked, k3 (a list) reads as full and is overwritten.
	check(run("1000000000000", []string{"k1", "k1", "k2", "k3"}, 2, 3, 0, 1), now, 0, 2*T, 0, 0, 0, now+2*T, 0, 0)
	state("k1", "1000500000000")
	state("k2", "")
	state("k3", "1000100000000")
	if ttl, err := c.PTTL(ctx, "k1").Result(); err != nil || ttl > 500*time.Second || ttl < 490*time.Second {
		t.Fatalf("PTTL k1 = %v (%v), want 500s", ttl, err)
	}
	// k1 is full: the batch is denied and nothing is written (not k2).
	check(run("1000000000000", []string{"k2", "k1"}, 1, 1), now, 0, tau, 0, now+tau)
	state("k2", "")
	state("k1", "1000500000000")
	// A clock gone backwards is clamped to TAT - tau; a cost above the
	// capacity is denied.
	check(run("0", []string{"k1", "k2"}, 0, 6), 0, tau, 0, now+tau, 0)
	state("k1", "1000500000000")
	state("k2", "")
	// Later: room again.
	check(run("1000300000000", []string{"k1"}, 1), now+3*T, 2*T, now+tau)
	state("k1", "1000600000000")
	// More keys than one MGET reads: the last one still sees its state.
	many := make([]string, 2500)
	costs := make([]int64, len(many))
	for i := range many {
		many[i] = fmt.Sprint("m", i)
		costs[i] = 1
	}
	many[len(many)-1] = "k1"
	got := run("1000300000000", many, costs...)
	want := make([]int64, 1+2*len(many))
	want[0] = now + 3*T
	want[len(many)] = 3 * T
	want[2*len(many)] = now + 6*T
	check(got, want...)
	state("m1999", "1000400000000")
	state("k1", "1000700000000")
}

// RateLimitRefund restores a bucket item's TAT from before the charge
// exactly when the key still holds what the charge wrote: it deletes the
// key only when there was no state, keeps a TAT at or before now (a clock
// that goes back is clamped by it) with the charge's TTL, undoes items last
// first (two items on one key), and gives back n·T when another charge
// landed in between.
func TestRateLimitRefundBucket(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T   = 100_000_000 // 100 s: the TTLs outlive any stall of the test
		tau = 5 * T
		now = 1_000_000_000_000
	)
	nowS := fmt.Sprint(now)
	charge := func(keys []string, costs ...int64) {
		t.Helper()
		args := []any{nowS}
		for _, n := range costs {
			args = append(args, T, tau, n)
		}
		if err := RateLimitBuckets.Run(ctx, c, keys, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// item: cost n, the TAT it saw (mark) and the TAT' it wrote.
	type item struct {
		key         string
		n           int64
		mark, wrote int64
	}
	refundArgs := func(items []item) ([]string, []any) {
		keys := make([]string, len(items))
		args := []any{nowS}
		for i, it := range items {
			keys[i] = it.key
			args = append(args, 0, 5, 5*T, 5, T, it.n, "", it.mark, it.wrote)
		}
		return keys, args
	}
	refund := func(want int64, items ...item) {
		t.Helper()
		keys, args := refundArgs(items)
		got, err := RateLimitRefund.Run(ctx, c, keys, args...).Int64()
		if err != nil || got != want {
			t.Fatalf("refund %+v: %d %v, want %d exactly restored", items, got, err, want)
		}
	}
	state := func(key string, want string, minTTL time.Duration) {
		t.Helper()
		v, err := c.Get(ctx, key).Result()
		if want == "" {
			if err != redis.Nil {
				t.Fatalf("%s = %q (%v), want absent", key, v, err)
			}
			return
		}
		if err != nil || v != want {
			t.Fatalf("%s = %q (%v), want %q", key, v, err, want)
		}
		if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl < minTTL || ttl > minTTL+10*time.Second {
			t.Fatalf("PTTL %s = %v (%v), want about %v", key, ttl, err, minTTL)
		}
	}

	// No state before the charge: the refund deletes the key.
	charge([]string{"a"}, 2)
	refund(1, item{"a", 2, 0, now + 2*T})
	state("a", "", 0)

	// A state the refund leaves not full: set back with its TTL.
	if err := c.Set(ctx, "b", now+2*T, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	charge([]string{"b"}, 1)
	refund(1, item{"b", 1, now + 2*T, now + 3*T})
	state("b", fmt.Sprint(now+2*T), 290*time.Second) // the charge's TTL

	// Two items on one key: undone last first, back to no state.
	charge([]string{"r", "r"}, 1, 2)
	refund(2, item{"r", 1, 0, now + T}, item{"r", 2, now + T, now + 3*T})
	state("r", "", 0)

	// Another charge landed after ours: n·T is given back (not exact).
	charge([]string{"x"}, 1)
	charge([]string{"x"}, 1)
	refund(0, item{"x", 1, 0, now + T})
	state("x", fmt.Sprint(now+T), 90*time.Second)

	// A state at or before now (full, but it clamps a clock that goes back)
	// is kept, not deleted, with the charge's TTL.
	if err := c.Set(ctx, "s", now-5, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	charge([]string{"s"}, 1)
	refund(1, item{"s", 1, now - 5, now + T})
	state("s", fmt.Sprint(now-5), 90*time.Second)
}
