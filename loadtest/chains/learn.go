package chains

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"

	"github.com/spillway-go/spillway/loadtest/sim"
)

// latencyLimit learns how many queries this server may have at the
// database from their latency, as a concurrency.Algorithm: it knows
// neither the database's capacity nor the number of servers.
//
// Its baseline is the mean latency of the first baselineSamples queries
// (used from the first window of windowSamples on), then follows the
// normal windows' means by a fiftieth of the difference. Each window of
// windowSamples queries admitted since the limit last moved ends with:
//   - a tenth off, when its mean is beyond tolerance × the baseline;
//   - before the first cut, the limit doubled (TCP's slow start) when at
//     least half of it was in use;
//   - after it, the limit held when the mean is beyond growTolerance ×
//     the baseline; else grown by a probe, minProbe of the limit after a
//     cut, doubled with every window that grew, up to maxProbe: close to
//     the capacity it is cut again within a few small steps, and when the
//     capacity came back the steps compound.
//
// It never grows more than one step past its cap (SetCap: what the fleet
// shedder allows this server now), and cuts start from the limit in use,
// the lower of the two. A collapse does not wait for a window: the last
// fastSamples queries all beyond fastFactor × the baseline cut in
// proportion (tolerance × baseline / latency, at most by half); a failed
// query, or overdueMin queries still in flight past overdueFactor × the
// baseline (Overdue), halve it. Queries admitted before the last cut say
// nothing.
//
// The mean of a window rather than any one query: service times vary by
// ±50%, and a loaded machine adds tens of milliseconds to single queries
// at random, so a threshold on single queries (AIMD's Timeout) backs off
// when nothing is wrong or waits until the database is far past its
// capacity.
type latencyLimit struct {
	trace    io.Writer // every change of the limit (-trace); nil: none
	limit    float64
	baseline time.Duration
	grown    bool // cut at least once: growth is additive from then on

	since   time.Time                  // the limit last moved: the window counts queries admitted since
	cutAt   time.Time                  // the last cut: queries admitted before it say nothing
	recent  [fastSamples]time.Duration // the last RTTs, in a ring
	nrecent int
	n       int
	sum     time.Duration
	maxUsed int
	cap     float64       // SetCap; 0: none
	bn      int           // samples in the baseline while learning it
	bsum    time.Duration // their sum
	why     string        // the cause of the change being made, for the trace
	probe   float64       // the next step after a cut, a share of the limit
}

const (
	// overdueFactor, overdueMin: queries still in flight past
	// overdueFactor × the baseline, at least overdueMin of them, show an
	// overload before they end (no query takes more than 1.5× the mean
	// when the database keeps up).
	overdueFactor = 2.0
	overdueMin    = 3
	// minProbe, maxProbe: after a cut the limit grows by minProbe of
	// itself per window, doubling while it keeps growing, up to maxProbe.
	minProbe      = 1.0 / 32
	maxProbe      = 0.25
	windowSamples = 12
	// baselineSamples: the baseline is the mean of the first
	// baselineSamples queries (from the first window's on), then follows
	// the normal windows.
	baselineSamples = 48
	fastSamples     = 3
	tolerance       = 1.2  // a window mean within 1.2× the baseline is normal
	growTolerance   = 1.05 // within 1.05× the limit may grow
	fastFactor      = 1.75
	maxLimit        = 1000
)

func newLatencyLimit(initial int) *latencyLimit { return &latencyLimit{limit: float64(initial)} }

// SetCap sets the most this server may have in flight whatever it learns
// (what the fleet shedder allows it now), 0 for none. The limit does not
// grow past it, and cuts start from the lower of the two, the limit in
// use.
func (l *latencyLimit) SetCap(c float64) { l.cap = c }

// eff is the limit in use: the learned limit, at most the cap.
func (l *latencyLimit) eff() float64 {
	if l.cap > 0 {
		return math.Min(l.limit, l.cap)
	}
	return l.limit
}

// Limit implements concurrency.Algorithm.
func (l *latencyLimit) Limit() int { return int(l.limit) }

// Update implements concurrency.Algorithm.
func (l *latencyLimit) Update(s concurrency.Sample) {
	if s.Start.Before(l.cutAt) {
		return // admitted before the last cut, under a higher limit
	}
	end := s.Start.Add(s.RTT)
	if s.Outcome == spillway.Dropped {
		l.why = "dropped"
		l.set(l.eff()*0.5, end)
		return
	}
	l.recent[l.nrecent%fastSamples] = s.RTT
	l.nrecent++
	if !s.Start.Before(l.since) {
		// Only queries admitted since the limit last moved tell whether
		// it may grow; any since the last cut can call for another.
		l.n++
		l.sum += s.RTT
		l.maxUsed = max(l.maxUsed, s.InFlight)
	}
	mean := time.Duration(0)
	if l.n > 0 {
		mean = l.sum / time.Duration(l.n)
	}
	if l.bn < baselineSamples {
		// Learning the baseline: the mean of every sample so far, used
		// from the first window on. One window's mean is off by 8% (1σ)
		// with service times of ±50%; a baseline learned that low would
		// take every later window for an overload.
		l.bn++
		l.bsum += s.RTT
		first := l.baseline == 0
		if l.bn >= windowSamples {
			l.baseline = l.bsum / time.Duration(l.bn)
		}
		if l.baseline == 0 {
			return
		}
		if first {
			l.set(l.limit, end)
			return
		}
	}
	if l.nrecent >= fastSamples {
		// All of the last few, beyond the slowest a query takes when the
		// database keeps up (1.5× the mean): one or two queries slowed by
		// the machine (a pause, a late timer) are not an overload.
		if r := slices.Min(l.recent[:]); float64(r) > fastFactor*float64(l.baseline) {
			l.why = "fast"
			l.set(l.eff()*math.Max(0.5, tolerance*float64(l.baseline)/float64(r)), end)
			return
		}
	}
	if l.n < windowSamples {
		return
	}
	switch {
	case float64(mean) > tolerance*float64(l.baseline):
		l.why = "window"
		l.set(l.eff()*0.9, end)
	case l.grown && float64(mean) > growTolerance*float64(l.baseline):
		// Since the first cut: slower than usual, not enough to cut:
		// hold, and probe gently again from here. (At a capacity of 15,
		// one query over it is 14% slower: a window sees it only now
		// and then.)
		l.probe = minProbe
		l.set(l.limit, end)
	default:
		switch {
		case l.bn < baselineSamples: // still learning it
		default:
			// A fiftieth of the difference, either way: a faster fall
			// (it was a tenth) settles the baseline below the mean, and
			// every window then looks slower than it is.
			l.baseline += (mean - l.baseline) / 50
		}
		next := l.limit
		// Grow only when the window used at least half the limit in use,
		// and never far past the cap: a limit far above what the fleet
		// allowed was never shown to keep the latency, and a server whose
		// cap rises (the others cut theirs) would jump to it at once.
		if 2*l.maxUsed >= int(l.eff()) {
			if l.grown {
				// After a cut, probe gently and speed up while it keeps
				// working: a step of a 32nd of the limit, doubled after
				// every window that grew, up to a quarter. Near the
				// capacity growth is cut again within a few small
				// steps; when the capacity came back, it compounds.
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

// set moves the limit and starts a new window of samples admitted from
// at on.
func (l *latencyLimit) set(limit float64, at time.Time) {
	if limit < l.limit {
		l.grown = true
		l.cutAt, l.nrecent, l.probe = at, 0, minProbe
	}
	if l.trace != nil && int(l.limit) != int(limit) {
		fmt.Fprintf(l.trace, "trace %s %p limit %.1f -> %.1f cap %.0f baseline %v %s\n", at.Format("15:04:05.000"), l, l.limit, limit, l.cap, l.baseline, l.why)
	}
	l.why = ""
	l.limit = math.Min(maxLimit, math.Max(1, limit))
	l.since, l.n, l.sum, l.maxUsed = at, 0, 0, 0
}

// Raise grows the limit at once by this server's share of the idle
// workers the database's gauge g reported, up to to (what the fleet
// shedder allows this server now), when g shows at least one idle worker
// on average over a window that began after the last cut: there is room
// a probe would take seconds to find, and nothing since the last overload
// says otherwise. A reading from before the cut says nothing. Servers
// whose shares add up to one add up at most the idle workers reported.
func (l *latencyLimit) Raise(g sim.Gauge, share, to float64, at time.Time) {
	if g.Idle < 1 || !g.From.After(l.cutAt) || share <= 0 {
		return
	}
	if next := math.Min(to, l.limit+math.Floor(g.Idle*share+0.5)); next > l.limit {
		l.why = "gauge"
		l.set(next, at)
	}
}

// Overdue halves the limit in use when queries admitted since the last
// cut are still in flight past overdueFactor × the baseline,
// overdueMin of them or more: the database has slowed down, and the
// queries that show it have not ended yet (a query that ends is a sample,
// and ends late). Their age is a lower bound of their latency, and at
// least twice the baseline: a cut in proportion (baseline / latency)
// would be by half or more. starts yields the start times of the queries
// in flight.
func (l *latencyLimit) Overdue(now time.Time, starts func(yield func(time.Time) bool)) {
	if l.baseline == 0 {
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
		l.why = "overdue"
		l.set(l.eff()*0.5, now)
	}
}
