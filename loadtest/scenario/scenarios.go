package scenario

import (
	"fmt"
	"slices"
	"time"

	"github.com/spillway-go/spillway/loadtest/sim"
)

// Scenario is one load scenario: how its phases split a configuration's
// run and what its pass criteria look at.
type Scenario struct {
	Name string
	// Default is the scenario's total load time over its configurations
	// when -duration is not given.
	Default time.Duration
	// Phases splits one configuration's run of length d.
	Phases func(d time.Duration, sys sim.System, servers int) []sim.Phase
	// Overload are the phases in which the full chain must keep goodput at
	// 90% of the database's capacity in that phase.
	Overload []string
	// Hurt is where none and naive must collapse: configuration → phase.
	Hurt map[string]string
	// Before is the phase whose goodput recovery must reach again, and
	// Recovery the phase that starts when the fault ends ("" for none).
	Before, Recovery string
	// Why says in one line what the scenario breaks.
	Why string
	// Workers is how many requests each API server handles at once (0:
	// as many as arrive).
	Workers int

	// The newer scenarios' own settings. System and Population, when
	// set, reshape the system and the clients; Configs, when set, limits
	// the configurations run; Tenant, Deadlines and StuckTimeout turn on
	// the full chain's options of the same names (chains.Env), and
	// Features are those the ablation also removes.
	System       func(sim.System) sim.System `json:"-"`
	Population   func() sim.Population       `json:"-"`
	Configs      []string
	Tenant       string
	Deadlines    bool
	StuckTimeout bool
	Features     []string
}

// loadScenarios are the scenarios that drive the fleet, in the order
// -scenario all runs them.
var loadScenarios = []Scenario{
	{
		Name: "cascade", Default: 90 * time.Second, Phases: cascadePhases,
		Overload: []string{"spike", "redis_down"},
		Hurt:     map[string]string{"none": "spike", "naive": "redis_down"},
		Before:   "spike", Recovery: "recovery",
		Why: "a 10× spike, then Redis slow (+300 ms each way) and hung, then back",
	},
	{
		Name: "goodput", Default: 72 * time.Second, Phases: goodputPhases,
		Why: "offered load stepped from 0.5× to 4× the database's capacity",
	},
	{
		Name: "uneven", Default: 96 * time.Second, Phases: unevenPhases,
		Overload: []string{"spike", "skewed"},
		Hurt:     map[string]string{"none": "skewed", "naive": "skewed"},
		Before:   "spike", Recovery: "even",
		Why: "1.5× capacity; for the middle 40% the balancer sends 70% of it to one of the servers",
	},
	{
		Name: "elastic", Default: 96 * time.Second, Phases: elasticPhases,
		Overload: []string{"spike", "one_down", "joined"},
		Hurt:     map[string]string{"none": "one_down", "naive": "one_down"},
		Before:   "spike", Recovery: "joined",
		Why: "1.5× capacity; a server dies at 30% (its work in flight lost), a new one joins at 60%",
	},
	{
		Name: "capacity_drop", Default: 96 * time.Second, Phases: capacityDropPhases,
		Overload: []string{"spike", "capacity_half"},
		Hurt:     map[string]string{"none": "capacity_half", "naive": "capacity_half"},
		Before:   "spike", Recovery: "restored",
		Why: "1.5× capacity; the database's capacity halves (30 → 15) for the middle 40%",
	},
	{
		Name: "workers", Default: 96 * time.Second, Phases: workersPhases, Workers: serverWorkers,
		Overload: []string{"spike", "exports"},
		Hurt:     map[string]string{"none": "exports", "naive": "exports"},
		Before:   "spike", Recovery: "after",
		Why: "1.5× capacity; for the middle 40% slow exports (2 s each, no database) could take every server worker",
	},
}

// scenarioNames lists the scenarios -scenario all runs, in order. A new
// scenario runs by name only until it has passed a series of runs of its
// own (docs/loadtest.md): noisy_tenant, deadlines and stuck_backend
// joined after ten of ten.
var scenarioNames = []string{"cascade", "goodput", "uneven", "elastic", "capacity_drop", "workers", "noisy_tenant", "deadlines", "stuck_backend", "accuracy"}

// ScenarioNames lists every scenario -scenario accepts, in the order
// -scenario all runs them.
func ScenarioNames() []string { return slices.Clone(scenarioNames) }

// ByName returns the load scenario called name.
func ByName(name string) (Scenario, bool) {
	for _, s := range append(slices.Clone(loadScenarios), fairScenarios...) {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// phaseSpec is one phase as a share of the run.
type phaseSpec struct {
	name     string
	frac     float64
	mult     float64 // offered rate, × the baseline (a quarter of the capacity)
	redis    string
	capacity float64 // × the database's capacity; 0 means 1
	servers  int     // live servers; 0 means all
	hot      float64 // share of the traffic the balancer sends to one server; 0: round robin
	export   float64 // export requests, × the baseline
	slow     float64 // the database's service time × this; 0: 1
	stuck    bool    // every query hangs to the statement timeout
}

func buildPhases(d time.Duration, sys sim.System, servers int, spec []phaseSpec) []sim.Phase {
	var out []sim.Phase
	var at time.Duration
	for k, s := range spec {
		l := time.Duration(float64(d) * s.frac).Round(time.Millisecond)
		if k == len(spec)-1 {
			l = d - at
		}
		capMult := s.capacity
		if capMult == 0 {
			capMult = 1
		}
		live := s.servers
		if live == 0 {
			live = servers
		}
		redis := s.redis
		if redis == "" {
			redis = sim.RedisHealthy
		}
		out = append(out, sim.Phase{Name: s.name, Start: at, Length: l, Rate: sys.Baseline * s.mult, Redis: redis,
			Capacity: max(1, int(float64(sys.Capacity)*capMult+0.5)), Servers: live, HotShare: s.hot, ExportRate: sys.Baseline * s.export,
			Slow: s.slow, Stuck: s.stuck,
			StartSec: at.Seconds(), EndSec: (at + l).Seconds()})
		at += l
	}
	return out
}

// cascadePhases splits one configuration's run of length d into the
// cascade's phases: baseline → spike to 10× → Redis slow → Redis down →
// Redis back (the spike lasts to the end, so recovery happens under load).
func cascadePhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "baseline", frac: 0.16, mult: 1},
		{name: "spike", frac: 0.20, mult: 10},
		{name: "redis_slow", frac: 0.20, mult: 10, redis: sim.RedisSlow},
		{name: "redis_down", frac: 0.20, mult: 10, redis: sim.RedisDown},
		{name: "recovery", frac: 0.24, mult: 10},
	})
}

// overloadMult is the offered rate of the new scenarios' overload, × the
// baseline: 1.5× the database's capacity. Higher, per-server pools of C/N
// stop losing goodput on an uneven fleet (every server has more work than
// its pool); lower, nothing is overloaded.
const overloadMult = 6

// unevenPhases: an overload spread evenly, then for the middle 40% the
// balancer sends 70% of the traffic to one server (the other two share
// the rest), then even again.
func unevenPhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "baseline", frac: 0.15, mult: 1},
		{name: "spike", frac: 0.15, mult: overloadMult},
		{name: "skewed", frac: 0.40, mult: overloadMult, hot: 0.7},
		{name: "even", frac: 0.30, mult: overloadMult},
	})
}

// elasticPhases: under overload one server dies at 30% of the run (its
// requests in flight fail, its clients go to the others) and a new one
// joins at 60%.
func elasticPhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "baseline", frac: 0.15, mult: 1},
		{name: "spike", frac: 0.15, mult: overloadMult},
		{name: "one_down", frac: 0.30, mult: overloadMult, servers: max(1, servers-1)},
		{name: "joined", frac: 0.40, mult: overloadMult},
	})
}

// capacityDropPhases: under overload the database's capacity halves for
// the middle 40% of the run (a lost replica, a noisy neighbour), then
// comes back.
func capacityDropPhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "baseline", frac: 0.15, mult: 1},
		{name: "spike", frac: 0.15, mult: overloadMult},
		{name: "capacity_half", frac: 0.40, mult: overloadMult, capacity: 0.5},
		{name: "restored", frac: 0.30, mult: overloadMult},
	})
}

// serverWorkers is how many requests one API server handles at once in
// the workers scenario (at scale 1); the other scenarios do not bound
// their servers' workers.
const serverWorkers = 40

// exportMult is the export route's offered rate in the workers scenario,
// × the baseline: 60 requests/s of 2 s each want 120 workers, the whole
// fleet's (3 × 40), before the database's routes get any.
const exportMult = 1.6

// workersPhases: an overload spread evenly; then for the middle 40% of
// the run, on top of it, exports that hold a server worker for 2 s each
// without touching the database; then the exports stop.
func workersPhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "baseline", frac: 0.15, mult: 1},
		{name: "spike", frac: 0.15, mult: overloadMult},
		{name: "exports", frac: 0.40, mult: overloadMult, export: exportMult},
		{name: "after", frac: 0.30, mult: overloadMult},
	})
}

// GoodputLevels are the offered loads of the goodput sweep, as multiples
// of the backend's capacity.
var GoodputLevels = []float64{0.5, 1, 1.5, 2, 3, 4}

// goodputPhases splits d into one step per level, Redis healthy.
func goodputPhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	var spec []phaseSpec
	for _, lv := range GoodputLevels {
		spec = append(spec, phaseSpec{name: fmt.Sprintf("%.1fx", lv), frac: 1 / float64(len(GoodputLevels)),
			mult: lv * sys.CapacityRPS() / sys.Baseline})
	}
	return buildPhases(d, sys, servers, spec)
}

// durationFor returns the scenario's total load time.
func durationFor(p Params, scenario string) time.Duration {
	if p.Duration > 0 {
		return p.Duration
	}
	if s, ok := ByName(scenario); ok {
		return s.Default
	}
	return 90 * time.Second
}
