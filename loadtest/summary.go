package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Summary is everything a run measured; it is written as summary.json.
type Summary struct {
	Seed      uint64                     `json:"seed"`
	Servers   int                        `json:"servers"`
	Retry     string                     `json:"well_behaved_retry"`
	Redis     string                     `json:"redis"`
	GoVersion string                     `json:"go_version"`
	CPUs      int                        `json:"cpus"`
	Started   time.Time                  `json:"started"`
	Scenarios map[string]*ScenarioResult `json:"scenarios"`
	Verdict   []Check                    `json:"verdict"`
	// Ablation is, per scenario, the full chain without each block in
	// turn: removed block → the full chain's criteria that then fail
	// (empty: none). Only with -ablation.
	Ablation map[string]map[string][]string `json:"ablation,omitempty"`
	order    []string
}

// ScenarioResult is one scenario's outcome.
type ScenarioResult struct {
	Name            string                   `json:"name"`
	DurationSeconds float64                  `json:"duration_s"` // load time per configuration
	Phases          []Phase                  `json:"phases,omitempty"`
	Arrivals        int                      `json:"arrivals,omitempty"` // logical requests offered per configuration
	ScheduleSHA256  string                   `json:"schedule_sha256,omitempty"`
	Order           []string                 `json:"configuration_order,omitempty"`
	Configurations  map[string]*ConfigResult `json:"configurations,omitempty"`
	// Ablated are the full chain's runs without one block (-ablation).
	Ablated  map[string]*ConfigResult `json:"ablated,omitempty"`
	scenario Scenario
	Accuracy *AccuracyResult `json:"accuracy,omitempty"`
}

// Check is one pass criterion with its measured value.
type Check struct {
	Scenario      string `json:"scenario"`
	Configuration string `json:"configuration"`
	Criterion     string `json:"criterion"`
	Measured      string `json:"measured"`
	Pass          bool   `json:"pass"`
	// Info marks a measurement reported without a threshold; Pass then
	// only says that it was measured.
	Info bool `json:"info,omitempty"`
	// Expected marks a criterion of a configuration that is shown failing
	// on purpose (static): it does not decide the verdict, Pass says
	// whether it was met.
	Expected bool `json:"shown_only,omitempty"`
	// Key names the criterion in the ablation table.
	Key string `json:"key,omitempty"`
}

// Passed reports whether every check passed.
func (s *Summary) Passed() bool {
	for _, c := range s.Verdict {
		if !c.Pass && !c.Expected {
			return false
		}
	}
	return true
}

// Run runs the scenarios p selects and checks the criteria.
func Run(ctx context.Context, p Params, progress io.Writer) (*Summary, error) {
	raiseFileLimit()
	// The harness allocates little that lives long; fewer collections
	// leave more of a small machine to the system under test.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	sum := &Summary{
		Seed: p.Seed, Servers: p.Servers, Retry: p.Retry.String(),
		GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), Started: time.Now().UTC(),
		Scenarios: map[string]*ScenarioResult{},
	}
	scenarios := []string{p.Scenario}
	if p.Scenario == "all" {
		scenarios = scenarioNames
	}
	var wall time.Duration
	for _, sc := range scenarios {
		if sc != "accuracy" {
			wall += durationFor(p, sc)
			if p.Ablation && sc != "goodput" {
				wall += durationFor(p, sc) / time.Duration(len(configurations(p.Configs))) * time.Duration(len(fullBlocks))
			}
		}
	}
	prog := NewProgress(progress, wall)
	defer prog.Close()

	var redisEnv *RedisEnv
	for _, sc := range scenarios {
		if sc == "accuracy" {
			continue
		}
		dir, err := os.MkdirTemp("", "spillway-loadtest-")
		if err != nil {
			return nil, fmt.Errorf("loadtest: %w", err)
		}
		defer os.RemoveAll(dir)
		redisEnv, err = StartRedis(p.RedisAddr, dir)
		if err != nil {
			return nil, err
		}
		defer redisEnv.Close()
		sum.Redis = redisEnv.Kind
		prog.Log("loadtest: Redis: %s (through a fault proxy on %s)", redisEnv.Kind, redisEnv.Addr())
		break
	}
	for _, sc := range scenarios {
		var (
			res *ScenarioResult
			err error
		)
		switch sc {
		case "accuracy":
			res = runAccuracy(p, prog)
		default:
			res, err = runLoadScenario(ctx, p, sc, redisEnv, prog)
		}
		if err != nil {
			return nil, err
		}
		sum.Scenarios[sc] = res
		sum.order = append(sum.order, sc)
		sum.Verdict = append(sum.Verdict, checks(res)...)
		if res.Ablated != nil {
			if sum.Ablation == nil {
				sum.Ablation = map[string]map[string][]string{}
			}
			sum.Ablation[sc] = ablationOf(res)
		}
	}
	return sum, nil
}

func runLoadScenario(ctx context.Context, p Params, name string, redisEnv *RedisEnv, prog *Progress) (*ScenarioResult, error) {
	spec, ok := scenarioByName(name)
	if !ok {
		return nil, fmt.Errorf("loadtest: unknown scenario %q", name)
	}
	sys := systemFor(p)
	cfgs := configurations(p.Configs)
	per := durationFor(p, name) / time.Duration(len(cfgs))
	phases := spec.Phases(per, sys, p.Servers)
	pop := DefaultPopulation()
	sched := BuildSchedule(p.Seed, phases, pop)
	res := &ScenarioResult{
		Name: name, DurationSeconds: per.Seconds(), Phases: phases, Arrivals: len(sched),
		ScheduleSHA256: ScheduleDigest(sched), Configurations: map[string]*ConfigResult{}, scenario: spec,
	}
	if p.Ablation && name != "goodput" {
		for _, b := range fullBlocks {
			cfgs = append(cfgs, Configuration{Name: "full-" + b, Title: "full chain without " + b + " (" + blockTitles[b] + ")", Build: fullChain(b), removed: b})
		}
	}
	for k, cfg := range cfgs {
		env := &Env{Redis: redisEnv, Servers: p.Servers, System: sys, Prefix: "lt" + strconv.Itoa(int(time.Now().UnixNano()%1e9)) + ":" + cfg.Name + ":"}
		label := fmt.Sprintf("%s %d/%d %s", name, k+1, len(cfgs), cfg.Name)
		r, err := runConfiguration(ctx, p, env, cfg, phases, sched, pop, prog, label)
		if err != nil {
			return nil, err
		}
		if spec.Recovery != "" {
			r.setRecovery(r.Series, phases, spec.Before, spec.Recovery, sys)
		}
		if cfg.removed != "" {
			r.Removed = cfg.removed
			if res.Ablated == nil {
				res.Ablated = map[string]*ConfigResult{}
			}
			res.Ablated[cfg.removed] = r
			continue
		}
		res.Configurations[cfg.Name] = r
		res.Order = append(res.Order, cfg.Name)
	}
	return res, nil
}

// maxTrustedLagMS is the dispatch lag (p99) past which a run's figures
// are flagged as describing a starved harness.
const maxTrustedLagMS = 50

// dash is printed where a figure does not apply.
const dash = "–"

// PrintVerdict prints each scenario's figures and the verdict, in at most
// 120 columns.
func PrintVerdict(w io.Writer, s *Summary) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	flush := func() {
		tw.Flush()
		writeTrimmed(w, &buf)
	}
	for _, name := range s.order {
		sc := s.Scenarios[name]
		fmt.Fprintf(tw, "\n== %s ==\n", name)
		if sc.Accuracy != nil {
			printAccuracy(tw, sc.Accuracy)
			continue
		}
		if sc.scenario.Why != "" {
			fmt.Fprintf(tw, "%s\n", sc.scenario.Why)
		}
		first := sc.Configurations[sc.Order[0]]
		fmt.Fprintf(tw, "database: capacity %d concurrent (%.0f queries/s); %d servers; %.1f s per configuration;\n",
			first.BackendCapacity, first.BackendCapacityRPS, s.Servers, sc.DurationSeconds)
		fmt.Fprintf(tw, "%d requests offered to each configuration (schedule %s…)\n", sc.Arrivals, sc.ScheduleSHA256[:12])
		fmt.Fprintln(tw, "cap: the database's capacity; DB peak: most queries in flight; DB p99, Crit p99 (client latency of")
		fmt.Fprintln(tw, "Critical requests that succeeded) in ms; Crit ok: Critical success after retries; –: does not apply")
		fmt.Fprintln(tw, "config\tphase\tcap\toffered/s\tadmitted/s\tgoodput/s\tDB peak\tDB p99\tdegraded/s\tCrit p99\tCrit ok")
		fmt.Fprintln(tw, "\t\t\t(incl. retries)\t\t\t\t\t\t\t")
		rows := func(cn string, c *ConfigResult) {
			for _, ph := range c.Phases {
				adm, deg := fmt.Sprintf("%.0f", ph.AdmittedRPS), fmt.Sprintf("%.0f", ph.DegradedRPS)
				if cn == "none" {
					adm, deg = dash, dash // no limiter decides
				}
				crit99, critOK := dash, dash
				if ph.CriticalP99MS > 0 {
					crit99 = fmt.Sprintf("%.0f", ph.CriticalP99MS)
				}
				if ph.CriticalRequests > 0 {
					critOK = fmt.Sprintf("%.1f%%", ph.CriticalSuccess*100)
				}
				p99 := dash
				if ph.BackendP99MS > 0 {
					p99 = fmt.Sprintf("%.0f", ph.BackendP99MS)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t%s\n", cn, ph.Name, ph.Capacity, ph.OfferedRPS, adm,
					ph.GoodputRPS, ph.BackendPeak, p99, deg, crit99, critOK)
			}
		}
		for _, cn := range sc.Order {
			rows(cn, sc.Configurations[cn])
		}
		flush()
		if len(sc.Ablated) > 0 {
			fmt.Fprintln(tw, "\nthe full chain without one block (ablation):")
			fmt.Fprintln(tw, "config\tphase\tcap\toffered/s\tadmitted/s\tgoodput/s\tDB peak\tDB p99\tdegraded/s\tCrit p99\tCrit ok")
			for _, b := range fullBlocks {
				if c := sc.Ablated[b]; c != nil {
					rows("-"+b, c)
				}
			}
		}
	}
	flush()
	for _, name := range s.order {
		sc := s.Scenarios[name]
		for _, cn := range sc.Order {
			if lag := sc.Configurations[cn].DispatchLagP99MS; lag > maxTrustedLagMS {
				fmt.Fprintf(w, "\nWARNING: %s/%s: the load generator ran %.0f ms late (p99): the machine is too busy\nfor these figures to describe the system under test.\n", name, cn, lag)
			}
		}
	}
	fmt.Fprintln(w, "\n== verdict ==")
	fmt.Fprintln(w, "(static is shown, not judged: its criteria read met/MISSED; the full chain's PASS/FAIL decide)")
	last := ""
	for _, c := range s.Verdict {
		if c.Scenario != last {
			fmt.Fprintf(w, "-- %s\n", c.Scenario)
			last = c.Scenario
		}
		res := "PASS"
		switch {
		case c.Expected && c.Pass:
			res = "met"
		case c.Expected:
			res = "MISSED"
		case !c.Pass:
			res = "FAIL"
		case c.Info:
			res = "info"
		}
		fmt.Fprintf(w, "%-6s %-7s %s\n", res, c.Configuration, c.Criterion)
		fmt.Fprintf(w, "%15s%s\n", "", c.Measured)
	}
	if len(s.Ablation) > 0 {
		printAblation(w, s)
	}
}

// writeTrimmed copies buf to w without the spaces tabwriter leaves at the
// ends of lines, and empties buf.
func writeTrimmed(w io.Writer, buf *bytes.Buffer) {
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		nl := strings.HasSuffix(line, "\n")
		line = strings.TrimRight(line, " \n")
		if nl {
			line += "\n"
		}
		io.WriteString(w, line)
	}
	buf.Reset()
}

// printAblation prints, per scenario and removed block, the full chain's
// criteria that fail without the block, and names the blocks whose
// removal fails nothing the full chain passes.
func printAblation(w io.Writer, s *Summary) {
	fmt.Fprintln(w, "\n== ablation: the full chain's criteria that fail without each block ==")
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tremoved\tfails without it (beyond what the full chain fails)")
	matters := map[string]bool{}
	for _, name := range s.order {
		ab := s.Ablation[name]
		if ab == nil {
			continue
		}
		base := map[string]bool{}
		for _, c := range s.Verdict {
			if c.Scenario == name && c.Configuration == "full" && !c.Pass {
				base[c.Key] = true
			}
		}
		for _, b := range fullBlocks {
			failed, ok := ab[b]
			if !ok {
				continue
			}
			var extra []string
			for _, k := range failed {
				if !base[k] {
					extra = append(extra, k)
				}
			}
			cell := dash
			if len(extra) > 0 {
				cell = strings.Join(extra, ", ")
				matters[b] = true
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", name, b, cell)
		}
	}
	tw.Flush()
	writeTrimmed(w, &buf)
	var idle []string
	for _, b := range fullBlocks {
		if !matters[b] {
			idle = append(idle, b)
		}
	}
	if len(idle) > 0 {
		fmt.Fprintf(w, "blocks whose removal failed no criterion in any scenario run: %s\n", strings.Join(idle, ", "))
	} else {
		fmt.Fprintln(w, "every block's removal failed a criterion in at least one scenario")
	}
}
