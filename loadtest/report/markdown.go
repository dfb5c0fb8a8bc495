package report

import (
	"fmt"
	"strings"

	"github.com/spillway-go/spillway/internal/genmd"
)

// Markdown is the run's verdict as the markdown that -md writes into
// docs/figures/ (after genmd's header): the run's settings, one row per
// criterion with its measured value and result, and the ablation table
// when the run had one.
func Markdown(s *Report) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Seed %d, %d servers, well-behaved clients retry: %s; Redis: %s; %s, %d CPUs. ",
		s.Seed, s.Servers, s.Retry, s.Redis, s.GoVersion, s.CPUs)
	sb.WriteString("Result: PASS/FAIL decide the verdict; `met`/`MISSED` are shown, not judged (static); `info` has no threshold.\n\n")
	rows := make([][]string, 0, len(s.Verdict))
	for _, c := range s.Verdict {
		rows = append(rows, []string{c.Scenario, c.Configuration, c.Criterion, c.Measured, result(c)})
	}
	sb.WriteString(genmd.Table([]string{"scenario", "configuration", "criterion", "measured", "result"}, rows))
	if len(s.Ablation) > 0 {
		sb.WriteString("\nAblation: the full chain's criteria that fail without each block.\n\n")
		var ab [][]string
		for _, name := range s.Order {
			for _, b := range ablationOrder() {
				failed, ok := s.Ablation[name][b]
				if !ok {
					continue
				}
				cell := dash
				if len(failed) > 0 {
					cell = strings.Join(failed, ", ")
				}
				ab = append(ab, []string{name, b, cell})
			}
		}
		sb.WriteString(genmd.Table([]string{"scenario", "removed", "fails without it"}, ab))
	}
	verdict := "every criterion passed"
	if !s.Passed() {
		verdict = "a criterion failed"
	}
	fmt.Fprintf(&sb, "\nVerdict: %s.\n", verdict)
	return sb.String()
}

// result is a check's result as PrintVerdict prints it.
func result(c Check) string {
	switch {
	case c.Expected && c.Pass:
		return "met"
	case c.Expected:
		return "MISSED"
	case !c.Pass:
		return "FAIL"
	case c.Info:
		return "info"
	}
	return "PASS"
}
