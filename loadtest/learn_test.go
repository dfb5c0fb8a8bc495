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
// and the limit is in use, cuts at once in proportion when the last few
// queries take far longer, then grows by a quarter per window, and falls
// by a tenth when a window's mean passes 1.2× the baseline.
func TestLatencyLimit(t *testing.T) {
	l := newLatencyLimit(4)
	at := time.Unix(1000, 0)
	at = feed(l, at, windowSamples, 200*time.Millisecond, 4) // learns the baseline, 200 ms
	if l.baseline != 200*time.Millisecond || l.Limit() != 4 {
		t.Fatalf("baseline %v, limit %d; want 200ms, 4", l.baseline, l.Limit())
	}
	at = feed(l, at, windowSamples, 200*time.Millisecond, 2) // half in use: doubles
	at = feed(l, at, windowSamples, 200*time.Millisecond, 4)
	if l.Limit() != 16 {
		t.Fatalf("slow start: limit %d, want 16", l.Limit())
	}
	at = feed(l, at, windowSamples, 200*time.Millisecond, 7) // under half in use: holds
	if l.Limit() != 16 {
		t.Fatalf("limit not in use: %d, want 16", l.Limit())
	}
	// A query admitted before the last change says nothing: ignored.
	l.Update(concurrency.Sample{Start: at.Add(-time.Hour), RTT: time.Hour, InFlight: 16, Outcome: spillway.Dropped})
	if l.Limit() != 16 {
		t.Fatalf("an old sample moved the limit to %d", l.Limit())
	}
	// The database slows down 4×: three queries are enough to cut, by at
	// most half.
	at = feed(l, at, fastSamples, 800*time.Millisecond, 16)
	if l.Limit() != 8 || !l.grown {
		t.Fatalf("after a collapse: limit %d, want 8", l.Limit())
	}
	// Back to normal: a quarter per window from now on.
	at = feed(l, at, windowSamples, 200*time.Millisecond, 8)
	if l.Limit() != 10 {
		t.Fatalf("additive growth: limit %d, want 10", l.Limit())
	}
	// A window 1.3× slower than the baseline, not enough for a cut at
	// once: a tenth off at its end.
	feed(l, at, windowSamples, 260*time.Millisecond, 10)
	if l.Limit() != 9 {
		t.Fatalf("mild overload: limit %d, want 9", l.Limit())
	}
	// A failed query halves it.
	l.Update(concurrency.Sample{Start: at.Add(time.Hour), RTT: time.Second, InFlight: 9, Outcome: spillway.Dropped})
	if l.Limit() != 4 {
		t.Fatalf("after a failure: limit %d, want 4", l.Limit())
	}
}
