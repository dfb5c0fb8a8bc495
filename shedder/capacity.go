package shedder

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Reading is what a dependency (a database, say) reports about how much
// of its capacity was used over a window: units of work (connections,
// workers) busy and idle on average from Since to At. Busy + Idle is its
// capacity now.
type Reading struct {
	Since, At  time.Time // the window; a reading whose At did not move is not new
	Busy, Idle float64   // units busy and idle on average over the window
	// Active is the work at the dependency on average over the window,
	// the work waiting for a unit included (queries queued for a worker,
	// a lock or a connection; a run queue): Busy plus what waits. 0 when
	// the gauge does not measure it. A Pool's learned limit reads slow
	// work as an overload only while work waits: a reading that began
	// after its last cut and shows less than half a unit waiting (Active
	// − Busy < 0.5) says the dependency is slower, not queueing, as an
	// idle unit does.
	Active float64
}

// Gauge reports the dependency's latest Reading. A CapacityWatcher calls
// it once per poll, from one goroutine at a time, with a context bounded
// by its timeout. A gauge that knows only the dependency's capacity (its
// healthy replicas times their connections, say) returns
// Reading{At: time.Now(), Busy: capacity}: every call a new reading, all of
// it busy, so it sizes the fleet shedder and never raises a Pool's limit.
type Gauge func(ctx context.Context) (Reading, error)

// CapacityWatcher is the capacity input of the full chain: it polls a
// Gauge of the shared dependency and, on every new reading (its At
// moved), sets the fleet shedder's capacity to what the dependency
// reports (Busy + Idle, rounded down, at least 1, at most the Fleet's
// capacity when the watcher was made) and hands the reading to the Pool,
// which takes its share of the idle capacity at once.
//
// Latency alone cannot tell a dependency that has room for one more call
// from one that has none: below its capacity every call takes as long,
// so a learned limit finds the capacity only by passing it. The gauge
// says where the capacity is without passing it, and the Fleet sheds by
// priority against the capacity the dependency has now, not the one it
// was configured with.
//
// A reading that fails, is not new, or is not finite and non-negative
// changes nothing: the Fleet keeps its last capacity. Safe for concurrent
// use.
type CapacityWatcher struct {
	g        Gauge
	fleet    *Fleet
	pool     *Pool
	max      int64
	interval time.Duration
	timeout  time.Duration

	mu     sync.Mutex // serializes polls
	last   Reading
	errors atomic.Int64
}

// NewCapacityWatcher returns a watcher that feeds g's readings to fleet
// and pool; either may be nil, not both. The fleet's capacity when it is
// made is the most the watcher ever sets.
func NewCapacityWatcher(g Gauge, fleet *Fleet, pool *Pool, s WatcherSettings) (*CapacityWatcher, error) {
	if g == nil {
		return nil, fmt.Errorf("shedder: capacity gauge is nil")
	}
	if fleet == nil && pool == nil {
		return nil, fmt.Errorf("shedder: capacity watcher has neither a fleet nor a pool to feed")
	}
	interval, timeout := orDur(s.Interval, 100*time.Millisecond), orDur(s.Timeout, 50*time.Millisecond)
	if interval <= 0 {
		return nil, fmt.Errorf("shedder: capacity interval %v must be positive", interval)
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("shedder: capacity timeout %v must be positive", timeout)
	}
	w := &CapacityWatcher{g: g, fleet: fleet, pool: pool, interval: interval, timeout: timeout}
	if fleet != nil {
		w.max = fleet.capacity.Load()
	}
	return w, nil
}

// errBadReading is returned by poll for a reading that is not finite and
// non-negative.
var errBadReading = errors.New("shedder: capacity reading must be finite and non-negative")

// poll reads the gauge once and, when the reading is new, applies it. It
// returns the gauge's error or errBadReading (wrapped); nothing changes
// then.
func (w *CapacityWatcher) poll(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	r, err := w.g(ctx)
	cancel()
	if err != nil {
		w.errors.Add(1)
		return fmt.Errorf("shedder: capacity gauge: %w", err)
	}
	if r.At.IsZero() || r.At.Equal(w.last.At) {
		return nil // none yet, or the one already applied
	}
	if !(r.Busy >= 0 && r.Idle >= 0 && r.Active >= 0) || math.IsInf(r.Busy+r.Idle+r.Active, 1) {
		w.errors.Add(1)
		return fmt.Errorf("%w: busy %v, idle %v, active %v", errBadReading, r.Busy, r.Idle, r.Active)
	}
	w.last = r
	if w.fleet != nil {
		est := int64(math.Floor(min(r.Busy+r.Idle, MaxFleetCapacity) + 1e-6))
		_ = w.fleet.setCapacity(min(w.max, max(1, est))) // in range: never fails
	}
	if w.pool != nil {
		w.pool.observe(r)
	}
	return nil
}

// Run reads the gauge every interval until ctx ends, then returns
// ctx.Err(). A failed or bad reading does not stop it; it changes nothing.
func (w *CapacityWatcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		_ = w.poll(ctx)
	}
}

// lastReading returns the last reading applied (the zero Reading before
// the first).
func (w *CapacityWatcher) lastReading() Reading {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// failures returns how many polls failed or read a bad reading.
func (w *CapacityWatcher) failures() int64 { return w.errors.Load() }
