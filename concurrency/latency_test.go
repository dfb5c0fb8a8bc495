package concurrency

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

func newLatency(t *testing.T, cfg LatencyConfig) *LatencyLimit {
	t.Helper()
	l, err := NewLatencyLimit(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// feed gives l n samples of rtt, each admitted after the previous one
// ended, with inFlight in use, and returns the time after the last.
func feed(l *LatencyLimit, at time.Time, n int, rtt time.Duration, inFlight int) time.Time {
	for i := 0; i < n; i++ {
		l.update(sample{Start: at, RTT: rtt, InFlight: inFlight, Outcome: spillway.Success})
		at = at.Add(rtt + time.Millisecond)
	}
	return at
}

// The learned limit doubles while the dependency keeps its usual latency
// and the limit is used, cuts at once in proportion when the last few
// calls take far longer, then probes gently (growing steps while it keeps
// working, held by a window 1.05–1.2× slower), and falls by a tenth when
// a window's mean passes 1.2× the baseline.
func TestLatencyLimit(t *testing.T) {
	var changes []LatencyChange
	l := newLatency(t, LatencyConfig{OnChange: func(c LatencyChange) { changes = append(changes, c) }})
	const window, baselineSamples = 12, 48
	at := time.Unix(1000, 0)
	at = feed(l, at, window, 200*time.Millisecond, 4) // a first baseline, 200 ms
	if l.baseline != 200*time.Millisecond || l.value() != 4 {
		t.Fatalf("baseline %v, limit %d; want 200ms, 4", l.baseline, l.value())
	}
	at = feed(l, at, window, 200*time.Millisecond, 2) // half used: doubles
	at = feed(l, at, window, 200*time.Millisecond, 4)
	if l.value() != 16 {
		t.Fatalf("slow start: limit %d, want 16", l.value())
	}
	at = feed(l, at, window, 200*time.Millisecond, 7) // under half used: holds
	if l.value() != 16 || l.bn != baselineSamples {
		t.Fatalf("limit not in use: %d, want 16 (baseline from %d samples)", l.value(), l.bn)
	}
	// Two calls 4× slower are not enough (the machine may have paused);
	// three in a row are, a cut by at most half.
	at = feed(l, at, 2, 800*time.Millisecond, 16)
	if l.value() != 16 {
		t.Fatalf("two slow calls: limit %d, want 16", l.value())
	}
	at = feed(l, at, 1, 800*time.Millisecond, 16)
	if l.value() != 8 || !l.grown {
		t.Fatalf("after a collapse: limit %d, want 8", l.value())
	}
	// A call admitted before the cut says nothing: ignored.
	l.update(sample{Start: at.Add(-time.Hour), RTT: time.Hour, InFlight: 16, Outcome: spillway.Dropped})
	if l.value() != 8 {
		t.Fatalf("an old sample moved the limit to %d", l.value())
	}
	// Back to normal it probes gently: a 32nd of the limit, doubled
	// after every window that grew, up to a quarter.
	for i, want := range []float64{8.25, 8.25 * 17 / 16, 8.25 * 17 / 16 * 9 / 8, 8.25 * 17 / 16 * 9 / 8 * 5 / 4} {
		at = feed(l, at, window, 200*time.Millisecond, 8)
		if math.Abs(l.limit-want) > 1e-9 {
			t.Fatalf("probe %d: limit %v, want %v", i, l.limit, want)
		}
	}
	// A window 1.1× slower: no cut, no growth, and the next probe is
	// small again.
	grown := l.limit // 12.33
	at = feed(l, at, window, 220*time.Millisecond, 12)
	if l.limit != grown {
		t.Fatalf("slow window: limit %v, want %v held", l.limit, grown)
	}
	at = feed(l, at, window, 200*time.Millisecond, 12)
	if want := grown * 33 / 32; math.Abs(l.limit-want) > 1e-9 {
		t.Fatalf("after a slow window: limit %v, want %v", l.limit, want)
	}
	// A window 1.3× slower than the baseline, not enough for a cut at
	// once: a tenth off at its end.
	at = feed(l, at, window, 260*time.Millisecond, 12)
	if want := grown * 33 / 32 * 0.9; math.Abs(l.limit-want) > 1e-9 || l.value() != 11 {
		t.Fatalf("mild overload: limit %v, want %v", l.limit, want)
	}
	// Capped (by what the fleet allows this server), it does not grow
	// past one step above the cap, and cuts start from the cap, the
	// limit in use.
	l.setCap(8)
	held := l.limit
	at = feed(l, at, window, 200*time.Millisecond, 8)
	if l.limit != held || l.eff() != 8 {
		t.Fatalf("capped: limit %v (in use %v), want %v held, 8 in use", l.limit, l.eff(), held)
	}
	at = feed(l, at, fastSamples, 800*time.Millisecond, 8) // 8 · 0.5
	if l.value() != 4 {
		t.Fatalf("cut under the cap: limit %d, want 4", l.value())
	}
	l.setCap(0)
	// A failed call halves it; an Ignored one says nothing.
	l.update(sample{Start: at.Add(time.Hour), RTT: time.Second, InFlight: 4, Outcome: spillway.Ignored})
	if l.value() != 4 {
		t.Fatalf("after an ignored sample: limit %v, want 4", l.limit)
	}
	l.learn(at.Add(time.Hour), time.Second, 4, spillway.Dropped)
	if l.value() != 2 {
		t.Fatalf("after a failure: limit %v, want 2", l.limit)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.Cause)
	}
	// Growth (slow start, probes that pass an integer) has no cause.
	want := []string{"", "", "fast", "", "", "window", "fast", "dropped"}
	if !slices.Equal(got, want) {
		t.Fatalf("changes %v, want causes %q", changes, want)
	}
	if c := changes[6]; c.From != held || c.To != 4 || c.Cap != 8 || c.Baseline != l.baseline {
		t.Fatalf("the capped cut reported %+v", c)
	}
}

// Work still in flight past twice the baseline halves the limit before
// it ends: three of them or more, admitted since the last change.
func TestLatencyLimitOverdue(t *testing.T) {
	l := newLatency(t, LatencyConfig{Initial: 20})
	at := feed(l, time.Unix(1000, 0), 48, 200*time.Millisecond, 9) // under half used
	if l.baseline != 200*time.Millisecond || l.value() != 20 {
		t.Fatalf("baseline %v, limit %d; want 200ms, 20", l.baseline, l.value())
	}
	now := at.Add(time.Second)
	// Two overdue, one young: no cut.
	l.overdue(now, slices.Values([]time.Time{now.Add(-450 * time.Millisecond), now.Add(-450 * time.Millisecond), now.Add(-100 * time.Millisecond)}))
	if l.value() != 20 {
		t.Fatalf("two overdue: limit %d, want 20", l.value())
	}
	old := []time.Time{now.Add(-410 * time.Millisecond), now.Add(-410 * time.Millisecond), now.Add(-140 * time.Millisecond), now.Add(-500 * time.Millisecond)}
	l.overdue(now, slices.Values(old))
	if l.value() != 10 {
		t.Fatalf("three overdue: limit %d, want 10", l.value())
	}
	// The same work again: admitted before the cut, it says nothing.
	l.overdue(now.Add(time.Second), slices.Values(old))
	if l.value() != 10 {
		t.Fatalf("the same overdue work cut again: limit %d, want 10", l.value())
	}
	// Before a baseline, nothing is overdue.
	fresh := newLatency(t, LatencyConfig{Initial: 20})
	fresh.overdue(now, slices.Values(old))
	if fresh.value() != 20 {
		t.Fatalf("no baseline: limit %d, want 20", fresh.value())
	}
}

// Raise grows the limit by this server's share of the idle capacity,
// rounded up, up to what the fleet allows, once per reading, only on a
// reading that shows an idle unit and began after the last cut; it never
// lowers it.
func TestLatencyLimitRaise(t *testing.T) {
	l := newLatency(t, LatencyConfig{})
	at := feed(l, time.Unix(1000, 0), 48, 200*time.Millisecond, 4) // slow start to 16
	at = feed(l, at, fastSamples, 800*time.Millisecond, 16)        // a cut, by half
	cut := l.cutAt
	if l.value() != 8 || cut.IsZero() {
		t.Fatalf("limit %d after a collapse (cut at %v)", l.value(), cut)
	}
	after := func(ms int) time.Time { return cut.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		name        string
		idle, share float64
		to          int64
		since       time.Time
		want        int
	}{
		{"a reading from before the cut", 11, 0.5, 30, cut.Add(-time.Second), 8},
		{"a reading without an idle unit", 0.5, 0.5, 30, after(1), 8},
		{"NaN idle", math.NaN(), 0.5, 30, after(1), 8},
		{"no share", 11, 0, 30, after(1), 8},
		{"an allowance below the limit", 11, 0.5, 3, after(1), 8},
		{"half of 11 idle, rounded up", 11, 0.5, 30, after(2), 14},
		{"the same reading again", 11, 0.5, 30, after(2), 14},
		{"an older reading", 11, 0.5, 30, after(1), 14},
		{"the allowance bounds it", 11, 0.5, 16, after(3), 16},
		{"a lower allowance later", 11, 0.5, 9, after(4), 16},
		{"one idle unit shared by three", 1, 1.0 / 3, 30, after(5), 17},
		{"two idle units shared by three", 2, 1.0 / 3, 30, after(6), 18},
	} {
		l.raise(c.idle, c.share, c.to, c.since, at)
		if l.value() != c.want {
			t.Fatalf("%s: limit %d, want %d", c.name, l.value(), c.want)
		}
	}
	// A new cut (18 halved) makes a reading that began before it stale.
	// (The latest reading shows no idle unit: with one, slow work would
	// move the baseline instead, TestLatencyLimitIdleRebaseline.)
	l.raise(0.5, 1.0/3, 30, after(7), at)
	at = feed(l, at.Add(time.Second), fastSamples, 800*time.Millisecond, 18)
	if l.value() != 9 {
		t.Fatalf("limit %d after the second collapse, want 9", l.value())
	}
	l.raise(11, 0.5, 30, after(7), at)
	if l.value() != 9 {
		t.Fatalf("a reading from before the second cut raised the limit to %d", l.value())
	}
}

// Slow work while the latest capacity reading, begun after the last cut,
// shows idle capacity moves the baseline instead of cutting: the
// dependency became slower (a slower replica), it is not queueing. When
// it is fast again, a window far under the baseline brings it back. With
// a busy latest reading the same slow work cuts.
func TestLatencyLimitIdleRebaseline(t *testing.T) {
	l := newLatency(t, LatencyConfig{})
	at := feed(l, time.Unix(1000, 0), 48, 200*time.Millisecond, 4) // slow start to 16
	at = feed(l, at, fastSamples, 800*time.Millisecond, 16)        // a cut, by half
	if l.value() != 8 || l.baseline != 200*time.Millisecond {
		t.Fatalf("limit %d, baseline %v after a collapse; want 8, 200ms", l.value(), l.baseline)
	}
	cut := l.cutAt
	l.raise(4, 0.5, 8, cut.Add(time.Millisecond), at) // idle, but the allowance holds the limit
	at = feed(l, at, fastSamples, 600*time.Millisecond, 8)
	if l.value() != 8 || l.baseline != 600*time.Millisecond {
		t.Fatalf("slow work with idle capacity: limit %d, baseline %v; want 8, 600ms", l.value(), l.baseline)
	}
	at = feed(l, at, 12, 600*time.Millisecond, 8) // a window at the new baseline: no cut
	if l.value() < 8 || l.baseline != 600*time.Millisecond {
		t.Fatalf("a window at the new baseline: limit %d, baseline %v; want >= 8, 600ms", l.value(), l.baseline)
	}
	limit := l.value()
	at = feed(l, at, 12, 200*time.Millisecond, 1) // fast again, little used: no growth
	if l.value() != limit || l.baseline != 200*time.Millisecond {
		t.Fatalf("fast again: limit %d, baseline %v; want %d, 200ms", l.value(), l.baseline, limit)
	}
	// The latest reading busy: slow work is an overload again.
	l.raise(0.5, 0.5, 30, at, at)
	feed(l, at, fastSamples, 600*time.Millisecond, limit)
	if l.value() >= limit || l.baseline != 200*time.Millisecond {
		t.Fatalf("slow work, busy reading: limit %d, baseline %v; want < %d, 200ms", l.value(), l.baseline, limit)
	}
}

// A gauge that measures the work waiting at the dependency (Queued) tells
// a slower dependency from an overloaded one when every worker is busy:
// slow work while the latest reading, begun after the last cut, shows
// less than half a unit waiting moves the baseline, and work overdue does
// not cut; a reading with a queue makes the same slow work cut. The
// latest reading decides, whether it came with Raise or Queued.
func TestLatencyLimitQueueRebaseline(t *testing.T) {
	l := newLatency(t, LatencyConfig{})
	at := feed(l, time.Unix(1000, 0), 48, 200*time.Millisecond, 4) // slow start to 16
	at = feed(l, at, fastSamples, 800*time.Millisecond, 16)        // a cut, by half
	if l.value() != 8 || l.baseline != 200*time.Millisecond {
		t.Fatalf("limit %d, baseline %v after a collapse; want 8, 200ms", l.value(), l.baseline)
	}
	cut := l.cutAt
	after := func(ms int) time.Time { return cut.Add(time.Duration(ms) * time.Millisecond) }

	// A reading from before the cut says nothing: slow work cuts.
	probe := *l
	probe.queued(0, cut.Add(-time.Millisecond))
	feed(&probe, at, fastSamples, 600*time.Millisecond, 8)
	if probe.value() >= 8 {
		t.Fatalf("a calm reading from before the cut kept the limit at %d", probe.value())
	}

	// Every worker busy, nothing waiting: the dependency is slower.
	l.raise(0, 0.5, 30, after(1), at) // no idle unit
	l.queued(0.3, after(1))
	at = feed(l, at, fastSamples, 600*time.Millisecond, 8)
	if l.value() != 8 || l.baseline != 600*time.Millisecond {
		t.Fatalf("slow work, nothing waiting: limit %d, baseline %v; want 8, 600ms", l.value(), l.baseline)
	}
	old := slices.Repeat([]time.Time{at.Add(-2 * time.Second)}, 3)
	l.overdue(at, slices.Values(old)) // 2 s in flight, past 2 × 600 ms
	if l.value() != 8 {
		t.Fatalf("overdue work with nothing waiting cut the limit to %d", l.value())
	}

	// A newer reading with work waiting: the same slowness is a queue.
	l.queued(2, after(2))
	feed(l, at, fastSamples, 1800*time.Millisecond, 8)
	if l.value() >= 8 || l.baseline != 600*time.Millisecond {
		t.Fatalf("slow work, 2 waiting: limit %d, baseline %v; want < 8, 600ms", l.value(), l.baseline)
	}

	// The latest reading decides: a queue after an idle reading cuts, an
	// idle reading after a queue does not; a NaN queue is a queue.
	for _, c := range []struct {
		name    string
		read    func(l *LatencyLimit, cut time.Time)
		wantCut bool
	}{
		{"idle, then a queue", func(l *LatencyLimit, cut time.Time) {
			l.raise(3, 0.5, 8, cut.Add(time.Millisecond), cut)
			l.queued(1, cut.Add(2*time.Millisecond))
		}, true},
		{"a queue, then idle", func(l *LatencyLimit, cut time.Time) {
			l.queued(1, cut.Add(time.Millisecond))
			l.raise(3, 0.5, 4, cut.Add(2*time.Millisecond), cut)
		}, false},
		{"the same reading: the queue decides", func(l *LatencyLimit, cut time.Time) {
			l.raise(3, 0.5, 4, cut.Add(time.Millisecond), cut)
			l.queued(1, cut.Add(time.Millisecond))
		}, true},
		{"NaN waiting", func(l *LatencyLimit, cut time.Time) { l.queued(math.NaN(), cut.Add(time.Millisecond)) }, true},
		{"an older calm reading after a queue", func(l *LatencyLimit, cut time.Time) {
			l.queued(1, cut.Add(2*time.Millisecond))
			l.queued(0, cut.Add(time.Millisecond))
		}, true},
	} {
		m := newLatency(t, LatencyConfig{})
		at := feed(m, time.Unix(1000, 0), 48, 200*time.Millisecond, 4)
		at = feed(m, at, fastSamples, 800*time.Millisecond, 16)
		limit := m.value()
		c.read(m, m.cutAt)
		feed(m, at, fastSamples, 600*time.Millisecond, limit)
		if cutNow := m.value() < limit; cutNow != c.wantCut {
			t.Errorf("%s: limit %d -> %d (baseline %v), want cut %v", c.name, limit, m.value(), m.baseline, c.wantCut)
		}
	}
}

// The limit stays within [Min, Max]: slow start stops at Max, and cuts at
// Min.
func TestLatencyLimitBounds(t *testing.T) {
	l := newLatency(t, LatencyConfig{Initial: 4, Min: 3, Max: 20})
	at := feed(l, time.Unix(1000, 0), 12*6, 10*time.Millisecond, 20)
	if l.value() != 20 {
		t.Fatalf("slow start: limit %d, want Max 20", l.value())
	}
	for i := 0; i < 10; i++ {
		l.learn(at, time.Second, 20, spillway.Dropped)
		at = at.Add(2 * time.Second)
	}
	if l.value() != 3 {
		t.Fatalf("after ten failures: limit %d, want Min 3", l.value())
	}
}

func TestLatencyConfigValidation(t *testing.T) {
	for name, cfg := range map[string]LatencyConfig{
		"min negative":       {Min: -1},
		"max below min":      {Min: 5, Max: 4, Initial: 5},
		"initial below min":  {Min: 5, Initial: 2},
		"initial above max":  {Max: 10, Initial: 11},
		"window negative":    {Window: -1},
		"tolerance at 1.05":  {Tolerance: 1.05},
		"tolerance below 1":  {Tolerance: 0.5},
		"tolerance NaN":      {Tolerance: math.NaN()},
		"tolerance infinite": {Tolerance: math.Inf(1)},
		"initial negative":   {Initial: -3},
	} {
		if _, err := NewLatencyLimit(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	l := newLatency(t, LatencyConfig{})
	if l.cfg.Initial != 4 || l.cfg.Min != 1 || l.cfg.Max != 1000 || l.cfg.Window != 12 || l.cfg.Tolerance != 1.2 || l.value() != 4 {
		t.Fatalf("defaults %+v, limit %d", l.cfg, l.value())
	}
}

// TestLatencyLimitSteadyOverload: a dependency of capacity 20 (the sim:
// RTT grows in proportion to the work beyond 20) overloaded for 5,000
// round trips. The limit settles just above the capacity, where a window
// is 1.05–1.2× slower than the baseline, and never creeps upward; the
// Gradient2-style baseline in the same scenario climbs past 10 ×
// capacity.
func TestLatencyLimitSteadyOverload(t *testing.T) {
	const capacity = 20
	l := newLatency(t, LatencyConfig{})
	s := newSim(t, l, capacity, 10*time.Millisecond)
	maxIn := func(from, to int) int {
		m := 0
		for i := from; i < to; i++ {
			s.round(math.MaxInt32)
			m = max(m, l.value())
		}
		return m
	}
	maxIn(0, 1000) // slow start and settling
	early := maxIn(1000, 2000)
	maxIn(2000, 4000)
	late := maxIn(4000, 5000)
	if early != 23 || late != 23 {
		t.Fatalf("max limit rounds 1000-2000: %d, rounds 4000-5000: %d; want 23 and 23 (1.15 × capacity)", early, late)
	}

	ref := &gradient2Like{limit: 20}
	rs := newSim(t, ref, capacity, 10*time.Millisecond)
	for i := 0; i < 3000 && ref.value() < 10*capacity; i++ {
		rs.round(math.MaxInt32)
	}
	if ref.value() < 10*capacity {
		t.Fatalf("the reference long-average baseline reached only %d; the scenario no longer detects creep", ref.value())
	}
}

// TestLatencyLimitFollowsSlowerDependency: the dependency's latency
// triples for good at the same capacity. The limit falls to Min, where a
// window with one call in flight at a time shows the new latency: it
// becomes the baseline, and the limit probes back up to the capacity.
func TestLatencyLimitFollowsSlowerDependency(t *testing.T) {
	const capacity = 20
	var causes []string
	l := newLatency(t, LatencyConfig{OnChange: func(c LatencyChange) {
		if c.Cause == "rebaseline" {
			causes = append(causes, c.Cause)
		}
	}})
	s := newSim(t, l, capacity, 10*time.Millisecond)
	for i := 0; i < 1000; i++ {
		s.round(math.MaxInt32)
	}
	if l.value() != 23 || l.baseline != 10*time.Millisecond {
		t.Fatalf("before: limit %d, baseline %v", l.value(), l.baseline)
	}
	s.base = 30 * time.Millisecond
	atMin, back := -1, -1
	for i := 0; i < 2000 && back < 0; i++ {
		s.round(math.MaxInt32)
		if atMin < 0 && l.value() == 1 {
			atMin = i
		}
		if atMin >= 0 && l.value() >= capacity {
			back = i
		}
	}
	t.Logf("at Min after %d round trips, back to %d after %d; baseline %v", atMin, capacity, back, l.baseline)
	if atMin != 4 || back != 119 || l.baseline != 30*time.Millisecond || len(causes) != 1 {
		t.Fatalf("at Min after %d round trips (want 4), back to the capacity after %d (want 119), baseline %v (want 30ms), %d rebaselines (want 1)", atMin, back, l.baseline, len(causes))
	}
}

// Latency that stays bad (LatencyConfig.Timeout): work all in flight past
// the Timeout, with nothing ended in time for as long, sends the limit to
// Min at once; samples at the Timeout and failures keep it there (no
// rebaseline, no Raise); the first call that ends in time again ends it,
// and the limit slow starts from Min.
func TestLatencyLimitStuck(t *testing.T) {
	var causes []string
	l := newLatency(t, LatencyConfig{Initial: 20, Timeout: time.Second, OnChange: func(c LatencyChange) { causes = append(causes, c.Cause) }})
	at := feed(l, time.Unix(1000, 0), 48, 200*time.Millisecond, 9) // baseline 200 ms, under half used
	if l.baseline != 200*time.Millisecond || l.value() != 20 || l.stuck {
		t.Fatalf("baseline %v, limit %d, stuck %v; want 200ms, 20, false", l.baseline, l.value(), l.stuck)
	}
	// One of three in flight younger than the Timeout: not stuck (the
	// overdue rule halves).
	now := at.Add(1500 * time.Millisecond)
	starts := []time.Time{at, at, at.Add(900 * time.Millisecond)}
	l.overdue(now, slices.Values(starts))
	if l.value() != 10 || l.stuck {
		t.Fatalf("one young: limit %d, stuck %v; want 10, false", l.value(), l.stuck)
	}
	// All three past the Timeout, nothing ended in time for 2 s: Min,
	// though the work was admitted before the last cut.
	now = at.Add(2 * time.Second)
	l.overdue(now, slices.Values(starts))
	if l.value() != 1 || !l.stuck {
		t.Fatalf("all stuck: limit %d, stuck %v; want 1, true", l.value(), l.stuck)
	}
	// Idle capacity reported by a gauge does not raise a stuck limit.
	l.raise(11, 0.5, 30, now.Add(time.Millisecond), now.Add(300*time.Millisecond))
	if l.value() != 1 {
		t.Fatalf("raised while stuck to %d", l.value())
	}
	// Every call ends at the Timeout (a steady ratio) or fails: it stays
	// at Min and keeps its baseline.
	at = now
	for i := 0; i < 48; i++ {
		o := spillway.Success
		if i%2 == 1 {
			o = spillway.Dropped
		}
		l.update(sample{Start: at, RTT: time.Second, InFlight: 1, Outcome: o})
		at = at.Add(time.Second + time.Millisecond)
	}
	if l.value() != 1 || l.baseline != 200*time.Millisecond || !l.stuck {
		t.Fatalf("at the timeout: limit %d, baseline %v, stuck %v; want 1, 200ms, true", l.value(), l.baseline, l.stuck)
	}
	// The dependency is back: the first call in time ends it, and the
	// limit doubles with every window from Min.
	at = feed(l, at, 1, 200*time.Millisecond, 1)
	if l.stuck {
		t.Fatal("still stuck after a call in time")
	}
	var got []int
	for _, used := range []int{1, 2, 4, 8} {
		at = feed(l, at, 12, 200*time.Millisecond, used)
		got = append(got, l.value())
	}
	if !slices.Equal(got, []int{2, 4, 8, 16}) {
		t.Fatalf("after the return: limits %v, want [2 4 8 16]", got)
	}
	if want := []string{"overdue", "stuck", "", "", "", ""}; !slices.Equal(causes, want) {
		t.Fatalf("causes %q, want %q", causes, want)
	}

	// Without a Timeout the same calls at 1 s are a slower dependency:
	// at Min they become the baseline and the limit climbs on them.
	ref := newLatency(t, LatencyConfig{Initial: 20})
	at = feed(ref, time.Unix(1000, 0), 48, 200*time.Millisecond, 9)
	ref.overdue(at.Add(2*time.Second), slices.Values([]time.Time{at, at, at}))
	for ref.value() > 1 {
		at = feed(ref, at, 3, 2*time.Second, 20)
	}
	for i := 0; i < 3 && ref.baseline != time.Second; i++ {
		at = feed(ref, at, 12, time.Second, 1) // to Min, then a rebaseline to 1 s
	}
	_ = feed(ref, at, 12, time.Second, 1) // grows on it
	if ref.baseline != time.Second || ref.limit != 1+1.0/32 {
		t.Fatalf("without a Timeout: baseline %v, limit %v; want 1s and growing above 1", ref.baseline, ref.limit)
	}
}

// Far above the long-run minimum counts as stuck too: with a Timeout of
// 10 s and a baseline of 100 ms, calls that all take 1.5 s (15× the
// baseline) send the limit to Min after 1 s of them.
func TestLatencyLimitStuckFarAboveMinimum(t *testing.T) {
	l := newLatency(t, LatencyConfig{Initial: 20, Timeout: 10 * time.Second})
	at := feed(l, time.Unix(1000, 0), 48, 100*time.Millisecond, 9)
	if l.stuckAt() != time.Second {
		t.Fatalf("stuck latency %v, want 1s (10 × the 100ms baseline)", l.stuckAt())
	}
	l.update(sample{Start: at, RTT: 1500 * time.Millisecond, InFlight: 9, Outcome: spillway.Success})
	if l.value() != 1 || !l.stuck {
		t.Fatalf("limit %d, stuck %v; want 1, true", l.value(), l.stuck)
	}
	// A negative Timeout is refused.
	if _, err := NewLatencyLimit(LatencyConfig{Timeout: -time.Second}); err == nil {
		t.Fatal("negative Timeout accepted")
	}
}
