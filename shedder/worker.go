package shedder

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// Source reports a utilization reading: 0 is idle, 1 is saturated; values
// above 1 mean overload. The Worker calls it once per tick, from one
// goroutine at a time.
type Source interface {
	Utilization() (float64, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func() (float64, error)

// Utilization calls f.
func (f SourceFunc) Utilization() (float64, error) { return f() }

// maxLevel is the shed level at which every priority is shed.
const maxLevel = float64(spillway.NumPriorities)

// Worker is the worker utilization load shedder: it protects one server by
// shedding the lowest priorities first as the server's utilization rises.
//
// Utilization is the largest of the peak in-flight work since the last tick
// over the worker capacity and the readings of the optional Sources (CPU
// from cgroups, say). A shed
// level L in [0, 4] turns into a shed probability per priority,
// clamp(L − p, 0, 1): Sheddable (p=0) is shed first, SheddablePlus only
// once Sheddable is shed entirely, then Critical, and CriticalPlus only once
// everything below is. Every tick L moves by a step — up while utilization
// is at or above the band's high mark or the hard cap (below) denied
// something, down while it is at or below the low
// mark or while the load offered in the last tick would fit under the high
// mark even unshed — and holds in between, so shedding ramps in and out
// gradually and does not flap.
//
// Independently of L, a hard cap keeps in-flight work within capacity:
// Sheddable and SheddablePlus work may use only capacity×(1−reserve),
// Critical the whole capacity, and CriticalPlus is not capped (it is shed
// only by L). Allowed decisions carry Limit 0, so a chain's headers keep
// reporting the client's own quota; denials carry the capacity and what is
// left of it.
//
// A Worker is safe for concurrent use. Ticks run lazily inside Admit when
// the clock has passed the next tick; no goroutine is started.
type Worker struct {
	capacity int64
	caps     [spillway.NumPriorities]int64 // hard cap on in-flight per priority
	o        options

	inflight atomic.Int64
	level    atomic.Uint64 // math.Float64bits of L
	offered  atomic.Int64  // cost offered since the last tick
	admitted atomic.Int64  // cost admitted since the last tick
	next     atomic.Int64  // UnixNano of the next tick
	peak     atomic.Int64  // largest in-flight since the last tick
	capHit   atomic.Bool   // the hard cap denied since the last tick

	mu        sync.Mutex // held by the goroutine running a tick
	last      time.Time
	lastUtil  float64
	srcErrors int64
}

// NewWorker returns a Worker for a server that can work on capacity units
// of cost at once (its worker pool size, say).
func NewWorker(capacity int64, opts ...Option) (*Worker, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("shedder: worker capacity %d must be positive", capacity)
	}
	o := defaultOptions("worker")
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validateWorker(); err != nil {
		return nil, err
	}
	w := &Worker{capacity: capacity, o: o}
	low := int64(math.Floor(float64(capacity) * (1 - o.reserve)))
	if low < 1 {
		low = 1
	}
	w.caps = [spillway.NumPriorities]int64{low, low, capacity, math.MaxInt64}
	return w, nil
}

// Admit decides r. It never returns an error. When allowed, done releases
// r's cost from the in-flight count.
func (w *Worker) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if err := r.Validate(); err != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: w.o.name}, spillway.Noop, nil
	}
	now := w.o.now()
	w.maybeTick(now)
	c := r.EffectiveCost()
	p := r.Priority
	w.offered.Add(c)
	if q := w.ShedProbability(p); q > 0 && (q >= 1 || w.o.rand() < q) {
		return w.deny(w.inflight.Load()), spillway.Noop, nil
	}
	n := w.inflight.Add(c)
	if n > w.caps[p] {
		n = w.inflight.Add(-c)
		w.capHit.Store(true)
		return w.deny(n), spillway.Noop, nil
	}
	for {
		old := w.peak.Load()
		if n <= old || w.peak.CompareAndSwap(old, n) {
			break
		}
	}
	w.admitted.Add(c)
	return spillway.Decision{Allowed: true, Limiter: w.o.name}, spillway.Once(func(spillway.Outcome) {
		w.inflight.Add(-c)
	}), nil
}

func (w *Worker) deny(inflight int64) spillway.Decision {
	rem := w.capacity - inflight
	if rem < 0 {
		rem = 0
	}
	return spillway.Decision{
		Reason:     spillway.ReasonShed,
		Limiter:    w.o.name,
		Limit:      w.capacity,
		Remaining:  rem,
		RetryAfter: w.o.retryAfter,
	}
}

// Level returns the shed level L in [0, 4]; see Worker.
func (w *Worker) Level() float64 { return math.Float64frombits(w.level.Load()) }

// ShedProbability returns the probability that a request of priority p is
// shed at the current level (before the hard cap).
func (w *Worker) ShedProbability(p spillway.Priority) float64 {
	q := w.Level() - float64(p)
	switch {
	case q <= 0:
		return 0
	case q >= 1:
		return 1
	}
	return q
}

// InFlight returns the cost of the admitted work not yet done.
func (w *Worker) InFlight() int64 { return w.inflight.Load() }

// Utilization returns the utilization measured at the last tick.
func (w *Worker) Utilization() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastUtil
}

// SourceErrors returns how many source readings failed so far.
func (w *Worker) SourceErrors() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.srcErrors
}

func (w *Worker) maybeTick(now time.Time) {
	n := now.UnixNano()
	if n < w.next.Load() || !w.mu.TryLock() {
		return
	}
	defer w.mu.Unlock()
	if n < w.next.Load() {
		return
	}
	w.tick(now)
}

// tick runs with w.mu held.
func (w *Worker) tick(now time.Time) {
	elapsed := int64(1)
	if !w.last.IsZero() && now.After(w.last) {
		elapsed = int64(now.Sub(w.last) / w.o.tick)
		if elapsed < 1 {
			elapsed = 1
		}
	}
	// The peak since the last tick, not a sample at the tick: a sample
	// taken just after a batch of completions would miss saturation.
	u := float64(w.peak.Swap(w.inflight.Load())) / float64(w.capacity)
	capHit := w.capHit.Swap(false)
	for _, s := range w.o.sources {
		v, err := s.Utilization()
		if err != nil || math.IsNaN(v) {
			w.srcErrors++
			continue
		}
		u = max(u, v)
	}
	offered, admitted := w.offered.Swap(0), w.admitted.Swap(0)
	// est is the utilization had nothing been shed in the last tick.
	est := u
	if admitted > 0 {
		est = u * float64(offered) / float64(admitted)
	} else if offered > 0 {
		est = math.Inf(1)
	}
	L := w.Level()
	switch {
	case u >= w.o.high || capHit:
		L += w.o.stepUp
	case u <= w.o.low || est < w.o.high:
		// An idle stretch of several ticks gives back several steps.
		L -= w.o.stepDown * float64(min(elapsed, 1<<20))
	}
	L = min(max(L, 0), maxLevel)
	w.level.Store(math.Float64bits(L))
	w.lastUtil = u
	w.last = now
	w.next.Store(now.Add(w.o.tick).UnixNano())
}
