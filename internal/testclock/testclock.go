// Package testclock is a settable clock for tests, safe for concurrent use:
// a test moves it with Advance while the code under test reads it with Now,
// or has every reading move it on by a step (SetStep).
package testclock

import (
	"sync"
	"time"
)

// Clock is a settable clock. Pass its Now method where code takes a
// func() time.Time.
type Clock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

// New returns a Clock set to start.
func New(start time.Time) *Clock { return &Clock{t: start} }

// Now returns the clock's time, first moving it by the step when one is
// set.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// Advance moves the clock by d (backwards when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// SetStep makes every later Now move the clock by d before reading it, so
// that two readings are d apart (0, the default, stops the stepping).
func (c *Clock) SetStep(d time.Duration) {
	c.mu.Lock()
	c.step = d
	c.mu.Unlock()
}
