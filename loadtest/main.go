// Command loadtest is spillway's load-test harness: it reproduces a
// cascading failure on one machine (a spike, then a slow and then a hung
// Redis, in front of a database that thrashes when overloaded) and shows
// what the full spillway chain does about it, next to no limiter and a
// naive fail-open limiter. It also sweeps offered load for goodput curves
// and replays a synthetic trace to measure the sliding window counter's
// accuracy. See docs/loadtest.md.
//
//	go run ./loadtest                       # the cascade, ~90 s
//	go run ./loadtest -scenario all -out out # everything, with plots
//	go run ./loadtest -md docs/figures/loadtest-cascade.md # the verdict as a generated table
//
// It exits 0 when every criterion passed, 3 when one failed, 2 on bad
// flags and 1 on any other error. Through go run the shell sees 1 for any
// of them (go run prints "exit status 3" and exits 1); build it to see the
// status itself: go build -o /tmp/loadtest ./loadtest && /tmp/loadtest.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/spillway-go/spillway/internal/genmd"
	"github.com/spillway-go/spillway/loadtest/chains"
	"github.com/spillway-go/spillway/loadtest/report"
	"github.com/spillway-go/spillway/loadtest/scenario"
	"github.com/spillway-go/spillway/loadtest/sim"
)

// options are the flags: the harness's settings and main's own.
type options struct {
	scenario.Params
	cpuprofile string // write a CPU profile here
	md         string // write the verdict as markdown here
}

func main() {
	p, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	var progress io.Writer = os.Stderr
	if p.Quiet {
		progress = nil
	}
	if f := p.cpuprofile; f != "" {
		if out, err := os.Create(f); err == nil {
			_ = pprof.StartCPUProfile(out)
			defer pprof.StopCPUProfile()
		}
	}
	raiseFileLimit()
	load := genmd.LoadAvg()
	sum, err := scenario.Run(ctx, p.Params, progress)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rep := report.Judge(sum)
	report.PrintVerdict(os.Stdout, rep)
	if p.Debug.On() {
		fmt.Print("\n== debug counters ==\n", p.Debug.String())
	}
	if p.Out != "" {
		files, err := report.WriteOutputs(p.Out, rep)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", strings.Join(files, ", "))
	}
	if p.md != "" {
		if err := genmd.Write(p.md, command(os.Args[1:]), load, report.Markdown(rep)); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest: -md:", err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", p.md)
	}
	if !rep.Passed() {
		pprof.StopCPUProfile()
		os.Exit(3)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p := options{Params: scenario.Params{Scale: 1}}
	fs.StringVar(&p.Scenario, "scenario", "cascade", "scenario to run: "+strings.Join(scenario.ScenarioNames(), ", ")+" or all")
	fs.DurationVar(&p.Duration, "duration", 0, "total load time of each scenario over all its configurations (0: cascade 90s, goodput 72s, uneven, elastic and capacity_drop 96s each; accuracy replays 8× this in simulated time); every phase scales with it")
	fs.Uint64Var(&p.Seed, "seed", 1, "seed of the offered schedule: the same seed offers exactly the same load")
	fs.IntVar(&p.Servers, "servers", 3, "number of API servers in the fleet")
	fs.StringVar(&p.Out, "out", "", "directory for summary.json, PNG plots and report.html (empty: none)")
	fs.StringVar(&p.RedisAddr, "redis", "", "address of an existing Redis to use (empty: start redis-server on a free port, or an embedded Redis when redis-server is not installed)")
	retry := fs.String("retry", "honor", "how well-behaved clients retry: honor (Retry-After, under a retry budget) or naive (at once); abusive clients always retry naively")
	fs.Float64Var(&p.Scale, "scale", 1, "multiplies the backend capacity and every offered rate (a smaller system for slow machines)")
	fs.BoolVar(&p.Quiet, "quiet", false, "no progress bar")
	configs := fs.String("configs", strings.Join(chains.Names, ","), "configurations to compare (comma-separated subset of "+strings.Join(chains.Names, ", ")+")")
	fs.BoolVar(&p.Ablation, "ablation", false, "also run the full chain without each of its blocks in turn, in every scenario but goodput (adds "+strconv.Itoa(len(chains.FullBlocks))+" runs per scenario)")
	fs.DurationVar(&p.GaugeWindow, "gauge-window", sim.DefaultGaugeWindow, "how often the simulated database publishes its utilization gauge (the full chain's capacity input)")
	debug := fs.Bool("debug", os.Getenv("LOADTEST_DEBUG") != "", "print, after the verdict, denials by priority and block, client answers, degraded causes and timings (default from LOADTEST_DEBUG)")
	trace := fs.Bool("trace", os.Getenv("LOADTEST_TRACE") != "", "print every change of a learned limit on stderr (default from LOADTEST_TRACE)")
	fs.BoolVar(&p.NoProxy, "no-proxy", os.Getenv("LOADTEST_NO_PROXY") != "", "connect the fleet to Redis directly, not through the fault proxy: the Redis phases then do nothing (default from LOADTEST_NO_PROXY)")
	fs.StringVar(&p.md, "md", "", "write the verdict table as markdown to this file, with a header naming the command, date, commit and load average (e.g. docs/figures/loadtest-cascade.md; empty: none)")
	fs.StringVar(&p.cpuprofile, "cpuprofile", os.Getenv("LOADTEST_CPUPROFILE"), "write a CPU profile to this file (default from LOADTEST_CPUPROFILE)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./loadtest [flags]\n\nExit status: 0 every criterion passed, 3 one failed, 2 bad flags, 1 other errors\n(go run turns any non-zero status into 1 and prints \"exit status N\").\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return p, err
	}
	if *debug {
		p.Debug = sim.NewDebug()
	}
	if *trace {
		p.Trace = stderr
	}
	if fs.NArg() > 0 {
		return p, fmt.Errorf("loadtest: unexpected argument %q", fs.Arg(0))
	}
	if p.Scenario != "all" && !slices.Contains(scenario.ScenarioNames(), p.Scenario) {
		return p, fmt.Errorf("loadtest: -scenario %q: want %s or all", p.Scenario, strings.Join(scenario.ScenarioNames(), ", "))
	}
	switch *retry {
	case "honor":
		p.Retry = sim.RetryHonor
	case "naive":
		p.Retry = sim.RetryNaive
	default:
		return p, fmt.Errorf("loadtest: -retry %q: want honor or naive", *retry)
	}
	for _, c := range strings.Split(*configs, ",") {
		switch c = strings.TrimSpace(c); c {
		case "":
		default:
			if !slices.Contains(chains.Names, c) {
				return p, fmt.Errorf("loadtest: -configs: unknown configuration %q (want %s)", c, strings.Join(chains.Names, ", "))
			}
			p.Configs = append(p.Configs, c)
		}
	}
	if len(p.Configs) == 0 {
		return p, fmt.Errorf("loadtest: -configs: none given")
	}
	if p.Duration < 0 {
		return p, fmt.Errorf("loadtest: -duration %v must not be negative", p.Duration)
	}
	if p.Servers < 1 || p.Servers > 64 {
		return p, fmt.Errorf("loadtest: -servers %d: want 1 to 64", p.Servers)
	}
	if p.Scale <= 0 || p.Scale > 10 {
		return p, fmt.Errorf("loadtest: -scale %v: want more than 0 and at most 10", p.Scale)
	}
	return p, nil
}

// command is the command line that ran the harness, as a user retypes it
// from the repository's root.
func command(args []string) string {
	q := make([]string, 0, len(args)+2)
	q = append(q, "go", "run", "./loadtest")
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$") {
			a = strconv.Quote(a)
		}
		q = append(q, a)
	}
	return strings.Join(q, " ")
}
