package scenario

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/spillway-go/spillway/ratelimit"

	"github.com/spillway-go/spillway/loadtest/sim"
)

// AccuracyResult is Cloudflare's experiment on a synthetic trace: the same
// requests decided by the sliding window counter (two counters per key)
// and by the exact sliding log, and the boundary overshoot of the fixed
// window.
type AccuracyResult struct {
	Sources          int     `json:"sources"`
	SimulatedSeconds float64 `json:"simulated_s"`
	Policy           string  `json:"policy"`
	TotalDecisions   int64   `json:"total_decisions"`
	WrongDecisions   int64   `json:"wrong_decisions"` // counter ≠ exact log
	WrongShare       float64 `json:"wrong_share"`
	FalseAllows      int64   `json:"false_allows"` // counter allowed, log denied
	FalseDenies      int64   `json:"false_denies"` // counter denied, log allowed
	DeniedByLog      int64   `json:"denied_by_log"`
	FixedWindowWrong int64   `json:"fixed_window_wrong"` // fixed window ≠ exact log
	// Most requests admitted for one source in any interval of one
	// Period, as a multiple of Limit (1 = never above the limit).
	OvershootFixedWindow    float64 `json:"overshoot_fixed_window"`
	OvershootSlidingCount   float64 `json:"overshoot_sliding_window_counter"`
	OvershootSlidingLog     float64 `json:"overshoot_sliding_window_log"`
	BoundaryDemoFixed       int64   `json:"boundary_demo_fixed_window"` // admitted in 2 ms across a window boundary
	BoundaryDemoCounter     int64   `json:"boundary_demo_sliding_window_counter"`
	BoundaryDemoLimit       int64   `json:"boundary_demo_limit"`
	ReplayDecisionsPerSec   float64 `json:"replay_decisions_per_s"`
	DistinctKeysAtEnd       int     `json:"distinct_keys"`
	HeavyTailTopShare       float64 `json:"top_1pct_sources_share"` // share of requests sent by the busiest 1% of sources
	ScheduleSHA256          string  `json:"schedule_sha256"`
	WrongSharePerMillion    float64 `json:"wrong_per_million"`
	CloudflareReportedWrong string  `json:"cloudflare_reported"`
	// Windows: the sliding window counter and the bucketed sliding
	// window against the exact log on Poisson populations (see
	// windowAccuracy).
	Windows       []WindowAccuracy `json:"windows,omitempty"`
	WindowsPolicy string           `json:"windows_policy,omitempty"`
}

type traceEvent struct {
	at  int64 // µs
	src int32
}

// accuracyPolicy: 20 requests per 10 s per source.
var accuracyLimit, accuracyPeriod = int64(20), 10 * time.Second

// buildTrace draws a bursty, heavy-tailed trace: each source alternates
// ON periods (exponential, mean 5 s) in which it sends Poisson requests at
// its own rate, and OFF periods (Pareto, α 1.5, mean 20 s); the ON rates
// are Pareto (α 1.5) from 0.1 req/s, capped at 100 req/s, so most sources
// stay far below the limit and a few blow through it.
func buildTrace(seed uint64, sources int, length time.Duration) []traceEvent {
	rng := rand.New(rand.NewPCG(seed, 0xacc))
	end := float64(length.Microseconds())
	var ev []traceEvent
	pareto := func(xm, alpha float64) float64 { return xm / math.Pow(1-rng.Float64(), 1/alpha) }
	for s := 0; s < sources; s++ {
		rate := min(100, pareto(0.1, 1.5)) // req/s while ON
		t := rng.Float64() * 20e6          // random phase
		for t < end {
			on := rng.ExpFloat64() * 5e6
			stop := min(end, t+on)
			for {
				t += rng.ExpFloat64() * 1e6 / rate
				if t >= stop {
					break
				}
				ev = append(ev, traceEvent{at: int64(t), src: int32(s)})
			}
			t = stop + pareto(20e6/3, 1.5) // Pareto with mean 20 s
		}
	}
	slices.SortFunc(ev, func(a, b traceEvent) int {
		if a.at != b.at {
			if a.at < b.at {
				return -1
			}
			return 1
		}
		return int(a.src - b.src)
	})
	return ev
}

// overshoot tracks, per source, the admitted times in the last Period and
// the largest count seen.
type overshoot struct {
	period int64
	q      [][]int64
	max    int
}

func newOvershoot(sources int, period time.Duration) *overshoot {
	return &overshoot{period: period.Microseconds(), q: make([][]int64, sources)}
}

func (o *overshoot) admit(src int32, at int64) {
	q := o.q[src]
	i := 0
	for i < len(q) && q[i] <= at-o.period {
		i++
	}
	q = append(q[i:], at)
	o.q[src] = q
	o.max = max(o.max, len(q))
}

func runAccuracy(p Params, prog *Progress) *ScenarioResult {
	length := 8 * durationFor(p, "cascade")
	sources := 5000
	start := time.Now()
	prog.Log("loadtest: accuracy: drawing a %v trace of %d sources", length, sources)
	ev := buildTrace(p.Seed, sources, length)

	var now int64 // µs, the fake clock
	clock := func() time.Time { return time.UnixMicro(now) }
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clock})
	mk := func(a ratelimit.Algorithm) *ratelimit.Limiter {
		l, err := ratelimit.New(store, ratelimit.Policy{Algorithm: a, Limit: accuracyLimit, Period: accuracyPeriod}, ratelimit.Settings{Scope: a.String()})
		if err != nil {
			panic(err) // a constant, valid policy
		}
		return l
	}
	swc, swl, fw := mk(ratelimit.SlidingWindowCounter), mk(ratelimit.SlidingWindowLog), mk(ratelimit.FixedWindow)
	oFW, oSWC, oSWL := newOvershoot(sources, accuracyPeriod), newOvershoot(sources, accuracyPeriod), newOvershoot(sources, accuracyPeriod)
	keys := make([]string, sources)
	perSource := make([]int64, sources)
	for i := range keys {
		keys[i] = "src-" + strconv.Itoa(i)
	}
	r := &AccuracyResult{
		Sources: sources, SimulatedSeconds: length.Seconds(),
		Policy:                  fmt.Sprintf("%d per %v per source", accuracyLimit, accuracyPeriod),
		CloudflareReportedWrong: "0.003% of 400M requests (real traffic, 2017)",
	}
	ctx := context.Background()
	replay := time.Now()
	for k, e := range ev {
		now = e.at
		k1 := keys[e.src]
		perSource[e.src]++
		dc, _ := swc.Allow(ctx, k1, 1)
		dl, _ := swl.Allow(ctx, k1, 1)
		df, _ := fw.Allow(ctx, k1, 1)
		if dc.Allowed != dl.Allowed {
			r.WrongDecisions++
			if dc.Allowed {
				r.FalseAllows++
			} else {
				r.FalseDenies++
			}
		}
		if df.Allowed != dl.Allowed {
			r.FixedWindowWrong++
		}
		if !dl.Allowed {
			r.DeniedByLog++
		}
		if dc.Allowed {
			oSWC.admit(e.src, e.at)
		}
		if dl.Allowed {
			oSWL.admit(e.src, e.at)
		}
		if df.Allowed {
			oFW.admit(e.src, e.at)
		}
		if k%100000 == 0 {
			prog.Update("accuracy", "replay", 0)
		}
	}
	el := time.Since(replay).Seconds()
	r.TotalDecisions = int64(len(ev))
	if len(ev) > 0 {
		r.WrongShare = float64(r.WrongDecisions) / float64(len(ev))
		r.WrongSharePerMillion = r.WrongShare * 1e6
		if el > 0 {
			r.ReplayDecisionsPerSec = 3 * float64(len(ev)) / el
		}
	}
	lim := float64(accuracyLimit)
	r.OvershootFixedWindow = float64(oFW.max) / lim
	r.OvershootSlidingCount = float64(oSWC.max) / lim
	r.OvershootSlidingLog = float64(oSWL.max) / lim
	r.DistinctKeysAtEnd = rateHooks.Len(store)
	slices.Sort(perSource)
	var top int64
	for _, c := range perSource[len(perSource)-max(1, sources/100):] {
		top += c
	}
	if len(ev) > 0 {
		r.HeavyTailTopShare = float64(top) / float64(len(ev))
	}
	r.ScheduleSHA256 = traceDigest(ev)

	// The boundary demo: a fresh source sends Limit requests 1 ms before
	// a window boundary and Limit more 1 ms after it.
	demo := func(l *ratelimit.Limiter) int64 {
		var n int64
		base := (now/accuracyPeriod.Microseconds() + 10) * accuracyPeriod.Microseconds()
		for _, at := range []int64{base - 1000, base + 1000} {
			now = at
			for j := int64(0); j < accuracyLimit; j++ {
				if d, _ := l.Allow(ctx, "boundary-demo", 1); d.Allowed {
					n++
				}
			}
		}
		return n
	}
	r.BoundaryDemoLimit = accuracyLimit
	r.BoundaryDemoFixed = demo(fw)
	r.BoundaryDemoCounter = demo(swc)
	wl := windowLength(p)
	prog.Log("loadtest: accuracy: the windows on Poisson populations, %v simulated (%d contenders)", wl, len(windowContenders()))
	r.Windows = windowAccuracy(p.Seed, windowSources, wl)
	r.WindowsPolicy = fmt.Sprintf("%d per %v per source, %d sources per population, %v simulated", windowLimit, windowPeriod, windowSources, wl)
	prog.Log("loadtest: accuracy: %d decisions replayed in %.1fs", len(ev), time.Since(start).Seconds())
	return &ScenarioResult{Name: "accuracy", DurationSeconds: length.Seconds(), Accuracy: r}
}

func traceDigest(ev []traceEvent) string {
	s := make([]sim.Arrival, len(ev))
	for i, e := range ev {
		s[i] = sim.Arrival{At: time.Duration(e.at) * time.Microsecond, Client: int(e.src)}
	}
	return sim.ScheduleDigest(s)
}

func PrintAccuracy(w io.Writer, a *AccuracyResult) {
	fmt.Fprintf(w, "trace: %d requests from %d sources over %.0f s simulated\n(busiest 1%% of sources send %.0f%%); policy %s\n",
		a.TotalDecisions, a.Sources, a.SimulatedSeconds, a.HeavyTailTopShare*100, a.Policy)
	fmt.Fprintf(w, "sliding window counter vs exact sliding log: %d wrong of %d\n(%.4f%%; %d false allows, %d false denies); the log denied %d\n",
		a.WrongDecisions, a.TotalDecisions, a.WrongShare*100, a.FalseAllows, a.FalseDenies, a.DeniedByLog)
	fmt.Fprintf(w, "fixed window vs exact log: %d wrong\n", a.FixedWindowWrong)
	fmt.Fprintf(w, "most admitted in any %v for one source: fixed window %.2f×, sliding counter %.2f×, sliding log %.2f× the limit\n",
		accuracyPeriod, a.OvershootFixedWindow, a.OvershootSlidingCount, a.OvershootSlidingLog)
	fmt.Fprintf(w, "boundary demo (%d requests 1 ms before a window boundary, %d 1 ms after): fixed window admitted %d, sliding counter %d\n",
		a.BoundaryDemoLimit, a.BoundaryDemoLimit, a.BoundaryDemoFixed, a.BoundaryDemoCounter)
	if len(a.Windows) > 0 {
		fmt.Fprintf(w, "\nsliding windows against the exact log; %s:\n", a.WindowsPolicy)
		printWindowAccuracy(w, a.Windows)
	}
}

// ---------------------------------------------------------------------------
// The bucketed sliding window against the exact log. Self-contained: the
// populations, the replay and the tally are the functions below; the
// scenario calls windowAccuracy, the report printWindowAccuracy and
// plotWindowErrors.
// ---------------------------------------------------------------------------

// The windows' policy: 100 per minute per source, as in the issue that
// asked for the bucketed window.
const (
	windowLimit   = int64(100)
	windowPeriod  = time.Minute
	windowSources = 100
)

// windowLength is the simulated time of each population: 20 × the
// scenario's duration, 30 minutes by default.
func windowLength(p Params) time.Duration { return 20 * durationFor(p, "cascade") }

// windowPopulations are the rates of the sources, as a multiple of the
// limit: each source draws its rate uniformly in [lo, hi] and sends Poisson
// arrivals at it.
var windowPopulations = []struct {
	name   string
	lo, hi float64
}{
	{"0.5x", 0.5, 0.5},
	{"0.8-1.2x", 0.8, 1.2},
	{"2-5x", 2, 5},
}

// WindowAccuracy is one contender's decisions on one population, judged
// two ways against the exact sliding log:
//
//   - against an exact log fed the same requests (each keeps its own
//     admissions, as two deployments would): Differ is the share of
//     requests the two decide differently, WrongAllowed the share the
//     contender allowed and the log denied, WrongDenied the reverse;
//   - against the exact count of what the contender itself admitted:
//     OverAdmit is the share it allowed although that put more than the
//     limit in the last period, UnderAdmit the share it denied although
//     the request fitted. A conservative window's OverAdmit is 0;
//   - one step at a time: OneStep is the share of requests on which the
//     contender, holding the exact log's own admissions (charged exactly
//     when the log admitted), decides otherwise than the log;
//     OneStepAllowed the share it would allow and the log denies. Differ
//     over OneStep is how much an error is amplified once the two hold
//     different histories.
type WindowAccuracy struct {
	Population     string  `json:"population"`
	Contender      string  `json:"contender"`
	Buckets        int64   `json:"buckets,omitempty"`
	Mode           string  `json:"mode,omitempty"`
	Decisions      int64   `json:"decisions"`
	Differ         float64 `json:"differ"`
	WrongAllowed   float64 `json:"wrongly_allowed"`
	WrongDenied    float64 `json:"wrongly_denied"`
	OverAdmit      float64 `json:"over_admit"`
	UnderAdmit     float64 `json:"under_admit"`
	OneStep        float64 `json:"one_step"`
	OneStepAllowed float64 `json:"one_step_wrongly_allowed"`
}

// windowContenders are the policies compared with the exact log: the
// counter and the bucketed window at N = 4, 10, 20, 60, 200 and 1000 in
// both modes (the last two show what N it takes to come within 1% of the
// log on sources near their limit).
func windowContenders() []ratelimit.Policy {
	cs := []ratelimit.Policy{{Algorithm: ratelimit.SlidingWindowCounter}}
	for _, n := range []int64{4, 10, 20, 60, 200, 1000} {
		for _, m := range []ratelimit.WindowMode{ratelimit.Interpolated, ratelimit.Conservative} {
			cs = append(cs, ratelimit.Policy{Algorithm: ratelimit.SlidingWindowBuckets, Buckets: n, Mode: m})
		}
	}
	for i := range cs {
		cs[i].Limit, cs[i].Period = windowLimit, windowPeriod
	}
	return cs
}

// windowAccuracy replays every population on the exact log and every
// contender and tallies their errors, population by population.
func windowAccuracy(seed uint64, sources int, length time.Duration) []WindowAccuracy {
	var out []WindowAccuracy
	for i, pop := range windowPopulations {
		ev := poissonSources(seed+uint64(i)*7919, sources, pop.lo, pop.hi, windowLimit, windowPeriod, length)
		rows := compareWindows(ev, sources, windowContenders())
		for j := range rows {
			rows[j].Population = pop.name
		}
		out = append(out, rows...)
	}
	return out
}

// poissonSources draws the requests of sources sending Poisson arrivals,
// each at a rate drawn uniformly in [lo, hi] × limit per period, over
// length, in time order.
func poissonSources(seed uint64, sources int, lo, hi float64, limit int64, period, length time.Duration) []traceEvent {
	rng := rand.New(rand.NewPCG(seed, 0x5a5a))
	end := float64(length.Microseconds())
	var ev []traceEvent
	for s := range sources {
		perUS := (lo + (hi-lo)*rng.Float64()) * float64(limit) / float64(period.Microseconds())
		for t := rng.ExpFloat64() / perUS; t < end; t += rng.ExpFloat64() / perUS {
			ev = append(ev, traceEvent{at: int64(t), src: int32(s)})
		}
	}
	slices.SortFunc(ev, func(a, b traceEvent) int {
		if a.at != b.at {
			if a.at < b.at {
				return -1
			}
			return 1
		}
		return int(a.src - b.src)
	})
	return ev
}

// compareWindows decides ev (cost 1 each, in order) on an exact sliding
// log and on each contender, every one on its own memory store with a
// clock at the request's time, and tallies each contender's errors (see
// WindowAccuracy). The contenders share the log's Limit and Period.
//
// The one-step error uses a shadow of each contender: the same policy
// with a limit no trace reaches (shadowLimit), charged 1 exactly when the
// log admits. Every estimate here (the log's count, the counter's, the
// bucketed window's) is independent of the limit, so a peek (cost 0) at
// the shadow reads the contender's estimate est = shadowLimit − Remaining
// on the log's history, and the contender would admit iff est + 1 ≤ Limit.
func compareWindows(ev []traceEvent, sources int, contenders []ratelimit.Policy) []WindowAccuracy {
	var now int64
	clock := func() time.Time { return time.UnixMicro(1_700_000_000_000_000 + now) }
	mk := func(p ratelimit.Policy) *ratelimit.Limiter {
		l, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clock}), p, ratelimit.Settings{})
		if err != nil {
			panic(err) // the contenders are constant, valid policies
		}
		return l
	}
	limit, period := contenders[0].Limit, contenders[0].Period.Microseconds()
	exact := mk(ratelimit.Policy{Algorithm: ratelimit.SlidingWindowLog, Limit: limit, Period: contenders[0].Period})
	type tally struct {
		l, shadow                        *ratelimit.Limiter
		admitted                         [][]int64 // per source, the times it admitted in the last period
		differ, allow, deny, over, under int64
		step, stepAllow                  int64
	}
	ts := make([]*tally, len(contenders))
	for i, p := range contenders {
		sp := p
		sp.Limit = shadowLimit
		ts[i] = &tally{l: mk(p), shadow: mk(sp), admitted: make([][]int64, sources)}
	}
	keys := make([]string, sources)
	for i := range keys {
		keys[i] = "src-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	for _, e := range ev {
		now = e.at
		k := keys[e.src]
		dl, _ := exact.Allow(ctx, k, 1)
		for _, t := range ts {
			d, _ := t.l.Allow(ctx, k, 1)
			if d.Allowed != dl.Allowed {
				t.differ++
				if d.Allowed {
					t.allow++
				} else {
					t.deny++
				}
			}
			q := t.admitted[e.src]
			i := 0
			for i < len(q) && q[i] <= e.at-period {
				i++
			}
			q = q[i:]
			fits := int64(len(q)) < limit
			switch {
			case d.Allowed && !fits:
				t.over++
			case !d.Allowed && fits:
				t.under++
			}
			if d.Allowed {
				q = append(q, e.at)
			}
			t.admitted[e.src] = q
			ds, _ := t.shadow.Allow(ctx, k, 0)
			if fit := shadowLimit-ds.Remaining+1 <= limit; fit != dl.Allowed {
				t.step++
				if fit {
					t.stepAllow++
				}
			}
			if dl.Allowed {
				t.shadow.Allow(ctx, k, 1)
			}
		}
	}
	n := float64(max(len(ev), 1))
	out := make([]WindowAccuracy, len(contenders))
	for i, p := range contenders {
		t := ts[i]
		w := WindowAccuracy{Contender: "counter", Decisions: int64(len(ev)),
			Differ: float64(t.differ) / n, WrongAllowed: float64(t.allow) / n, WrongDenied: float64(t.deny) / n,
			OverAdmit: float64(t.over) / n, UnderAdmit: float64(t.under) / n,
			OneStep: float64(t.step) / n, OneStepAllowed: float64(t.stepAllow) / n}
		if p.Algorithm == ratelimit.SlidingWindowBuckets {
			w.Contender, w.Buckets, w.Mode = "buckets", rateHooks.EffectiveBuckets(p), p.Mode.String()
		}
		out[i] = w
	}
	return out
}

// shadowLimit is the limit of compareWindows' shadows: above any estimate
// a trace here can produce, and within Validate's bounds for a period of
// a minute (at most one per µs, Limit·Period ≤ 2^53).
const shadowLimit = int64(1) << 20

// printWindowAccuracy prints the rows as a table, in percent.
func printWindowAccuracy(w io.Writer, rows []WindowAccuracy) {
	fmt.Fprintf(w, "%-9s %-28s %10s %9s %9s %9s %9s %9s %9s %9s\n", "sources", "contender", "decisions", "differ", "wr.allow", "wr.deny", "over", "under", "1-step", "1s.allow")
	for _, r := range rows {
		name := "sliding_window_counter"
		if r.Contender == "buckets" {
			name = fmt.Sprintf("buckets N=%d %s", r.Buckets, r.Mode)
		}
		fmt.Fprintf(w, "%-9s %-28s %10d %8.3f%% %8.3f%% %8.3f%% %8.3f%% %8.3f%% %8.3f%% %8.3f%%\n", r.Population, name, r.Decisions,
			100*r.Differ, 100*r.WrongAllowed, 100*r.WrongDenied, 100*r.OverAdmit, 100*r.UnderAdmit, 100*r.OneStep, 100*r.OneStepAllowed)
	}
	fmt.Fprintln(w, "differ, wr.allow, wr.deny: against an exact log fed the same requests;")
	fmt.Fprintln(w, "over, under: against the exact count of what the contender itself admitted;")
	fmt.Fprintln(w, "1-step, 1s.allow: the contender holding the log's own admissions, against the log")
}
