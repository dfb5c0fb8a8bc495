package shedder_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/shedder"
)

func newClock() *testclock.Clock { return testclock.New(time.Unix(1_700_000_000, 0)) }

// seeded returns a deterministic uniform source for Knobs.Rand.
func seeded(seed uint64) func() float64 {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

// The simulated server: capacity workers, every request takes service
// steps of simStep each, so 1× load is capacity/service arrivals per step.
const (
	simCapacity = 100
	simService  = 10
	simStep     = 10 * time.Millisecond
)

// simMix is the share of each priority in the offered load (Sheddable,
// SheddablePlus, Critical, CriticalPlus): at 4× capacity the Critical and
// CriticalPlus work alone is 80% of capacity.
var simMix = [spillway.NumPriorities]float64{0.60, 0.20, 0.15, 0.05}

type simResult struct {
	offered, admitted [spillway.NumPriorities]int64
	firstShed         [spillway.NumPriorities]int // step of the first denial, -1 if none
}

func (r *simResult) goodput(p spillway.Priority) float64 {
	if r.offered[p] == 0 {
		return 1
	}
	return float64(r.admitted[p]) / float64(r.offered[p])
}

// simulate offers load(step)× capacity to lim for steps steps, advancing
// clk by simStep per step, and calls observe (if not nil) after each step.
// Only steps from measureFrom on are counted in the result.
// Arrivals are spread evenly (no randomness), interleaved across
// priorities; every admitted request completes after simService steps.
func simulate(t testing.TB, lim spillway.Limiter, clk *testclock.Clock, steps, measureFrom int, load func(step int) float64, observe func(step int)) simResult {
	t.Helper()
	ctx := context.Background()
	var (
		res  simResult
		acc  [spillway.NumPriorities]float64
		ring = make([][]spillway.Done, simService)
		req  spillway.Request
	)
	for p := range res.firstShed {
		res.firstShed[p] = -1
	}
	for s := 0; s < steps; s++ {
		slot := s % simService
		for _, done := range ring[slot] {
			done(spillway.Success)
		}
		ring[slot] = ring[slot][:0]
		x := load(s)
		var k [spillway.NumPriorities]int
		for p := range acc {
			acc[p] += x * simCapacity / simService * simMix[p]
			k[p] = int(acc[p])
			acc[p] -= float64(k[p])
		}
		for more := true; more; {
			more = false
			for i := 0; i < spillway.NumPriorities; i++ {
				p := spillway.Priority((i + s) % spillway.NumPriorities)
				if k[p] == 0 {
					continue
				}
				k[p]--
				more = true
				req = spillway.Request{Priority: p, Cost: 1}
				measured := s >= measureFrom
				if measured {
					res.offered[p]++
				}
				d, done, err := lim.Admit(ctx, &req)
				if err != nil {
					t.Fatalf("step %d: Admit: %v", s, err)
				}
				if d.Allowed {
					if measured {
						res.admitted[p]++
					}
					ring[slot] = append(ring[slot], done)
				} else {
					if d.Reason != spillway.ReasonShed || d.RetryAfter <= 0 {
						t.Fatalf("step %d: denial %+v: want ReasonShed with a RetryAfter", s, d)
					}
					if measured && res.firstShed[p] < 0 {
						res.firstShed[p] = s
					}
				}
			}
		}
		if observe != nil {
			observe(s)
		}
		clk.Advance(simStep)
	}
	return res
}

func newSimWorker(t testing.TB, clk *testclock.Clock) *shedder.Worker {
	t.Helper()
	w, err := shedder.NewWorker(simCapacity, shedder.WorkerSettings{Clock: clk.Now}.With(shedder.Knobs{Rand: seeded(1)}))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// Offered load rises from 0.5× to 4× capacity over 35 s, then holds 4× for
// 10 s.
func TestWorkerRisingLoad(t *testing.T) {
	clk := newClock()
	w := newSimWorker(t, clk)
	const perSecond = int(time.Second / simStep)
	load := func(s int) float64 { return min(0.5+0.1*float64(s)/float64(perSecond), 4) }
	var orderViolations int
	res := simulate(t, w, clk, 45*perSecond, 0, load, func(int) {
		// A priority is shed only while every lower one is shed entirely.
		for p := spillway.SheddablePlus; p <= spillway.CriticalPlus; p++ {
			if w.ShedProbability(p) > 0 && w.ShedProbability(p-1) < 1 {
				orderViolations++
			}
		}
	})
	for p := spillway.Sheddable; p <= spillway.CriticalPlus; p++ {
		t.Logf("%v: offered %d admitted %d goodput %.3f first shed at step %d", p, res.offered[p], res.admitted[p], res.goodput(p), res.firstShed[p])
	}
	if orderViolations != 0 {
		t.Errorf("%d observations shed a priority while a lower one was not fully shed", orderViolations)
	}
	if g := res.goodput(spillway.Critical); g < 0.95 {
		t.Errorf("Critical goodput %.3f, want >= 0.95", g)
	}
	if res.admitted[spillway.CriticalPlus] != res.offered[spillway.CriticalPlus] {
		t.Errorf("CriticalPlus admitted %d of %d, want all", res.admitted[spillway.CriticalPlus], res.offered[spillway.CriticalPlus])
	}
	// Sheddable absorbs the rejections: lower priorities lose more.
	rejected := func(p spillway.Priority) int64 { return res.offered[p] - res.admitted[p] }
	total := rejected(0) + rejected(1) + rejected(2) + rejected(3)
	if rejected(spillway.Sheddable)*10 < total*7 {
		t.Errorf("Sheddable took %d of %d rejections, want >= 70%%", rejected(spillway.Sheddable), total)
	}
	for p := spillway.SheddablePlus; p <= spillway.CriticalPlus; p++ {
		if res.goodput(p) < res.goodput(p-1) {
			t.Errorf("goodput of %v (%.3f) below that of %v (%.3f)", p, res.goodput(p), p-1, res.goodput(p-1))
		}
	}
	// Shedding starts in priority order.
	if !(res.firstShed[spillway.Sheddable] >= 0 && res.firstShed[spillway.Sheddable] <= res.firstShed[spillway.SheddablePlus]) {
		t.Errorf("first sheds %v: Sheddable must be shed first", res.firstShed)
	}
	if res.firstShed[spillway.Critical] >= 0 && res.firstShed[spillway.Critical] < res.firstShed[spillway.SheddablePlus] {
		t.Errorf("first sheds %v: Critical shed before SheddablePlus", res.firstShed)
	}
}

// A spike to 4× for 10 s between two stretches at 0.5×: shedding ramps in,
// then ends gradually without oscillating.
func TestWorkerSpikeRecovery(t *testing.T) {
	clk := newClock()
	w := newSimWorker(t, clk)
	const perSecond = int(time.Second / simStep)
	spikeStart, spikeEnd, end := 5*perSecond, 15*perSecond, 35*perSecond
	load := func(s int) float64 {
		if s >= spikeStart && s < spikeEnd {
			return 4
		}
		return 0.5
	}
	var (
		shedding    [spillway.NumPriorities]bool
		flips       [spillway.NumPriorities]int
		levels      []float64
		maxLevel    float64
		recoveredAt = -1
	)
	res := simulate(t, w, clk, end, 0, load, func(s int) {
		for p := range shedding {
			now := w.ShedProbability(spillway.Priority(p)) > 0
			if now != shedding[p] {
				flips[p]++
				shedding[p] = now
			}
		}
		if s%simService == 0 {
			levels = append(levels, w.Level())
		}
		maxLevel = max(maxLevel, w.Level())
		if s >= spikeEnd && recoveredAt < 0 && w.Level() == 0 {
			recoveredAt = s
		}
	})
	t.Logf("flips %v, max level %.2f, recovered %v after the spike, goodput %.3f %.3f %.3f %.3f",
		flips, maxLevel, time.Duration(recoveredAt-spikeEnd)*simStep,
		res.goodput(0), res.goodput(1), res.goodput(2), res.goodput(3))
	// Sheddable and SheddablePlus turn on once and off once; the rest never.
	if want := [spillway.NumPriorities]int{2, 2, 0, 0}; flips != want {
		t.Errorf("flips per priority %v, want %v", flips, want)
	}
	if recoveredAt < 0 {
		t.Fatal("shedding did not end after the spike")
	}
	// Gradual: the level falls by at most one step per tick and never rises
	// again once the spike is over.
	firstAfter := spikeEnd/simService + 1
	for i := firstAfter; i < len(levels); i++ {
		if levels[i] > levels[i-1] {
			t.Errorf("level rose from %.2f to %.2f at tick %d after the spike", levels[i-1], levels[i], i)
		}
		if levels[i-1]-levels[i] > 0.05+1e-9 {
			t.Errorf("level fell from %.2f to %.2f at tick %d: not gradual", levels[i-1], levels[i], i)
		}
	}
	if d := time.Duration(recoveredAt-spikeEnd) * simStep; d < time.Second {
		t.Errorf("recovered in %v, want a gradual ramp of at least 1s", d)
	}
	if g := res.goodput(spillway.Critical); g < 0.95 {
		t.Errorf("Critical goodput %.3f, want >= 0.95", g)
	}
}

// Load held just under and just over the high mark does not make the
// shedder flap.
func TestWorkerSteadyLoadDoesNotFlap(t *testing.T) {
	for _, x := range []float64{0.85, 0.95, 1.2, 2.5} {
		t.Run(fmt.Sprint(x), func(t *testing.T) {
			clk := newClock()
			w := newSimWorker(t, clk)
			var (
				on    [spillway.NumPriorities]bool
				flips int
			)
			simulate(t, w, clk, 6000, 0, func(int) float64 { return x }, func(s int) {
				for p := range on {
					now := w.ShedProbability(spillway.Priority(p)) > 0
					if now != on[p] {
						flips++
						on[p] = now
					}
				}
			})
			// Turning on up to three priorities once each while reaching
			// the steady level is fine; more means flapping.
			if flips > 3 {
				t.Errorf("load %v×: %d flips over 60 s", x, flips)
			}
		})
	}
}

// TestGoodputTable prints goodput per priority against offered load for the
// docs: go test ./shedder -run TestGoodputTable -v
func TestGoodputTable(t *testing.T) {
	loads := []float64{0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4}
	var b strings.Builder
	b.WriteString("| offered load | sheddable | sheddable_plus | critical | critical_plus | utilization |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, x := range loads {
		clk := newClock()
		w := newSimWorker(t, clk)
		// 10 s to settle, then measure 30 s.
		var util float64
		var n int
		res := simulate(t, w, clk, 4000, 1000, func(int) float64 { return x }, func(s int) {
			if s >= 1000 {
				util += float64(w.InFlight()) / simCapacity
				n++
			}
		})
		fmt.Fprintf(&b, "| %.1f× | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.0f%% |\n", x,
			100*res.goodput(0), 100*res.goodput(1), 100*res.goodput(2), 100*res.goodput(3), 100*util/float64(n))
		if x <= 0.5 && res.admitted != res.offered {
			t.Errorf("load %v×: shed something (%v of %v)", x, res.admitted, res.offered)
		}
		if g := res.goodput(spillway.Critical); g < 0.95 {
			t.Errorf("load %v×: Critical goodput %.3f, want >= 0.95", x, g)
		}
	}
	t.Log("goodput per priority (worker shedder, mix 60/20/15/5):\n" + b.String())
}

func itoa(n int) string { return fmt.Sprint(n) }
