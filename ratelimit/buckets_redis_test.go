package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
)

// TestSlidingWindowBucketsState pins the exact state both stores keep for
// a bucketed window, step by step: the newest sub-window and its counts
// (the memory store's entry; the Redis value, h in 7 bytes and a byte per
// count for a limit below 256, and its PTTL).
func TestSlidingWindowBucketsState(t *testing.T) {
	_, c := redisServer(t)
	ctx := context.Background()
	clk := testclock.New(rt0) // rt0 is a whole second: sub-windows start on it
	rs := mustRedisStore(c, RedisSettings{Clock: clk.Now})
	mem := NewMemoryStore(MemorySettings{Clock: clk.Now})
	p := Policy{Algorithm: SlidingWindowBuckets, Limit: 4, Period: time.Second, Buckets: 4, Mode: Conservative} // W = 250ms
	h0 := rt0.UnixMicro() / 250_000
	it := Item{Scope: "s", Key: "k", Policy: p}
	key := redisKey("spillway:", &it)
	if want := "spillway:s:{k}:swb"; key != want {
		t.Fatalf("key %q, want %q", key, want)
	}
	for i, s := range []struct {
		at      time.Duration
		n       int64
		allowed bool
		head    int64
		counts  []int64
		ttl     time.Duration
	}{
		{0, 3, true, h0, []int64{3, 0, 0, 0, 0}, 1250 * time.Millisecond},
		{ms(500), 2, false, h0, []int64{3, 0, 0, 0, 0}, 1250 * time.Millisecond},
		{ms(500), 1, true, h0 + 2, []int64{1, 0, 3, 0, 0}, 1250 * time.Millisecond},
		{1249999 * time.Microsecond, 1, true, h0 + 4, []int64{1, 0, 1, 0, 3}, time.Second},
		{ms(1250), 2, true, h0 + 5, []int64{2, 1, 0, 1, 0}, 1250 * time.Millisecond},
		{ms(9000), 1, true, h0 + 36, []int64{1, 0, 0, 0, 0}, 1250 * time.Millisecond},
	} {
		clk.Set(rt0.Add(s.at))
		out := make([]spillway.Decision, 1)
		items := []Item{it}
		items[0].Cost = s.n
		okR, errR := rs.Decide(ctx, items, out)
		okM, errM := mem.Decide(ctx, items, out)
		if errR != nil || errM != nil || okR != s.allowed || okM != s.allowed {
			t.Fatalf("step %d: redis %v %v, memory %v %v; want %v", i, okR, errR, okM, errM, s.allowed)
		}
		v, err := c.Get(ctx, key).Result()
		want := string([]byte{byte(s.head >> 48), byte(s.head >> 40), byte(s.head >> 32), byte(s.head >> 24), byte(s.head >> 16), byte(s.head >> 8), byte(s.head),
			byte(s.counts[0]), byte(s.counts[1]), byte(s.counts[2]), byte(s.counts[3]), byte(s.counts[4])})
		if err != nil || v != want {
			t.Fatalf("step %d: redis holds %x (%v), want %x", i, v, err, want)
		}
		if pttl, err := c.PTTL(ctx, key).Result(); err != nil || pttl > s.ttl || pttl < s.ttl-time.Second/2 {
			t.Fatalf("step %d: PTTL %v (%v), want %v (less the time the test took)", i, pttl, err, s.ttl)
		}
		k := mem.prepare(it.Scope, it.Key, p.Algorithm)
		sh := &mem.shards[k.shard]
		sh.mu.Lock()
		e := sh.find(&k)
		var head int64
		var counts []int64
		if e != nil && e.log != nil {
			head, counts = e.a, slices.Clone(e.log.ts)
		}
		sh.mu.Unlock()
		if head != s.head || !slices.Equal(counts, s.counts) {
			t.Fatalf("step %d: memory holds %d %v, want %d %v", i, head, counts, s.head, s.counts)
		}
	}
	// Another N reads as no state, on both stores.
	q := p
	q.Buckets = 5
	out := make([]spillway.Decision, 1)
	for _, st := range []Store{rs, mem} {
		if ok, err := st.Decide(ctx, []Item{{Scope: "s", Key: "k", Policy: q}}, out); err != nil || !ok || out[0].Remaining != 4 {
			t.Fatalf("%T under another N: %v %v %+v, want 4 remaining", st, ok, err, out[0])
		}
	}
}

// TestSlidingWindowBucketsBatches: all or nothing on every store, items on
// one key see each other, peeks charge nothing.
func TestSlidingWindowBucketsBatches(t *testing.T) {
	cons := Policy{Algorithm: SlidingWindowBuckets, Limit: 3, Period: time.Second, Buckets: 5, Mode: Conservative}
	interp := Policy{Algorithm: SlidingWindowBuckets, Limit: 3, Period: time.Minute, Buckets: 60}
	for _, f := range storeFactories {
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newConfClock()
			st := f.new(t, clock.Now)
			out := make([]spillway.Decision, 4)
			decide := func(items ...Item) bool {
				t.Helper()
				ok, err := st.Decide(ctx, items, out)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			peek := func(scope string, p Policy) int64 {
				t.Helper()
				if !decide(Item{Scope: scope, Key: "a", Policy: p}) {
					t.Fatal("a peek was denied")
				}
				return out[0].Remaining
			}
			if !decide(Item{Scope: "c", Key: "a", Policy: cons, Cost: 2}, Item{Scope: "i", Key: "a", Policy: interp, Cost: 1}) {
				t.Fatal("first batch denied")
			}
			clock.Set(confT0.Add(ms(100)))
			// denied by its last item: nothing charged, new keys included
			if decide(Item{Scope: "c", Key: "a", Policy: cons, Cost: 1}, Item{Scope: "i", Key: "a", Policy: interp, Cost: 2},
				Item{Scope: "c", Key: "new", Policy: cons, Cost: 1}, Item{Scope: "i", Key: "a", Policy: interp, Cost: 4}) {
				t.Fatal("batch with a cost above the limit allowed")
			}
			if !out[0].Allowed || !out[1].Allowed || !out[2].Allowed || out[3].Reason != spillway.ReasonCostExceedsLimit {
				t.Fatalf("decisions %+v", out)
			}
			if r, r2 := peek("c", cons), peek("i", interp); r != 1 || r2 != 2 {
				t.Fatalf("remaining %d, %d after a denied batch; want 1, 2", r, r2)
			}
			if !decide(Item{Scope: "c", Key: "new", Policy: cons}) || out[0].Remaining != 3 || out[0].ResetAfter != 0 {
				t.Fatalf("a key created by a denied batch: %+v", out[0])
			}
			// two items on one key: the second sees the first's charge
			if decide(Item{Scope: "i", Key: "a", Policy: interp, Cost: 1}, Item{Scope: "i", Key: "a", Policy: interp, Cost: 2}) {
				t.Fatal("3 more on a key with 2 left allowed")
			}
			if !out[0].Allowed || out[0].Remaining != 1 || out[1].Allowed || out[1].Remaining != 1 {
				t.Fatalf("same-key batch %+v %+v", out[0], out[1])
			}
			if r := peek("i", interp); r != 2 {
				t.Fatalf("remaining %d after a denied same-key batch, want 2", r)
			}
		})
	}
}

// TestSlidingWindowBucketsCluster runs the bucketed window's conformance
// tables and a cross-slot batch refund on a 3-primary/3-replica Cluster.
func TestSlidingWindowBucketsCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	ctx := context.Background()
	for i, tab := range conformanceTables {
		if tab.policy.Algorithm != SlidingWindowBuckets {
			continue
		}
		for _, dc := range deciders {
			t.Run(tab.name+"/"+dc.name, func(t *testing.T) {
				c := cl.Client(t)
				c.AddHook(&freezeHook{raw: cl.Client(t)})
				clock := newConfClock()
				st := mustRedisStore(c, RedisSettings{Clock: clock.Now, Prefix: fmt.Sprintf("conf%d-%s:", i, dc.name)})
				runSteps(t, st, clock, tab.policy, dc.decide, tab.steps)
			})
		}
	}
	t.Run("refund", func(t *testing.T) {
		c := cl.Client(t)
		clk := testclock.New(rt0)
		s := mustRedisStore(c, RedisSettings{Clock: clk.Now, Prefix: "swb-refund:"})
		m := NewMemoryStore(MemorySettings{Clock: clk.Now})
		p := Policy{Algorithm: SlidingWindowBuckets, Limit: 5, Period: time.Minute, Buckets: 6, Mode: Conservative}
		// entities on different slots: a and b are charged, z (a cost
		// above the limit) denies
		batch := []Item{{Scope: "p", Key: "a", Policy: p, Cost: 2}, {Scope: "p", Key: "b", Policy: p, Cost: 1}, {Scope: "p", Key: "z", Policy: p, Cost: 6}}
		if slot(redisKey("swb-refund:", &batch[0])) == slot(redisKey("swb-refund:", &batch[2])) {
			t.Fatal("a and z share a slot")
		}
		out, outM := make([]spillway.Decision, 3), make([]spillway.Decision, 3)
		if ok, err := s.Decide(ctx, batch[:1], out); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if ok, err := m.Decide(ctx, batch[:1], outM); err != nil || !ok {
			t.Fatal(ok, err)
		}
		// within the window (the charge shifts 2 sub-windows) and past it
		// (the charge drops every count): both refunds restore the state
		for round, at := range []time.Duration{25 * time.Second, 90 * time.Second} {
			clk.Set(rt0.Add(at))
			okR, errR := s.Decide(ctx, batch, out)
			okM, errM := m.Decide(ctx, batch, outM)
			if errR != nil || errM != nil || okR || okM || !out[0].Allowed || !slices.Equal(out, outM) {
				t.Fatalf("round %d: redis %v %v %+v\nmemory %v %v %+v", round, okR, errR, out, okM, errM, outM)
			}
		}
		// refunded exactly: a holds what it held before the denied
		// batches, b nothing
		v, err := c.Get(ctx, redisKey("swb-refund:", &batch[0])).Result()
		if h, counts := parseBuckets(v, 6, 5); err != nil || h != rt0.UnixMicro()/10_000_000 || !slices.Equal(counts, []int64{2, 0, 0, 0, 0, 0, 0}) {
			t.Fatalf("a holds %x (%v): %d %v", v, err, h, counts)
		}
		if n, err := c.Exists(ctx, redisKey("swb-refund:", &batch[1])).Result(); err != nil || n != 0 {
			t.Fatalf("b exists: %d %v", n, err)
		}
		// and a clock gone back decides as on the memory store
		clk.Set(rt0.Add(30 * time.Second))
		okR, errR := s.Decide(ctx, batch[:1], out)
		okM, errM := m.Decide(ctx, batch[:1], outM)
		if errR != nil || errM != nil || okR != okM || out[0] != outM[0] || out[0].Remaining != 1 {
			t.Fatalf("after the clock went back: redis %v %v %+v, memory %v %v %+v; want 1 remaining", okR, errR, out[0], okM, errM, outM[0])
		}
	})
}

// TestSlidingWindowBucketsWidths: a count takes 1, 2, 4 or 7 bytes in
// Redis by the limit; the script packs what parseBuckets reads, whatever
// the width.
func TestSlidingWindowBucketsWidths(t *testing.T) {
	srv, c := redisServer(t)
	c.AddHook(&freezeHook{raw: srv.Client(t)}) // the periods are µs: keep the keys
	ctx := context.Background()
	clk := testclock.New(rt0)
	rs := mustRedisStore(c, RedisSettings{Clock: clk.Now})
	// (Validate's L ≤ P and L·P ≤ 2^53 keep L below 2^27: 7 bytes are
	// never used)
	for _, L := range []int64{255, 256, 65535, 65536, 1 << 26} {
		p := Policy{Algorithm: SlidingWindowBuckets, Limit: L, Period: time.Duration(2*L) * time.Microsecond, Buckets: 2}
		it := Item{Scope: fmt.Sprint(L), Key: "k", Policy: p, Cost: L - 1}
		if ok, err := rs.Decide(ctx, []Item{it}, make([]spillway.Decision, 1)); err != nil || !ok {
			t.Fatalf("L=%d: %v %v", L, ok, err)
		}
		v, err := c.Get(ctx, redisKey("spillway:", &it)).Result()
		h, counts := parseBuckets(v, 2, L)
		if err != nil || len(v) != 7+3*bucketsWidth(L) || h != rt0.UnixMicro()/(p.Period.Microseconds()/2) || !slices.Equal(counts, []int64{L - 1, 0, 0}) {
			t.Fatalf("L=%d: %x (%v) reads %d %v", L, v, err, h, counts)
		}
		if got := formatBuckets(h, counts, L); got != v {
			t.Fatalf("L=%d: formatBuckets %x, the script %x", L, got, v)
		}
	}
}
