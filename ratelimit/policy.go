package ratelimit

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm selects how a Policy counts. The zero value is TokenBucket.
//
// All algorithms work in integer microseconds. Let L = Limit, P = Period in
// µs, B = Burst (0 means L), n = cost, and T = ceil(P / L), the emission
// interval (µs per token; rounding up means a policy never admits more than
// it says). Every algorithm is a pure function of (state, now, n):
//
//   - TokenBucket, GCRA, LeakyBucket keep one value per key, the theoretical
//     arrival time TAT (µs). Capacity in time is τ = B·T. A request of n is
//     allowed iff max(TAT, now) + n·T − now ≤ τ; then TAT' = max(TAT, now) +
//     n·T. Remaining = floor((now + τ − TAT') / T); ResetAfter = TAT' − now
//     (≥ 0); RetryAfter on denial = max(TAT, now) + n·T − τ − now. The three
//     admit the same sequences (a meter-style leaky bucket and GCRA are the
//     token bucket seen from the other side) and share state for the same
//     scope and key; LeakyBucket additionally offers the smoothing delay
//     (see Limiter.Schedule), and reports its Limit as the bucket capacity B.
//   - FixedWindow: windows [k·P, (k+1)·P); one counter per key for the
//     current window, created with its expiry at the window end. Allowed iff
//     count + n ≤ L. Remaining = L − count'; ResetAfter = end of window − now
//     (0 when the count is 0); RetryAfter = end of window − now.
//   - SlidingWindowLog: one entry per admitted unit in the last P, each with
//     a unique member; an entry at ts counts while ts > now − P. Allowed iff
//     entries + n ≤ L; RetryAfter is when enough of the oldest entries leave
//     the window; ResetAfter when the newest does.
//   - SlidingWindowCounter: Cloudflare's estimate from the previous and the
//     current fixed window: est = floor(prev·(P − e) / P) + cur, e = now −
//     start of the current window. Allowed iff est + n ≤ L. RetryAfter and
//     ResetAfter are the exact times the estimate allows the request and
//     reaches 0 (see algorithms.go).
//   - SlidingWindowBuckets: the Period cut into N = Buckets sub-windows of
//     W = P/N µs, aligned on multiples of W; one count per sub-window for
//     the current one and the N before it (N+1 counts). At now, in
//     sub-window k with e = now − k·W elapsed, the N newest counts lie in
//     the window (now − P, now]; the oldest, sub-window k−N, overlaps its
//     start. Conservative counts it whole while it overlaps (e < W − 1),
//     so it never admits more than the exact log would in any window;
//     Interpolated weighs it by its overlap, floor(c·(W − e)/W), as the
//     counter does (N = 1 interpolated is the counter). Allowed iff
//     estimate + n ≤ L. RetryAfter and ResetAfter are the exact times the
//     estimate allows the request and reaches 0 (see algorithms.go).
//
// A cost above what the policy can ever admit (n > B for the bucket family,
// n > L for the windows) is denied with spillway.ReasonCostExceedsLimit and
// RetryAfter 0: it can never succeed. Cost 0 is a peek: always allowed,
// writes nothing, reports Remaining. A denial changes no state. Time going
// backwards never gives more room than if no time had passed: the bucket
// family clamps now to TAT − τ, the fixed window and the counter to the
// start of the stored window (sub-window for SlidingWindowBuckets), the
// log to its newest entry. Durations are
// computed in µs and reported rounded up to whole milliseconds. The exact
// arithmetic, shared by both stores, is ratelimit/algorithms.go.
type Algorithm uint8

const (
	TokenBucket Algorithm = iota
	GCRA
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
	LeakyBucket
	SlidingWindowBuckets
	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{"token_bucket", "gcra", "fixed_window", "sliding_window_log", "sliding_window_counter", "leaky_bucket", "sliding_window_buckets"}

// String returns the snake_case name used in configs ("token_bucket").
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// AlgorithmNames lists the names UnmarshalText accepts, comma-separated,
// for error messages.
const AlgorithmNames = "token_bucket, gcra, fixed_window, sliding_window_log, sliding_window_counter, leaky_bucket, sliding_window_buckets"

// UnmarshalText sets a to the algorithm named text, the name String
// returns (encoding.TextUnmarshaler: flags, JSON and YAML decode it).
func (a *Algorithm) UnmarshalText(text []byte) error {
	for i, n := range algorithmNames {
		if n == string(text) {
			*a = Algorithm(i)
			return nil
		}
	}
	return fmt.Errorf("ratelimit: unknown algorithm %q (want one of %s)", text, AlgorithmNames)
}

// Policy is a rate: Limit requests per Period, with a Burst capacity for the
// bucket family. It is a plain comparable value.
type Policy struct {
	Algorithm Algorithm     // zero value: TokenBucket
	Limit     int64         // requests per Period; must be > 0
	Period    time.Duration // must be ≥ 1µs and a whole number of µs... see Validate
	Burst     int64         // capacity for TokenBucket, GCRA, LeakyBucket; 0 means Limit; ignored (must be 0 or Limit) by the windows
	// Buckets is SlidingWindowBuckets' number of sub-windows per Period,
	// N; 0 means DefaultBuckets. Period must be a whole multiple of N µs.
	// Other algorithms: must be 0.
	Buckets int64
	// Mode is how SlidingWindowBuckets counts the oldest sub-window; the
	// zero value is Interpolated. Other algorithms: must be the zero value.
	Mode WindowMode
}

// WindowMode says how SlidingWindowBuckets counts its oldest sub-window,
// the one that straddles the start of the window (see Algorithm).
type WindowMode uint8

const (
	// Interpolated weighs the oldest sub-window's count by its overlap with
	// the window. Closest to the exact log on average; it can admit more
	// than Limit within one Period: at most Limit plus the oldest
	// sub-window's count times the elapsed share of the current one (see
	// docs/ratelimit.md for the bound and the measured error).
	Interpolated WindowMode = iota
	// Conservative counts the oldest sub-window whole while it overlaps
	// the window: it never admits more than Limit in any window of one
	// Period (never more than the exact sliding log would), and may deny
	// up to about Limit/Buckets too early.
	Conservative
	numModes
)

var modeNames = [numModes]string{"interpolated", "conservative"}

// String returns the name used in configs ("interpolated").
func (m WindowMode) String() string {
	if m < numModes {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// DefaultBuckets is SlidingWindowBuckets' number of sub-windows when
// Policy.Buckets is 0.
const DefaultBuckets = 10

// MaxBuckets is the largest Policy.Buckets that Validate accepts: a key's
// state is Buckets+1 counts.
const MaxBuckets = 1000

// effectiveBuckets returns Buckets, or DefaultBuckets when it is 0.
func (p Policy) effectiveBuckets() int64 {
	if p.Buckets == 0 {
		return DefaultBuckets
	}
	return p.Buckets
}

// MaxSpanMicros is the largest Burst·T (bucket family) and the longest
// Period, in µs, that Validate accepts: 2^52 µs, about 142 years. The
// Redis scripts compute in doubles, exact up to 2^53: a bucket stores the
// arrival time now + Burst·T and forms a need of up to 2·Burst·T, a window
// forms times up to now + 2·Period, so with this bound every number they
// form stays exact until the year 2112 (now ≤ 2^52 µs). At Burst·T = 2^53
// the scripts would round and the two stores disagree. The windows' product
// Limit·Period (a count times a duration, never added to now) may go up to
// 2^53.
const MaxSpanMicros = 1 << 52

// maxExact is the largest integer a double represents exactly, with every
// integer below it.
const maxExact = 1 << 53

// ErrInvalidPolicy is wrapped by every policy validation error.
var ErrInvalidPolicy = errors.New("ratelimit: invalid policy")

// Validate reports what is wrong with p, naming the field. Limits: Limit and
// Period > 0, Period a whole number of microseconds, Burst ≥ 0, Period/Limit
// at least 1µs, Period and Burst·T (in µs) at most MaxSpanMicros (2^52) and
// Limit·Period at most 2^53, so that the Redis scripts, which compute in
// doubles, stay exact.
func (p Policy) Validate() error {
	if p.Algorithm >= numAlgorithms {
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidPolicy, uint8(p.Algorithm))
	}
	if p.Limit <= 0 {
		return fmt.Errorf("%w: limit %d must be positive", ErrInvalidPolicy, p.Limit)
	}
	if p.Period <= 0 {
		return fmt.Errorf("%w: period %v must be positive", ErrInvalidPolicy, p.Period)
	}
	if p.Period%time.Microsecond != 0 {
		return fmt.Errorf("%w: period %v must be a whole number of microseconds", ErrInvalidPolicy, p.Period)
	}
	if p.Burst < 0 {
		return fmt.Errorf("%w: burst %d must not be negative", ErrInvalidPolicy, p.Burst)
	}
	if p.Algorithm != SlidingWindowBuckets && (p.Buckets != 0 || p.Mode != 0) {
		return fmt.Errorf("%w: buckets %d and mode %s are for sliding_window_buckets only, not %s", ErrInvalidPolicy, p.Buckets, p.Mode, p.Algorithm)
	}
	periodUS := p.Period.Microseconds()
	if periodUS > MaxSpanMicros {
		return fmt.Errorf("%w: period %v exceeds 2^52 µs (MaxSpanMicros, about 142 years)", ErrInvalidPolicy, p.Period)
	}
	if periodUS < p.Limit {
		return fmt.Errorf("%w: limit %d per %v is more than one per microsecond", ErrInvalidPolicy, p.Limit, p.Period)
	}
	if p.Algorithm == SlidingWindowBuckets {
		if p.Mode >= numModes {
			return fmt.Errorf("%w: unknown mode %d (want interpolated or conservative)", ErrInvalidPolicy, uint8(p.Mode))
		}
		if p.Buckets < 0 || p.Buckets > MaxBuckets {
			return fmt.Errorf("%w: buckets %d must be in [1, %d] (0: the default %d)", ErrInvalidPolicy, p.Buckets, MaxBuckets, DefaultBuckets)
		}
		if N := p.effectiveBuckets(); periodUS%N != 0 {
			return fmt.Errorf("%w: period %v is not a whole multiple of %d buckets (in µs)", ErrInvalidPolicy, p.Period, N)
		}
	}
	switch p.Algorithm {
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter, SlidingWindowBuckets:
		if p.Burst != 0 && p.Burst != p.Limit {
			return fmt.Errorf("%w: burst %d is not supported by %s (windows admit Limit per Period; leave burst 0)", ErrInvalidPolicy, p.Burst, p.Algorithm)
		}
		if p.Limit > maxExact/periodUS {
			return fmt.Errorf("%w: limit %d × period %v exceeds 2^53 µs", ErrInvalidPolicy, p.Limit, p.Period)
		}
	default:
		if p.effectiveBurst() > MaxSpanMicros/p.emissionInterval() {
			return fmt.Errorf("%w: burst %d × interval %dµs exceeds 2^52 µs (MaxSpanMicros)", ErrInvalidPolicy, p.effectiveBurst(), p.emissionInterval())
		}
	}
	return nil
}

// effectiveBurst returns Burst, or Limit when Burst is 0.
func (p Policy) effectiveBurst() int64 {
	if p.Burst == 0 {
		return p.Limit
	}
	return p.Burst
}

// Capacity is the largest cost the policy can ever admit in one request and
// the Limit reported in decisions: the burst for the bucket family, the limit
// for the windows.
func (p Policy) Capacity() int64 {
	switch p.Algorithm {
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter, SlidingWindowBuckets:
		return p.Limit
	}
	return p.effectiveBurst()
}

// emissionInterval is T = ceil(Period/Limit) in microseconds.
func (p Policy) emissionInterval() int64 {
	periodUS := p.Period.Microseconds()
	return (periodUS + p.Limit - 1) / p.Limit
}

// String formats p as "token_bucket 100/1s burst 50" (a bucketed window:
// "sliding_window_buckets 100/1m0s buckets 10 interpolated").
func (p Policy) String() string {
	s := fmt.Sprintf("%s %d/%v", p.Algorithm, p.Limit, p.Period)
	if p.Burst != 0 {
		s += fmt.Sprintf(" burst %d", p.Burst)
	}
	if p.Algorithm == SlidingWindowBuckets {
		s += fmt.Sprintf(" buckets %d %s", p.effectiveBuckets(), p.Mode)
	}
	return s
}
