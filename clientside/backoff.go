package clientside

import (
	"math/rand/v2"
	"time"
)

// Backoff computes how long to wait before a retry. The zero value uses
// the documented defaults.
//
// Without a Retry-After the wait is exponential with "equal jitter":
// d = min(Max, Base·2^(attempt−1)), and the wait is uniform in [d/2, d).
// With a Retry-After the server's word wins: the wait is uniform in
// [RetryAfter, RetryAfter·(1+Jitter)), never earlier than asked, so clients
// told the same value do not return in lockstep; a Retry-After above
// MaxRetryAfter means do not retry.
type Backoff struct {
	Base          time.Duration  // first exponential wait; 0 means 100ms
	Max           time.Duration  // cap on the exponential wait; 0 means 10s
	MaxRetryAfter time.Duration  // longest Retry-After worth waiting for; 0 means 30s
	Jitter        float64        // spread added to a Retry-After, as a fraction; 0 means 0.2, negative means none
	Rand          func() float64 // uniform in [0, 1); nil means math/rand/v2.Float64
}

// Delay returns the wait before retry number attempt (1 for the first
// retry) given the server's Retry-After (0 when it sent none), and whether
// to retry at all.
func (b Backoff) Delay(attempt int, retryAfter time.Duration) (time.Duration, bool) {
	base, maxD, maxRA, jitter, rnd := b.Base, b.Max, b.MaxRetryAfter, b.Jitter, b.Rand
	if base <= 0 {
		base = 100 * time.Millisecond
	}
	if maxD <= 0 {
		maxD = 10 * time.Second
	}
	if maxRA <= 0 {
		maxRA = 30 * time.Second
	}
	switch {
	case jitter == 0:
		jitter = 0.2
	case jitter < 0:
		jitter = 0
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	if retryAfter > 0 {
		if retryAfter > maxRA {
			return 0, false
		}
		return retryAfter + time.Duration(rnd()*jitter*float64(retryAfter)), true
	}
	if attempt < 1 {
		attempt = 1
	}
	d := base
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2 // cannot overflow: d < maxD before doubling
	}
	d = min(d, maxD)
	return d/2 + time.Duration(rnd()*float64(d/2)), true
}
