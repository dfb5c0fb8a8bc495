package main

import "fmt"

// checks evaluates a scenario's pass criteria.
func checks(sc *ScenarioResult) []Check {
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

func phase(c *ConfigResult, name string) PhaseResult {
	for _, p := range c.Phases {
		if p.Name == name {
			return p
		}
	}
	return PhaseResult{}
}

// collapse reports whether a configuration collapsed in a phase: goodput
// below half the capacity, or backend p99 beyond 10× its baseline p99.
func collapse(c *ConfigResult, base PhaseResult, ph PhaseResult) (bool, string) {
	capRPS := c.BackendCapacityRPS
	ratio := 0.0
	if base.BackendP99MS > 0 {
		ratio = ph.BackendP99MS / base.BackendP99MS
	}
	m := fmt.Sprintf("goodput %.0f/s (%.0f%% of capacity), backend p99 %.0f ms (%.1f× baseline)", ph.GoodputRPS, 100*ph.GoodputRPS/capRPS, ph.BackendP99MS, ratio)
	return ph.GoodputRPS < 0.5*capRPS || ratio > 10, m
}

func cascadeChecks(sc *ScenarioResult) []Check {
	var out []Check
	add := func(cfg, crit, measured string, pass bool) {
		out = append(out, Check{Scenario: sc.Name, Configuration: cfg, Criterion: crit, Measured: measured, Pass: pass})
	}
	if c := sc.Configurations["none"]; c != nil {
		ok, m := collapse(c, phase(c, "baseline"), phase(c, "spike"))
		add("none", "collapses in the spike (goodput < 50% of capacity or backend p99 > 10× baseline)", m, ok)
	}
	if c := sc.Configurations["naive"]; c != nil {
		ok, m := collapse(c, phase(c, "baseline"), phase(c, "redis_down"))
		add("naive", "collapses when Redis is down (goodput < 50% of capacity or backend p99 > 10× baseline)", m, ok)
	}
	if c := sc.Configurations["full"]; c != nil {
		lim := float64(c.BackendCapacity) * 1.05
		add("full", fmt.Sprintf("backend concurrency ≤ capacity + 5%% (%.1f) throughout", lim),
			fmt.Sprintf("peak %d (capacity %d)", c.BackendPeakConcurrency, c.BackendCapacity), float64(c.BackendPeakConcurrency) <= lim)
		for _, name := range []string{"spike", "redis_down"} {
			ph := phase(c, name)
			add("full", fmt.Sprintf("goodput ≥ 90%% of capacity during %s", name),
				fmt.Sprintf("%.0f/s = %.1f%% of %.0f/s", ph.GoodputRPS, 100*ph.GoodputRPS/c.BackendCapacityRPS, c.BackendCapacityRPS),
				ph.GoodputRPS >= 0.9*c.BackendCapacityRPS)
		}
		add("full", "Critical success ≥ 99% (well-behaved Critical and CriticalPlus requests, after retries)",
			fmt.Sprintf("%.2f%% of %d", 100*c.CriticalSuccess, c.CriticalRequests), c.CriticalRequests > 0 && c.CriticalSuccess >= 0.99)
		m, pass := "did not recover", false
		if c.RecoverySeconds != nil {
			m, pass = fmt.Sprintf("%.2f s", *c.RecoverySeconds), *c.RecoverySeconds <= 5
		}
		add("full", "recovers within 5 s of Redis returning (no degraded decisions, breakers closed, goodput ≥ 90% of the spike's)", m, pass)
	}
	return out
}

func goodputChecks(sc *ScenarioResult) []Check {
	var out []Check
	top := fmt.Sprintf("%.1fx", goodputLevels[len(goodputLevels)-1])
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
