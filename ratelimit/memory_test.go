package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

func mustLimiter(t testing.TB, st Store, p Policy, set ...Settings) *Limiter {
	t.Helper()
	l, err := New(st, p, append(set, Settings{})[0])
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func remainingOf(t testing.TB, l *Limiter, key string) int64 {
	t.Helper()
	d, err := l.Allow(context.Background(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// TestFixedWindowBoundaryBurst demonstrates the fixed window's known flaw:
// N at the end of one window and N at the start of the next admit 2N
// within a few milliseconds, twice the rate over any one-second span.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	const N = 5
	clock := newConfClock()
	l := mustLimiter(t, NewMemoryStore(MemorySettings{Clock: clock.Now}), Policy{Algorithm: FixedWindow, Limit: N, Period: time.Second})
	admitted := 0
	for _, at := range []time.Duration{ms(999), ms(1000)} {
		clock.Set(confT0.Add(at))
		for i := 0; i < 2*N; i++ {
			if d, _ := l.Allow(context.Background(), "k", 1); d.Allowed {
				admitted++
			}
		}
	}
	if admitted != 2*N {
		t.Fatalf("admitted %d around the boundary, want 2N = %d", admitted, 2*N)
	}
}

// TestSlidingWindowCounterBoundaryBounded runs the boundary attack against
// the sliding window counter (it admits N, not 2N), then pits a greedy
// client against the three window algorithms: silent until 1 ms before a
// boundary, then taking everything it is offered, every millisecond, for
// five seconds. The table pins the most it got within any span of each
// length: the fixed window gives 2N within 2 ms, the counter N + ceil(N·d/P)
// within a span d (its overshoot grows with the span, reaching 2N only over
// a whole period), the log never more than N.
func TestSlidingWindowCounterBoundaryBounded(t *testing.T) {
	const N = 5
	ctx := context.Background()
	clock := newConfClock()
	l := mustLimiter(t, NewMemoryStore(MemorySettings{Clock: clock.Now}), Policy{Algorithm: SlidingWindowCounter, Limit: N, Period: time.Second})
	admitted := 0
	for _, at := range []time.Duration{ms(999), ms(1000)} {
		clock.Set(confT0.Add(at))
		for i := 0; i < 2*N; i++ {
			if d, _ := l.Allow(ctx, "k", 1); d.Allowed {
				admitted++
			}
		}
	}
	if admitted != N {
		t.Fatalf("admitted %d around the boundary, want N = %d", admitted, N)
	}

	spans := []time.Duration{ms(2), ms(100), ms(250), ms(500), ms(1000)}
	want := map[Algorithm][]int{
		FixedWindow:          {10, 10, 10, 10, 10},
		SlidingWindowCounter: {5, 6, 7, 8, 10},
		SlidingWindowLog:     {5, 5, 5, 5, 5},
	}
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter, SlidingWindowLog} {
		clock := newConfClock()
		l := mustLimiter(t, NewMemoryStore(MemorySettings{Clock: clock.Now}), Policy{Algorithm: a, Limit: N, Period: time.Second})
		var times []time.Duration
		for at := ms(999); at < ms(6000); at += time.Millisecond {
			clock.Set(confT0.Add(at))
			peek, _ := l.Allow(ctx, "greedy", 0)
			if peek.Remaining == 0 {
				continue
			}
			if d, _ := l.Allow(ctx, "greedy", peek.Remaining); !d.Allowed {
				t.Fatalf("%v: denied the Remaining %d a peek reported", a, peek.Remaining)
			}
			for range peek.Remaining {
				times = append(times, at)
			}
		}
		if len(times) != 6*N { // windows 0 to 5, N each
			t.Fatalf("%v: admitted %d in total, want %d", a, len(times), 6*N)
		}
		for k, span := range spans {
			worst := 0
			for i := range times {
				n := 0
				for j := i; j < len(times) && times[j] < times[i]+span; j++ {
					n++
				}
				worst = max(worst, n)
			}
			if worst != want[a][k] {
				t.Errorf("%v: worst span of %v admitted %d, want %d", a, span, worst, want[a][k])
			}
			if bound := N + int((N*span+time.Second-1)/time.Second); a == SlidingWindowCounter && worst > bound {
				t.Errorf("counter: span %v admitted %d, above N + ceil(N·d/P) = %d", span, worst, bound)
			}
		}
	}
}

func TestMemoryStoreEvictsFullStateFirst(t *testing.T) {
	clock := newConfClock()
	st := NewMemoryStore(MemorySettings{Clock: clock.Now, MaxKeys: 4, Shards: 1})
	l := mustLimiter(t, st, Policy{Limit: 10, Period: time.Second}) // T = 100ms, burst 10
	ctx := context.Background()
	for _, c := range []struct {
		key  string
		cost int64 // full again after cost × 100ms
	}{{"a", 1}, {"b", 5}, {"c", 3}, {"d", 4}} {
		if d, _ := l.Allow(ctx, c.key, c.cost); !d.Allowed {
			t.Fatalf("%s denied", c.key)
		}
	}
	// Peeks and denials never create keys.
	for i := 0; i < 10; i++ {
		l.Allow(ctx, fmt.Sprint("peek", i), 0)
		l.Allow(ctx, fmt.Sprint("big", i), 11)
	}
	if n := st.keyCount(); n != 4 {
		t.Fatalf("Len = %d, want 4", n)
	}
	// At 150ms, a is full again: it goes first.
	clock.Set(confT0.Add(ms(150)))
	l.Allow(ctx, "e", 4) // full at 550ms
	if n := st.keyCount(); n != 4 {
		t.Fatalf("Len = %d after an insert at the cap, want 4", n)
	}
	for key, want := range map[string]int64{"b": 6, "c": 8, "d": 7, "e": 6} {
		if got := remainingOf(t, l, key); got != want {
			t.Fatalf("%s remaining %d, want %d (kept)", key, got, want)
		}
	}
	// No state is full now: the one full soonest (c, at 300ms) goes.
	l.Allow(ctx, "f", 1)
	if got := remainingOf(t, l, "c"); got != 10 {
		t.Fatalf("c remaining %d, want 10 (evicted: forgotten)", got)
	}
	for key, want := range map[string]int64{"b": 6, "d": 7, "e": 6, "f": 9} {
		if got := remainingOf(t, l, key); got != want {
			t.Fatalf("%s remaining %d, want %d (kept)", key, got, want)
		}
	}
	if n := st.keyCount(); n != 4 {
		t.Fatalf("Len = %d, want 4", n)
	}
	// Many distinct keys never grow the store past its cap.
	for i := 0; i < 1000; i++ {
		l.Allow(ctx, fmt.Sprint("attacker", i), 1)
	}
	if n := st.keyCount(); n != 4 {
		t.Fatalf("Len = %d after 1000 keys, want 4", n)
	}
}

func TestMemoryStoreCapSpreadOverShards(t *testing.T) {
	st := NewMemoryStore(MemorySettings{MaxKeys: 100, Shards: 8})
	l := mustLimiter(t, st, Policy{Limit: 1, Period: time.Hour})
	for i := 0; i < 5000; i++ {
		l.Allow(context.Background(), fmt.Sprint(i), 1)
	}
	if n := st.keyCount(); n != 100 {
		t.Fatalf("Len = %d, want exactly the cap 100", n)
	}
	// A cap below the shard count lowers the shard count.
	small := NewMemoryStore(MemorySettings{MaxKeys: 3, Shards: 64})
	ls := mustLimiter(t, small, Policy{Limit: 1, Period: time.Hour})
	for i := 0; i < 50; i++ {
		ls.Allow(context.Background(), fmt.Sprint(i), 1)
	}
	if n := small.keyCount(); n != 3 {
		t.Fatalf("Len = %d, want 3", n)
	}
}

func TestMemoryStoreLongKeysAreBounded(t *testing.T) {
	st := NewMemoryStore(MemorySettings{})
	l := mustLimiter(t, st, Policy{Limit: 2, Period: time.Hour})
	ctx := context.Background()
	long := strings.Repeat("x", 10_000)
	other := long[:9_999] + "y"
	for i, want := range []bool{true, true, false} {
		if d, _ := l.Allow(ctx, long, 1); d.Allowed != want {
			t.Fatalf("call %d on a long key: allowed %v, want %v", i, d.Allowed, want)
		}
	}
	if d, _ := l.Allow(ctx, other, 1); !d.Allowed {
		t.Fatal("a different long key shares state")
	}
	// The stored entry holds a digest, not the 10 KB key.
	for i := range st.shards {
		for _, e := range st.shards[i].m {
			if !e.long || len(e.key) != 16 {
				t.Fatalf("long key stored verbatim (%d bytes)", len(e.key))
			}
		}
	}
	if err := l.Reset(ctx, long); err != nil {
		t.Fatal(err)
	}
	if got := remainingOf(t, l, long); got != 2 {
		t.Fatalf("remaining %d after Reset, want 2", got)
	}
	// A key of exactly keys.MaxPart bytes is kept as is.
	exact := strings.Repeat("z", 64)
	l.Allow(ctx, exact, 1)
	found := false
	for i := range st.shards {
		for _, e := range st.shards[i].m {
			found = found || e.key == exact
		}
	}
	if !found {
		t.Fatal("64-byte key not stored verbatim")
	}
}

func TestMemoryStoreScopesAndLayoutsAreSeparate(t *testing.T) {
	st := NewMemoryStore(MemorySettings{})
	ctx := context.Background()
	p := Policy{Limit: 1, Period: time.Hour}
	a := mustLimiter(t, st, p, Settings{Scope: "a"})
	b := mustLimiter(t, st, p, Settings{Scope: "b"})
	fw := mustLimiter(t, st, Policy{Algorithm: FixedWindow, Limit: 1, Period: time.Hour}, Settings{Scope: "a"})
	for _, l := range []*Limiter{a, b, fw} {
		if d, _ := l.Allow(ctx, "k", 1); !d.Allowed {
			t.Fatalf("%s/%v: first request denied: state leaked between scopes or layouts", l.scope, l.policy.Algorithm)
		}
	}
	// GCRA and TokenBucket share the bucket layout of the same scope.
	g := mustLimiter(t, st, Policy{Algorithm: GCRA, Limit: 1, Period: time.Hour}, Settings{Scope: "a"})
	if d, _ := g.Allow(ctx, "k", 1); d.Allowed {
		t.Fatal("GCRA under scope a does not see the token bucket's charge")
	}
}

// TestMemoryStoreConcurrent hammers a store from many goroutines with
// single items and overlapping batches (locked in both key orders) with no
// refill: exactly the burst is admitted, never more; run with -race.
func TestMemoryStoreConcurrent(t *testing.T) {
	clock := newConfClock()
	st := NewMemoryStore(MemorySettings{Clock: clock.Now, Shards: 4})
	p := Policy{Limit: 100, Period: time.Hour} // burst 100, no refill within the test
	ctx := context.Background()
	var single, batches atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]spillway.Decision, 2)
			for i := 0; i < 300; i++ {
				items := []Item{{Scope: "s", Key: "x", Policy: p, Cost: 1}, {Scope: "s", Key: "y", Policy: p, Cost: 1}}
				if g%2 == 1 {
					items[0], items[1] = items[1], items[0]
				}
				ok, err := st.Decide(ctx, items, out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					batches.Add(1)
				}
				o1 := make([]spillway.Decision, 1)
				if ok, _ := st.Decide(ctx, []Item{{Scope: "s", Key: "z", Policy: p, Cost: 1}}, o1); ok {
					single.Add(1)
				}
				if i%50 == 0 {
					st.keyCount()
				}
			}
		}()
	}
	wg.Wait()
	if batches.Load() != 100 || single.Load() != 100 {
		t.Fatalf("admitted %d batches and %d singles, want exactly 100 each", batches.Load(), single.Load())
	}
}

func TestMemoryStoreDecideErrors(t *testing.T) {
	st := NewMemoryStore(MemorySettings{})
	ctx := context.Background()
	p := Policy{Limit: 1, Period: time.Second}
	if _, err := st.Decide(ctx, []Item{{Key: "a", Policy: p}}, nil); err == nil || !strings.Contains(err.Error(), "out has 0 decisions for 1 items") {
		t.Fatalf("short out: %v", err)
	}
	if ok, err := st.Decide(ctx, nil, nil); !ok || err != nil {
		t.Fatalf("empty batch: %v %v", ok, err)
	}
	out := make([]spillway.Decision, 1)
	_, err := st.Decide(ctx, []Item{{Key: "a", Policy: p, Cost: -2}}, out)
	if err == nil || err.Error() != "ratelimit: item 0: invalid cost: cost -2 is negative" || !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("negative cost: %v", err)
	}
	out = make([]spillway.Decision, 2)
	_, err = st.Decide(ctx, []Item{{Key: "a", Policy: p, Cost: 1}, {Key: "b", Policy: Policy{Period: time.Second}, Cost: 1}}, out)
	if err == nil || err.Error() != "ratelimit: item 1: invalid policy: limit 0 must be positive" || !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("invalid policy: %v", err)
	}
}

func TestMemoryStoreAllocations(t *testing.T) {
	ctx := context.Background()
	for _, a := range []Algorithm{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindowCounter, SlidingWindowLog} {
		l := mustLimiter(t, NewMemoryStore(MemorySettings{}), Policy{Algorithm: a, Limit: 1000, Period: time.Millisecond})
		l.Allow(ctx, "warm", 1)
		if n := testing.AllocsPerRun(1000, func() { l.Allow(ctx, "warm", 1) }); n != 0 {
			t.Errorf("%v: %v allocations per Allow, want 0", a, n)
		}
	}
}
