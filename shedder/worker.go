package shedder

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

// Source reports a utilization reading: 0 is idle, 1 is saturated; values
// above 1 mean overload. The Worker calls it once per tick, from one
// goroutine at a time (see WorkerSettings.Sources).
type Source interface {
	Utilization() (float64, error)
}

// sourceFunc adapts a function to Source (for tests).
type sourceFunc func() (float64, error)

// Utilization calls f.
func (f sourceFunc) Utilization() (float64, error) { return f() }

// maxLevel is the shed level at which every priority is shed.
const maxLevel = float64(spillway.NumPriorities)

// Worker is the worker utilization load shedder: it protects one server by
// shedding the lowest priorities first as the server's utilization rises.
//
// Utilization is the largest of the peak in-flight work since the last tick
// over the worker capacity and the readings of the optional Sources (CPU
// from cgroups, say). A shed level L in [0, 4] turns into a shed
// probability per priority, clamp(L − p, 0, 1): Sheddable (p=0) is shed
// first, SheddablePlus only once Sheddable is shed entirely, then Critical,
// and CriticalPlus only once everything below is.
//
// Every tick (default 100ms) L moves by at most one step, with hysteresis:
//
//   - utilization at or above the band's high mark (default 0.9): up by
//     the up step (default 0.25);
//   - otherwise, if the reserve (below) turned work away: up by the down
//     step (default 0.05), but never past shedding the priority it turned
//     away, so the reserve's rejections fall on Sheddable before
//     SheddablePlus;
//   - utilization at or below the low mark (default 0.75): down one step
//     (several after an idle stretch);
//   - otherwise down one step only if the work that step would have
//     admitted in the last tick keeps utilization under the middle of the
//     band; else hold.
//
// So shedding ramps in fast and out slowly, settles just under the high
// mark, and does not flap between levels.
//
// Independently of L, a hard cap keeps in-flight work within capacity:
// Sheddable and SheddablePlus work is admitted only while total in-flight
// work stays within capacity×(1−reserve) (default reserve 0.2, kept for
// Critical work), Critical work while it stays within capacity, and
// CriticalPlus work is not capped (it is shed only by L). A request that
// costs more than its cap could never be admitted and is denied with
// spillway.ReasonCostExceedsLimit and no RetryAfter. Allowed decisions
// carry Limit 0, so a chain's headers keep reporting the client's own
// quota; denials carry the capacity and what is left of it.
//
// A Worker is safe for concurrent use. Ticks run lazily inside Admit when
// the clock has passed the next tick; no goroutine is started.
type Worker struct {
	capacity int64
	caps     [spillway.NumPriorities]int64 // hard cap on in-flight per priority
	o        options

	inflight atomic.Int64
	level    atomic.Uint64                        // math.Float64bits of L
	offered  [spillway.NumPriorities]atomic.Int64 // cost offered per priority since the last tick
	admitted atomic.Int64                         // cost admitted since the last tick
	next     atomic.Int64                         // UnixNano of the next tick
	peak     atomic.Int64                         // largest in-flight since the last tick
	capHit   atomic.Int32                         // 1 + the highest priority the hard cap denied since the last tick, 0 none

	mu        sync.Mutex // held by the goroutine running a tick
	last      time.Time
	lastUtil  float64
	srcErrors int64
}

// NewWorker returns a Worker for a server that can work on capacity units
// of cost at once (its worker pool size, say). It fails when capacity is
// not positive or a setting is out of range.
func NewWorker(capacity int64, s WorkerSettings) (*Worker, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("shedder: worker capacity %d must be positive", capacity)
	}
	o := workerOptions(s)
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
// r's cost from the in-flight count. A malformed (or nil) request is denied
// with spillway.ReasonInvalid.
func (w *Worker) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: w.o.name}, spillway.Noop, nil
	}
	now := w.o.now()
	w.maybeTick(now)
	c := r.EffectiveCost()
	p := r.Priority
	if c > w.caps[p] {
		// It could never be admitted: say so instead of "retry later".
		return spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: w.o.name, Limit: w.caps[p]}, spillway.Noop, nil
	}
	addSat(&w.offered[p], c)
	if q := shedProbability(w.shedLevel(), p); q > 0 && (q >= 1 || w.o.rand() < q) {
		return w.deny(w.inflight.Load()), spillway.Noop, nil
	}
	// Compare before adding: c > cap − in flight never wraps, where
	// in flight + c could (CriticalPlus has no cap: MaxInt64).
	var n int64
	for {
		old := w.inflight.Load()
		if c > w.caps[p]-old {
			for hit := int32(p) + 1; ; {
				old := w.capHit.Load()
				if hit <= old || w.capHit.CompareAndSwap(old, hit) {
					break
				}
			}
			return w.deny(old), spillway.Noop, nil
		}
		if n = old + c; w.inflight.CompareAndSwap(old, n) {
			break
		}
	}
	for {
		old := w.peak.Load()
		if n <= old || w.peak.CompareAndSwap(old, n) {
			break
		}
	}
	addSat(&w.admitted, c)
	return spillway.Decision{Allowed: true, Limiter: w.o.name}, block.Once(func(spillway.Outcome) {
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

// WorkerStats is a snapshot of a Worker.
type WorkerStats struct {
	// Level is the shed level L in [0, 4] (see Worker): a request of
	// priority p is shed with probability clamp(L − p, 0, 1), before the
	// hard cap.
	Level float64
	// Utilization is the utilization measured at the last tick.
	Utilization float64
	// InFlight is the cost of the admitted work not yet done.
	InFlight int64
	// SourceErrors is how many source readings failed so far.
	SourceErrors int64
}

// Stats returns a snapshot of the Worker.
func (w *Worker) Stats() WorkerStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return WorkerStats{Level: w.shedLevel(), Utilization: w.lastUtil, InFlight: w.inflight.Load(), SourceErrors: w.srcErrors}
}

// shedLevel returns the shed level L.
func (w *Worker) shedLevel() float64 { return math.Float64frombits(w.level.Load()) }

func shedProbability(level float64, p spillway.Priority) float64 {
	q := level - float64(p)
	switch {
	case q <= 0:
		return 0
	case q >= 1:
		return 1
	}
	return q
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
	capHit := w.capHit.Swap(0)
	for _, s := range w.o.sources {
		v, err := s.Utilization()
		if err != nil || math.IsNaN(v) {
			w.srcErrors++
			continue
		}
		u = max(u, v)
	}
	var offered [spillway.NumPriorities]int64
	for p := range offered {
		offered[p] = w.offered[p].Swap(0)
	}
	admitted := w.admitted.Swap(0)
	L := w.shedLevel()
	switch {
	case u >= w.o.high:
		L += w.o.stepUp
	case capHit > 0:
		// Only the reserve turned work away: shed lower priorities first,
		// gently (utilization is not at the high mark), and never past
		// the priority that met the cap.
		L = max(L, min(L+w.o.stepDown, float64(capHit)))
	case u <= w.o.low:
		// An idle stretch of several ticks gives back several steps.
		L -= w.o.stepDown * float64(min(elapsed, 1<<20))
	case L > 0:
		// Give back one step if the work it would have admitted in the
		// last tick keeps utilization under the middle of the band: the
		// level settles just below the high mark instead of anywhere in
		// the band, and one step down cannot carry it over the top.
		next := max(L-w.o.stepDown, 0)
		var gain float64
		for p, n := range offered {
			gain += float64(n) * (shedProbability(L, spillway.Priority(p)) - shedProbability(next, spillway.Priority(p)))
		}
		if admitted > 0 && u*(float64(admitted)+gain)/float64(admitted) < (w.o.low+w.o.high)/2 {
			L = next
		}
	}
	L = min(max(L, 0), maxLevel)
	w.level.Store(math.Float64bits(L))
	w.lastUtil = u
	w.last = now
	w.next.Store(now.Add(w.o.tick).UnixNano())
}

var (
	_ spillway.Limiter = (*Worker)(nil)
	_ spillway.Limiter = (*Fleet)(nil)
	_ Source           = (*cgroupCPU)(nil)
)

// addSat adds c ≥ 0 to a counter of offered or admitted cost, saturating
// at math.MaxInt64 instead of wrapping.
func addSat(v *atomic.Int64, c int64) {
	for {
		old := v.Load()
		n := old + c
		if n < old {
			n = math.MaxInt64
		}
		if v.CompareAndSwap(old, n) {
			return
		}
	}
}
