package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
)

// TestRedisStoreCluster runs against a real 3-primary/3-replica Cluster:
// batches whose items span slots (and primaries) are decided all or
// nothing, partial denials are refunded exactly for every algorithm, and
// the differential test holds across slots.
func TestRedisStoreCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	ctx := context.Background()

	t.Run("slots", func(t *testing.T) {
		c := cl.Client(t)
		s := mustRedisStore(c)
		// Entities whose keys land on three different primaries.
		owners := map[string]bool{}
		for _, e := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
			k := redisKey("spillway:", &Item{Scope: "x", Key: e})
			sl, err := cl.KeySlot(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if sl != slot(k) {
				t.Fatalf("slot(%q) = %d, CLUSTER KEYSLOT = %d", k, slot(k), sl)
			}
			o, err := cl.Owner(ctx, sl)
			if err != nil {
				t.Fatal(err)
			}
			owners[o.Addr] = true
		}
		if len(owners) < 2 {
			t.Fatalf("keys landed on %d primaries, want several", len(owners))
		}
		p := Policy{Limit: 10, Period: time.Minute}
		var items []Item
		for _, e := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
			items = append(items, Item{Scope: "x", Key: e, Policy: p, Cost: 2}, Item{Scope: "y", Key: e, Policy: p, Cost: 1})
		}
		out := make([]spillway.Decision, len(items))
		ok, err := s.Decide(ctx, items, out)
		if err != nil || !ok {
			t.Fatalf("cross-slot batch: %v %v", ok, err)
		}
		for i := range items {
			if want := 10 - items[i].Cost; out[i].Remaining != want {
				t.Fatalf("item %d remaining %d, want %d", i, out[i].Remaining, want)
			}
		}
	})

	for a := Algorithm(0); a < numAlgorithms; a++ {
		t.Run("refund/"+a.String(), func(t *testing.T) {
			c := cl.Client(t)
			clk := testclock.New(rt0)
			prefix := "refund-" + a.String() + ":"
			s := mustRedisStore(c, RedisSettings{Clock: clk.Now, Prefix: prefix})
			p := Policy{Algorithm: a, Limit: 5, Period: time.Minute}
			full := Policy{Algorithm: a, Limit: 1, Period: time.Minute}
			out := make([]spillway.Decision, 4)
			// "z" is exhausted; "a", "b", "c" have room and live on other slots.
			if ok, err := s.Decide(ctx, []Item{{Scope: "z", Key: "z", Policy: full, Cost: 1}}, out); err != nil || !ok {
				t.Fatal(ok, err)
			}
			if ok, err := s.Decide(ctx, []Item{{Scope: "p", Key: "a", Policy: p, Cost: 1}}, out); err != nil || !ok {
				t.Fatal(ok, err)
			}
			clk.Advance(time.Millisecond)
			batch := []Item{
				{Scope: "p", Key: "a", Policy: p, Cost: 2},
				{Scope: "p", Key: "b", Policy: p, Cost: 3},
				{Scope: "p", Key: "c", Policy: p, Cost: 1},
				{Scope: "z", Key: "z", Policy: full, Cost: 1},
			}
			slots := map[int]bool{}
			for i := range batch {
				sl, err := cl.KeySlot(ctx, redisKey(prefix, &batch[i]))
				if err != nil {
					t.Fatal(err)
				}
				slots[sl] = true
			}
			if len(slots) != 4 {
				t.Fatalf("batch spans %d slots, want 4", len(slots))
			}
			for round := 0; round < 3; round++ {
				ok, err := s.Decide(ctx, batch, out)
				if err != nil || ok {
					t.Fatalf("round %d: %v %v, want denied", round, ok, err)
				}
				if !out[0].Allowed || !out[1].Allowed || !out[2].Allowed || out[3].Allowed {
					t.Fatalf("round %d decisions %+v", round, out)
				}
				if out[0].Remaining != 2 || out[1].Remaining != 2 || out[2].Remaining != 4 {
					t.Fatalf("round %d: remaining %d %d %d, want 2 2 4 (as if charged, after refunds)", round, out[0].Remaining, out[1].Remaining, out[2].Remaining)
				}
			}
			// Everything the denied batches charged was given back.
			for _, c := range []struct {
				key  string
				want int64
			}{{"a", 4}, {"b", 5}, {"c", 5}} {
				ok, err := s.Decide(ctx, []Item{{Scope: "p", Key: c.key, Policy: p}}, out)
				if err != nil || !ok || out[0].Remaining != c.want {
					t.Fatalf("peek %s: %v %v %+v, want %d remaining", c.key, ok, err, out[0], c.want)
				}
			}
			// A key the refund emptied is deleted.
			for _, it := range batch[1:3] {
				k := redisKey(prefix, &it)
				if n, err := c.Exists(ctx, k).Result(); err != nil || n != 0 {
					t.Fatalf("%s exists (%d, %v), want deleted by the refund", k, n, err)
				}
			}
		})
	}

	// A refund restores the state from before the charge, as the memory
	// store (which charges nothing) keeps it, even when that state is full
	// or in a past window: a clock that then goes back is clamped by it
	// (algorithms.go), so forgetting it would give more room.
	for a := Algorithm(0); a < numAlgorithms; a++ {
		t.Run("refund-restores-state/"+a.String(), func(t *testing.T) {
			c := cl.Client(t)
			clk := testclock.New(rt0) // rt0 starts a minute: a window boundary
			prefix := "refund-state-" + a.String() + ":"
			rs := mustRedisStore(c, RedisSettings{Clock: clk.Now, Prefix: prefix})
			ms := NewMemoryStore(MemorySettings{Clock: clk.Now})
			p := Policy{Algorithm: a, Limit: 5, Period: time.Minute} // T = 12 s
			a1 := Item{Scope: "p", Key: "a", Policy: p, Cost: 1}
			z := Item{Scope: "z", Key: "z", Policy: p, Cost: 6} // above the capacity: always denied
			if rk, zk := redisKey(prefix, &a1), redisKey(prefix, &z); slot(rk) == slot(zk) {
				t.Fatalf("%s and %s share a slot; change the entity names", rk, zk)
			}
			outR := make([]spillway.Decision, 2)
			outM := make([]spillway.Decision, 2)
			step := func(what string, items []Item, wantOK bool) {
				t.Helper()
				okR, errR := rs.Decide(ctx, items, outR)
				okM, errM := ms.Decide(ctx, items, outM)
				if errR != nil || errM != nil || okR != wantOK || okM != wantOK {
					t.Fatalf("%s: redis %v %v, memory %v %v; want %v", what, okR, errR, okM, errM, wantOK)
				}
				for i := range items {
					if outR[i] != outM[i] {
						t.Fatalf("%s item %d:\n redis  %+v\n memory %+v", what, i, outR[i], outM[i])
					}
				}
			}
			step("charge a", []Item{a1}, true) // bucket: TAT rt0+12s; windows: 1 in the first minute
			clk.Advance(70 * time.Second)      // a is full again, in the next window
			step("denied batch", []Item{a1, z}, false)
			if !outR[0].Allowed {
				t.Fatalf("a was not charged on its slot: %+v", outR[0])
			}
			if a == TokenBucket || a == GCRA || a == LeakyBucket {
				want := fmt.Sprint(rt0.Add(12 * time.Second).UnixMicro())
				if v, err := c.Get(ctx, redisKey(prefix, &a1)).Result(); err != nil || v != want {
					t.Fatalf("after the refund a holds %q (%v), want the TAT from before the charge, %s", v, err, want)
				}
			}
			// Back before the old TAT, into the first window: the old charge
			// still counts (3 left after this one; without the state, 4).
			// The log's entry left the window at the denied batch, which
			// trimmed it on both stores.
			clk.Advance(-63 * time.Second)
			step("clock gone back", []Item{a1}, true)
			want := int64(3)
			if a == SlidingWindowLog {
				want = 4
			}
			if outR[0].Remaining != want {
				t.Fatalf("after the clock went back: %+v, want %d remaining", outR[0], want)
			}
		})
	}

	// With Redis TIME the hot paths write a TAT compact ("r" PXAT E); a
	// refund of a denied cross-slot batch leaves each key byte for byte
	// as it was, expiry included, and deletes a key that had no state.
	t.Run("refund-byte-for-byte", func(t *testing.T) {
		c := cl.Client(t)
		prefix := "refund-bytes:"
		s := mustRedisStore(c, RedisSettings{Prefix: prefix})
		p := Policy{Limit: 5, Period: time.Minute} // T = 12 s
		a := Item{Scope: "p", Key: "a", Policy: p, Cost: 2}
		b := Item{Scope: "p", Key: "b", Policy: p, Cost: 1}
		z := Item{Scope: "z", Key: "z", Policy: p, Cost: 6} // above the capacity: always denied
		out := make([]spillway.Decision, 3)
		if ok, err := s.Decide(ctx, []Item{a}, out); err != nil || !ok {
			t.Fatal(ok, err)
		}
		ka, kb := redisKey(prefix, &a), redisKey(prefix, &b)
		if slot(ka) == slot(redisKey(prefix, &z)) || slot(kb) == slot(redisKey(prefix, &z)) {
			t.Fatal("test keys share a slot with z; change the entity names")
		}
		before := rawState(t, c, ka)
		if v := before[0].(string); len(v) > 3 {
			t.Fatalf("a holds %q, want the compact form (at most 3 digits)", v)
		}
		for round := 0; round < 3; round++ {
			ok, err := s.Decide(ctx, []Item{a, b, z}, out)
			if err != nil || ok || !out[0].Allowed || !out[1].Allowed {
				t.Fatalf("round %d: %v %v %+v, want denied by z alone", round, ok, err, out)
			}
			if after := rawState(t, c, ka); after[0] != before[0] || after[1] != before[1] {
				t.Fatalf("round %d: a after the refund: %q PXAT %v, want %q PXAT %v", round, after[0], after[1], before[0], before[1])
			}
			if n, err := c.Exists(ctx, kb).Result(); err != nil || n != 0 {
				t.Fatalf("round %d: b exists (%d, %v) after the refund, want no state", round, n, err)
			}
		}
	})

	t.Run("refund-after-error", func(t *testing.T) {
		c := cl.Client(t, func(o *redis.ClusterOptions) {
			o.ReadTimeout = 200 * time.Millisecond
			o.MaxRetries = -1
		})
		s := mustRedisStore(c, RedisSettings{Prefix: "err:"})
		p := Policy{Limit: 5, Period: time.Minute}
		batch := []Item{{Scope: "p", Key: "a", Policy: p, Cost: 2}, {Scope: "p", Key: "b", Policy: p, Cost: 2}, {Scope: "p", Key: "z", Policy: p, Cost: 1}}
		out := make([]spillway.Decision, 3)
		if ok, err := s.Decide(ctx, batch, out); err != nil || !ok { // warm up connections and scripts
			t.Fatal(ok, err)
		}
		// Pause the primary of z (not of a or b): its group times out.
		owner, err := cl.OwnerOfKey(ctx, redisKey("err:", &batch[2]))
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range batch[:2] {
			o, err := cl.OwnerOfKey(ctx, redisKey("err:", &it))
			if err != nil {
				t.Fatal(err)
			}
			if o == owner {
				t.Fatal("test keys share a primary; change the entity names (the test needs them on different primaries)")
			}
		}
		if err := owner.Pause(); err != nil {
			t.Fatal(err)
		}
		ok, err := s.Decide(ctx, batch, out)
		if rerr := owner.Resume(); rerr != nil {
			t.Fatal(rerr)
		}
		if err == nil || ok {
			t.Fatalf("batch with a paused primary: %v %v, want an error", ok, err)
		}
		if strings.Contains(err.Error(), "refund") {
			t.Fatalf("refund failed: %v", err)
		}
		for _, it := range batch[:2] {
			it.Cost = 0
			if ok, err := s.Decide(ctx, []Item{it}, out); err != nil || !ok || out[0].Remaining != 3 {
				t.Fatalf("peek %s: %v %v %+v, want 3 remaining (the failed batch refunded)", it.Key, ok, err, out[0])
			}
		}
	})

	t.Run("wrapped-client", func(t *testing.T) {
		// A ClusterClient behind a type the store does not recognise: the
		// server's CROSSSLOT answer makes the store group by slot itself.
		type wrapped struct{ *redis.ClusterClient }
		s := mustRedisStore(wrapped{cl.Client(t)}, RedisSettings{Prefix: "wrap:"})
		p := Policy{Limit: 5, Period: time.Minute}
		batch := []Item{{Scope: "p", Key: "a", Policy: p, Cost: 2}, {Scope: "p", Key: "b", Policy: p, Cost: 3}}
		out := make([]spillway.Decision, 2)
		for round, want := range []bool{true, false} {
			ok, err := s.Decide(ctx, batch, out)
			if err != nil || ok != want {
				t.Fatalf("round %d: %v %v, want %v", round, ok, err, want)
			}
		}
		if out[0].Remaining != 1 || out[1].Allowed {
			t.Fatalf("second round decisions %+v", out)
		}
	})

	t.Run("differential", func(t *testing.T) {
		c := cl.Client(t)
		hook := &freezeHook{raw: cl.Client(t)}
		c.AddHook(hook)
		for seed := uint64(11); seed <= 12; seed++ {
			t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
				differential(t, c, hook, seed, 300, anyFamily)
			})
		}
		t.Run("buckets13", func(t *testing.T) {
			differential(t, c, hook, 13, 300, bucketFamily)
		})
		t.Run("fixed14", func(t *testing.T) {
			differential(t, c, hook, 14, 300, fixedFamily)
		})
	})
}
