package clientside

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Option configures a Throttle or a RetryBudget; an option that does not
// apply to one is ignored by it, as documented on each.
type Option func(*config)

type config struct {
	now       func() time.Time
	rand      func() float64
	k         float64
	window    time.Duration
	buckets   int
	ratio     float64
	minPerSec float64
	maxTokens float64
}

func defaultConfig() config {
	return config{
		now:       time.Now,
		rand:      rand.Float64,
		k:         2,
		window:    2 * time.Minute,
		buckets:   60,
		ratio:     0.1,
		minPerSec: 1,
		maxTokens: 10,
	}
}

func (c *config) validate() error {
	if c.now == nil {
		return fmt.Errorf("clientside: clock is nil")
	}
	if c.rand == nil {
		return fmt.Errorf("clientside: rand is nil")
	}
	return nil
}

// WithClock sets the clock (default time.Now).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithRand sets the uniform source in [0, 1) that decides local rejections
// (default math/rand/v2.Float64); it must be safe for concurrent use if the
// Throttle is used concurrently. Throttle only.
func WithRand(f func() float64) Option { return func(c *config) { c.rand = f } }

// WithK sets the multiplier K of the throttle (default 2): the client sends
// up to K times as many requests as the backend accepts. Lower is more
// aggressive. It must be at least 1. Throttle only.
func WithK(k float64) Option { return func(c *config) { c.k = k } }

// WithWindow sets the sliding window of the throttle (default 2 minutes)
// and the number of buckets it is kept in (default 60): the window slides
// one bucket at a time. Throttle only.
func WithWindow(window time.Duration, buckets int) Option {
	return func(c *config) { c.window, c.buckets = window, buckets }
}

// WithRatio sets the tokens each request deposits in a retry budget
// (default 0.1): retries stay under this fraction of requests, plus the
// minimum. It must be in [0, 1]. RetryBudget only.
func WithRatio(r float64) Option { return func(c *config) { c.ratio = r } }

// WithMinRetriesPerSecond sets the tokens a retry budget gains per second
// regardless of traffic (default 1), so a client with little traffic can
// still retry. It must not be negative. RetryBudget only.
func WithMinRetriesPerSecond(n float64) Option { return func(c *config) { c.minPerSec = n } }

// WithMaxTokens sets the most tokens a retry budget holds, and what it
// starts with (default 10): the largest burst of retries. It must be at
// least 1. RetryBudget only.
func WithMaxTokens(n float64) Option { return func(c *config) { c.maxTokens = n } }

func bad(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }
