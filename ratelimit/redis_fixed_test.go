package ratelimit

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

// A coalesced call of fixed windows sends a group's codes once when the
// next groups repeat them: their sizes are negative.
func TestFixedArgsRepeatCodes(t *testing.T) {
	fw := func(limit int64, cost int64) Item {
		return Item{Key: "k", Cost: cost, Policy: Policy{Algorithm: FixedWindow, Limit: limit, Period: time.Second}}
	}
	a := []Item{fw(10, 1), fw(20, 1), fw(10, 1)}
	b := []Item{fw(10, 1), fw(20, 3), fw(10, 1)}
	var args bucketsArgs
	for _, g := range [][]Item{a, a, a, b, b, a, a[:2]} {
		args.addFixed(g)
	}
	if want := []int{3, -3, -3, 3, -3, 3, 2}; !slices.Equal(args.sizes, want) {
		t.Fatalf("sizes %v, want %v", args.sizes, want)
	}
	want := []int64{1, 2, 1 /* a */, 1, -2, 3, 1 /* b */, 1, 2, 1 /* a */, 1, 2 /* a[:2] */}
	if !slices.Equal(args.codes, want) {
		t.Fatalf("codes %v, want %v", args.codes, want)
	}
	// the bucket family's script never gets a negative size
	var bk bucketsArgs
	tb := []Item{{Key: "k", Cost: 1, Policy: Policy{Algorithm: TokenBucket, Limit: 10, Period: time.Second}}}
	bk.add(tb)
	bk.add(tb)
	if !slices.Equal(bk.sizes, []int{1, 1}) {
		t.Fatalf("buckets sizes %v, want [1 1]", bk.sizes)
	}
}

// On Redis's clock a key that already holds the current window is
// rewritten with KEEPTTL: the TTL its window's first charge set (the
// window's end) stands; a new window's key gets its TTL. The counts are
// exact, coalesced or not.
func TestFixedWindowKeepsTTL(t *testing.T) {
	_, c := redisServer(t)
	ctx := context.Background()
	s := mustRedisStore(c, RedisSettings{Prefix: "fk:"})
	p := Policy{Algorithm: FixedWindow, Limit: 50, Period: time.Hour}
	if left := p.Period - time.Duration(time.Now().UnixNano())%p.Period; left < 20*time.Second {
		time.Sleep(left + 100*time.Millisecond) // not across a window's end
	}
	items := []Item{{Key: "a", Cost: 1, Policy: p}, {Key: "b", Cost: 2, Policy: p}}
	keys := []string{redisKey("fk:", &items[0]), redisKey("fk:", &items[1])}
	out := make([]spillway.Decision, 2)
	for call := int64(1); call <= 3; call++ {
		ok, err := s.Decide(ctx, items, out)
		if err != nil || !ok {
			t.Fatalf("call %d: %v %v", call, ok, err)
		}
		for i, k := range keys {
			if want := p.Limit - call*items[i].Cost; out[i].Remaining != want {
				t.Fatalf("call %d item %d: remaining %d, want %d", call, i, out[i].Remaining, want)
			}
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			switch call {
			case 1: // set by the charge: the window's end
				if ttl < out[i].ResetAfter-100*time.Millisecond || ttl > out[i].ResetAfter+time.Millisecond {
					t.Fatalf("PTTL %s = %v, want the reset %v", k, ttl, out[i].ResetAfter)
				}
				// a TTL the next charges must keep (none would set it)
				if err := c.PExpire(ctx, k, p.Period+time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			default:
				if ttl < p.Period {
					t.Fatalf("call %d: PTTL %s = %v, want the TTL set after call 1 kept (> %v)", call, k, ttl, p.Period)
				}
			}
		}
	}
	// coalesced: 20 callers on the same keys, each charge counted once
	done := make(chan bool)
	for range 20 {
		go func() {
			out := make([]spillway.Decision, 2)
			ok, err := s.Decide(ctx, items, out)
			done <- ok && err == nil
		}()
	}
	for range 20 {
		if !<-done {
			t.Fatal("a coalesced call was denied or failed")
		}
	}
	w := strconv.FormatInt(time.Now().UnixMicro()/p.Period.Microseconds(), 10)
	for i, k := range keys {
		v, err := c.Get(ctx, k).Result()
		if want := w + ":" + strconv.FormatInt(23*items[i].Cost, 10); err != nil || v != want {
			t.Fatalf("%s = %q (%v), want %q", k, v, err, want)
		}
	}
	// a new window's key gets its TTL
	items[0].Key = "c"
	if ok, err := s.Decide(ctx, items[:1], out); err != nil || !ok {
		t.Fatalf("new key: %v %v", ok, err)
	}
	if ttl, err := c.PTTL(ctx, redisKey("fk:", &items[0])).Result(); err != nil || ttl <= 0 || ttl > out[0].ResetAfter+time.Millisecond {
		t.Fatalf("new key: PTTL %v (%v), want (0, %v]", ttl, err, out[0].ResetAfter)
	}
}
