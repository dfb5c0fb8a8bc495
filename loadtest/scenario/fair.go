package scenario

import (
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/loadtest/sim"
)

// fairScenarios are the scenarios of fair shares, deadlines and latency
// that stays bad, part of -scenario all. Each compares the static and the
// full chain.
var fairScenarios = []Scenario{
	{
		Name: "noisy_tenant", Default: 90 * time.Second, Phases: noisyPhases,
		System: halfCapacity, Population: noisyPopulation,
		Configs: []string{"static", "full"}, Tenant: spillway.DimUser, Features: []string{"fair"},
		Why: "20 tenants at Critical, each within its keys' rate limits; one sends 10× its share; 3× the database's capacity",
	},
	{
		Name: "deadlines", Default: 60 * time.Second, Phases: deadlinePhases,
		System: fastQueries, Overload: []string{"spike", "slow"},
		Configs: []string{"static", "full"}, Deadlines: true, Features: []string{"deadlines"},
		Why: "clients give up after 300 ms and say so; 1.5× capacity; the database 3× slower for the middle 35%",
	},
	{
		Name: "stuck_backend", Default: 60 * time.Second, Phases: stuckPhases,
		Before: "load", Recovery: "back",
		Configs: []string{"static", "full"}, StuckTimeout: true, Features: []string{"stuck"},
		Why: "1.5× capacity; for 20% of the run every query hangs to the statement timeout (2 s) and fails",
	},
}

// halfCapacity is the noisy tenant's system: a database of half the
// usual capacity (15 at scale 1), so that 3× its capacity stays within
// what the machine running the harness can offer.
func halfCapacity(s sim.System) sim.System {
	s.Capacity = max(2, s.Capacity/2)
	s.Baseline = float64(s.Capacity) / s.Service.Seconds() / 4
	return s
}

// noisyTenants: 20 tenants of 10 API keys each, all Critical; tenant 1
// sends 10× the share of each of the others (10 of 29 parts).
const noisyTenants = 20

func noisyPopulation() sim.Population {
	return sim.Population{
		WellBehaved: noisyTenants * 10,
		Tenants:     noisyTenants,
		NoisyShare:  10.0 / 29,
		PriorityMix: [spillway.NumPriorities]float64{0, 0, 1, 0},
	}
}

// noisyPhases: half the capacity for a fifth of the run, then 3× it
// (12 × the baseline, a quarter of the capacity).
func noisyPhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "warm", frac: 0.2, mult: 2},
		{name: "noisy", frac: 0.8, mult: 12},
	})
}

// fastQueries is the deadlines scenario's system: 10 queries at once of
// 50 ms (200 queries/s), clients that wait 300 ms per attempt.
func fastQueries(s sim.System) sim.System {
	s.Capacity = max(2, s.Capacity/3)
	s.Service = 50 * time.Millisecond
	s.ClientTimeout = 300 * time.Millisecond
	s.Baseline = float64(s.Capacity) / s.Service.Seconds() / 4
	return s
}

// deadlinePhases: 1.5× capacity; for the middle 35% every query takes 3×
// as long (the capacity in queries/s is a third).
func deadlinePhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "baseline", frac: 0.15, mult: 1},
		{name: "spike", frac: 0.25, mult: overloadMult},
		{name: "slow", frac: 0.35, mult: overloadMult, slow: 3},
		{name: "after", frac: 0.25, mult: overloadMult},
	})
}

// stuckPhases: 1.5× capacity; for 20% of the run every query hangs.
func stuckPhases(d time.Duration, sys sim.System, servers int) []sim.Phase {
	return buildPhases(d, sys, servers, []phaseSpec{
		{name: "baseline", frac: 0.15, mult: 1},
		{name: "load", frac: 0.25, mult: overloadMult},
		{name: "stuck", frac: 0.2, mult: overloadMult, stuck: true},
		{name: "back", frac: 0.4, mult: overloadMult},
	})
}
