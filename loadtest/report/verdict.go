package report

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spillway-go/spillway/loadtest/chains"
	"github.com/spillway-go/spillway/loadtest/scenario"
	"github.com/spillway-go/spillway/loadtest/sim"
)

// Report is a run's summary with its verdict; it is written as
// summary.json.
type Report struct {
	*scenario.Summary
	Verdict []Check `json:"verdict"`
	// Ablation is, per scenario, the full chain without each block in
	// turn: removed block → the full chain's criteria that then fail
	// (empty: none). Only with -ablation.
	Ablation map[string]map[string][]string `json:"ablation,omitempty"`
}

// Judge checks every scenario of sum against its criteria.
func Judge(sum *scenario.Summary) *Report {
	r := &Report{Summary: sum}
	for _, name := range sum.Order {
		res := sum.Scenarios[name]
		r.Verdict = append(r.Verdict, checks(res)...)
		if res.Ablated != nil {
			if r.Ablation == nil {
				r.Ablation = map[string]map[string][]string{}
			}
			r.Ablation[name] = ablationOf(res)
		}
	}
	return r
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
func (s *Report) Passed() bool {
	for _, c := range s.Verdict {
		if !c.Pass && !c.Expected {
			return false
		}
	}
	return true
}

// maxTrustedLagMS is the dispatch lag (p99) past which a run's figures
// are flagged as describing a starved harness.
const maxTrustedLagMS = 50

// dash is printed where a figure does not apply.
const dash = "–"

// PrintVerdict prints each scenario's figures and the verdict, in at most
// 120 columns.
func PrintVerdict(w io.Writer, s *Report) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	flush := func() {
		tw.Flush()
		writeTrimmed(w, &buf)
	}
	for _, name := range s.Order {
		sc := s.Scenarios[name]
		fmt.Fprintf(tw, "\n== %s ==\n", name)
		if sc.Accuracy != nil {
			scenario.PrintAccuracy(tw, sc.Accuracy)
			continue
		}
		if sc.Scenario.Why != "" {
			fmt.Fprintf(tw, "%s\n", sc.Scenario.Why)
		}
		first := sc.Configurations[sc.Order[0]]
		fmt.Fprintf(tw, "database: capacity %d concurrent (%.0f queries/s); %d servers; %.1f s per configuration;\n",
			first.BackendCapacity, first.BackendCapacityRPS, s.Servers, sc.DurationSeconds)
		fmt.Fprintf(tw, "%d requests offered to each configuration (schedule %s…)\n", sc.Arrivals, sc.ScheduleSHA256[:12])
		fmt.Fprintln(tw, "cap: the database's capacity; DB peak: most queries in flight; DB p99, Crit p99 (client latency of")
		fmt.Fprintln(tw, "Critical requests that succeeded) in ms; Crit ok: Critical success after retries; –: does not apply")
		fmt.Fprintln(tw, "config\tphase\tcap\toffered/s\tadmitted/s\tgoodput/s\tDB peak\tDB p99\tdegraded/s\tCrit p99\tCrit ok")
		fmt.Fprintln(tw, "\t\t\t(incl. retries)\t\t\t\t\t\t\t")
		rows := func(cn string, c *scenario.ConfigResult) {
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
		printExports(w, sc)
		if len(sc.Ablated) > 0 {
			fmt.Fprintln(tw, "\nthe full chain without one block (ablation):")
			fmt.Fprintln(tw, "config\tphase\tcap\toffered/s\tadmitted/s\tgoodput/s\tDB peak\tDB p99\tdegraded/s\tCrit p99\tCrit ok")
			for _, b := range ablationOrder() {
				if c := sc.Ablated[b]; c != nil {
					rows("-"+b, c)
				}
			}
		}
	}
	flush()
	for _, name := range s.Order {
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
func printAblation(w io.Writer, s *Report) {
	fmt.Fprintln(w, "\n== ablation: the full chain's criteria that fail without each block ==")
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tremoved\tfails without it (beyond what the full chain fails)")
	matters, ran := map[string]bool{}, map[string]bool{}
	for _, name := range s.Order {
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
		for _, b := range ablationOrder() {
			failed, ok := ab[b]
			if !ok {
				continue
			}
			ran[b] = true
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
	for _, b := range ablationOrder() {
		if ran[b] && !matters[b] {
			idle = append(idle, b)
		}
	}
	if len(idle) > 0 {
		fmt.Fprintf(w, "blocks whose removal failed no criterion in any scenario run: %s\n", strings.Join(idle, ", "))
	} else {
		fmt.Fprintln(w, "every block's removal failed a criterion in at least one scenario")
	}
}

// ablationOrder is the order of the ablation's rows: the full chain's
// blocks, then the options newer scenarios turn on.
func ablationOrder() []string { return append(slices.Clone(chains.FullBlocks), chains.Features...) }

// printExports prints, for a scenario with an export route, how many
// exports each configuration was sent and answered (200 within their
// client's timeout) per second in the phases that had them; the tables
// count the database's routes only.
func printExports(w io.Writer, sc *scenario.ScenarioResult) {
	var on []sim.Phase
	for _, ph := range sc.Phases {
		if ph.ExportRate > 0 {
			on = append(on, ph)
		}
	}
	if len(on) == 0 {
		return
	}
	for _, ph := range on {
		fmt.Fprintf(w, "exports in %s (not in the figures above), sent/s and answered/s:", ph.Name)
		for _, cn := range sc.Order {
			s := sc.Configurations[cn].Series
			i, j := s.Window(ph.Start, ph.End())
			fmt.Fprintf(w, " %s %.0f, %.0f;", cn, sim.Mean(s.Exports, i, j), sim.Mean(s.ExportsOK, i, j))
		}
		fmt.Fprintln(w)
	}
}
