package clientside

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// ThrottleSettings configures NewThrottle; its zero value is the default.
// Each constructor of the package takes its own settings struct, so a
// setting that does not apply to it does not compile.
type ThrottleSettings struct {
	// K is the multiplier of the throttle (0 means 2): the client sends
	// up to K times as many requests as the backend accepts. Lower is more
	// aggressive. It must be at least 1.
	K float64
	// Window is the sliding window (0 means 2 minutes), kept in Buckets
	// buckets (0 means 60): the window slides one bucket at a time.
	Window  time.Duration
	Buckets int
	// Clock is the clock (nil means time.Now).
	Clock func() time.Time
	// Rand is the uniform source in [0, 1) that decides local rejections
	// (nil means math/rand/v2.Float64); it must be safe for concurrent use
	// if the Throttle is used concurrently.
	Rand func() float64
}

// RetryBudgetSettings configures NewRetryBudget; its zero value is the
// default.
type RetryBudgetSettings struct {
	// Ratio is the tokens each request deposits (0 means 0.1, negative
	// means none): retries stay under this fraction of requests, plus the
	// minimum. It must be at most 1.
	Ratio float64
	// MinRetriesPerSecond is the tokens the budget gains per second
	// regardless of traffic (0 means 1, negative means none), so a client
	// with little traffic can still retry.
	MinRetriesPerSecond float64
	// MaxTokens is the most tokens the budget holds, and what it starts
	// with (0 means 10): the largest burst of retries. It must be at
	// least 1.
	MaxTokens float64
	// Clock is the clock (nil means time.Now).
	Clock func() time.Time
}

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

func throttleConfig(s ThrottleSettings) config {
	c := defaultConfig()
	if s.K != 0 {
		c.k = s.K
	}
	if s.Window != 0 {
		c.window = s.Window
	}
	if s.Buckets != 0 {
		c.buckets = s.Buckets
	}
	if s.Clock != nil {
		c.now = s.Clock
	}
	if s.Rand != nil {
		c.rand = s.Rand
	}
	return c
}

func budgetConfig(s RetryBudgetSettings) config {
	c := defaultConfig()
	switch {
	case s.Ratio < 0:
		c.ratio = 0
	case s.Ratio != 0:
		c.ratio = s.Ratio
	}
	switch {
	case s.MinRetriesPerSecond < 0:
		c.minPerSec = 0
	case s.MinRetriesPerSecond != 0:
		c.minPerSec = s.MinRetriesPerSecond
	}
	if s.MaxTokens != 0 {
		c.maxTokens = s.MaxTokens
	}
	if s.Clock != nil {
		c.now = s.Clock
	}
	return c
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

func bad(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }
