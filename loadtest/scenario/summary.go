package scenario

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/spillway-go/spillway/loadtest/chains"
	"github.com/spillway-go/spillway/loadtest/sim"
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
	// Order lists the scenarios in the order they ran.
	Order []string `json:"scenario_order"`
}

// ScenarioResult is one scenario's outcome.
type ScenarioResult struct {
	Name            string                   `json:"name"`
	DurationSeconds float64                  `json:"duration_s"` // load time per configuration
	Phases          []sim.Phase              `json:"phases,omitempty"`
	Arrivals        int                      `json:"arrivals,omitempty"` // logical requests offered per configuration
	ScheduleSHA256  string                   `json:"schedule_sha256,omitempty"`
	Order           []string                 `json:"configuration_order,omitempty"`
	Configurations  map[string]*ConfigResult `json:"configurations,omitempty"`
	// Ablated are the full chain's runs without one block (-ablation).
	Ablated  map[string]*ConfigResult `json:"ablated,omitempty"`
	Scenario Scenario                 `json:"-"`
	Accuracy *AccuracyResult          `json:"accuracy,omitempty"`
}

// Run runs the scenarios p selects and returns what they measured (the
// report judges it).
func Run(ctx context.Context, p Params, progress io.Writer) (*Summary, error) {
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
		// a scenario that runs none of the configurations asked for
		// (deadlines and stuck_backend compare static and full only) is
		// left out of all, not an error
		scenarios = nil
		for _, sc := range scenarioNames {
			if spec, ok := ByName(sc); !ok || len(scenarioConfigs(p, spec)) > 0 {
				scenarios = append(scenarios, sc)
			}
		}
	}
	var wall time.Duration
	for _, sc := range scenarios {
		if sc != "accuracy" {
			wall += durationFor(p, sc)
			if spec, ok := ByName(sc); ok && p.Ablation && sc != "goodput" {
				n := len(scenarioConfigs(p, spec))
				wall += durationFor(p, sc) / time.Duration(max(n, 1)) * time.Duration(len(chains.FullBlocks)+len(spec.Features))
			}
		}
	}
	prog := NewProgress(progress, wall)
	defer prog.Close()

	var redisEnv *sim.RedisEnv
	for _, sc := range scenarios {
		if sc == "accuracy" {
			continue
		}
		dir, err := os.MkdirTemp("", "spillway-loadtest-")
		if err != nil {
			return nil, fmt.Errorf("loadtest: %w", err)
		}
		defer os.RemoveAll(dir)
		redisEnv, err = sim.StartRedis(p.RedisAddr, dir)
		redisEnv.Direct = p.NoProxy
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
		sum.Order = append(sum.Order, sc)
	}
	return sum, nil
}

func runLoadScenario(ctx context.Context, p Params, name string, redisEnv *sim.RedisEnv, prog *Progress) (*ScenarioResult, error) {
	spec, ok := ByName(name)
	if !ok {
		return nil, fmt.Errorf("loadtest: unknown scenario %q", name)
	}
	sys := sim.SystemFor(p.Scale)
	if spec.System != nil {
		sys = spec.System(sys)
	}
	if p.GaugeWindow > 0 {
		sys.GaugeWindow = p.GaugeWindow
	}
	cfgs := scenarioConfigs(p, spec)
	if len(cfgs) == 0 {
		return nil, fmt.Errorf("loadtest: scenario %s runs only %v", name, spec.Configs)
	}
	per := durationFor(p, name) / time.Duration(len(cfgs))
	phases := spec.Phases(per, sys, p.Servers)
	pop := sim.DefaultPopulation()
	if spec.Population != nil {
		pop = spec.Population()
	}
	sched := sim.BuildSchedule(p.Seed, phases, pop)
	res := &ScenarioResult{
		Name: name, DurationSeconds: per.Seconds(), Phases: phases, Arrivals: len(sched),
		ScheduleSHA256: sim.ScheduleDigest(sched), Configurations: map[string]*ConfigResult{}, Scenario: spec,
	}
	if p.Ablation && name != "goodput" {
		for _, b := range append(slices.Clone(chains.FullBlocks), spec.Features...) {
			cfgs = append(cfgs, chains.Configuration{Name: "full-" + b, Title: "full chain without " + b + " (" + chains.BlockTitles[b] + ")", Build: chains.Full(b), Removed: b})
		}
	}
	workers := 0
	if spec.Workers > 0 {
		workers = max(2, int(math.Round(float64(spec.Workers)*p.Scale)))
	}
	l := &load{p: p, redis: redisEnv, phases: phases, sched: sched, pop: pop, prog: prog, spec: spec}
	for k, cfg := range cfgs {
		env := &chains.Env{
			Redis: redisEnv.Addr(), Servers: p.Servers, System: sys, Workers: workers,
			Prefix: "lt" + strconv.Itoa(int(time.Now().UnixNano()%1e9)) + ":" + cfg.Name + ":",
			Debug:  p.Debug, Trace: p.Trace,
			Tenant: spec.Tenant, Deadlines: spec.Deadlines,
		}
		if spec.StuckTimeout {
			env.StuckTimeout = sys.ClientTimeout
		}
		label := fmt.Sprintf("%s %d/%d %s", name, k+1, len(cfgs), cfg.Name)
		r, err := l.runConfiguration(ctx, env, cfg, label)
		if err != nil {
			return nil, err
		}
		if spec.Recovery != "" {
			r.setRecovery(r.Series, phases, spec.Before, spec.Recovery, sys)
		}
		if cfg.Removed != "" {
			r.Removed = cfg.Removed
			if res.Ablated == nil {
				res.Ablated = map[string]*ConfigResult{}
			}
			res.Ablated[cfg.Removed] = r
			continue
		}
		res.Configurations[cfg.Name] = r
		res.Order = append(res.Order, cfg.Name)
	}
	return res, nil
}

// scenarioConfigs returns the configurations of -configs that scenario
// spec runs: all of them, or those of its Configs.
func scenarioConfigs(p Params, spec Scenario) []chains.Configuration {
	cfgs := chains.Configurations(p.Configs)
	if len(spec.Configs) == 0 {
		return cfgs
	}
	var keep []chains.Configuration
	for _, c := range cfgs {
		if slices.Contains(spec.Configs, c.Name) {
			keep = append(keep, c)
		}
	}
	return keep
}
