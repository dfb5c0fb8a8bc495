package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spillway-go/spillway/loadtest/chains"
	"github.com/spillway-go/spillway/loadtest/report"
	"github.com/spillway-go/spillway/loadtest/scenario"
	"github.com/spillway-go/spillway/loadtest/sim"
)

// TestShortRun runs every scenario briefly against a real redis-server (or
// the embedded Redis when it is not installed), with a small system, and
// checks that the summary has every field with sane values. It does not
// check the pass criteria: a few seconds on a loaded CI machine prove that
// the harness works, not what the chain does (the full run does).
//
// "The backend did work" (peak and p99 above 0) holds however late the
// machine runs the load: a query's latency is recorded in the bucket where
// the query started, so every query sent during the load counts even when
// it ends after the load (a 1-in-24 failure on a loaded machine came from
// queries of a thrashing backend all ending after the last bucket).
func TestShortRun(t *testing.T) {
	dir := t.TempDir()
	base := scenario.Params{Duration: 3 * time.Second, Seed: 7, Servers: 2, Retry: sim.RetryHonor, Scale: 0.25, Quiet: true}
	sum := &report.Report{Summary: &scenario.Summary{Scenarios: map[string]*scenario.ScenarioResult{}}, Ablation: map[string]map[string][]string{}}
	for _, run := range []struct {
		scenario string
		configs  []string
		duration time.Duration
		ablation bool
	}{
		{"cascade", nil, 4 * time.Second, false},                        // all four configurations
		{"goodput", []string{"full"}, 0, false},                         // one is enough to prove the sweep
		{"uneven", []string{"static", "full"}, 2 * time.Second, false},  // the balancer's skew
		{"elastic", []string{"static", "full"}, 2 * time.Second, false}, // a server killed, one started
		{"capacity_drop", []string{"full"}, time.Second, true},          // the capacity changes; the ablation's runs
		{"workers", []string{"static", "full"}, 2 * time.Second, false}, // bounded server workers, the export route
		{"accuracy", nil, 0, false},
	} {
		p := base
		p.Scenario, p.Configs, p.Ablation = run.scenario, run.configs, run.ablation
		if run.duration > 0 {
			p.Duration = run.duration
		}
		res, err := scenario.Run(context.Background(), p, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := report.Judge(res)
		sum.Redis = max(sum.Redis, s.Redis)
		sum.Scenarios[run.scenario] = s.Scenarios[run.scenario]
		sum.Order = append(sum.Order, run.scenario)
		sum.Verdict = append(sum.Verdict, s.Verdict...)
		for k, v := range s.Ablation {
			sum.Ablation[k] = v
		}
	}
	files, err := report.WriteOutputs(dir, sum)
	if err != nil {
		t.Fatal(err)
	}
	// summary, cascade comparison + 4, goodput curves + 1, uneven,
	// elastic and workers comparison + 2 each, capacity_drop comparison +
	// 1, the windows' error against N, report
	if len(files) != 21 {
		t.Errorf("wrote %d files, want 21: %v", len(files), files)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || st.Size() == 0 {
			t.Errorf("output %s missing or empty: %v", f, err)
		}
	}
	html, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(html), "data:image/png;base64,") || strings.Contains(string(html), "src=\"http") {
		t.Error("report.html does not embed its plots")
	}
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Redis     string `json:"redis"`
		Scenarios map[string]struct {
			Configurations map[string]map[string]any `json:"configurations"`
			Accuracy       map[string]any            `json:"accuracy"`
			ScheduleSHA256 string                    `json:"schedule_sha256"`
		} `json:"scenarios"`
		Verdict  []map[string]any               `json:"verdict"`
		Ablation map[string]map[string][]string `json:"ablation"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.Redis == "" {
		t.Error("summary does not say which Redis it used")
	}
	wantCap := float64(sim.SystemFor(base.Scale).Capacity)
	fields := []string{"offered", "admitted", "goodput", "backend_peak_concurrency", "backend_capacity", "backend_p99_ms",
		"rejected_by_reason", "rejected_by_limiter", "degraded_decisions", "recovery_seconds"}
	for sc, cfgs := range map[string][]string{"cascade": {"none", "naive", "static", "full"}, "goodput": {"full"},
		"uneven": {"static", "full"}, "elastic": {"static", "full"}, "capacity_drop": {"full"}, "workers": {"static", "full"}} {
		s, ok := raw.Scenarios[sc]
		if !ok {
			t.Fatalf("summary has no scenario %q", sc)
		}
		if len(s.ScheduleSHA256) != 64 {
			t.Errorf("%s: schedule digest %q", sc, s.ScheduleSHA256)
		}
		for _, cfg := range cfgs {
			c, ok := s.Configurations[cfg]
			if !ok {
				t.Fatalf("%s: no configuration %q", sc, cfg)
			}
			for _, f := range fields {
				if _, ok := c[f]; !ok {
					t.Errorf("%s/%s: field %q missing", sc, cfg, f)
				}
			}
			offered, admitted, goodput := c["offered"].(float64), c["admitted"].(float64), c["goodput"].(float64)
			if offered <= 0 {
				t.Errorf("%s/%s: offered %v", sc, cfg, offered)
			}
			if goodput < 0 || goodput > offered {
				t.Errorf("%s/%s: goodput %v not in [0, offered %v]", sc, cfg, goodput, offered)
			}
			if cfg != "none" && (admitted <= 0 || admitted > offered) {
				t.Errorf("%s/%s: admitted %v not in (0, offered %v]", sc, cfg, admitted, offered)
			}
			if cfg == "none" && admitted != 0 {
				t.Errorf("%s/none: admitted %v, want 0 (no limiter decides)", sc, admitted)
			}
			if c["backend_capacity"].(float64) != wantCap {
				t.Errorf("%s/%s: backend_capacity %v, want %v", sc, cfg, c["backend_capacity"], wantCap)
			}
			if c["backend_peak_concurrency"].(float64) <= 0 || c["backend_p99_ms"].(float64) <= 0 {
				t.Errorf("%s/%s: backend peak %v, p99 %v: the backend did no work", sc, cfg, c["backend_peak_concurrency"], c["backend_p99_ms"])
			}
			if _, ok := c["rejected_by_reason"].(map[string]any); !ok {
				t.Errorf("%s/%s: rejected_by_reason is %T", sc, cfg, c["rejected_by_reason"])
			}
			byLimiter, ok := c["rejected_by_limiter"].(map[string]any)
			if !ok {
				t.Errorf("%s/%s: rejected_by_limiter is %T", sc, cfg, c["rejected_by_limiter"])
			}
			for block := range byLimiter {
				if !slices.Contains(chains.FullBlocks, block) {
					t.Errorf("%s/%s: rejected_by_limiter names %q, not a block of the chain", sc, cfg, block)
				}
			}
		}
	}
	acc := raw.Scenarios["accuracy"].Accuracy
	total, wrong := acc["total_decisions"].(float64), acc["wrong_decisions"].(float64)
	if total < 1000 || wrong < 0 || wrong > total {
		t.Errorf("accuracy: %v wrong of %v decisions", wrong, total)
	}
	if acc["boundary_demo_fixed_window"].(float64) != 2*acc["boundary_demo_limit"].(float64) {
		t.Errorf("accuracy: fixed window boundary demo admitted %v, want 2 × %v", acc["boundary_demo_fixed_window"], acc["boundary_demo_limit"])
	}
	if acc["overshoot_sliding_window_log"].(float64) > 1 {
		t.Errorf("accuracy: the exact sliding log admitted %v× its limit in one period", acc["overshoot_sliding_window_log"])
	}
	if len(raw.Verdict) == 0 {
		t.Error("no verdict rows")
	}
	// The ablation ran the full chain without each block in turn.
	ab := raw.Ablation["capacity_drop"]
	for _, b := range chains.FullBlocks {
		if failed, ok := ab[b]; !ok || failed == nil {
			t.Errorf("ablation of capacity_drop: no entry for %q: %v", b, ab)
		}
	}
	if len(ab) != len(chains.FullBlocks) {
		t.Errorf("ablation of capacity_drop has %d entries, want %d: %v", len(ab), len(chains.FullBlocks), ab)
	}
	// What is printed fits in 120 columns.
	var out strings.Builder
	report.PrintVerdict(&out, sum)
	for i, line := range strings.Split(out.String(), "\n") {
		if n := utf8.RuneCountInString(line); n > 120 {
			t.Errorf("output line %d has %d columns: %q", i, n, line)
		}
	}
}

// TestScheduleIsReproducible: the same seed offers exactly the same load;
// another seed does not.
func TestScheduleIsReproducible(t *testing.T) {
	sys := sim.SystemFor(1)
	sc, _ := scenario.ByName("cascade")
	ph := sc.Phases(5*time.Second, sys, 3)
	a := sim.BuildSchedule(42, ph, sim.DefaultPopulation())
	b := sim.BuildSchedule(42, ph, sim.DefaultPopulation())
	c := sim.BuildSchedule(43, ph, sim.DefaultPopulation())
	if sim.ScheduleDigest(a) != sim.ScheduleDigest(b) {
		t.Fatal("same seed, different schedules")
	}
	if sim.ScheduleDigest(a) == sim.ScheduleDigest(c) {
		t.Fatal("different seeds, same schedule")
	}
	// Poisson arrivals: the count per phase is within 5σ of rate × length.
	for _, p := range ph {
		n := 0
		for _, x := range a {
			if x.At >= p.Start && x.At < p.End() {
				n++
			}
		}
		want := p.Rate * p.Length.Seconds()
		if d := float64(n) - want; d*d > 25*want {
			t.Errorf("phase %s: %d arrivals, want about %.0f", p.Name, n, want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	for _, bad := range [][]string{
		{"-scenario", "nope"}, {"-servers", "0"}, {"-retry", "sometimes"}, {"-duration", "-1s"}, {"-scale", "0"}, {"-configs", "full,bogus"}, {"extra"},
	} {
		if _, err := parseFlags(bad, nilWriter{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	p, err := parseFlags([]string{"-scenario", "goodput", "-seed", "9", "-servers", "3", "-configs", "full"}, nilWriter{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Scenario != "goodput" || p.Seed != 9 || p.Servers != 3 || len(p.Configs) != 1 || p.Configs[0] != "full" {
		t.Errorf("parseFlags: %+v", p)
	}
}

type nilWriter struct{}

func (nilWriter) Write(b []byte) (int, error) { return len(b), nil }

// -md writes the verdict as a generated markdown table whose header names
// the command that made it.
func TestMarkdownVerdict(t *testing.T) {
	p, err := parseFlags([]string{"-scenario", "cascade", "-md", "docs/figures/x.md"}, nilWriter{})
	if err != nil || p.md != "docs/figures/x.md" {
		t.Fatalf("parseFlags -md: %+v, %v", p.md, err)
	}
	if got, want := command([]string{"-scenario", "all", "-configs", "full, static"}), `go run ./loadtest -scenario all -configs "full, static"`; got != want {
		t.Fatalf("command = %q, want %q", got, want)
	}
	rep := &report.Report{
		Summary: &scenario.Summary{Seed: 1, Servers: 3, Retry: "honor", Redis: "redis-server", GoVersion: "go1.26", CPUs: 2},
		Verdict: []report.Check{
			{Scenario: "cascade", Configuration: "full", Criterion: "goodput ≥ 1.5× none's", Measured: "2.1× (a|b)", Pass: true},
			{Scenario: "cascade", Configuration: "static", Criterion: "Critical ok", Measured: "80%", Expected: true},
			{Scenario: "cascade", Configuration: "full", Criterion: "no backend overload", Measured: "peak 130", Pass: false},
		},
	}
	md := report.Markdown(rep)
	for _, want := range []string{
		"| scenario | configuration | criterion | measured | result |\n|---|---|---|---|---|\n",
		"| cascade | full | goodput ≥ 1.5× none's | 2.1× (a\\|b) | PASS |\n",
		"| cascade | static | Critical ok | 80% | MISSED |\n",
		"| cascade | full | no backend overload | peak 130 | FAIL |\n",
		"Verdict: a criterion failed.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
}
