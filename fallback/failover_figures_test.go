package fallback_test

import (
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spillway-go/spillway/internal/genmd"
)

var failoverMD = flag.String("md", "", "TestClusterPrimaryKilledIsABlipForItsSlots and TestSentinelMasterKilledIsABlip: when both passed, write what they measured (every run of -count, as ranges) as a markdown table to this file (relative to fallback/, e.g. ../docs/figures/failover.md), with a header naming the command, date, commit and load average")

// raceEnabled is set by a file built with -race only, for the command
// line.
var raceEnabled bool

// failoverFigure is what one failover test measured.
type failoverFigure struct {
	setup      string        // the topology, for the column's header
	serving    time.Duration // from the kill until the replica serves
	errs       int64         // calls not answered
	p99, worst time.Duration // latency from the kill until 2 s after serving
	back       time.Duration // the last decision made locally (for the failed entities), after serving; 0 if none was
	off        int64         // units by which Redis's Remaining differs from limit − admitted (failed entities)
	admitted   int64         // units admitted (failed entities)
	offOther   int64         // Cluster: the same on the healthy primaries' entities; -1 for none
}

// failovers collects the figures of every failover test run in this
// process, per topology ("Cluster", "Sentinel"), when -md is set.
var failovers struct {
	sync.Mutex
	runs map[string][]failoverFigure
}

func recordFailover(topology string, f failoverFigure) {
	if *failoverMD == "" {
		return
	}
	failovers.Lock()
	defer failovers.Unlock()
	if failovers.runs == nil {
		failovers.runs = map[string][]failoverFigure{}
	}
	failovers.runs[topology] = append(failovers.runs[topology], f)
}

// writeFailoverFigures writes the -md file (nothing without -md); load is
// the load average when the run began.
func writeFailoverFigures(load string) error {
	if *failoverMD == "" {
		return nil
	}
	failovers.Lock()
	defer failovers.Unlock()
	topologies := []string{"Cluster", "Sentinel"}
	for _, tp := range topologies {
		if len(failovers.runs[tp]) == 0 {
			return fmt.Errorf("-md %s: no %s failover ran; run TestClusterPrimaryKilled and TestSentinelMasterKilled together", *failoverMD, tp)
		}
	}
	header := []string{""}
	rows := [][]string{
		{"replica serving after the kill"},
		{"calls not answered"},
		{"latency from the kill to 2 s after the replica serves"},
		{"decided locally"},
		{"last decided locally, after the replica serves"},
		{"Redis's `Remaining` vs limit − admitted"},
	}
	decidedLocally := map[string]string{
		"Cluster":  "the failed primary's entities only, until their slots move",
		"Sentinel": "every entity, until the new master answers the probe",
	}
	var counts []string
	for _, tp := range topologies {
		runs := failovers.runs[tp]
		counts = append(counts, fmt.Sprintf("%s %d", tp, len(runs)))
		header = append(header, tp+", "+runs[0].setup)
		get := func(f func(failoverFigure) int64) string { return spanInt(runs, f) }
		off := "off by " + get(func(f failoverFigure) int64 { return f.off }) + " units of " +
			get(func(f failoverFigure) int64 { return f.admitted }) + " admitted"
		if runs[0].offOther >= 0 {
			off += " on the failed primary's entities, " + get(func(f failoverFigure) int64 { return f.offOther }) + " elsewhere"
		}
		cells := []string{
			spanDur(runs, func(f failoverFigure) time.Duration { return f.serving }, time.Second, 2, "s"),
			get(func(f failoverFigure) int64 { return f.errs }),
			"p99 " + spanDur(runs, func(f failoverFigure) time.Duration { return f.p99 }, time.Millisecond, 1, "ms") +
				", max " + spanDur(runs, func(f failoverFigure) time.Duration { return f.worst }, time.Millisecond, 1, "ms"),
			decidedLocally[tp],
			spanDur(runs, func(f failoverFigure) time.Duration { return f.back }, time.Second, 2, "s"),
			off,
		}
		for i := range rows {
			rows[i] = append(rows[i], cells[i])
		}
	}
	body := fmt.Sprintf("What a failover costs: `fallback.NewStore` over a real Redis whose primary gets SIGKILL under 16 callers "+
		"(default settings: 50 ms budget, K = 5, `OpenTimeout` 1 s; a limit of 1,000 a day per entity). "+
		"Runs: %s; a range is the lowest–highest over them.\n\n", strings.Join(counts, ", "))
	return genmd.Write(*failoverMD, genmd.TestCommand("cd fallback && go test", raceEnabled), load, body+genmd.Table(header, rows))
}

// spanInt formats the lowest and highest of f over runs ("3" or "0–3").
func spanInt(runs []failoverFigure, f func(failoverFigure) int64) string {
	lo, hi := f(runs[0]), f(runs[0])
	for _, r := range runs[1:] {
		lo, hi = min(lo, f(r)), max(hi, f(r))
	}
	if lo == hi {
		return thousands(lo)
	}
	return thousands(lo) + "–" + thousands(hi)
}

// spanDur formats the lowest and highest of f over runs in unit, with
// prec decimals ("2.31 s", "4.6–9.3 ms").
func spanDur(runs []failoverFigure, f func(failoverFigure) time.Duration, unit time.Duration, prec int, name string) string {
	lo, hi := f(runs[0]), f(runs[0])
	for _, r := range runs[1:] {
		lo, hi = min(lo, f(r)), max(hi, f(r))
	}
	l := fmt.Sprintf("%.*f", prec, float64(lo)/float64(unit))
	h := fmt.Sprintf("%.*f", prec, float64(hi)/float64(unit))
	if l == h {
		return l + " " + name
	}
	return l + "–" + h + " " + name
}

// thousands formats n with commas every three digits.
func thousands(n int64) string {
	if n < 0 {
		return "-" + thousands(-n)
	}
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
