package report

import (
	"fmt"
	"math"

	"github.com/spillway-go/spillway/loadtest/scenario"
	"github.com/spillway-go/spillway/loadtest/sim"
)

// newerChecks are the criteria of the scenarios of fair shares, deadlines
// and latency that stays bad, per configuration.
var newerChecks = map[string]func(*scenario.ScenarioResult, *scenario.ConfigResult) []Check{
	"noisy_tenant":  noisyChecks,
	"deadlines":     deadlineChecks,
	"stuck_backend": stuckChecks,
}

// configChecks are the criteria a configuration is held to in sc.
func configChecks(sc *scenario.ScenarioResult, c *scenario.ConfigResult) []Check {
	if f := newerChecks[sc.Name]; f != nil {
		return f(sc, c)
	}
	return chainChecks(sc, c)
}

// concurrencyFirst starts a configuration's criteria in sc with the
// backend's concurrency against its capacity; add appends one more.
func concurrencyFirst(sc *scenario.ScenarioResult, c *scenario.ConfigResult) (out *[]Check, add func(key, crit, measured string, pass bool)) {
	out = new([]Check)
	add = func(key, crit, measured string, pass bool) {
		*out = append(*out, Check{Scenario: sc.Name, Configuration: c.Name, Criterion: crit, Measured: measured, Pass: pass, Key: key})
	}
	ok, m := concurrencyCheck(sc, c)
	add("concurrency", "backend concurrency ≤ capacity + 5% throughout", m, ok)
	return out, add
}

func phaseSpan(sc *scenario.ScenarioResult, c *scenario.ConfigResult, name string) (int, int, sim.Phase) {
	for _, ph := range sc.Phases {
		if ph.Name == name {
			i, j := c.Series.Window(ph.Start, ph.End())
			return i, j, ph
		}
	}
	return 0, 0, sim.Phase{}
}

// TenantShares returns, over the buckets [i, j) of s, each tenant's
// goodput (attempts answered 200 in time, per second; index 0 is tenant 1)
// and its 429 and 503 answers and the mean Retry-After of its 429s.
func TenantShares(s *sim.Series, i, j, tenants int) (good []float64, n429, n503 []int64, retry []float64) {
	secs := float64(j-i) * s.BucketSec
	for t := 1; t <= tenants; t++ {
		var ok, a, b, r int64
		for k := i; k < j && k < len(s.TenantOK); k++ {
			ok += s.TenantOK[k][t]
			a += s.Tenant429[k][t]
			b += s.Tenant503[k][t]
			r += s.TenantRetryMS[k][t]
		}
		good = append(good, float64(ok)/max(secs, 1e-9))
		n429, n503 = append(n429, a), append(n503, b)
		retry = append(retry, float64(r)/math.Max(1, float64(a)))
	}
	return good, n429, n503, retry
}

// Jain returns Jain's fairness index of xs: (Σx)² / (n Σx²), 1 when all
// are equal.
func Jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

const noisyTenantCount = 20

func noisyChecks(sc *scenario.ScenarioResult, c *scenario.ConfigResult) []Check {
	out, add := concurrencyFirst(sc, c)
	i, j, ph := phaseSpan(sc, c, "noisy")
	good, n429, n503, retry := TenantShares(c.Series, i, j, noisyTenantCount)
	var total float64
	for _, g := range good {
		total += g
	}
	// Every tenant offers more than a twentieth of the capacity (the
	// others 3 × 1/29 of it each): the max-min fair share of what was
	// served is a twentieth each.
	fair := total / noisyTenantCount
	others := good[1:]
	worst := math.Inf(1)
	for _, g := range others {
		worst = math.Min(worst, g/fair)
	}
	capRPS := float64(ph.Capacity) * c.BackendCapacityRPS / float64(c.BackendCapacity)
	add("goodput:noisy", "goodput ≥ 90% of capacity during noisy",
		fmt.Sprintf("%.1f/s = %.1f%% of %.0f/s", total, 100*total/capRPS, capRPS), total >= 0.9*capRPS)
	add("fair_share", "each of the 19 other tenants gets ≥ 95% of its fair share of the goodput (a twentieth)",
		fmt.Sprintf("worst %.1f%% (fair share %.2f/s; noisy tenant %.2f/s = %.0f%%)", 100*worst, fair, good[0], 100*good[0]/fair), worst >= 0.95)
	jain := Jain(others)
	add("jain", "Jain's fairness index over the 19 ≥ 0.95", fmt.Sprintf("%.4f", jain), jain >= 0.95)
	var o429, o503 int64
	var oRetry float64
	for k := 1; k < len(n429); k++ {
		o429 += n429[k]
		o503 += n503[k]
		oRetry += retry[k] * float64(n429[k])
	}
	share := float64(n429[0]) / math.Max(1, float64(n429[0]+n503[0]))
	add("noisy_429", "the noisy tenant's refusals are 429 with its own Retry-After (≥ 90% of them 429, not 503)",
		fmt.Sprintf("%d × 429 (mean Retry-After %.0f ms), %d × 503 = %.1f%% 429; the others: %d × 429 (mean %.0f ms), %d × 503",
			n429[0], retry[0], n503[0], 100*share, o429, oRetry/math.Max(1, float64(o429)), o503),
		n429[0] > 0 && share >= 0.9)
	return *out
}

func deadlineChecks(sc *scenario.ScenarioResult, c *scenario.ConfigResult) []Check {
	out, add := concurrencyFirst(sc, c)
	for _, name := range sc.Scenario.Overload {
		ph := phase(c, name)
		slow := 1.0
		for _, p := range sc.Phases {
			if p.Name == name && p.Slow > 0 {
				slow = p.Slow
			}
		}
		capRPS := float64(ph.Capacity) * c.BackendCapacityRPS / float64(c.BackendCapacity) / slow
		add("goodput:"+name, fmt.Sprintf("goodput ≥ 90%% of capacity during %s", name),
			fmt.Sprintf("%.0f/s = %.1f%% of %.0f/s", ph.GoodputRPS, 100*ph.GoodputRPS/capRPS, capRPS), ph.GoodputRPS >= 0.9*capRPS)
	}
	s := c.Series
	var busy, wasted float64
	for k := range s.BackendBusyS {
		busy += s.BackendBusyS[k]
		wasted += s.BackendWastedS[k]
	}
	share := wasted / math.Max(busy, 1e-9)
	i, j, _ := phaseSpan(sc, c, "slow")
	var sb, sw float64
	for k := i; k < j; k++ {
		sb += s.BackendBusyS[k]
		sw += s.BackendWastedS[k]
	}
	add("wasted", "≤ 1% of the database's work spent after its client had given up",
		fmt.Sprintf("%.2f%% (%.1f of %.1f query-seconds; in slow %.2f%%)", 100*share, wasted, busy, 100*sw/math.Max(sb, 1e-9)), busy > 0 && share <= 0.01)
	return *out
}

func stuckChecks(sc *scenario.ScenarioResult, c *scenario.ConfigResult) []Check {
	out, add := concurrencyFirst(sc, c)
	s := c.Series
	i, j, ph := phaseSpan(sc, c, "stuck")
	min := "no learned limit"
	minOK := false
	for k := i; k < j; k++ {
		if s.LearnedMaxLow[k] >= 0 {
			min = "not at its minimum during stuck"
		}
		if s.LearnedMaxLow[k] == 1 {
			t := s.T[k] + s.BucketSec - ph.StartSec
			min, minOK = fmt.Sprintf("every server's limit at 1 by %.2f s", t), t <= 2
			break
		}
	}
	add("limit_min", "the learned limit reaches its minimum within 2 s of every query timing out", min, minOK)
	li, lj, _ := phaseSpan(sc, c, "load")
	var pre float64
	for k := li; k < lj; k++ {
		pre += s.SlotsHigh[k]
	}
	pre /= math.Max(1, float64(lj-li))
	bi, bj, back := phaseSpan(sc, c, "back")
	rec, recOK := "no learned limit", false
	if pre > 0 {
		rec = fmt.Sprintf("not back to 80%% of %.1f slots", pre)
		for k := bi; k < bj; k++ {
			if s.SlotsHigh[k] >= 0.8*pre {
				t := s.T[k] + s.BucketSec - back.StartSec
				rec, recOK = fmt.Sprintf("%.2f s (the fleet's pools at %.0f slots; %.1f before)", t, s.SlotsHigh[k], pre), t <= 5
				break
			}
		}
	}
	add("limit_back", "the learned limit recovers (the pools' slots back to 80% of before) within 5 s of the backend's return", rec, recOK)
	g, gOK := "did not recover", false
	if c.RecoverySeconds != nil {
		g, gOK = fmt.Sprintf("%.2f s", *c.RecoverySeconds), *c.RecoverySeconds <= 5
	}
	add("recovery", "goodput recovers within 5 s of back starting", g, gOK)
	return *out
}
