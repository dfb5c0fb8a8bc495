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

// RateLimitBuckets replies one wait per item, lets an item see the charges
// of earlier items on its key, clamps a clock gone backwards, and writes
// only when every item has room.
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
	check(run("1000000000000", []string{"k1", "k1", "k2", "k3"}, 2, 3, 0, 1), 0, 2*T, 0, 0)
	state("k1", "1000500000000")
	state("k2", "")
	state("k3", "1000100000000")
	if ttl, err := c.PTTL(ctx, "k1").Result(); err != nil || ttl > 500*time.Second || ttl < 490*time.Second {
		t.Fatalf("PTTL k1 = %v (%v), want 500s", ttl, err)
	}
	// k1 is full: the batch is denied and nothing is written (not k2).
	check(run("1000000000000", []string{"k2", "k1"}, 1, 1), 0, tau)
	state("k2", "")
	state("k1", "1000500000000")
	// A clock gone backwards is clamped to TAT - tau; a cost above the
	// capacity is denied.
	check(run("0", []string{"k1", "k2"}, 0, 6), tau, 0)
	state("k1", "1000500000000")
	state("k2", "")
	// Later: room again.
	check(run("1000300000000", []string{"k1"}, 1), 2*T)
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
	want := make([]int64, len(many))
	want[len(many)-1] = 3 * T
	check(got, want...)
	state("m1999", "1000400000000")
	state("k1", "1000700000000")
}
