package main

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
)

// feed gives l n samples of rtt, each admitted after the previous one
// ended, with inFlight in use, and returns the time after the last.
func feed(l *latencyLimit, at time.Time, n int, rtt time.Duration, inFlight int) time.Time {
	for i := 0; i < n; i++ {
		l.Update(concurrency.Sample{Start: at, RTT: rtt, InFlight: inFlight, Outcome: spillway.Success})
		at = at.Add(rtt + time.Millisecond)
	}
	return at
}

// The learned limit doubles while the database keeps its usual latency
// and the limit is used, cuts at once in proportion when the last few
// queries take far longer, then grows by an eighth (at least one) per
// window, and falls by a tenth when a window's mean passes 1.2× the
// baseline.
func TestLatencyLimit(t *testing.T) {
	l := newLatencyLimit(4)
	at := time.Unix(1000, 0)
	at = feed(l, at, windowSamples, 200*time.Millisecond, 4) // a first baseline, 200 ms
	if l.baseline != 200*time.Millisecond || l.Limit() != 4 {
		t.Fatalf("baseline %v, limit %d; want 200ms, 4", l.baseline, l.Limit())
	}
	at = feed(l, at, windowSamples, 200*time.Millisecond, 2) // half used: doubles
	at = feed(l, at, windowSamples, 200*time.Millisecond, 4)
	if l.Limit() != 16 {
		t.Fatalf("slow start: limit %d, want 16", l.Limit())
	}
	at = feed(l, at, windowSamples, 200*time.Millisecond, 7) // under half used: holds
	if l.Limit() != 16 || l.bn != baselineSamples {
		t.Fatalf("limit not in use: %d, want 16 (baseline from %d samples)", l.Limit(), l.bn)
	}
	// Two queries 4× slower are not enough (the machine may have paused);
	// three in a row are, a cut by at most half.
	at = feed(l, at, 2, 800*time.Millisecond, 16)
	if l.Limit() != 16 {
		t.Fatalf("two slow queries: limit %d, want 16", l.Limit())
	}
	at = feed(l, at, 1, 800*time.Millisecond, 16)
	if l.Limit() != 8 || !l.grown {
		t.Fatalf("after a collapse: limit %d, want 8", l.Limit())
	}
	// A query admitted before the cut says nothing: ignored.
	l.Update(concurrency.Sample{Start: at.Add(-time.Hour), RTT: time.Hour, InFlight: 16, Outcome: spillway.Dropped})
	if l.Limit() != 8 {
		t.Fatalf("an old sample moved the limit to %d", l.Limit())
	}
	// Back to normal: an eighth per window from now on (at least half a
	// query), 9 after one window.
	at = feed(l, at, windowSamples, 200*time.Millisecond, 8)
	if l.Limit() != 9 {
		t.Fatalf("additive growth: limit %d, want 9", l.Limit())
	}
	// A window 1.3× slower than the baseline, not enough for a cut at
	// once: a tenth off at its end (8.1).
	at = feed(l, at, windowSamples, 260*time.Millisecond, 9)
	if l.Limit() != 8 {
		t.Fatalf("mild overload: limit %d, want 8", l.Limit())
	}
	// Capped (by what the fleet allows this server), it grows to one
	// step past the cap and no further, and cuts start from the cap, the
	// limit in use.
	l.SetCap(8)
	at = feed(l, at, windowSamples, 200*time.Millisecond, 8) // 8.1 + 1.01
	at = feed(l, at, windowSamples, 200*time.Millisecond, 8) // at most 8 + 1
	at = feed(l, at, windowSamples, 200*time.Millisecond, 8)
	if l.Limit() != 9 || l.limit != 9 {
		t.Fatalf("capped growth: limit %v, want 9", l.limit)
	}
	l.SetCap(6)
	at = feed(l, at, fastSamples, 800*time.Millisecond, 6) // 6 · 0.5
	if l.Limit() != 3 {
		t.Fatalf("cut under the cap: limit %d, want 3", l.Limit())
	}
	l.SetCap(0)
	// A failed query halves it.
	l.Update(concurrency.Sample{Start: at.Add(time.Hour), RTT: time.Second, InFlight: 3, Outcome: spillway.Dropped})
	if l.Limit() != 1 || l.limit != 1.5 {
		t.Fatalf("after a failure: limit %v, want 1.5", l.limit)
	}
}

// Queries still in flight past twice the baseline halve the limit before
// they end: three of them or more, admitted since the last change.
func TestLatencyLimitOverdue(t *testing.T) {
	l := newLatencyLimit(20)
	at := feed(l, time.Unix(1000, 0), baselineSamples, 200*time.Millisecond, 9) // under half used
	if l.baseline != 200*time.Millisecond || l.Limit() != 20 {
		t.Fatalf("baseline %v, limit %d; want 200ms, 20", l.baseline, l.Limit())
	}
	starts := func(ts ...time.Time) func(func(time.Time) bool) {
		return func(yield func(time.Time) bool) {
			for _, s := range ts {
				if !yield(s) {
					return
				}
			}
		}
	}
	now := at.Add(time.Second)
	// Two overdue, one young: no cut.
	l.Overdue(now, starts(now.Add(-450*time.Millisecond), now.Add(-450*time.Millisecond), now.Add(-100*time.Millisecond)))
	if l.Limit() != 20 {
		t.Fatalf("two overdue: limit %d, want 20", l.Limit())
	}
	l.Overdue(now, starts(now.Add(-410*time.Millisecond), now.Add(-410*time.Millisecond), now.Add(-140*time.Millisecond), now.Add(-500*time.Millisecond)))
	if l.Limit() != 10 {
		t.Fatalf("three overdue: limit %d, want 10", l.Limit())
	}
	// The same queries again: admitted before the cut, they say nothing.
	l.Overdue(now.Add(time.Second), starts(now.Add(-410*time.Millisecond), now.Add(-410*time.Millisecond), now.Add(-500*time.Millisecond)))
	if l.Limit() != 10 {
		t.Fatalf("the same overdue queries cut again: limit %d, want 10", l.Limit())
	}
}
