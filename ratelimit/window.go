package ratelimit

import "time"

// window is the time p takes to grant its Capacity from empty: Period for
// the windows (FixedWindow, SlidingWindowLog, SlidingWindowCounter,
// SlidingWindowBuckets), and
// Capacity emission intervals for the bucket family (token bucket, GCRA,
// leaky bucket): 60 s for 5/minute, 12 s for 1000/minute burst 200. It is
// the Window of the decisions that Limiter and tiers return, and the w= of
// the IETF RateLimit-Policy header. A policy that does not validate gives 0.
func (p Policy) window() time.Duration {
	if p.Validate() != nil {
		return 0
	}
	switch p.Algorithm {
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter, SlidingWindowBuckets:
		return p.Period
	}
	// Validate bounds Burst × EmissionInterval by 2^52 µs: no overflow.
	return time.Duration(p.Capacity()*p.emissionInterval()) * time.Microsecond
}
