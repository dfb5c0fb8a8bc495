package globalceiling

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
)

// newFakeClock starts exactly at the beginning of a second, so a window of
// one second (or 100 ms) begins now.
func newFakeClock() *testclock.Clock { return testclock.New(time.Unix(1_800_000_000, 0)) }

// servers returns n ceilings ("servers") with their own clients on srv.
func servers(t *testing.T, srv *redistest.Server, n int, limit int64, window time.Duration, s Settings) []*Ceiling {
	t.Helper()
	var cs []*Ceiling
	for i := 0; i < n; i++ {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
		t.Cleanup(func() { rdb.Close() })
		c, err := New(rdb, "orders-db", limit, window, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

func shardValues(t *testing.T, c *Ceiling, rdb redis.Cmdable, w int64) []int64 {
	t.Helper()
	vals := make([]int64, c.o.shards)
	for j := range vals {
		n, err := rdb.Get(context.Background(), c.key(w, j)).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		vals[j] = n
	}
	return vals
}

func critical() *spillway.Request { return &spillway.Request{Priority: spillway.Critical} }

// TestExactThreeServersNeverOvershoot: three servers, K = 8, 3 × 30
// goroutines racing for a ceiling of 500 in one window on one Redis node:
// never more than 500 admitted, and the shard counters hold exactly the
// admitted total (every denied charge was refunded).
func TestExactThreeServersNeverOvershoot(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	// A long window: the counters' TTL runs on Redis's wall clock, and
	// this test must stay inside one window of the fake clock.
	cs := servers(t, srv, 3, 500, time.Minute, Settings{Clock: clock.Now})
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	for _, c := range cs {
		for g := 0; g < 30; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 25; i++ {
					d, _, err := c.Admit(ctx, critical())
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					} else {
						denied.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if admitted.Load() > 500 {
		t.Fatalf("admitted %d > ceiling 500", admitted.Load())
	}
	// Denied charges standing for a moment may have refused a few
	// admissions early (undershoot); alone, the rest goes through.
	for {
		d, _, err := cs[0].Admit(ctx, critical())
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			if d.Reason != spillway.ReasonCeiling || d.RetryAfter != time.Minute || d.Remaining != 0 {
				t.Fatalf("denial %+v, want ceiling with RetryAfter 1m", d)
			}
			break
		}
		admitted.Add(1)
	}
	t.Logf("concurrent phase: %d denied; total admitted %d", denied.Load(), admitted.Load())
	if admitted.Load() != 500 {
		t.Fatalf("admitted %d in the window, want exactly 500", admitted.Load())
	}
	w, _ := cs[0].windowOf(clock.Now())
	var sum int64
	for _, v := range shardValues(t, cs[0], srv.Client(t), w) {
		sum += v
	}
	if sum != 500 {
		t.Fatalf("shard counters sum to %d, want 500", sum)
	}
	// The next window starts from zero.
	clock.Advance(time.Minute)
	if d, _, err := cs[1].Admit(ctx, critical()); err != nil || !d.Allowed || d.Remaining != 499 {
		t.Fatalf("next window: %+v %v", d, err)
	}
}

func TestExactDecisionsAndReserve(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	clock.Advance(250 * time.Millisecond)
	c := servers(t, srv, 1, 10, time.Second, Settings{Clock: clock.Now, Reserve: 0.2})[0]
	ctx := context.Background()
	low := &spillway.Request{Priority: spillway.SheddablePlus}
	for i := 1; i <= 8; i++ {
		d, _, err := c.Admit(ctx, low)
		want := spillway.Decision{Allowed: true, Limiter: "orders-db", Limit: 8, Remaining: int64(8 - i), ResetAfter: 750 * time.Millisecond}
		if err != nil || d != want {
			t.Fatalf("sheddable %d: %+v %v, want %+v", i, d, err, want)
		}
	}
	d, _, _ := c.Admit(ctx, low)
	if want := (spillway.Decision{Reason: spillway.ReasonCeiling, Limiter: "orders-db", Limit: 8, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond}); d != want {
		t.Fatalf("sheddable in the reserve: %+v, want %+v", d, want)
	}
	for i := 1; i <= 2; i++ {
		if d, _, _ := c.Admit(ctx, critical()); !d.Allowed || d.Limit != 10 || d.Remaining != int64(2-i) {
			t.Fatalf("critical %d: %+v", i, d)
		}
	}
	if d, _, _ := c.Admit(ctx, &spillway.Request{Priority: spillway.CriticalPlus}); d.Allowed {
		t.Fatalf("critical_plus above the ceiling admitted: %+v", d)
	}
	// Cost above what is left is denied and refunded.
	clock.Advance(time.Second)
	if d, _, _ := c.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: 11}); d.Allowed {
		t.Fatalf("cost 11 of 10 admitted: %+v", d)
	}
	if d, _, _ := c.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: 10}); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost 10 after a refunded 11: %+v", d)
	}
	if d, _, _ := c.Admit(ctx, &spillway.Request{Cost: -1}); d.Reason != spillway.ReasonInvalid {
		t.Fatalf("malformed: %+v", d)
	}
	if d, _, _ := c.Admit(ctx, nil); d.Reason != spillway.ReasonInvalid {
		t.Fatalf("nil request: %+v", d)
	}
	// The script survives SCRIPT FLUSH (NOSCRIPT → load → retry).
	if _, err := srv.Do(ctx, "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if d, _, err := c.Admit(ctx, critical()); err != nil || !d.Allowed {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", d, err)
	}
	// Every counter has a TTL.
	w, _ := c.windowOf(clock.Now())
	keysSeen := 0
	for j := 0; j < 8; j++ {
		pttl, err := srv.Client(t).PTTL(ctx, c.key(w, j)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl == -2 {
			continue
		}
		keysSeen++
		if pttl <= 0 || pttl > 2*time.Second {
			t.Fatalf("shard %d PTTL %v", j, pttl)
		}
	}
	if keysSeen != 1 {
		t.Fatalf("%d shard keys exist after one admission, want 1", keysSeen)
	}
}

// TestCachedOvershootBound: three servers, each admitting up to 40 per
// 100 ms sync interval against a ceiling of 1000 per second. Each sees the
// others' admissions only at its next sync, so the stated bound is
// Limit + (N−1)·r·T = 1000 + 2·40 = 1080 — and in this lock-step schedule
// it is reached exactly, in every window.
func TestCachedOvershootBound(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	cs := servers(t, srv, 3, 1000, time.Second, Settings{Clock: clock.Now, Mode: Cached, manualSync: true, SyncInterval: time.Minute}) // Sync is called by hand; this keeps the counters' wall-clock TTL long
	admittedPerWindow := runLockStep(t, clock, cs, 20, 40)
	for w, n := range admittedPerWindow {
		if n != 1080 {
			t.Fatalf("window %d admitted %d, want the bound 1080 exactly", w, n)
		}
	}
	var writes, admitted int64
	for _, c := range cs {
		s := c.stats()
		writes += s.Writes
		admitted += s.Admitted
	}
	if writes != admitted {
		t.Fatalf("cached mode wrote %d times for %d admissions, want one write each", writes, admitted)
	}
}

// TestLocalAggregationBoundAndWrites: the same schedule in
// LocalAggregation mode. Bound: Limit + (N−1)·r·2T = 1000 + 2·80 = 1160;
// writes: one flush per server per interval with something to flush.
func TestLocalAggregationBoundAndWrites(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	cs := servers(t, srv, 3, 1000, time.Second, Settings{Clock: clock.Now, Mode: LocalAggregation, manualSync: true, SyncInterval: time.Minute})
	admittedPerWindow := runLockStep(t, clock, cs, 20, 40)
	var writes, admitted int64
	for _, c := range cs {
		s := c.stats()
		writes += s.Writes
		admitted += s.Admitted
	}
	for w, n := range admittedPerWindow {
		if n < 1000 || n > 1160 {
			t.Fatalf("window %d admitted %d, want within [1000, 1160]", w, n)
		}
	}
	// Everything admitted reached Redis (the final sync flushed the rest).
	rdb := srv.Client(t)
	for w, n := range admittedPerWindow {
		var sum int64
		for _, v := range shardValues(t, cs[0], rdb, w) {
			sum += v
		}
		if sum != n {
			t.Fatalf("window %d: shards hold %d, admitted %d", w, sum, n)
		}
	}
	t.Logf("admitted per window %v; %d writes for %d admissions", admittedPerWindow, writes, admitted)
	if writes*20 > admitted {
		t.Fatalf("%d writes for %d admissions: want at most one per 20", writes, admitted)
	}
}

// runLockStep advances the clock in 100 ms ticks; at each tick every
// server syncs, then admits up to perTick requests. It returns the admitted
// count per window index.
func runLockStep(t *testing.T, clock *testclock.Clock, cs []*Ceiling, ticks, perTick int) map[int64]int64 {
	t.Helper()
	ctx := context.Background()
	per := map[int64]int64{}
	for tick := 0; tick < ticks; tick++ {
		for _, c := range cs {
			if err := c.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		w, _ := cs[0].windowOf(clock.Now())
		for _, c := range cs {
			for i := 0; i < perTick; i++ {
				d, _, err := c.Admit(ctx, critical())
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					per[w]++
				}
			}
		}
		clock.Advance(100 * time.Millisecond)
	}
	for _, c := range cs {
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return per
}

// TestShardWriteSpread: 4000 admissions charge the 8 shard keys evenly
// (each within 25% of 500), and the 8 keys carry 8 different hash tags.
func TestShardWriteSpread(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	r := rand.New(rand.NewPCG(1, 2))
	c := servers(t, srv, 1, 1_000_000, time.Minute, Settings{Clock: clock.Now, Mode: Cached, manualSync: true, intn: func(n int) int { return r.IntN(n) }})[0]
	ctx := context.Background()
	for i := 0; i < 4000; i++ {
		if d, _, err := c.Admit(ctx, critical()); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	w, _ := c.windowOf(clock.Now())
	vals := shardValues(t, c, srv.Client(t), w)
	tags := map[string]bool{}
	for j, v := range vals {
		if v < 375 || v > 625 {
			t.Fatalf("shard %d took %d of 4000 writes (all: %v), want 500 ± 25%%", j, v, vals)
		}
		k := c.key(w, j)
		tags[k[strings.IndexByte(k, '{'):]] = true
	}
	if len(tags) != 8 {
		t.Fatalf("shard keys share hash tags: %v", tags)
	}
	t.Logf("writes per shard: %v", vals)
}

func TestLocalAggregationStale(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	c, err := New(rdb, "db", 100, time.Second, Settings{Clock: clock.Now, Mode: LocalAggregation, SyncInterval: 5 * time.Millisecond, StaleAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if d, _, err := c.Admit(ctx, critical()); err != nil || !d.Allowed {
		t.Fatalf("fresh: %+v %v", d, err)
	}
	srv.Stop()
	clock.Advance(1100 * time.Millisecond)
	_, err = c.admitN(ctx, spillway.Critical, 1)
	if !errors.Is(err, ErrStale) {
		t.Fatalf("with Redis gone for longer than the stale bound: err = %v, want ErrStale", err)
	}
	// Admit falls back by itself: the client's share (0.2 of 100).
	for i := 0; i < 20; i++ {
		if d, _, err := c.Admit(ctx, critical()); err != nil || !d.Allowed || !d.Degraded || d.Limit != 20 {
			t.Fatalf("stale, degraded %d: %+v %v", i, d, err)
		}
	}
	if d, _, err := c.Admit(ctx, critical()); err != nil || d.Allowed || !d.Degraded || d.Reason != spillway.ReasonCeiling {
		t.Fatalf("stale, share used: %+v %v", d, err)
	}
}

// TestStaleAnswersWhileSyncing: admissions that find the total stale
// while the background loop keeps syncing (and refreshing it) answer
// either ErrStale or a decision, and under -race touch nothing the loop
// writes without the lock (a read of the last sync time after unlocking
// was caught by the load-test harness in CI).
func TestStaleAnswersWhileSyncing(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	c, err := New(rdb, "db", 1_000_000, time.Hour, Settings{Clock: clock.Now, Mode: LocalAggregation, SyncInterval: time.Millisecond, StaleAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	stale, allowed := 0, 0
	for i := 0; i < 300; i++ {
		if i%10 == 0 {
			clock.Advance(1100 * time.Millisecond)
		}
		d, err := c.admitN(ctx, spillway.Critical, 1)
		switch {
		case errors.Is(err, ErrStale):
			stale++
		case err == nil && d.Allowed:
			allowed++
		default:
			t.Fatalf("admission %d: %+v %v, want ErrStale or allowed", i, d, err)
		}
		if i%10 == 5 {
			time.Sleep(5 * time.Millisecond) // let the loop sync
		}
	}
	if stale == 0 || allowed == 0 {
		t.Fatalf("%d admissions found the total stale, %d were allowed; want both", stale, allowed)
	}
	t.Logf("%d stale, %d allowed", stale, allowed)
}

func TestNewValidates(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{})
	defer rdb.Close()
	// The key is the field the error must name.
	cases := map[string]struct {
		client redis.UniversalClient
		name   string
		limit  int64
		window time.Duration
		s      Settings
	}{
		"client":        {nil, "", 0, 0, Settings{}},
		"name":          {rdb, "", 1, time.Second, Settings{}},
		"limit 0":       {rdb, "x", 0, time.Second, Settings{}},
		"limit -1":      {rdb, "x", -1, time.Second, Settings{}},
		"window 0s":     {rdb, "x", 1, 0, Settings{}},
		"window -1s":    {rdb, "x", 1, -time.Second, Settings{}},
		"mode":          {rdb, "x", 1, time.Second, Settings{Mode: 9}},
		"shards -1":     {rdb, "x", 1, time.Second, Settings{Shards: -1}},
		"sync interval": {rdb, "x", 1, time.Second, Settings{SyncInterval: -1}},
		"stale after":   {rdb, "x", 1, time.Second, Settings{StaleAfter: -1}},
		"reserve 1":     {rdb, "x", 1, time.Second, Settings{Reserve: 1}},
		"reserve NaN":   {rdb, "x", 1, time.Second, Settings{Reserve: math.NaN()}},
		"prefix":        {rdb, "x", 1, time.Second, Settings{Prefix: "a{"}},
	}
	for field, c := range cases {
		c.s.manualSync = true
		g, err := New(c.client, c.name, c.limit, c.window, c.s)
		if err == nil || g != nil || !strings.HasPrefix(err.Error(), "globalceiling: New: ") || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: New = %v, %v; want an error naming %q", field, g, err, field)
		}
	}
}

// TestLocalAggregationFlushLandsOnce: a flush whose charge landed is never
// sent again, even when the reads of the same pipeline failed; a flush
// that failed is sent again; both survive SCRIPT FLUSH.
func TestLocalAggregationFlushLandsOnce(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	c := servers(t, srv, 1, 1000, time.Minute, Settings{Clock: clock.Now, Mode: LocalAggregation, manualSync: true, intn: func(int) int { return 0 }})[0]
	ctx := context.Background()
	rdb := srv.Client(t)
	w, _ := c.windowOf(clock.Now())
	admit := func(n int) {
		for i := 0; i < n; i++ {
			if d, _, err := c.Admit(ctx, critical()); err != nil || !d.Allowed {
				t.Fatal(d, err)
			}
		}
	}
	shard0 := func() int64 {
		n, err := rdb.Get(ctx, c.key(w, 0)).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return n
	}
	admit(5)
	if _, err := srv.Do(ctx, "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := shard0(); got != 5 {
		t.Fatalf("after the first flush shard 0 holds %d, want 5", got)
	}
	// Shard 5 of the wrong type: the reads fail, the flush to shard 0 lands.
	if err := rdb.LPush(ctx, c.key(w, 5), "x").Err(); err != nil {
		t.Fatal(err)
	}
	admit(3)
	if err := c.Sync(ctx); err == nil {
		t.Fatal("sync with a broken shard: no error")
	}
	if got := shard0(); got != 8 {
		t.Fatalf("shard 0 holds %d, want 8", got)
	}
	rdb.Del(ctx, c.key(w, 5))
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := shard0(); got != 8 {
		t.Fatalf("after a clean sync shard 0 holds %d, want 8 (no second flush of the 3)", got)
	}
	// Shard 0 of the wrong type: the flush fails and is sent again later.
	if err := rdb.Del(ctx, c.key(w, 0)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.LPush(ctx, c.key(w, 0), "x").Err(); err != nil {
		t.Fatal(err)
	}
	admit(4)
	if err := c.Sync(ctx); err == nil {
		t.Fatal("flush into a broken shard: no error")
	}
	rdb.Del(ctx, c.key(w, 0))
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := shard0(); got != 4 {
		t.Fatalf("shard 0 holds %d after the retried flush, want 4", got)
	}
}

// TestKeysOfMatchesKey: the shard keys cached per window are Key's, for a
// new window, a repeated one and an older one asked for again.
func TestKeysOfMatchesKey(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialed
	t.Cleanup(func() { rdb.Close() })
	c, err := New(rdb, "orders-db", 100, time.Second, Settings{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for _, w := range []int64{7, 7, 8, 7} {
		ks := c.keysOf(w)
		if len(ks) != c.o.shards {
			t.Fatalf("window %d: %d keys, want %d", w, len(ks), c.o.shards)
		}
		for j, k := range ks {
			if want := c.key(w, j); k != want {
				t.Fatalf("window %d shard %d: %q, want %q", w, j, k, want)
			}
		}
	}
}
