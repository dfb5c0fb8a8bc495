package main

import (
	"math"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
)

// latencyLimit learns how many queries this server may have at the
// database from their latency, as a concurrency.Algorithm: it knows
// neither the database's capacity nor the number of servers.
//
// Its baseline is the mean latency of a window of queries when the
// database is not overloaded: the first window's, then followed by the
// normal windows' means, down faster than up (a tenth of the difference
// against a fiftieth), so a sustained overload cannot pass for normal.
// Each window of windowSamples queries admitted since the last change
// either raises the limit (doubling it until the first sign of overload,
// as TCP's slow start, then by a quarter, at least one (its mean within
// tolerance of the baseline and at least half the limit in use)), or
// lowers it by a tenth (its mean beyond). A collapse does not wait for a whole window: fastSamples
// queries whose mean is beyond fastFactor × the baseline, or a failed
// query, cut the limit in proportion (baseline / mean, at most by half).
//
// The mean of a window rather than any one query: service times vary by
// ±50%, and a loaded machine adds tens of milliseconds to single queries
// at random, so a threshold on single queries (AIMD's Timeout) backs off
// when nothing is wrong or waits until the database is far past its
// capacity.
type latencyLimit struct {
	limit    float64
	baseline time.Duration
	grown    bool // cut at least once: growth is additive from then on

	since   time.Time                  // samples admitted before this say nothing about the limit
	recent  [fastSamples]time.Duration // the last RTTs, in a ring
	nrecent int
	n       int
	sum     time.Duration
	maxUsed int
}

const (
	windowSamples = 12
	fastSamples   = 3
	tolerance     = 1.2 // a window mean within 1.2× the baseline is normal
	fastFactor    = 1.6
	maxLimit      = 1000
)

func newLatencyLimit(initial int) *latencyLimit { return &latencyLimit{limit: float64(initial)} }

// Limit implements concurrency.Algorithm.
func (l *latencyLimit) Limit() int { return int(l.limit) }

// Update implements concurrency.Algorithm.
func (l *latencyLimit) Update(s concurrency.Sample) {
	if s.Start.Before(l.since) {
		return
	}
	end := s.Start.Add(s.RTT)
	if s.Outcome == spillway.Dropped {
		l.set(l.limit*0.5, end)
		return
	}
	l.recent[l.nrecent%fastSamples] = s.RTT
	l.nrecent++
	l.n++
	l.sum += s.RTT
	l.maxUsed = max(l.maxUsed, s.InFlight)
	mean := l.sum / time.Duration(l.n)
	if l.baseline == 0 {
		if l.n >= windowSamples {
			l.baseline = mean
			l.set(l.limit, end)
		}
		return
	}
	if l.nrecent >= fastSamples {
		var r time.Duration
		for _, v := range l.recent {
			r += v
		}
		if r /= fastSamples; float64(r) > fastFactor*float64(l.baseline) {
			l.set(l.limit*math.Max(0.5, tolerance*float64(l.baseline)/float64(r)), end)
			return
		}
	}
	if l.n < windowSamples {
		return
	}
	switch {
	case float64(mean) > tolerance*float64(l.baseline):
		l.set(l.limit*0.9, end)
	default:
		if mean < l.baseline {
			l.baseline -= (l.baseline - mean) / 10
		} else {
			l.baseline += (mean - l.baseline) / 50
		}
		next := l.limit
		if 2*l.maxUsed >= int(l.limit) {
			if l.grown {
				next += math.Max(1, l.limit/4)
			} else {
				next *= 2 // slow start: until the first sign of overload
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
	}
	l.limit = math.Min(maxLimit, math.Max(1, limit))
	l.since, l.n, l.sum, l.maxUsed, l.nrecent = at, 0, 0, 0, 0
}
