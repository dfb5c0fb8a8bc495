package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/testclock"
)

// TestSlidingWindowBucketsInvariants runs the invariant checker (exact
// Remaining, RetryAfter and ResetAfter, a full state deciding like none,
// a denial changing nothing, the backwards clock, the admitted bound) on
// bucketed windows of both modes only.
func TestSlidingWindowBucketsInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(28, 28))
	for i := 0; i < 400; i++ {
		p := randomTestPolicy(uint8(SlidingWindowBuckets), uint8(r.Uint32()), r.Uint32(), uint8(r.Uint32()))
		checkAlgorithm(t, p, r.Uint64(), 200)
	}
}

// TestSlidingWindowBucketsOneIsTheCounter pins that one interpolated
// sub-window is Cloudflare's counter: the same decisions, field by field.
func TestSlidingWindowBucketsOneIsTheCounter(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 28))
	for range 200 {
		L := 1 + r.Int64N(20)
		P := L + r.Int64N(2_000_000)
		pb := Policy{Algorithm: SlidingWindowBuckets, Buckets: 1, Limit: L, Period: time.Duration(P) * time.Microsecond}
		pc := Policy{Algorithm: SlidingWindowCounter, Limit: L, Period: pb.Period}
		b, c := &sim{p: pb}, &sim{p: pc}
		now := int64(1_700_000_000_000_000) + r.Int64N(P)
		for range 200 {
			now += r.Int64N(P/2 + 1)
			n := r.Int64N(L + 2)
			if ob, oc := b.apply(now, n), c.apply(now, n); ob != oc {
				t.Fatalf("%v at %d cost %d: buckets %+v, counter %+v", pb, now, n, ob, oc)
			}
		}
	}
}

// TestSlidingWindowBucketsTimeGoingBackwardsIsClamped: a clock before the
// stored sub-window decides as at its start.
func TestSlidingWindowBucketsTimeGoingBackwardsIsClamped(t *testing.T) {
	p := Policy{Algorithm: SlidingWindowBuckets, Buckets: 4, Limit: 4, Period: time.Second, Mode: Conservative}.limits() // W = 250ms
	o, k := bucketsDecide(0, nil, 1_600_000, p, 4)                                                                       // sub-window 6
	if !o.allowed || k != 6 {
		t.Fatalf("%+v %d", o, k)
	}
	c := []int64{4, 0, 0, 0, 0}
	back, _ := bucketsDecide(6, c, 100_000, p, 1)
	at, _ := bucketsDecide(6, c, 1_500_000, p, 1)
	if back != at || back.allowed || back.retry != 1_249_999 {
		t.Fatalf("backwards %+v, at the sub-window's start %+v", back, at)
	}
}

// TestSlidingWindowBucketsCostAboveLimit: denied for ever, nothing written.
func TestSlidingWindowBucketsCostAboveLimit(t *testing.T) {
	p := Policy{Algorithm: SlidingWindowBuckets, Buckets: 4, Limit: 4, Period: time.Second}.limits()
	c := []int64{1, 0, 0, 0, 0}
	o, _ := bucketsDecide(4, c, 1_000_000, p, 5)
	if o.allowed || !o.exceeds || o.retry != 0 || o.remaining != 3 {
		t.Fatalf("%+v", o)
	}
}

// TestSlidingWindowBucketsForeignLength: counts written under another N
// read as no state.
func TestSlidingWindowBucketsForeignLength(t *testing.T) {
	p := Policy{Algorithm: SlidingWindowBuckets, Buckets: 4, Limit: 4, Period: time.Second}.limits()
	o, _ := bucketsDecide(4, []int64{4, 4, 4}, 1_000_000, p, 0)
	if o.remaining != 4 || o.reset != 0 {
		t.Fatalf("%+v", o)
	}
}

// The conformance tables of SlidingWindowBuckets (registered with the
// suite's tables in init): 4 per second in 4 sub-windows of 250 ms.
func init() {
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	conformanceTables = append(conformanceTables,
		stepTable{
			name:   "sliding_window_buckets_conservative",
			policy: Policy{Algorithm: SlidingWindowBuckets, Limit: 4, Period: time.Second, Buckets: 4, Mode: Conservative},
			steps: []step{
				// reset: the sub-window [0, 250ms) leaves the window of
				// 1s + 249999µs (its last µs, 249999, is then out).
				allow(0, 3, 1, ms(1250)),
				// 3 + 2 > 4 until sub-window 0 stops overlapping: the
				// exact log would allow at 1000ms, this mode at 1249.999.
				deny(ms(500), 2, 1, ms(750), ms(750)),
				allow(ms(500), 1, 0, ms(1250)),
				// at 1000ms sub-window 0 still overlaps (1000 − 1000,
				// 1000]: 1 + 3 counted
				deny(ms(1000), 1, 0, ms(750), ms(250)),
				allow(us(1249999), 1, 2, ms(1000)),
				exceeds(us(1249999), 5, 2, ms(1000)),
				// time going backwards: clamped to the start of the stored
				// sub-window (1000ms), where sub-window 0 counts again
				deny(ms(100), 3, 0, ms(1250), ms(750)),
				allow(ms(3000), 0, 4, 0), // all sub-windows gone
				allow(ms(3000), 4, 0, ms(1250)),
				reset(ms(3000)),
				allow(ms(3000), 0, 4, 0),
			},
		},
		stepTable{
			name:   "sliding_window_buckets_interpolated",
			policy: Policy{Algorithm: SlidingWindowBuckets, Limit: 4, Period: time.Second, Buckets: 4},
			steps: []step{
				// reset = 1s + drain(3, 0) = 1e6 + ceil((2·250000+1)/3)
				allow(0, 3, 1, ms(1167)),
				// sub-window 0 weighs floor(3·(W−x)/W) ≤ 2 from x = 1µs
				deny(ms(500), 2, 1, ms(667), ms(501)),
				allow(ms(500), 1, 0, ms(1001)),
				deny(ms(1000), 1, 0, ms(501), ms(1)),
				// at 1125ms sub-window 0 weighs floor(3·0.5) = 1: 1 + 1 + 1
				allow(ms(1125), 1, 1, ms(876)),
				exceeds(ms(1125), 5, 1, ms(876)),
				// time going backwards: clamped to 1000ms, where sub-window
				// 0 weighs 3 again; 2 fit once it weighs 0 (166667µs)
				deny(ms(100), 2, 0, ms(1001), ms(167)),
				allow(ms(3000), 0, 4, 0),
				allow(ms(3000), 4, 0, ms(1188)), // 1e6 + drain(4, 0) = 1e6 + 187501
				reset(ms(3000)),
				allow(ms(3000), 0, 4, 0),
			},
		},
	)
}

// TestSlidingWindowBucketsConservativeNeverOverAdmits drives 1.2 million
// decisions of Poisson sources at 0.8–1.2× their limit (and a share of
// costs 2 and 3) through conservative bucketed windows of N = 4, 10 and
// 60 on a memory store, and judges each against the exact sliding log of
// what that limiter itself admitted: no request may be allowed that would
// put more than Limit in the window (now − Period, now].
func TestSlidingWindowBucketsConservativeNeverOverAdmits(t *testing.T) {
	const (
		sources  = 40
		perN     = 400_000
		limit    = 100
		periodUS = 60_000_000
	)
	ctx := context.Background()
	total := 0
	for _, N := range []int64{4, 10, 60} {
		var now int64
		clk := testclock.New(time.UnixMicro(1_700_000_000_000_000))
		store := NewMemoryStore(MemorySettings{Clock: clk.Now})
		p := Policy{Algorithm: SlidingWindowBuckets, Limit: limit, Period: periodUS * time.Microsecond, Buckets: N, Mode: Conservative}
		lim, err := New(store, p, Settings{})
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(N), 28))
		next := make([]float64, sources)   // each source's next arrival, µs after the start
		rate := make([]float64, sources)   // arrivals per µs
		log := make([][]admitted, sources) // what the limiter admitted, oldest first
		keys := make([]string, sources)
		for s := range sources {
			rate[s] = (0.8 + 0.4*r.Float64()) * limit / periodUS
			next[s] = r.ExpFloat64() / rate[s]
			keys[s] = fmt.Sprint("src", s)
		}
		var allowed, denied int
		for range perN {
			s := 0
			for j := range next {
				if next[j] < next[s] {
					s = j
				}
			}
			now = 1_700_000_000_000_000 + int64(next[s])
			clk.Set(time.UnixMicro(now))
			next[s] += r.ExpFloat64() / rate[s]
			n := int64(1)
			if x := r.IntN(20); x == 0 {
				n = 3
			} else if x < 3 {
				n = 2
			}
			q := log[s]
			for len(q) > 0 && q[0].t <= now-periodUS {
				q = q[1:]
			}
			var inWindow int64
			for _, a := range q {
				inWindow += a.n
			}
			d, err := lim.Allow(ctx, keys[s], n)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				allowed++
				if inWindow+n > limit {
					t.Fatalf("N=%d: %s allowed %d at %d with %d already admitted in the window: the exact log denies", N, keys[s], n, now, inWindow)
				}
				q = append(q, admitted{now, n})
			} else {
				denied++
			}
			log[s] = q
		}
		total += allowed + denied
		t.Logf("N=%d: %d allowed, %d denied, 0 wrongly allowed", N, allowed, denied)
		if denied == 0 || allowed == 0 {
			t.Fatalf("N=%d: %d allowed, %d denied: the sources are not near their limit", N, allowed, denied)
		}
	}
	if total < 1_000_000 {
		t.Fatalf("%d decisions, want at least a million", total)
	}
}
