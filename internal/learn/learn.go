// Package learn connects a learned concurrency limit
// (concurrency.LatencyLimit) to the shedder.Pool that drives it, without
// exporting the Pool's calls from package concurrency: concurrency sets
// Of in its init, and shedder calls it.
package learn

import (
	"iter"
	"time"

	"github.com/spillway-go/spillway"
)

// Limit is what a Pool calls on its learned limit, under its own lock.
type Limit interface {
	// Limit returns the learned limit, at least 1.
	Limit() int
	// Baseline returns the latency the windows compare against, 0 until
	// the first window (for tests).
	Baseline() time.Duration
	// Learn records one piece of admitted work that ended with o
	// (Success or Dropped): when it was admitted, how long it held its
	// slot, and the most pieces in flight from its admission to its end,
	// itself included.
	Learn(start time.Time, rtt time.Duration, inFlight int, o spillway.Outcome)
	// SetCap tells the limit the most this server may have in flight now
	// (what the fleet shedder allows it), 0 for none.
	SetCap(n int64)
	// Overdue is given the start times of the work in flight.
	Overdue(now time.Time, starts iter.Seq[time.Time])
	// Raise is given the last capacity reading that reported idle
	// capacity: idle units averaged over a window that began at since,
	// this server's share of them, and to, the most the limit may be
	// raised to.
	Raise(idle, share float64, to int64, since, at time.Time)
	// Queued is given the work waiting at the dependency on average over
	// a window that began at since.
	Queued(waiting float64, since time.Time)
}

// Of returns the Limit view of a concurrency.LatencyLimit; package
// concurrency sets it in its init.
var Of func(l any) Limit
