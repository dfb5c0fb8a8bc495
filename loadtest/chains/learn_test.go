package chains

import (
	"math"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"

	"github.com/spillway-go/spillway/loadtest/sim"
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
// queries take far longer, then probes gently (growing steps while it
// keeps working, held by a window 1.05–1.2× slower), and falls by a tenth
// when a window's mean passes 1.2× the baseline.
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
	// Back to normal it probes gently: a 32nd of the limit, doubled
	// after every window that grew, up to a quarter.
	for i, want := range []float64{8.25, 8.25 * 17 / 16, 8.25 * 17 / 16 * 9 / 8, 8.25 * 17 / 16 * 9 / 8 * 5 / 4} {
		at = feed(l, at, windowSamples, 200*time.Millisecond, 8)
		if math.Abs(l.limit-want) > 1e-9 {
			t.Fatalf("probe %d: limit %v, want %v", i, l.limit, want)
		}
	}
	// A window 1.1× slower: no cut, no growth, and the next probe is
	// small again.
	grown := l.limit // 12.33
	at = feed(l, at, windowSamples, 220*time.Millisecond, 12)
	if l.limit != grown {
		t.Fatalf("slow window: limit %v, want %v held", l.limit, grown)
	}
	at = feed(l, at, windowSamples, 200*time.Millisecond, 12)
	if want := grown * 33 / 32; math.Abs(l.limit-want) > 1e-9 {
		t.Fatalf("after a slow window: limit %v, want %v", l.limit, want)
	}
	// A window 1.3× slower than the baseline, not enough for a cut at
	// once: a tenth off at its end.
	at = feed(l, at, windowSamples, 260*time.Millisecond, 12)
	if want := grown * 33 / 32 * 0.9; math.Abs(l.limit-want) > 1e-9 || l.Limit() != 11 {
		t.Fatalf("mild overload: limit %v, want %v", l.limit, want)
	}
	// Capped (by what the fleet allows this server), it does not grow
	// past one step above the cap, and cuts start from the cap, the
	// limit in use.
	l.SetCap(8)
	held := l.limit
	at = feed(l, at, windowSamples, 200*time.Millisecond, 8)
	if l.limit != held || l.eff() != 8 {
		t.Fatalf("capped: limit %v (in use %v), want %v held, 8 in use", l.limit, l.eff(), held)
	}
	at = feed(l, at, fastSamples, 800*time.Millisecond, 8) // 8 · 0.5
	if l.Limit() != 4 {
		t.Fatalf("cut under the cap: limit %d, want 4", l.Limit())
	}
	l.SetCap(0)
	// A failed query halves it.
	l.Update(concurrency.Sample{Start: at.Add(time.Hour), RTT: time.Second, InFlight: 4, Outcome: spillway.Dropped})
	if l.Limit() != 2 {
		t.Fatalf("after a failure: limit %v, want 2", l.limit)
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

// Raise grows the limit by this server's share of the idle workers, up
// to what the fleet allows, only on a gauge reading that shows an idle
// worker and began after the last cut; it never lowers it.
func TestLatencyLimitRaise(t *testing.T) {
	l := newLatencyLimit(4)
	at := feed(l, time.Unix(1000, 0), baselineSamples, 200*time.Millisecond, 4) // slow start to 16
	at = feed(l, at, fastSamples, 800*time.Millisecond, 16)                     // a cut, by half
	cut := l.cutAt
	if l.Limit() != 8 || cut.IsZero() {
		t.Fatalf("limit %d after a collapse (cut at %v)", l.Limit(), cut)
	}
	room := sim.Gauge{From: cut.Add(time.Millisecond), To: cut.Add(time.Second), Active: 4, Idle: 11}
	for _, c := range []struct {
		name      string
		g         sim.Gauge
		share, to float64
		want      int
	}{
		{"a reading from before the cut", sim.Gauge{From: cut.Add(-time.Second), To: cut, Active: 4, Idle: 11}, 0.5, 30, 8},
		{"a reading without an idle worker", sim.Gauge{From: cut.Add(time.Millisecond), To: cut.Add(time.Second), Active: 14.5, Idle: 0.5}, 0.5, 30, 8},
		{"no share", room, 0, 30, 8},
		{"an allowance below the limit", room, 0.5, 3, 8},
		{"half of 11 idle, rounded", room, 0.5, 30, 14},
		{"the allowance bounds it", room, 0.5, 16, 16},
		{"a lower allowance later", room, 0.5, 9, 16},
	} {
		l.Raise(c.g, c.share, c.to, at)
		if l.Limit() != c.want {
			t.Fatalf("%s: limit %d, want %d", c.name, l.Limit(), c.want)
		}
	}
	// A new cut makes the same reading stale again.
	at = feed(l, at.Add(time.Second), fastSamples, 800*time.Millisecond, 16)
	if l.Limit() != 8 {
		t.Fatalf("limit %d after the second collapse, want 8", l.Limit())
	}
	l.Raise(room, 0.5, 30, at)
	if l.Limit() != 8 {
		t.Fatalf("a reading from before the second cut raised the limit to %d", l.Limit())
	}
}
