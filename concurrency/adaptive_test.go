package concurrency

import (
	"context"
	"github.com/spillway-go/spillway/internal/testclock"
	"math"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

func TestAIMDSteps(t *testing.T) {
	a, err := NewAIMD(AIMDConfig{Initial: 10, Min: 2, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ok := func(start time.Duration, inFlight int) sample {
		return sample{Start: t0.Add(start), RTT: 100 * time.Millisecond, InFlight: inFlight, Outcome: spillway.Success}
	}
	// Ten successes that used the limit add one (1/limit each).
	for i := 0; i < 10; i++ {
		a.update(ok(0, 5))
	}
	if got := a.value(); got != 10 && got != 11 {
		t.Fatalf("after 10 successes limit = %d", got)
	}
	a.update(ok(0, 6))
	if got := a.value(); got != 11 {
		t.Fatalf("after 11 successes limit = %d, want 11", got)
	}
	// App-limited successes (2 in flight of 11) teach nothing.
	for i := 0; i < 100; i++ {
		a.update(ok(0, 2))
	}
	if got := a.value(); got != 11 {
		t.Fatalf("app-limited successes moved the limit to %d", got)
	}
	// A drop: floor(11.x × 0.9) = 9. Its decrease answers every request
	// that started before it ended (t0+1s+100ms).
	a.update(sample{Start: t0.Add(time.Second), RTT: 100 * time.Millisecond, InFlight: 11, Outcome: spillway.Dropped})
	if got := a.value(); got != 9 {
		t.Fatalf("after a drop limit = %d, want 9", got)
	}
	a.update(sample{Start: t0.Add(time.Second + 50*time.Millisecond), RTT: time.Millisecond, Outcome: spillway.Dropped})
	if got := a.value(); got != 9 {
		t.Fatalf("a drop of the same round trip decreased again: %d", got)
	}
	// An RTT above the timeout is a drop: floor(9 × 0.9) = 8.
	a.update(sample{Start: t0.Add(2 * time.Second), RTT: 2 * time.Second, InFlight: 9, Outcome: spillway.Success})
	if got := a.value(); got != 8 {
		t.Fatalf("after a timeout limit = %d, want 8", got)
	}
	for i := 0; i < 50; i++ {
		a.update(sample{Start: t0.Add(time.Duration(10+i) * time.Minute), RTT: time.Millisecond, Outcome: spillway.Dropped})
	}
	if got := a.value(); got != 2 {
		t.Fatalf("limit fell to %d, want the floor 2", got)
	}
}

func TestAlgorithmConfigValidation(t *testing.T) {
	for name, cfg := range map[string]AIMDConfig{
		"min>max":  {Min: 5, Max: 4},
		"initial":  {Initial: 2000},
		"backoff":  {Backoff: 1.5},
		"timeout":  {Timeout: -1},
		"negative": {Min: -1},
	} {
		if _, err := NewAIMD(cfg); err == nil {
			t.Errorf("AIMD %s: no error", name)
		}
	}
	if _, err := NewAdaptive(nil, ""); err == nil {
		t.Error("NewAdaptive(nil): no error")
	}
}

func TestAdaptiveAdmitAndOutcomes(t *testing.T) {
	clock := newFakeClock()
	alg, _ := NewAIMD(AIMDConfig{Initial: 2, Min: 1})
	a, err := NewAdaptive(alg, "local")
	if err != nil {
		t.Fatal(err)
	}
	a.now = clock.Now
	ctx := context.Background()
	r := &spillway.Request{Priority: spillway.Critical}
	d1, done1, _ := a.Admit(ctx, r)
	d2, done2, _ := a.Admit(ctx, r)
	d3, _, _ := a.Admit(ctx, r)
	if !d1.Allowed || d1.Remaining != 1 || !d2.Allowed || d2.Remaining != 0 {
		t.Fatalf("admitted: %+v %+v", d1, d2)
	}
	if want := (spillway.Decision{Reason: spillway.ReasonShed, Limiter: "local", Limit: 2, RetryAfter: time.Second}); d3 != want {
		t.Fatalf("third: %+v, want %+v", d3, want)
	}
	done1(spillway.Ignored) // releases, teaches nothing
	done1(spillway.Dropped) // second call: nothing
	if a.InFlight() != 1 || a.Limit() != 2 {
		t.Fatalf("after ignored: in flight %d limit %d", a.InFlight(), a.Limit())
	}
	done2(spillway.Dropped)
	if a.InFlight() != 0 || a.Limit() != 1 {
		t.Fatalf("after dropped: in flight %d limit %d, want 0 and 1", a.InFlight(), a.Limit())
	}
	if d, _, _ := a.Admit(ctx, &spillway.Request{Cost: -1}); d.Reason != spillway.ReasonInvalid {
		t.Fatalf("malformed: %+v", d)
	}
	if d, _, _ := a.Admit(ctx, nil); d.Allowed || d.Reason != spillway.ReasonInvalid {
		t.Fatalf("nil request: %+v, want ReasonInvalid", d)
	}
}

// TestAdaptiveCountsRequestsNotCost: Adaptive's limit is in requests; a
// request's Cost does not weigh (see Adaptive.Admit for why).
func TestAdaptiveCountsRequestsNotCost(t *testing.T) {
	alg, _ := NewAIMD(AIMDConfig{Initial: 2, Min: 1})
	a, _ := NewAdaptive(alg, "local")
	ctx := context.Background()
	d1, done1, _ := a.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: 5})
	d2, done2, _ := a.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: 100})
	if want := (spillway.Decision{Allowed: true, Limiter: "local", Limit: 2, Remaining: 1}); d1 != want {
		t.Fatalf("cost 5: %+v, want %+v", d1, want)
	}
	if want := (spillway.Decision{Allowed: true, Limiter: "local", Limit: 2, Remaining: 0}); d2 != want {
		t.Fatalf("cost 100 (above the limit, one request): %+v, want %+v", d2, want)
	}
	if d, _, _ := a.Admit(ctx, &spillway.Request{Priority: spillway.Critical}); d.Allowed || d.Reason != spillway.ReasonShed {
		t.Fatalf("third request: %+v, want shed", d)
	}
	if a.InFlight() != 2 {
		t.Fatalf("in flight %d, want 2 requests", a.InFlight())
	}
	done1(spillway.Ignored)
	done2(spillway.Ignored)
	if a.InFlight() != 0 {
		t.Fatalf("in flight %d after both done, want 0", a.InFlight())
	}
}

// sim is a deterministic server of a fixed capacity behind an Adaptive: a
// request's RTT is base while at most capacity run, and grows in
// proportion to the queue beyond it. Each round offers more work than any
// limit admits (steady overload), runs what was admitted and completes it.
type sim struct {
	t        *testing.T
	clock    *testclock.Clock
	a        *Adaptive
	capacity int
	base     time.Duration
}

func newSim(t *testing.T, alg Algorithm, capacity int, base time.Duration) *sim {
	clock := newFakeClock()
	a, err := NewAdaptive(alg, "")
	if err != nil {
		t.Fatal(err)
	}
	a.now = clock.Now
	return &sim{t: t, clock: clock, a: a, capacity: capacity, base: base}
}

// round admits up to offered requests and returns how many ran.
func (s *sim) round(offered int) int {
	ctx := context.Background()
	var dones []spillway.Done
	for i := 0; i < offered; i++ {
		d, done, _ := s.a.Admit(ctx, &spillway.Request{Priority: spillway.Critical})
		if !d.Allowed {
			break
		}
		dones = append(dones, done)
	}
	n := len(dones)
	rtt := s.base
	if n > s.capacity {
		rtt = time.Duration(float64(s.base) * float64(n) / float64(s.capacity))
	}
	s.clock.Advance(rtt)
	for _, done := range dones {
		done(spillway.Success)
	}
	return n
}

// gradient2Like is the Gradient2 baseline rule in miniature — a long-term
// average RTT as the baseline — used to show that the overload scenario
// below detects upward creep.
type gradient2Like struct {
	limit, longRTT float64
	n              int
	sum            float64
	winStart       time.Time
}

func (g *gradient2Like) value() int { return int(g.limit) }
func (g *gradient2Like) update(s sample) {
	if s.Start.Before(g.winStart) {
		return
	}
	g.n++
	g.sum += float64(s.RTT)
	if g.n < 10 {
		return
	}
	short := g.sum / float64(g.n)
	if g.longRTT == 0 {
		g.longRTT = short
	}
	g.longRTT = 0.95*g.longRTT + 0.05*short // converges to the overloaded RTT
	gradient := math.Max(0.5, math.Min(1, 1.5*g.longRTT/short))
	est := g.limit*gradient + math.Ceil(math.Sqrt(g.limit))
	g.limit = math.Min(1000, 0.8*g.limit+0.2*est)
	g.n, g.sum, g.winStart = 0, 0, s.Start.Add(s.RTT)
}
