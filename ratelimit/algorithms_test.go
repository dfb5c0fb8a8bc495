package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// sim holds the state of one key for any algorithm and applies the pure
// functions of algorithms.go to it, as a store does.
type sim struct {
	p       Policy
	tat     int64
	fixed   fixedState
	counter counterState
	log     []int64
	head    int64   // SlidingWindowBuckets: newest sub-window
	buckets []int64 // SlidingWindowBuckets: counts, newest first
}

// decide runs the algorithm on the current state without committing.
func (s *sim) decide(now, n int64) outcome {
	c := *s
	c.log = slices.Clone(s.log)
	c.buckets = slices.Clone(s.buckets)
	return c.apply(now, n)
}

// apply runs the algorithm and commits, as a store does.
func (s *sim) apply(now, n int64) outcome {
	var o outcome
	switch s.p.Algorithm {
	case FixedWindow:
		o, s.fixed = fixedDecide(s.fixed, now, s.p.limits(), n)
	case SlidingWindowCounter:
		o, s.counter = counterDecide(s.counter, now, s.p.limits(), n)
	case SlidingWindowBuckets:
		var k int64
		lim := s.p.limits()
		o, k = bucketsDecide(s.head, s.buckets, now, lim, n)
		if o.allowed && n > 0 {
			if int64(len(s.buckets)) != lim.N+1 {
				s.buckets = make([]int64, lim.N+1)
			}
			shiftBuckets(s.buckets, k-s.head)
			s.buckets[0] += n
			s.head = k
		}
	case SlidingWindowLog:
		var trim int
		var at int64
		o, trim, at = logDecide(s.log, now, s.p.limits(), n)
		s.log = s.log[trim:]
		if o.allowed {
			for range n {
				s.log = append(s.log, at)
			}
		}
	default:
		o, s.tat = bucketDecide(s.tat, now, s.p.limits(), n)
	}
	return o
}

func (s *sim) state() any {
	switch s.p.Algorithm {
	case FixedWindow:
		return s.fixed
	case SlidingWindowCounter:
		return s.counter
	case SlidingWindowLog:
		return slices.Clone(s.log)
	case SlidingWindowBuckets:
		return fmt.Sprint(s.head, s.buckets)
	}
	return s.tat
}

// maxReset is the longest a state can take to be full again.
func maxReset(p Policy) int64 {
	P := p.Period.Microseconds()
	switch p.Algorithm {
	case FixedWindow, SlidingWindowLog:
		return P
	case SlidingWindowCounter:
		return 2 * P
	case SlidingWindowBuckets:
		return P + P/p.effectiveBuckets()
	}
	return p.effectiveBurst() * p.emissionInterval()
}

type admitted struct{ t, n int64 }

// checkAlgorithm drives one policy with random costs and time steps and
// checks every invariant the package documents.
func checkAlgorithm(t *testing.T, p Policy, seed uint64, steps int) {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatalf("invalid test policy %v: %v", p, err)
	}
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	P := p.Period.Microseconds()
	T := p.emissionInterval()
	capacity := p.Capacity()
	s := &sim{p: p}
	now := int64(1_700_000_000_000_000) + r.Int64N(P)
	var hist []admitted
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("policy %v seed %d: "+format, append([]any{p, seed}, args...)...)
	}
	for i := 0; i < steps; i++ {
		switch r.IntN(6) {
		case 0: // same instant
		case 1:
			now++
		case 2:
			now += r.Int64N(T + 1)
		case 3:
			now += r.Int64N(P + 1)
		case 4:
			now += r.Int64N(3 * P)
		case 5: // time going backwards: never more room than no time passing
			back := now - 1 - r.Int64N(2*P)
			n := r.Int64N(capacity + 1)
			ob, ol := s.decide(back, n), s.decide(now, n)
			if ob.allowed && !ol.allowed || s.decide(back, 0).remaining > s.decide(now, 0).remaining {
				fail("at %d (clock went back from %d) cost %d got %+v, more than no time passing %+v", back, now, n, ob, ol)
			}
			if ob.reset > maxReset(p) || ob.remaining < 0 {
				fail("backwards clock: out of range %+v", ob)
			}
			continue
		}
		var n int64
		switch r.IntN(8) {
		case 0:
			n = 0
		case 1:
			n = capacity + 1 + r.Int64N(3)
		default:
			n = 1 + r.Int64N(min(capacity, 4))
		}
		before := s.state()
		o := s.apply(now, n)
		after := s.state()

		// Ranges and reasons.
		if o.exceeds != (n > capacity) {
			fail("cost %d capacity %d: exceeds = %v", n, capacity, o.exceeds)
		}
		if o.remaining < 0 || o.remaining > capacity || o.reset < 0 || o.reset > maxReset(p) || o.retry < 0 {
			fail("out of range at %d cost %d: %+v", now, n, o)
		}
		if (o.retry == 0) != (o.allowed || o.exceeds) {
			fail("retry %d with allowed %v exceeds %v", o.retry, o.allowed, o.exceeds)
		}
		if stateTTL(o.reset) < 1 {
			fail("TTL below 1 ms")
		}
		// A denial and a peek change nothing.
		if (!o.allowed || n == 0) && !equalState(before, after) {
			fail("denied or peeked at %d cost %d changed the state: %v → %v", now, n, before, after)
		}
		if o.allowed && n > 0 {
			hist = append(hist, admitted{now, n})
		}
		// Remaining is exactly the largest cost that fits now.
		if !s.decide(now, o.remaining).allowed {
			fail("remaining %d does not fit at %d", o.remaining, now)
		}
		if o.remaining < capacity && s.decide(now, o.remaining+1).allowed {
			fail("remaining %d but %d fits at %d", o.remaining, o.remaining+1, now)
		}
		// RetryAfter is exactly when the same request fits.
		if !o.allowed && !o.exceeds {
			if !s.decide(now+o.retry, n).allowed {
				fail("cost %d denied at %d: retry %d too early", n, now, o.retry)
			}
			if s.decide(now+o.retry-1, n).allowed {
				fail("cost %d denied at %d: retry %d too late", n, now, o.retry)
			}
		}
		// ResetAfter is exactly when the state is full, and a full state
		// decides like no state at all (so a TTL may drop it).
		if full := s.decide(now+o.reset, 0); full.remaining != capacity {
			fail("at %d + reset %d remaining %d, want %d", now, o.reset, full.remaining, capacity)
		}
		if o.reset > 0 && s.decide(now+o.reset-1, 0).remaining == capacity {
			fail("at %d + reset %d − 1 already full", now, o.reset)
		}
		probe := 1 + r.Int64N(capacity)
		fresh := &sim{p: p}
		if got, want := s.decide(now+o.reset, probe), fresh.decide(now+o.reset, probe); got != want {
			fail("full state decides %+v, no state %+v", got, want)
		}
		// The state stays well formed.
		switch p.Algorithm {
		case FixedWindow:
			if s.fixed.count > p.Limit {
				fail("window count %d above limit", s.fixed.count)
			}
		case SlidingWindowCounter:
			if s.counter.cur > p.Limit || s.counter.prev > p.Limit {
				fail("counter state %+v above limit", s.counter)
			}
		case SlidingWindowBuckets:
			for _, c := range s.buckets {
				if c < 0 || c > p.Limit {
					fail("bucket counts %v out of [0, limit]", s.buckets)
				}
			}
		case SlidingWindowLog:
			if int64(len(s.log)) > p.Limit || !slices.IsSorted(s.log) {
				fail("log %v: longer than the limit or unsorted", s.log)
			}
		default:
			if s.tat-now > p.effectiveBurst()*T {
				fail("TAT %d is more than τ ahead of %d", s.tat, now)
			}
		}
	}
	checkAdmitted(t, p, hist)
}

func equalState(a, b any) bool {
	la, ok := a.([]int64)
	if ok {
		lb := b.([]int64)
		// Trimming expired entries is not a change.
		return len(lb) <= len(la) && slices.Equal(la[len(la)-len(lb):], lb)
	}
	return a == b
}

// checkAdmitted checks that no window admitted more than the policy allows.
func checkAdmitted(t *testing.T, p Policy, hist []admitted) {
	t.Helper()
	P := p.Period.Microseconds()
	L := p.Limit
	switch p.Algorithm {
	case FixedWindow, SlidingWindowCounter:
		per := map[int64]int64{}
		for _, a := range hist {
			per[a.t/P] += a.n
		}
		for w, c := range per {
			if c > L {
				t.Fatalf("policy %v: window %d admitted %d", p, w, c)
			}
		}
		if p.Algorithm == FixedWindow {
			return
		}
		// The sliding window counter: any span of one period admits
		// than 2L (see TestSlidingWindowCounterBoundaryBounded for the
		// practical bound).
		for i := range hist {
			var sum int64
			for j := i; j < len(hist) && hist[j].t < hist[i].t+P; j++ {
				sum += hist[j].n
			}
			if sum > 2*L {
				t.Fatalf("policy %v: %d admitted within one period from %d", p, sum, hist[i].t)
			}
		}
	case SlidingWindowBuckets:
		// Conservative: never more than L in any window (t−P, t];
		// Interpolated: at most L + the oldest sub-window's count ≤ 2L.
		bound := L
		if p.Mode == Interpolated {
			bound = 2 * L
		}
		for i := range hist {
			var sum int64
			for j := i; j < len(hist) && hist[j].t < hist[i].t+P; j++ {
				sum += hist[j].n
			}
			if sum > bound {
				t.Fatalf("policy %v: %d admitted within one period from %d", p, sum, hist[i].t)
			}
		}
	case SlidingWindowLog:
		for i := range hist {
			var sum int64
			for j := i; j < len(hist) && hist[j].t < hist[i].t+P; j++ {
				sum += hist[j].n
			}
			if sum > L {
				t.Fatalf("policy %v: %d admitted within one period from %d", p, sum, hist[i].t)
			}
		}
	default:
		B, T := p.effectiveBurst(), p.emissionInterval()
		for i := range hist {
			var sum int64
			for j := i; j < len(hist); j++ {
				sum += hist[j].n
				if sum > B+(hist[j].t-hist[i].t)/T {
					t.Fatalf("policy %v: %d admitted in [%d, %d], more than burst %d + %d µs / %d", p, sum, hist[i].t, hist[j].t, B, hist[j].t-hist[i].t, T)
				}
			}
		}
	}
}

// randomTestPolicy derives a small valid policy from fuzz inputs.
func randomTestPolicy(algo uint8, limit uint8, periodUS uint32, burst uint8) Policy {
	a := Algorithm(algo % uint8(numAlgorithms))
	L := 1 + int64(limit%20)
	P := L + int64(periodUS%2_000_000)
	p := Policy{Algorithm: a, Limit: L, Period: time.Duration(P) * time.Microsecond}
	switch a {
	case TokenBucket, GCRA, LeakyBucket:
		p.Burst = int64(burst % 30)
	case SlidingWindowBuckets:
		// N in 1..13 (and 0: the default), P a multiple of N, mode from
		// the burst's top bit
		N := int64(burst % 14)
		p.Buckets = N
		if burst&0x80 != 0 {
			p.Mode = Conservative
		}
		N = p.effectiveBuckets()
		p.Period = time.Duration(max((P+N-1)/N*N, N)) * time.Microsecond
	}
	return p
}

func TestAlgorithmInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 300; i++ {
		p := randomTestPolicy(uint8(r.Uint32()), uint8(r.Uint32()), r.Uint32(), uint8(r.Uint32()))
		checkAlgorithm(t, p, r.Uint64(), 150)
	}
}

func FuzzAlgorithms(f *testing.F) {
	f.Add(uint8(0), uint8(9), uint32(1_000_000), uint8(5), uint64(1))
	f.Add(uint8(2), uint8(2), uint32(999_997), uint8(0), uint64(2))
	f.Add(uint8(3), uint8(3), uint32(3), uint8(0), uint64(3))
	f.Add(uint8(4), uint8(19), uint32(1_234_567), uint8(0), uint64(4))
	f.Add(uint8(5), uint8(0), uint32(0), uint8(29), uint64(5))
	f.Fuzz(func(t *testing.T, algo, limit uint8, periodUS uint32, burst uint8, seed uint64) {
		checkAlgorithm(t, randomTestPolicy(algo, limit, periodUS, burst), seed, 200)
	})
}

// Regression tests named after the branches they pin.

func TestBucketTimeGoingBackwardsIsClamped(t *testing.T) {
	p := Policy{Limit: 10, Period: time.Second, Burst: 5} // T = 100ms, τ = 500ms
	_, tat := bucketDecide(0, 1_000_000, p.limits(), 5)   // TAT = 1.5s
	o, next := bucketDecide(tat, 0, p.limits(), 1)        // clamped to 1s
	if o.allowed || next != tat || o.remaining != 0 || o.reset != 500_000 || o.retry != 100_000 {
		t.Fatalf("got %+v TAT %d", o, next)
	}
}

func TestSaturatingArithmetic(t *testing.T) {
	if satAdd(math.MaxInt64, 1) != math.MaxInt64 || satAdd(math.MinInt64, -1) != math.MinInt64 || satAdd(3, -5) != -2 {
		t.Fatal("satAdd")
	}
	if satMul(math.MaxInt64, 2) != math.MaxInt64 || satMul(-math.MaxInt64, 2) != math.MinInt64 || satMul(-3, 4) != -12 || satMul(1<<31, 1<<31) != 1<<62 {
		t.Fatal("satMul")
	}
	// A clock near the end of int64 saturates instead of wrapping.
	p := Policy{Limit: 10, Period: time.Second}
	o, tat := bucketDecide(0, math.MaxInt64-10, p.limits(), 10)
	if !o.allowed || tat != math.MaxInt64 {
		t.Fatalf("got %+v TAT %d", o, tat)
	}
	if o, _ := fixedDecide(fixedState{}, math.MaxInt64, Policy{Algorithm: FixedWindow, Limit: 1, Period: 3 * time.Microsecond}.limits(), 1); !o.allowed || o.reset < 0 {
		t.Fatalf("fixed window at the end of time: %+v", o)
	}
}

func TestNegativeNowIsTheEpoch(t *testing.T) {
	p := Policy{Algorithm: FixedWindow, Limit: 2, Period: time.Second}
	o1, st := fixedDecide(fixedState{}, -5, p.limits(), 1)
	o2, _ := fixedDecide(fixedState{}, 0, p.limits(), 1)
	if o1 != o2 || st != (fixedState{0, 1}) {
		t.Fatalf("%+v %+v %+v", o1, o2, st)
	}
}

func TestStateTTL(t *testing.T) {
	for _, c := range []struct{ us, ms int64 }{{0, 1}, {-3, 1}, {1, 1}, {999, 1}, {1000, 1}, {1001, 2}, {1_500_000, 1500}} {
		if got := stateTTL(c.us); got != c.ms {
			t.Errorf("stateTTL(%d) = %d, want %d", c.us, got, c.ms)
		}
	}
	if ceilMillis(1) != time.Millisecond || ceilMillis(0) != 0 || ceilMillis(2000) != 2*time.Millisecond {
		t.Fatal("ceilMillis")
	}
}
