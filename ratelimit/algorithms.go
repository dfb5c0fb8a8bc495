package ratelimit

// This file is the whole algorithm math, written as pure functions of
// (state, now, policy, cost). The memory store runs them directly; the Redis
// Lua scripts (lua/*.lua) implement the same arithmetic line by line, and the
// differential test replays random sequences on both and compares every
// decision, so a change here is a change there.
//
// Conventions shared by every function:
//
//   - Times and durations are int64 microseconds. now is µs since the Unix
//     epoch; a negative now (before the epoch) is treated as 0.
//   - P = Period in µs, L = Limit, B = EffectiveBurst, n = cost (n ≥ 0; the
//     callers reject negative costs before calling).
//   - T = emissionInterval() = ceil(P / L), τ = B·T ("tau", the bucket
//     capacity expressed in time). Validate keeps B·T and P ≤ 2^52 and L·P ≤ 2^53, so the
//     products stay exact in Lua's doubles; the functions still saturate
//     instead of wrapping if a stored state belongs to another policy.
//   - A denial returns the state unchanged. Cost 0 is a peek: always allowed
//     (cost 0 never exceeds capacity and always fits), state unchanged.
//   - Cost above capacity (n > B for the bucket family, n > L for windows)
//     is denied with exceeds = true and retry 0: no wait makes it fit.
//     Remaining and reset then describe the current state.
//   - reset is the time until the state is back to full (Remaining =
//     capacity, nothing remembered); it is also the TTL of a Redis key
//     (see stateTTL). retry is the time until the same request can succeed,
//     0 when allowed.
//   - Time going backwards never gives more room than if no time had
//     passed: each algorithm clamps now to the earliest time its state
//     proves it has already seen (documented per function).

import (
	"math"
	"math/bits"
	"time"

	"github.com/spillway-go/spillway"
)

// limits are a policy's numbers in µs, computed once per policy (a Limiter
// keeps them) so the hot path does no division it can avoid.
type limits struct {
	L, P, B  int64 // Limit, Period in µs, EffectiveBurst
	T, tau   int64 // EmissionInterval, B·T
	capacity int64 // Policy.Capacity
	N, W     int64 // SlidingWindowBuckets: sub-windows per Period, their width P/N in µs
	interp   bool  // SlidingWindowBuckets: Interpolated mode
}

func (p Policy) limits() limits {
	T := p.emissionInterval()
	B := p.effectiveBurst()
	l := limits{L: p.Limit, P: p.Period.Microseconds(), B: B, T: T, tau: satMul(B, T), capacity: p.Capacity()}
	if p.Algorithm == SlidingWindowBuckets {
		l.N = p.effectiveBuckets()
		l.W = max(l.P/l.N, 1)
		l.interp = p.Mode == Interpolated
	}
	return l
}

// outcome is one algorithm's verdict, in µs; decision() turns it into the
// public spillway.Decision.
type outcome struct {
	allowed   bool
	exceeds   bool  // cost above capacity: denied forever, retry 0
	remaining int64 // what is left after this decision (current state when denied)
	reset     int64 // µs until the state is back to full
	retry     int64 // µs until the request can succeed; 0 when allowed or exceeds
	delay     int64 // bucket family only: µs from now until the request's slot (smoothing)
}

// decision builds the public decision. Durations are rounded UP to whole
// milliseconds (a caller that waits RetryAfter is never early).
func (o outcome) decision(scope string, p Policy) spillway.Decision {
	return o.decisionCap(scope, p.Capacity())
}

// decisionInto writes the decision into *d (the hot path: no copies).
func (o *outcome) decisionInto(d *spillway.Decision, scope string, capacity int64) {
	d.Allowed = o.allowed
	d.Reason = spillway.ReasonNone
	if o.exceeds {
		d.Reason = spillway.ReasonCostExceedsLimit
	} else if !o.allowed {
		d.Reason = spillway.ReasonRateLimited
	}
	d.Limiter = scope
	d.Limit = capacity
	d.Remaining = o.remaining
	d.ResetAfter = ceilMillis(o.reset)
	d.RetryAfter = ceilMillis(o.retry)
	d.Degraded = false
}

func (o outcome) decisionCap(scope string, capacity int64) spillway.Decision {
	d := spillway.Decision{
		Allowed:    o.allowed,
		Limiter:    scope,
		Limit:      capacity,
		Remaining:  o.remaining,
		ResetAfter: ceilMillis(o.reset),
		RetryAfter: ceilMillis(o.retry),
	}
	switch {
	case o.exceeds:
		d.Reason = spillway.ReasonCostExceedsLimit
	case !o.allowed:
		d.Reason = spillway.ReasonRateLimited
	}
	return d
}

// ceilMillis converts µs to a Duration rounded up to a whole millisecond.
func ceilMillis(us int64) time.Duration {
	const maxUS = math.MaxInt64 / int64(time.Microsecond) // the longest Duration, in µs
	if us <= 0 {
		return 0
	}
	if us > maxUS-1000 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration((us+999)/1000) * time.Millisecond
}

// stateTTL is the TTL, in milliseconds, of a key whose state is back to full
// reset µs from now: reset rounded up to a whole millisecond, and at least 1
// (Redis rejects a TTL of 0, and a key must never live forever). A state
// past its TTL is equivalent to no state at all, for every algorithm, so
// expiring (or evicting) it changes no future decision.
func stateTTL(reset int64) int64 {
	if reset <= 0 {
		return 1
	}
	ms := reset / 1000
	if reset%1000 != 0 {
		ms++
	}
	return ms
}

// ---------------------------------------------------------------------------
// TokenBucket, GCRA, LeakyBucket: one integer of state, the theoretical
// arrival time TAT (µs). TAT 0 (no state) means full.
//
//	now'      = max(now, TAT − τ)   // time backwards: see below
//	wait      = max(TAT, now') − now'           // in [0, τ]
//	need      = wait + n·T                      // TAT' − now'
//	allowed  ⇔ need ≤ τ
//	TAT'      = now' + need         (written only when allowed and n > 0)
//	remaining = floor((τ − need) / T)  when allowed
//	          = floor((τ − wait) / T)  when denied (the current state)
//	reset     = need when allowed, wait when denied
//	retry     = need − τ                        (denied only)
//	delay     = wait                // allowed only: when this request's turn
//	                                // comes, the smoothing delay of a leaky
//	                                // bucket used as a queue (Limiter.Schedule)
//
// The clamp: every write leaves TAT' − now ≤ τ, so TAT − τ is never later
// than the request that wrote TAT. A now before it (the clock went
// backwards, or the policy shrank) is moved up to it, where the state has
// exactly 0 room: never more room than if no time had passed, remaining
// never negative, reset never above τ. A now at or after TAT means the
// state is full: TAT ≤ now behaves exactly like no state (TAT 0).
// ---------------------------------------------------------------------------

func bucketDecide(tat, now int64, p limits, n int64) (o outcome, newTAT int64) {
	if now < 0 {
		now = 0
	}
	T, B, tau := p.T, p.B, p.tau
	if lo := tat - tau; now < lo { // tat ≥ 0 and tau ≥ 0: no overflow
		now = lo
	}
	wait := max(tat, now) - now // base − now', in [0, τ]
	if n > B {
		return outcome{exceeds: true, remaining: (tau - wait) / T, reset: wait}, tat
	}
	need := wait + n*T // TAT' − now'; n ≤ B, so n·T ≤ τ ≤ 2^52: no overflow
	if need > tau {
		return outcome{remaining: (tau - wait) / T, reset: wait, retry: need - tau}, tat
	}
	o = outcome{allowed: true, remaining: (tau - need) / T, reset: need, delay: wait}
	if n == 0 {
		return o, tat
	}
	return o, satAdd(now, need)
}

// ---------------------------------------------------------------------------
// FixedWindow: state (window index w, count c) for windows [k·P, (k+1)·P).
//
//	now'      = max(now, w·P)       // time backwards: stay in the stored window
//	k         = floor(now' / P); c = 0 if k > w
//	end       = (k+1)·P
//	allowed  ⇔ c + n ≤ L            (then c' = c + n, w' = k; written when n > 0)
//	remaining = L − c'              (c' = c when denied)
//	reset     = end − now' if c' > 0, else 0
//	retry     = end − now'          (denied only; the next window is empty and n ≤ L)
// ---------------------------------------------------------------------------

// fixedState is the FixedWindow state: the window index and its count.
type fixedState struct{ window, count int64 }

func fixedDecide(st fixedState, now int64, p limits, n int64) (outcome, fixedState) {
	if now < 0 {
		now = 0
	}
	P, L := p.P, p.L
	if lo := satMul(st.window, P); now < lo {
		now = lo
	}
	k := now / P
	c := st.count
	if k != st.window {
		c = 0
	}
	end := satMul(k+1, P)
	resetOf := func(c int64) int64 {
		if c > 0 {
			return end - now
		}
		return 0
	}
	if n > L {
		return outcome{exceeds: true, remaining: max(L-c, 0), reset: resetOf(c)}, st
	}
	if c+n > L {
		return outcome{remaining: max(L-c, 0), reset: resetOf(c), retry: end - now}, st
	}
	o := outcome{allowed: true, remaining: L - (c + n), reset: resetOf(c + n)}
	if n == 0 {
		return o, st
	}
	return o, fixedState{window: k, count: c + n}
}

// ---------------------------------------------------------------------------
// SlidingWindowCounter (Cloudflare): state (window index w, previous
// window's count prev, current window's count cur).
//
//	now'      = max(now, w·P)       // time backwards: stay in the stored window
//	k         = floor(now' / P)
//	          k = w:    (prev, cur) as stored
//	          k = w+1:  (prev, cur) = (cur, 0)
//	          k > w+1:  (prev, cur) = (0, 0)
//	e         = now' − k·P          // elapsed in the current window, 0 ≤ e < P
//	est(e)    = floor(prev·(P − e) / P) + cur
//	allowed  ⇔ est(e) + n ≤ L       (then cur' = cur + n, w' = k; written when n > 0)
//	remaining = L − est'            (est' with cur' when allowed; ≥ 0)
//
// drain(p, m) is the smallest offset x in a window such that
// floor(p·(P − x)/P) ≤ m, for m ≥ 0: 0 if p ≤ m, else
// ceil(((p − m − 1)·P + 1) / p) (always < P).
//
//	retry = drain(prev, L − cur − n) − e            if cur + n ≤ L
//	      = (P − e) + drain(cur, L − n)             otherwise (the next window)
//	reset = (P − e) + drain(cur', 0)                if cur' > 0
//	      = max(0, drain(prev, 0) − e)              otherwise
//
// The estimate never exceeds L within a policy, and any two adjacent
// windows together admit at most 2L (the fixed window's boundary burst
// halved in practice: see TestSlidingWindowCounterBoundaryBounded).
// ---------------------------------------------------------------------------

// counterState is the SlidingWindowCounter state.
type counterState struct{ window, prev, cur int64 }

func counterDecide(st counterState, now int64, p limits, n int64) (outcome, counterState) {
	if now < 0 {
		now = 0
	}
	P, L := p.P, p.L
	if lo := satMul(st.window, P); now < lo {
		now = lo
	}
	k := now / P
	prev, cur := st.prev, st.cur
	switch {
	case k == st.window:
	case k == st.window+1:
		prev, cur = cur, 0
	default:
		prev, cur = 0, 0
	}
	e := now - k*P
	est := func(cur int64) int64 { return satMul(prev, P-e)/P + cur }
	resetOf := func(cur int64) int64 {
		if cur > 0 {
			return (P - e) + drain(cur, 0, P)
		}
		return max(0, drain(prev, 0, P)-e)
	}
	if n > L {
		return outcome{exceeds: true, remaining: max(L-est(cur), 0), reset: resetOf(cur)}, st
	}
	if est(cur)+n > L {
		var retry int64
		if m := L - cur - n; m >= 0 {
			retry = drain(prev, m, P) - e
		} else {
			retry = (P - e) + drain(cur, L-n, P)
		}
		return outcome{remaining: max(L-est(cur), 0), reset: resetOf(cur), retry: retry}, st
	}
	o := outcome{allowed: true, remaining: L - est(cur+n), reset: resetOf(cur + n)}
	if n == 0 {
		return o, st
	}
	return o, counterState{window: k, prev: prev, cur: cur + n}
}

// drain returns the smallest x ≥ 0 with floor(p·(P−x)/P) ≤ m (m ≥ 0).
func drain(p, m, P int64) int64 {
	if p <= m {
		return 0
	}
	num := satAdd(satMul(p-m-1, P), 1)
	return (num + p - 1) / p
}

// ---------------------------------------------------------------------------
// SlidingWindowLog: one timestamp per admitted unit, ascending. An entry ts
// is in the window at now iff ts > now − P, so it leaves at ts + P.
//
//	now'      = max(now, newest)    // time backwards: not before the newest entry
//	live      = entries with ts > now' − P   (the older ones are trimmed)
//	c         = len(live)
//	allowed  ⇔ c + n ≤ L            (then n entries of now' are appended)
//	remaining = L − c'
//	reset     = newest' + P − now' if c' > 0, else 0
//	retry     = live[c + n − L − 1] + P − now'   (denied only: when enough of
//	            the oldest entries have left)
//
// The function does not modify ts: it reports how many leading entries are
// expired (trim, which a caller may drop whatever the verdict) and the time
// at which to append n entries when allowed.
// ---------------------------------------------------------------------------

func logDecide(ts []int64, now int64, p limits, n int64) (o outcome, trim int, at int64) {
	if now < 0 {
		now = 0
	}
	P, L := p.P, p.L
	if len(ts) > 0 && now < ts[len(ts)-1] {
		now = ts[len(ts)-1]
	}
	cutoff := now - P // entries ≤ cutoff are out
	for trim < len(ts) && ts[trim] <= cutoff {
		trim++
	}
	live := ts[trim:]
	c := int64(len(live))
	resetOf := func(c int64, newest int64) int64 {
		if c > 0 {
			return newest + P - now
		}
		return 0
	}
	var newest int64
	if c > 0 {
		newest = live[c-1]
	}
	if n > L {
		return outcome{exceeds: true, remaining: max(L-c, 0), reset: resetOf(c, newest)}, trim, now
	}
	if c+n > L {
		return outcome{
			remaining: max(L-c, 0),
			reset:     resetOf(c, newest),
			retry:     live[c+n-L-1] + P - now,
		}, trim, now
	}
	if n > 0 {
		newest = now
	}
	return outcome{allowed: true, remaining: L - (c + n), reset: resetOf(c+n, newest)}, trim, now
}

// ---------------------------------------------------------------------------
// Saturating arithmetic: results clamp to [MinInt64, MaxInt64] instead of
// wrapping. Only reachable with absurd clocks or a state written under
// another policy; it keeps every comparison above meaningful.
// ---------------------------------------------------------------------------

func satAdd(a, b int64) int64 {
	s := a + b
	if (s > a) == (b > 0) {
		return s
	}
	if b > 0 {
		return math.MaxInt64
	}
	return math.MinInt64
}

func satMul(a, b int64) int64 {
	if a >= 0 && b >= 0 { // the only case on the normal paths: cheap
		hi, lo := bits.Mul64(uint64(a), uint64(b))
		if hi != 0 || lo > math.MaxInt64 {
			return math.MaxInt64
		}
		return int64(lo)
	}
	if a == 0 || b == 0 {
		return 0
	}
	p := a * b
	if p/b == a && !(a == -1 && b == math.MinInt64) && !(b == -1 && a == math.MinInt64) {
		return p
	}
	if (a > 0) == (b > 0) {
		return math.MaxInt64
	}
	return math.MinInt64
}

// ---------------------------------------------------------------------------
// SlidingWindowBuckets: the Period cut into N sub-windows of W = P/N µs,
// sub-window j = [j·W, (j+1)·W). State: the index h of the newest stored
// sub-window and counts c[0..N], c[i] the count of sub-window h − i
// (newest first; no state: h = 0, no counts; counts of another length,
// written under another N, read as no state).
//
//	now'      = max(now, h·W)       // time backwards: stay in the stored sub-window
//	k         = floor(now' / W); e = now' − k·W       (0 ≤ e < W)
//	a(i)      = c[i − (k − h)], 0 outside [0, N]      // the counts shifted to k
//	full      = a(0) + … + a(N−1)   // sub-windows k−N+1 … k: inside (now' − P, now']
//	old       = a(N)                // sub-window k−N: overlaps the window's start
//	wt(c, e)  = c if e < W − 1, else 0                // Conservative: any overlap counts whole
//	          = floor(c·(W − e) / W)                  // Interpolated: weighed by its overlap
//	est       = full + wt(old, e)
//	allowed  ⇔ est + n ≤ L         (then c' = a with a(0) + n, h' = k; written when n > 0)
//	remaining = L − est'            (est' with the charge when allowed; ≥ 0)
//
// Sub-window k−N's entries are those at times ≤ (k−N+1)·W − 1, inside the
// window iff > now' − P = (k−N)·W + e: some can be iff e < W − 1. So
// Conservative's estimate is never below the exact count of what it
// admitted in (now' − P, now'], and it never lets a window hold more than
// L. Interpolated's window holds at most L + ⌈old·e/W⌉.
//
// zero(c, x0) is the smallest x ≥ x0 in a sub-window with wt(c, x) ≤ m,
// for m ≥ 0: x0 if wt(c, x0) ≤ m; else W − 1 (Conservative) or
// max(x0, drain(c, m, W)) (Interpolated).
//
//	retry = min over j = 0 … N of j·W + x_j − e, where after j sub-windows
//	        full_j = a(0) + … + a(N−1−j), old_j = a(N−j), m_j = L − n − full_j,
//	        and x_j = zero(old_j, j = 0 ? e : 0) taken at the first j with
//	        m_j ≥ 0 (at j = N, full_N = 0: n ≤ L always fits)
//	reset = (N − i)·W + zero(a(i), 0 with m = 0) − e, for the newest i with
//	        a(i) > 0 (the charge included), clamped at 0; 0 with no count
// ---------------------------------------------------------------------------

// bucketsView is the counts c of a state seen s sub-windows after its
// newest (a(i) = c[i − s]), with add more in a(0): the charge.
type bucketsView struct {
	c   []int64
	s   int64
	add int64
}

func (v *bucketsView) at(i int64) int64 {
	var x int64
	if j := i - v.s; j >= 0 && j < int64(len(v.c)) {
		x = v.c[j]
	}
	if i == 0 {
		x += v.add
	}
	return x
}

// weight is wt(c, e) of the policy's mode.
func (p *limits) weight(c, e int64) int64 {
	if p.interp {
		return satMul(c, p.W-e) / p.W
	}
	if e < p.W-1 {
		return c
	}
	return 0
}

// zeroAt is the smallest x ≥ x0 (0 ≤ x0 < W) with wt(c, x) ≤ m (m ≥ 0).
func (p *limits) zeroAt(c, m, x0 int64) int64 {
	if p.weight(c, x0) <= m {
		return x0
	}
	if p.interp {
		return max(x0, drain(c, m, p.W))
	}
	return p.W - 1
}

// bucketsDecide decides n against the state (h, c) at now. It returns the
// index k of the sub-window now falls in; when the request is allowed
// with n > 0, the caller writes h' = k and c' = the counts shifted by
// k − h (shiftBuckets) with n added to c'[0].
func bucketsDecide(h int64, c []int64, now int64, p limits, n int64) (o outcome, k int64) {
	if now < 0 {
		now = 0
	}
	N, W, L := p.N, p.W, p.L
	if int64(len(c)) != N+1 {
		h, c = 0, nil
	}
	if lo := satMul(h, W); now < lo {
		now = lo
	}
	k = now / W
	e := now - k*W
	v := bucketsView{c: c, s: k - h}
	var full int64
	for i := max(v.s, 0); i < N; i++ {
		full = satAdd(full, v.at(i))
	}
	est := satAdd(full, p.weight(v.at(N), e))
	if n > L {
		return outcome{exceeds: true, remaining: max(L-est, 0), reset: p.bucketsReset(&v, e)}, k
	}
	if satAdd(est, n) > L {
		return outcome{remaining: max(L-est, 0), reset: p.bucketsReset(&v, e), retry: p.bucketsRetry(&v, e, full, n)}, k
	}
	o = outcome{allowed: true, remaining: L - est - n}
	v.add = n
	o.reset = p.bucketsReset(&v, e)
	return o, k
}

// bucketsReset is the time from e until the estimate of v is 0.
func (p *limits) bucketsReset(v *bucketsView, e int64) int64 {
	for i := int64(0); i <= p.N; i++ {
		if c := v.at(i); c > 0 {
			return max(0, (p.N-i)*p.W+p.zeroAt(c, 0, 0)-e)
		}
	}
	return 0
}

// bucketsRetry is the time from e until n fits in v, whose N newest
// counts sum to full (n ≤ L).
func (p *limits) bucketsRetry(v *bucketsView, e, full, n int64) int64 {
	x0 := e
	for j := int64(0); j <= p.N; j++ {
		if m := p.L - n - full; m >= 0 {
			return j*p.W + p.zeroAt(v.at(p.N-j), m, x0) - e
		}
		full -= v.at(p.N - 1 - j)
		x0 = 0
	}
	return 0 // unreachable: full_N = 0 and n ≤ L
}

// shiftBuckets moves the counts c (newest first) s sub-windows on, in
// place: c[i] = old c[i − s], 0 where there is none.
func shiftBuckets(c []int64, s int64) {
	if s <= 0 {
		return
	}
	if s >= int64(len(c)) {
		clear(c)
		return
	}
	copy(c[s:], c[:int64(len(c))-s])
	clear(c[:s])
}
