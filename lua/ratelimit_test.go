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
		"ratelimit_hold.lua":         {ratelimitHoldSrc, RateLimitHold},
		"ratelimit_settle.lua":       {ratelimitSettleSrc, RateLimitSettle},
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
			args = append(args, 0, T, it.n, "", it.mark, 0, 0, it.wrote, 0, 0)
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

// RateLimitRefund restores a window's state from before the charge when
// the key still holds what the charge wrote (even a past window, which
// clamps a clock that goes back), and otherwise takes the cost off the
// charged window.
func TestRateLimitRefundWindows(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	cases := []struct {
		name, key, before string
		alg, n            int64
		old, wrote        [3]int64
		want              string // "" absent
		exact             int64
	}{
		{"fixed: past window restored", "f1", "8:1", 2, 1, [3]int64{7, 2}, [3]int64{8, 1}, "7:2", 1},
		{"fixed: no state before", "f2", "8:1", 2, 1, [3]int64{}, [3]int64{8, 1}, "", 1},
		{"fixed: charged since", "f3", "8:3", 2, 1, [3]int64{}, [3]int64{8, 1}, "8:2", 0},
		{"counter: past window restored", "c1", "9:2:1", 4, 1, [3]int64{8, 1, 2}, [3]int64{9, 2, 1}, "8:1:2", 1},
		{"counter: no state before", "c2", "9:0:3", 4, 3, [3]int64{}, [3]int64{9, 0, 3}, "", 1},
		{"counter: charged window now the previous", "c3", "10:3:0", 4, 1, [3]int64{8, 1, 2}, [3]int64{9, 2, 1}, "10:2:0", 0},
	}
	for _, tc := range cases {
		if err := c.Set(ctx, tc.key, tc.before, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := RateLimitRefund.Run(ctx, c, []string{tc.key}, "1000000000000", tc.alg, 1000, tc.n, "",
			tc.old[0], tc.old[1], tc.old[2], tc.wrote[0], tc.wrote[1], tc.wrote[2]).Int64()
		if err != nil || got != tc.exact {
			t.Fatalf("%s: refund replied %d %v, want %d", tc.name, got, err, tc.exact)
		}
		v, err := c.Get(ctx, tc.key).Result()
		if tc.want == "" && err != redis.Nil || tc.want != "" && (err != nil || v != tc.want) {
			t.Fatalf("%s: %s = %q (%v), want %q", tc.name, tc.key, v, err, tc.want)
		}
		if tc.want != "" {
			if ttl, err := c.PTTL(ctx, tc.key).Result(); err != nil || ttl < 50*time.Minute {
				t.Fatalf("%s: PTTL %v (%v), want the hour kept", tc.name, ttl, err)
			}
		}
	}
}
