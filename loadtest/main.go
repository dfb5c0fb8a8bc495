// Command loadtest is spillway's load-test harness: it reproduces a
// cascading failure on one machine (a spike, then a slow and then a hung
// Redis, in front of a database that thrashes when overloaded) and shows
// what the full spillway chain does about it, next to no limiter and a
// naive fail-open limiter. It also sweeps offered load for goodput curves
// and replays a synthetic trace to measure the sliding window counter's
// accuracy. See docs/loadtest.md.
//
//	go run ./loadtest                       # the cascade, ~75 s
//	go run ./loadtest -scenario all -out out # everything, with plots
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
	"strings"
	"time"
)

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
	if f := os.Getenv("LOADTEST_CPUPROFILE"); f != "" {
		if out, err := os.Create(f); err == nil {
			_ = pprof.StartCPUProfile(out)
			defer pprof.StopCPUProfile()
		}
	}
	sum, err := Run(ctx, p, progress)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	PrintVerdict(os.Stdout, sum)
	if debugDegraded {
		fmt.Println(degradedCauses.String())
	}
	if p.Out != "" {
		files, err := WriteOutputs(p.Out, sum)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s\n", strings.Join(files, ", "))
	}
	if !sum.Passed() {
		pprof.StopCPUProfile()
		os.Exit(3)
	}
}

func parseFlags(args []string, stderr io.Writer) (Params, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p := Params{Scale: 1}
	fs.StringVar(&p.Scenario, "scenario", "cascade", "scenario to run: cascade, goodput, accuracy or all")
	fs.DurationVar(&p.Duration, "duration", 0, "total load time of each scenario over all its configurations (0: cascade 75s, goodput 72s; accuracy replays 8× this in simulated time); every phase scales with it")
	fs.Uint64Var(&p.Seed, "seed", 1, "seed of the offered schedule: the same seed offers exactly the same load")
	fs.IntVar(&p.Servers, "servers", 3, "number of API servers in the fleet")
	fs.StringVar(&p.Out, "out", "", "directory for summary.json, PNG plots and report.html (empty: none)")
	fs.StringVar(&p.RedisAddr, "redis", "", "address of an existing Redis to use (empty: start redis-server on a free port, or an embedded Redis when redis-server is not installed)")
	retry := fs.String("retry", "honor", "how well-behaved clients retry: honor (Retry-After, under a retry budget) or naive (at once); abusive clients always retry naively")
	fs.Float64Var(&p.Scale, "scale", 1, "multiplies the backend capacity and every offered rate (a smaller system for slow machines)")
	fs.BoolVar(&p.Quiet, "quiet", false, "no progress bar")
	configs := fs.String("configs", "none,naive,full", "configurations to compare (comma-separated subset of none, naive, full)")
	if err := fs.Parse(args); err != nil {
		return p, err
	}
	if fs.NArg() > 0 {
		return p, fmt.Errorf("loadtest: unexpected argument %q", fs.Arg(0))
	}
	switch p.Scenario {
	case "cascade", "goodput", "accuracy", "all":
	default:
		return p, fmt.Errorf("loadtest: -scenario %q: want cascade, goodput, accuracy or all", p.Scenario)
	}
	switch *retry {
	case "honor":
		p.Retry = RetryHonor
	case "naive":
		p.Retry = RetryNaive
	default:
		return p, fmt.Errorf("loadtest: -retry %q: want honor or naive", *retry)
	}
	for _, c := range strings.Split(*configs, ",") {
		switch c = strings.TrimSpace(c); c {
		case "none", "naive", "full":
			p.Configs = append(p.Configs, c)
		case "":
		default:
			return p, fmt.Errorf("loadtest: -configs: unknown configuration %q (want none, naive, full)", c)
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

// durationFor returns the scenario's total load time.
func durationFor(p Params, scenario string) time.Duration {
	if p.Duration > 0 {
		return p.Duration
	}
	if scenario == "goodput" {
		return 72 * time.Second
	}
	return 75 * time.Second
}
