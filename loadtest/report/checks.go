package report

import (
	"fmt"
	"time"

	"github.com/spillway-go/spillway/loadtest/scenario"
	"github.com/spillway-go/spillway/loadtest/sim"
)

// checks evaluates a scenario's pass criteria.
func checks(sc *scenario.ScenarioResult) []Check {
	switch {
	case sc.Accuracy != nil:
		a := sc.Accuracy
		return []Check{
			{Scenario: sc.Name, Configuration: "sliding_window_counter", Criterion: "wrong decisions vs the exact sliding log (Cloudflare: 0.003% of real traffic)",
				Measured: fmt.Sprintf("%.4f%% (%d of %d; %.1f%% of the requests were over the limit)", a.WrongShare*100, a.WrongDecisions, a.TotalDecisions,
					100*float64(a.DeniedByLog)/float64(max(1, a.TotalDecisions))), Pass: a.TotalDecisions > 0, Info: true},
			{Scenario: sc.Name, Configuration: "fixed_window", Criterion: "boundary overshoot shown (> 1× the limit in one period)",
				Measured: fmt.Sprintf("%.2f× on the trace; %d of %d in 2 ms at a boundary", a.OvershootFixedWindow, a.BoundaryDemoFixed, a.BoundaryDemoLimit),
				Pass:     a.OvershootFixedWindow > 1 && a.BoundaryDemoFixed == 2*a.BoundaryDemoLimit},
			{Scenario: sc.Name, Configuration: "sliding_window_counter", Criterion: "most admitted in one period, × the limit",
				Measured: fmt.Sprintf("%.2f× on the trace; %d of %d in 2 ms at a boundary", a.OvershootSlidingCount, a.BoundaryDemoCounter, a.BoundaryDemoLimit), Pass: true, Info: true},
			{Scenario: sc.Name, Configuration: "sliding_window_log", Criterion: "never above the limit in any period",
				Measured: fmt.Sprintf("%.2f×", a.OvershootSlidingLog), Pass: a.OvershootSlidingLog <= 1},
		}
	case sc.Name == "goodput":
		return goodputChecks(sc)
	default:
		return cascadeChecks(sc)
	}
}

func phase(c *scenario.ConfigResult, name string) scenario.PhaseResult {
	for _, p := range c.Phases {
		if p.Name == name {
			return p
		}
	}
	return scenario.PhaseResult{}
}

// collapse reports whether a configuration collapsed in a phase: goodput
// below half the capacity, or backend p99 beyond 10× its baseline p99.
func collapse(c *scenario.ConfigResult, base scenario.PhaseResult, ph scenario.PhaseResult) (bool, string) {
	capRPS := c.BackendCapacityRPS
	if ph.Capacity > 0 {
		capRPS = float64(ph.Capacity) * c.BackendCapacityRPS / float64(c.BackendCapacity)
	}
	ratio := 0.0
	if base.BackendP99MS > 0 {
		ratio = ph.BackendP99MS / base.BackendP99MS
	}
	m := fmt.Sprintf("goodput %.0f/s (%.0f%% of capacity), backend p99 %.0f ms (%.1f× baseline)", ph.GoodputRPS, 100*ph.GoodputRPS/capRPS, ph.BackendP99MS, ratio)
	return ph.GoodputRPS < 0.5*capRPS || ratio > 10, m
}

// phaseAt returns the phases overlapping [from, to).
func phasesIn(phases []sim.Phase, from, to float64) []sim.Phase {
	var out []sim.Phase
	for _, ph := range phases {
		if ph.StartSec < to && ph.EndSec > from {
			out = append(out, ph)
		}
	}
	return out
}

// dropGrace is how long after the database's capacity falls the chain
// may take to bring its concurrency under the new capacity.
const dropGrace = 2 * time.Second

// concurrencyCheck compares each bucket's peak backend concurrency with
// 105% of the database's capacity at that time (the largest capacity of
// the phases the bucket overlaps), skipping the buckets that start within
// dropGrace of a drop in capacity.
func concurrencyCheck(sc *scenario.ScenarioResult, c *scenario.ConfigResult) (bool, string) {
	s := c.Series
	var drops []float64
	for k := 1; k < len(sc.Phases); k++ {
		if sc.Phases[k].Capacity < sc.Phases[k-1].Capacity {
			drops = append(drops, sc.Phases[k].StartSec)
		}
	}
	worst, worstAt, worstCap := -1.0, 0.0, 0
	peak, pass := 0.0, true
	for i, t := range s.T {
		skip := false
		for _, d := range drops {
			if t+s.BucketSec > d && t < d+dropGrace.Seconds() {
				skip = true
			}
		}
		if skip {
			continue
		}
		capNow := 0
		for _, ph := range phasesIn(sc.Phases, t, t+s.BucketSec) {
			capNow = max(capNow, ph.Capacity)
		}
		if capNow == 0 {
			continue
		}
		peak = max(peak, s.BackendConc[i])
		r := s.BackendConc[i] / float64(capNow)
		if r > worst {
			worst, worstAt, worstCap = r, t, capNow
		}
		if s.BackendConc[i] > 1.05*float64(capNow) {
			pass = false
		}
	}
	if worst < 0 {
		return false, "no load"
	}
	if pass {
		return true, fmt.Sprintf("peak %.0f; highest %.0f%% of capacity", peak, 100*worst)
	}
	return false, fmt.Sprintf("%.0f in flight at %.1f s, capacity %d (%.0f%%)", worst*float64(worstCap), worstAt, worstCap, 100*worst)
}

// chainChecks are the criteria every chain is held to in a load
// scenario: the full chain's pass criteria.
func chainChecks(sc *scenario.ScenarioResult, c *scenario.ConfigResult) []Check {
	spec := sc.Scenario
	var out []Check
	add := func(key, crit, measured string, pass bool) {
		out = append(out, Check{Scenario: sc.Name, Configuration: c.Name, Criterion: crit, Measured: measured, Pass: pass, Key: key})
	}
	crit := "backend concurrency ≤ capacity + 5% throughout"
	for k := 1; k < len(sc.Phases); k++ {
		if sc.Phases[k].Capacity != sc.Phases[0].Capacity {
			crit = "backend concurrency ≤ current capacity + 5% (2 s grace after a drop)"
		}
	}
	ok, m := concurrencyCheck(sc, c)
	add("concurrency", crit, m, ok)
	for _, name := range spec.Overload {
		ph := phase(c, name)
		capRPS := float64(ph.Capacity) * c.BackendCapacityRPS / float64(c.BackendCapacity)
		if ph.SettledGoodputRPS > 0 {
			g := ph.SettledGoodputRPS
			add("goodput:"+name, fmt.Sprintf("goodput ≥ 90%% of capacity during %s (from %v after the drop)", name, scenario.DropGrace),
				fmt.Sprintf("%.0f/s = %.1f%% of %.0f/s (whole phase %.1f%%)", g, 100*g/capRPS, capRPS, 100*ph.GoodputRPS/capRPS),
				g >= 0.9*capRPS)
			continue
		}
		add("goodput:"+name, fmt.Sprintf("goodput ≥ 90%% of capacity during %s", name),
			fmt.Sprintf("%.0f/s = %.1f%% of %.0f/s", ph.GoodputRPS, 100*ph.GoodputRPS/capRPS, capRPS),
			ph.GoodputRPS >= 0.9*capRPS)
	}
	add("critical", "Critical success ≥ 99% (well-behaved Critical(+) after retries)",
		fmt.Sprintf("%.2f%% of %d", 100*c.CriticalSuccess, c.CriticalRequests), c.CriticalRequests > 0 && c.CriticalSuccess >= 0.99)
	if spec.Recovery != "" {
		m, pass := "did not recover", false
		if c.RecoverySeconds != nil {
			m, pass = fmt.Sprintf("%.2f s", *c.RecoverySeconds), *c.RecoverySeconds <= 5
		}
		add("recovery", fmt.Sprintf("recovers within 5 s of %s starting", spec.Recovery), m, pass)
	}
	return out
}

// cascadeChecks are a load scenario's criteria: none and naive collapse
// where the scenario hurts (when it names a phase for them), the static
// chain's criteria are shown (and, but in cascade, it must miss one), the
// full chain's are judged; configChecks says which criteria a
// configuration is held to in the scenario.
func cascadeChecks(sc *scenario.ScenarioResult) []Check {
	var out []Check
	spec := sc.Scenario
	for _, cn := range []string{"none", "naive"} {
		c := sc.Configurations[cn]
		if c == nil || spec.Hurt[cn] == "" {
			continue
		}
		ok, m := collapse(c, phase(c, "baseline"), phase(c, spec.Hurt[cn]))
		out = append(out, Check{Scenario: sc.Name, Configuration: cn, Key: "collapse",
			Criterion: "collapses in " + spec.Hurt[cn] + " (goodput < 50% of capacity or backend p99 > 10× baseline)", Measured: m, Pass: ok})
	}
	if c := sc.Configurations["static"]; c != nil {
		sc := configChecks(sc, c)
		failed := 0
		for i := range sc {
			sc[i].Expected = true
			if !sc[i].Pass {
				failed++
			}
		}
		out = append(out, sc...)
		if spec.Name != "cascade" {
			out = append(out, Check{Scenario: spec.Name, Configuration: "static", Key: "static_fails",
				Criterion: "fails at least one of the full chain's criteria (the scenario is hard enough)",
				Measured:  fmt.Sprintf("%d of %d failed", failed, len(sc)), Pass: failed > 0})
		}
	}
	if c := sc.Configurations["full"]; c != nil {
		out = append(out, configChecks(sc, c)...)
	}
	return out
}

// ablationOf returns, for each block of the full chain, the keys of the
// full chain's criteria that fail without it.
func ablationOf(sc *scenario.ScenarioResult) map[string][]string {
	out := map[string][]string{}
	for b, c := range sc.Ablated {
		failed := []string{}
		for _, ch := range configChecks(sc, c) {
			if !ch.Pass {
				failed = append(failed, ch.Key)
			}
		}
		out[b] = failed
	}
	return out
}

func goodputChecks(sc *scenario.ScenarioResult) []Check {
	var out []Check
	top := fmt.Sprintf("%.1fx", scenario.GoodputLevels[len(scenario.GoodputLevels)-1])
	if c := sc.Configurations["none"]; c != nil {
		ph := phase(c, top)
		out = append(out, Check{Scenario: sc.Name, Configuration: "none", Criterion: "goodput at 4× capacity < 50% of capacity (collapse)",
			Measured: fmt.Sprintf("%.0f/s = %.1f%%", ph.GoodputRPS, 100*ph.GoodputRPS/c.BackendCapacityRPS), Pass: ph.GoodputRPS < 0.5*c.BackendCapacityRPS})
	}
	if c := sc.Configurations["full"]; c != nil {
		ph := phase(c, top)
		out = append(out, Check{Scenario: sc.Name, Configuration: "full", Criterion: "goodput at 4× capacity ≥ 90% of capacity",
			Measured: fmt.Sprintf("%.0f/s = %.1f%%", ph.GoodputRPS, 100*ph.GoodputRPS/c.BackendCapacityRPS), Pass: ph.GoodputRPS >= 0.9*c.BackendCapacityRPS})
		worst := 1.0
		for _, p := range c.Phases {
			if p.CriticalSuccess > 0 {
				worst = min(worst, p.CriticalSuccess)
			}
		}
		out = append(out, Check{Scenario: sc.Name, Configuration: "full", Criterion: "Critical success ≥ 99% at every offered load",
			Measured: fmt.Sprintf("worst %.2f%%", 100*worst), Pass: worst >= 0.99})
	}
	return out
}
