package ratelimit

import (
	"testing"
	"time"
)

func TestPolicyWindow(t *testing.T) {
	for _, c := range []struct {
		p    Policy
		want time.Duration
	}{
		{Policy{Algorithm: TokenBucket, Limit: 5, Period: time.Minute}, time.Minute},
		{Policy{Algorithm: TokenBucket, Limit: 1000, Period: time.Minute, Burst: 200}, 12 * time.Second},
		{Policy{Algorithm: GCRA, Limit: 100, Period: time.Second, Burst: 50}, 500 * time.Millisecond},
		{Policy{Algorithm: LeakyBucket, Limit: 3, Period: time.Second, Burst: 1}, 333334 * time.Microsecond}, // ceil(1 s/3) µs
		{Policy{Algorithm: FixedWindow, Limit: 100, Period: time.Hour}, time.Hour},
		{Policy{Algorithm: SlidingWindowLog, Limit: 10, Period: 10 * time.Second}, 10 * time.Second},
		{Policy{Algorithm: SlidingWindowCounter, Limit: 10, Period: time.Minute}, time.Minute},
		{Policy{Algorithm: TokenBucket, Limit: 0, Period: time.Minute}, 0}, // invalid
	} {
		if got := c.p.window(); got != c.want {
			t.Errorf("%v: Window %v, want %v", c.p, got, c.want)
		}
	}
}
