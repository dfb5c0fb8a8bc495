package concurrency

import (
	"fmt"
	"github.com/spillway-go/spillway/internal/learn"
	"iter"
	"math"
	"slices"
	"time"

	"github.com/spillway-go/spillway"
)

// LatencyConfig configures NewLatencyLimit. Zero values mean the documented
// defaults, which are the values the load-test harness measured.
type LatencyConfig struct {
	Initial int // starting limit, where slow start begins; default 4
	Min     int // floor; default 1
	Max     int // ceiling; default 1000
	// Window is how many samples, of work admitted since the limit last
	// moved, make one window; default 12. The baseline is learned from
	// the first 4 × Window samples.
	Window int
	// Tolerance: a window whose mean latency is within Tolerance × the
	// baseline is normal; beyond it the limit falls by a tenth. Default
	// 1.2; it must be above 1.05 (the band up to 1.05 × the baseline is
	// where the limit may grow).
	Tolerance float64
	// Timeout, when set, is the latency at which the callers give up
	// (their timeout, or the dependency's statement timeout): latency
	// that stays bad. Work that ends at or past the stuck latency (the
	// lower of Timeout and stuckFactor × the lowest baseline learned), or
	// fails (Dropped), or is all still in flight past it, with no piece
	// of work ending in time for as long, sends the limit to Min
	// at once (cause "stuck") instead of letting it hold or climb on a
	// steady ratio; while stuck, no rebaseline and no raise on idle capacity. The first
	// piece of work that ends in time again ends it, and the limit slow
	// starts from Min (doubling per window, as TCP after a timeout) and
	// takes idle capacity again. 0 (the default): none of this;
	// the limit behaves as without the field.
	Timeout time.Duration
	// OnChange, when set, is called with every change of the limit's
	// integer value, under the caller's lock (keep it short).
	OnChange func(LatencyChange)
}

// LatencyChange describes one change of a LatencyLimit, for tracing.
type LatencyChange struct {
	At       time.Time
	From, To float64       // the limit before and after
	Cap      int64         // the cap (a shedder.Pool sets it) at the time, 0 none
	Baseline time.Duration // the baseline latency at the time
	// Cause is what moved it: "dropped" (work failed), "fast" (the last
	// few all far beyond the baseline), "window" (a window's mean beyond
	// Tolerance × the baseline), "overdue" (work in flight far past the
	// baseline), "raise" (idle capacity reported), "rebaseline" (a new
	// baseline learned at Min; only the baseline changes), or ""
	// (growth).
	Cause string
}

// LatencyLimit learns how much work may be in flight at a dependency (a
// database, say) from the latency of the work it completes, knowing
// neither the dependency's capacity nor how many servers share it. It is
// an Algorithm (for Adaptive) and the learner of a shedder.Pool (NewPool,
// where it is meant to be used: the pool queues work in priority order
// for the slots this limit sets, capped by what the fleet shedder allows
// the server).
//
// Its baseline is the mean latency of the first 4 × Window samples (used
// from the first window on), then follows the normal windows' means by a
// fiftieth of the difference. Each window of Window samples admitted since
// the limit last moved ends with:
//   - a tenth off, when its mean is beyond Tolerance × the baseline;
//   - before the first cut, the limit doubled (TCP's slow start) when at
//     least half of it was in use;
//   - after it, the limit held when the mean is beyond 1.05 × the
//     baseline; else grown by a probe, a 32nd of the limit after a cut,
//     doubled with every window that grew, up to a quarter: close to the
//     capacity it is cut again within a few small steps, and when the
//     capacity came back the steps compound.
//
// It never grows more than one step (an eighth of the cap, at least 1)
// past its cap (what the fleet shedder allows this server now),
// and cuts start from the limit in use, the lower of the two. A collapse
// does not wait for a window: the last 3 samples all beyond 1.75 × the
// baseline cut in proportion (Tolerance × baseline / latency, at most by
// half); a failed piece of work (Dropped), or 3 still in flight past
// twice the baseline, halve it. Work admitted before the last
// cut says nothing. At Min, a window of work that never had more than Min
// in flight and was still slow sets a new baseline: the dependency itself
// became slower, and the limit probes up again from there rather than
// staying at Min for good. The same holds above Min when the latest
// capacity reading began after the last cut and shows no queue at the
// dependency: idle capacity, or, from a gauge that measures the
// work waiting, less than half a unit waiting though every
// worker may be busy. Slow work is then the dependency's own slowness (a
// slower replica, a cold cache), which fewer calls would not cure: the
// slow samples become the baseline, and neither they nor work overdue
// cut the limit. A window whose mean is 1.75× faster than the baseline (beyond
// what the spread of service times gives) becomes the baseline at once,
// so that an overload after the dependency is fast again shows as soon.
//
// The mean of a window rather than any one sample: service times vary,
// and a loaded machine adds tens of milliseconds to single calls at
// random, so a threshold on single samples (AIMD's Timeout) backs off
// when nothing is wrong or waits until the dependency is far past its
// capacity.
//
// Latency alone cannot tell a dependency that has room for one more call
// from one that has none (below its capacity every call takes as long),
// so the limit finds the capacity by passing it. In a shedder.Pool, a
// reading of idle capacity (shedder.CapacityWatcher) grows it at once instead.
//
// A LatencyLimit is not safe for concurrent use: Adaptive and
// shedder.Pool call it under their own lock.
type LatencyLimit struct {
	cfg LatencyConfig

	limit    float64
	baseline time.Duration
	grown    bool // cut at least once: growth is additive from then on

	since   time.Time                  // the limit last moved: the window counts samples admitted since
	cutAt   time.Time                  // the last cut: samples admitted before it say nothing
	raised  time.Time                  // the start of the last reading Raise took
	seen    time.Time                  // the start of the latest reading given to Raise
	idle    bool                       // that reading showed idle capacity
	qseen   time.Time                  // the start of the latest reading given to Queued
	calm    bool                       // that reading showed nothing waiting at the dependency
	recent  [fastSamples]time.Duration // the last RTTs, in a ring
	nrecent int
	n       int
	sum     time.Duration
	maxUsed int
	cap     float64       // the cap (setCap); 0: none
	bn      int           // samples in the baseline while learning it
	bsum    time.Duration // their sum
	cause   string        // the cause of the change being made
	probe   float64       // the next step after a cut, a share of the limit

	// Timeout (stuck latency) only.
	minBase  time.Duration // the lowest baseline learned
	lastGood time.Time     // the end of the last work that ended in time
	stuck    bool          // at Min because latency stays at the Timeout
}

const (
	// overdueFactor, overdueMin: work still in flight past overdueFactor ×
	// the baseline, at least overdueMin of them, shows an overload before
	// it ends.
	overdueFactor = 2.0
	overdueMin    = 3
	// minProbe, maxProbe: after a cut the limit grows by minProbe of
	// itself per window, doubling while it keeps growing, up to maxProbe.
	minProbe = 1.0 / 32
	maxProbe = 0.25
	// baselineWindows: the baseline is the mean of the first
	// baselineWindows × Window samples.
	baselineWindows = 4
	fastSamples     = 3
	growTolerance   = 1.05 // within 1.05× the limit may grow
	fastFactor      = 1.75
	// stuckFactor: with a Timeout, latency stuckFactor × the lowest
	// baseline learned, or more, is stuck too (far above the long-run
	// minimum), when that comes before the Timeout.
	stuckFactor = 10
)

// NewLatencyLimit validates cfg and returns a LatencyLimit in slow start
// at cfg.Initial.
func NewLatencyLimit(cfg LatencyConfig) (*LatencyLimit, error) {
	if cfg.Initial == 0 {
		cfg.Initial = 4
	}
	if cfg.Min == 0 {
		cfg.Min = 1
	}
	if cfg.Max == 0 {
		cfg.Max = 1000
	}
	if cfg.Window == 0 {
		cfg.Window = 12
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = 1.2
	}
	switch {
	case cfg.Min < 1 || cfg.Max < cfg.Min:
		return nil, fmt.Errorf("concurrency: NewLatencyLimit: need 1 <= Min (%d) <= Max (%d)", cfg.Min, cfg.Max)
	case cfg.Initial < cfg.Min || cfg.Initial > cfg.Max:
		return nil, fmt.Errorf("concurrency: NewLatencyLimit: Initial %d outside [Min %d, Max %d]", cfg.Initial, cfg.Min, cfg.Max)
	case cfg.Window < 1:
		return nil, fmt.Errorf("concurrency: NewLatencyLimit: Window %d must be at least 1", cfg.Window)
	case !(cfg.Tolerance > growTolerance) || math.IsInf(cfg.Tolerance, 1):
		return nil, fmt.Errorf("concurrency: NewLatencyLimit: Tolerance %v must be above %v and finite", cfg.Tolerance, growTolerance)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("concurrency: NewLatencyLimit: Timeout %v is negative", cfg.Timeout)
	}
	return &LatencyLimit{cfg: cfg, limit: float64(cfg.Initial)}, nil
}

// value implements Algorithm: the learned limit (the cap does not lower
// it; the caller takes the lower of the two).
func (l *LatencyLimit) value() int { return int(l.limit) }

// setCap sets the most this server may have in flight whatever it learns
// (what the fleet shedder allows it now), 0 for none. The limit does not
// grow more than one step past it, and cuts start from the lower of the
// two, the limit in use. A negative cap is none.
func (l *LatencyLimit) setCap(n int64) { l.cap = float64(max(n, 0)) }

// eff is the limit in use: the learned limit, at most the cap.
func (l *LatencyLimit) eff() float64 {
	if l.cap > 0 {
		return math.Min(l.limit, l.cap)
	}
	return l.limit
}

// learn is update with the sample's fields (for shedder.Pool).
func (l *LatencyLimit) learn(start time.Time, rtt time.Duration, inFlight int, o spillway.Outcome) {
	l.update(sample{Start: start, RTT: rtt, InFlight: inFlight, Outcome: o})
}

// stuckAt is the latency at which work is stuck: the Timeout, or
// stuckFactor × the lowest baseline when that is lower; 0 without a
// Timeout.
func (l *LatencyLimit) stuckAt() time.Duration {
	t := l.cfg.Timeout
	if t > 0 && l.minBase > 0 && stuckFactor*l.minBase < t {
		t = stuckFactor * l.minBase
	}
	return t
}

// goStuck sends the limit to Min (cause "stuck") when nothing ended in
// time for the whole stuck latency before at; it reports whether the limit is
// stuck.
func (l *LatencyLimit) goStuck(at time.Time) bool {
	if l.lastGood.IsZero() {
		l.lastGood = at // the clock starts at the first sign
	}
	if at.Sub(l.lastGood) < l.stuckAt() {
		return false
	}
	if !l.stuck || l.limit > float64(l.cfg.Min) {
		l.cause = "stuck"
		l.set(float64(l.cfg.Min), at)
	}
	l.stuck = true
	l.grown = false // slow start once it ends, as TCP after a timeout
	return true
}

// update implements Algorithm.
func (l *LatencyLimit) update(s sample) {
	if s.Outcome != spillway.Success && s.Outcome != spillway.Dropped {
		return
	}
	end := s.Start.Add(s.RTT)
	if st := l.stuckAt(); st > 0 {
		// Latency that stays bad: seen whenever the work was admitted (a
		// stuck dependency holds what was admitted before a cut too).
		if s.Outcome == spillway.Success && s.RTT < st {
			if end.After(l.lastGood) {
				l.lastGood = end
			}
			if l.stuck {
				l.stuck = false
				l.cutAt = end // what was admitted while stuck says nothing more
			}
		} else if l.goStuck(end) {
			return
		}
	}
	if s.Start.Before(l.cutAt) {
		return // admitted before the last cut, under a higher limit
	}
	if s.Outcome == spillway.Dropped {
		l.cause = "dropped"
		l.set(l.eff()*0.5, end)
		return
	}
	l.recent[l.nrecent%fastSamples] = s.RTT
	l.nrecent++
	if !s.Start.Before(l.since) {
		// Only work admitted since the limit last moved tells whether it
		// may grow; any since the last cut can call for another.
		l.n++
		l.sum += s.RTT
		l.maxUsed = max(l.maxUsed, s.InFlight)
	}
	mean := time.Duration(0)
	if l.n > 0 {
		mean = l.sum / time.Duration(l.n)
	}
	window := l.cfg.Window
	if l.bn < baselineWindows*window {
		// Learning the baseline: the mean of every sample so far, used
		// from the first window on. One window's mean is off by 8% (1σ)
		// with service times of ±50%; a baseline learned that low would
		// take every later window for an overload.
		l.bn++
		l.bsum += s.RTT
		first := l.baseline == 0
		if l.bn >= window {
			l.baseline = l.bsum / time.Duration(l.bn)
			l.noteBaseline()
		}
		if l.baseline == 0 {
			return
		}
		if first {
			l.set(l.limit, end)
			return
		}
	}
	floor := l.eff() <= float64(l.cfg.Min)
	if l.nrecent >= fastSamples && !floor {
		// All of the last few, beyond the slowest a call takes when the
		// dependency keeps up (1.5× the mean): one or two calls slowed by
		// the machine (a pause, a late timer) are not an overload.
		if r := slices.Min(l.recent[:]); float64(r) > fastFactor*float64(l.baseline) {
			if l.roomSinceCut() {
				l.rebaseline(r, end)
				return
			}
			l.cause = "fast"
			l.set(l.eff()*math.Max(0.5, l.cfg.Tolerance*float64(l.baseline)/float64(r)), end)
			return
		}
	}
	if l.n < window {
		return
	}
	switch {
	case floor && l.maxUsed <= l.cfg.Min && float64(mean) > l.cfg.Tolerance*float64(l.baseline):
		// At the floor, with no more than Min in flight, this server
		// adds no queue of its own: the dependency became slower (a
		// missing index, a slower replica), and a baseline kept from
		// before would hold the limit at Min for good. The window's mean
		// is the new baseline, as the probe of a BBR or Gradient
		// re-measures the unloaded latency; the limit probes up from
		// here.
		l.baseline = mean
		l.noteBaseline()
		l.cause = "rebaseline"
		l.set(l.limit, end)
	case float64(mean) > l.cfg.Tolerance*float64(l.baseline) && l.roomSinceCut():
		l.rebaseline(mean, end)
	case float64(mean) > l.cfg.Tolerance*float64(l.baseline):
		l.cause = "window"
		l.set(l.eff()*0.9, end)
	case float64(mean)*fastFactor < float64(l.baseline):
		// Far faster than the baseline, beyond what the spread of
		// service times gives a window's mean: the dependency is fast
		// again (after a rebaseline on slow work); follow it at once, or
		// an overload would have to pass the old, slow baseline to show.
		l.rebaseline(mean, end)
	case l.grown && float64(mean) > growTolerance*float64(l.baseline):
		// Since the first cut: slower than usual, not enough to cut:
		// hold, and probe gently again from here. (At a capacity of 15,
		// one call over it is 14% slower: a window sees it only now and
		// then.)
		l.probe = minProbe
		l.set(l.limit, end)
	default:
		if l.bn >= baselineWindows*window {
			// A fiftieth of the difference, either way: a faster fall
			// settles the baseline below the mean, and every window then
			// looks slower than it is.
			l.baseline += (mean - l.baseline) / 50
			l.noteBaseline()
		}
		next := l.limit
		// Grow only when the window used at least half the limit in use,
		// and never far past the cap: a limit far above what the fleet
		// allowed was never shown to keep the latency, and a server whose
		// cap rises (the others cut theirs) would jump to it at once.
		if 2*l.maxUsed >= int(l.eff()) {
			if l.grown {
				// After a cut, probe gently and speed up while it keeps
				// working: near the capacity growth is cut again within
				// a few small steps; when the capacity came back, it
				// compounds.
				next += l.limit * l.probe
				l.probe = math.Min(2*l.probe, maxProbe)
			} else {
				next *= 2 // slow start: until the first sign of overload
			}
			if l.cap > 0 {
				// One step past the cap, so that a cap that moves by a
				// unit between refreshes does not hold the limit at its
				// lows.
				next = math.Max(l.limit, math.Min(next, l.cap+math.Max(1, l.cap/8)))
			}
		}
		l.set(next, end)
	}
}

// roomSinceCut reports whether the latest capacity reading began after
// the last cut and showed no queue at the dependency: idle capacity
// (Raise) or, when the gauge measures it and that reading is the latest,
// nothing waiting (Queued). The work admitted since the cut is slow
// while nothing queues, so the slowness is the dependency's own (a
// slower replica, a cold cache), not a queue this limit should cut.
func (l *LatencyLimit) roomSinceCut() bool {
	if l.stuck {
		return false
	}
	if !l.qseen.IsZero() && !l.qseen.Before(l.seen) {
		return l.calm && l.qseen.After(l.cutAt)
	}
	return l.idle && l.seen.After(l.cutAt)
}

// calmWaiting is the most work waiting at the dependency, on average over
// a reading, that counts as no queue: less than half a unit.
const calmWaiting = 0.5

// queued (for shedder.Pool): waiting is the work waiting at
// the dependency on average over a capacity reading that began at since.
// While the latest such reading began after the last cut and shows less
// than half a unit waiting, slow work moves the baseline instead of
// cutting (as with idle capacity, see LatencyLimit); with a queue it cuts
// as usual. An older reading, or the same one again, changes nothing; a
// NaN or negative waiting is a queue of unknown size.
func (l *LatencyLimit) queued(waiting float64, since time.Time) {
	if since.After(l.qseen) {
		l.qseen, l.calm = since, waiting >= 0 && waiting < calmWaiting
	}
}

// rebaseline takes latency as the new baseline (cause "rebaseline") and
// keeps the limit.
func (l *LatencyLimit) rebaseline(latency time.Duration, at time.Time) {
	l.baseline = latency
	l.noteBaseline()
	l.cause = "rebaseline"
	l.set(l.limit, at)
}

// noteBaseline keeps the lowest baseline learned.
func (l *LatencyLimit) noteBaseline() {
	if l.baseline > 0 && (l.minBase == 0 || l.baseline < l.minBase) {
		l.minBase = l.baseline
	}
}

// set moves the limit and starts a new window of samples admitted from
// at on.
func (l *LatencyLimit) set(limit float64, at time.Time) {
	if limit < l.limit {
		l.grown = true
		l.cutAt, l.nrecent, l.probe = at, 0, minProbe
	}
	limit = math.Min(float64(l.cfg.Max), math.Max(float64(l.cfg.Min), limit))
	if l.cfg.OnChange != nil && (int(limit) != int(l.limit) || l.cause == "rebaseline") {
		l.cfg.OnChange(LatencyChange{At: at, From: l.limit, To: limit, Cap: int64(l.cap), Baseline: l.baseline, Cause: l.cause})
	}
	l.cause = ""
	l.limit = limit
	l.since, l.n, l.sum, l.maxUsed = at, 0, 0, 0
}

// raise grows the limit at once by share of idle (the idle capacity a
// gauge of the dependency reported, averaged over a window that began at
// since), rounded up, up to to (what the fleet shedder allows this server
// now), when idle is at least one unit and the window began after the
// last cut: there is room a probe would take seconds to find, and nothing
// since the last overload says otherwise. A reading from before the cut
// says nothing. Each reading raises once (readings are told apart by
// since): the same reading given again, before every decision, changes
// nothing. Rounded up, one idle unit shared by three servers raises each
// by one, so the server that can use it takes it at the next reading
// (rounded to nearest, none did, and the unit stayed idle until latency
// probes found it, seconds later); servers whose shares add up to one add
// up at most the idle capacity plus one each, and each at most to what
// the fleet allows it. It never lowers the limit.
func (l *LatencyLimit) raise(idle, share float64, to int64, since, at time.Time) {
	if since.After(l.seen) {
		l.seen, l.idle = since, idle >= 1
	}
	if l.stuck {
		return // idle because nothing it sends comes back: no room
	}
	if !(idle >= 1) || !since.After(l.cutAt) || !(share > 0) || !since.After(l.raised) {
		return
	}
	l.raised = since
	if next := math.Min(float64(to), l.limit+math.Ceil(min(idle*share, 1<<40))); next > l.limit {
		l.cause = "raise"
		l.set(next, at)
	}
}

// overdue halves the limit in use when work admitted since the last cut
// is still in flight past twice the baseline, 3 pieces or more: the
// dependency has slowed down, and the work that shows it has not ended
// yet (work that ends is a sample, and ends late). Their age is a lower
// bound of their latency, and at least twice the baseline: a cut in
// proportion (baseline / latency) would be by half or more. starts yields
// the start times of the work in flight.
//
// With a Timeout, work all still in flight past the stuck latency, with
// nothing ended in time for as long, sends the limit to Min
// ("stuck"): a dependency that hangs every call returns no samples.
func (l *LatencyLimit) overdue(now time.Time, starts iter.Seq[time.Time]) {
	if st := l.stuckAt(); st > 0 && !(l.stuck && l.limit <= float64(l.cfg.Min)) {
		n, old := 0, 0
		for s := range starts {
			n++
			if now.Sub(s) >= st {
				old++
			}
		}
		if n > 0 && old == n && l.goStuck(now) {
			return
		}
	}
	if l.baseline == 0 || l.eff() <= float64(l.cfg.Min) || l.roomSinceCut() {
		// Nothing to learn, nothing left to cut, or nothing queues at
		// the dependency: work past its usual latency is its own
		// slowness (the samples as they end move the baseline).
		return
	}
	limit := time.Duration(overdueFactor * float64(l.baseline))
	n := 0
	for s := range starts {
		if !s.Before(l.cutAt) && now.Sub(s) > limit {
			n++
		}
	}
	if n >= overdueMin {
		l.cause = "overdue"
		l.set(l.eff()*0.5, now)
	}
}

var _ Algorithm = (*LatencyLimit)(nil)

// poolView is the learn.Limit a shedder.Pool drives.
type poolView struct{ *LatencyLimit }

func init() {
	learn.Of = func(l any) learn.Limit {
		if ll, ok := l.(*LatencyLimit); ok && ll != nil {
			return poolView{ll}
		}
		return nil
	}
}

func (v poolView) Learn(start time.Time, rtt time.Duration, inFlight int, o spillway.Outcome) {
	v.learn(start, rtt, inFlight, o)
}
func (v poolView) Limit() int                                        { return v.value() }
func (v poolView) Baseline() time.Duration                           { return v.baseline }
func (v poolView) SetCap(n int64)                                    { v.setCap(n) }
func (v poolView) Overdue(now time.Time, starts iter.Seq[time.Time]) { v.overdue(now, starts) }
func (v poolView) Raise(idle, share float64, to int64, since, at time.Time) {
	v.raise(idle, share, to, since, at)
}
func (v poolView) Queued(waiting float64, since time.Time) { v.queued(waiting, since) }
