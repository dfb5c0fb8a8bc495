// Package shedder holds spillway's priority-aware load shedders, which
// protect a server or a fleet by dropping the least important work first,
// and the classification that gives each request its priority.
//
//   - Worker, the worker utilization shedder, protects one server: as its
//     in-flight work (and optionally its CPU, read from cgroup v1 or v2
//     quotas by NewCgroupCPU) rises, it sheds Sheddable work first, then
//     SheddablePlus, then Critical, and CriticalPlus only once everything
//     below is shed. Shedding ramps in and out in steps, with hysteresis.
//   - Queue bounds a server's own pool (its database connections, say) and
//     lets a request that finds it full wait briefly for a slot; a freed
//     slot goes to the highest-priority waiter, so Critical work waits
//     only for the next slot and no slot idles while work waits.
//   - Pool is a Queue whose number of slots a limit learned from latency
//     sets (a concurrency.LatencyLimit), capped by what the Fleet
//     allows this server (NewPool's fleet): a server's database pool sized by
//     what the database shows, not by a guess.
//   - CapacityWatcher polls a Gauge of the shared dependency (its busy and
//     idle workers, and the work waiting for one when the gauge measures
//     it) and sets the Fleet's capacity and the Pool from it.
//   - Fleet, the fleet usage shedder, protects a whole fleet: every server
//     reports its in-flight work per priority to Redis about every 100ms
//     and decides locally against the fleet-wide sum, keeping a fraction of
//     the capacity (default 20%) for Critical and CriticalPlus work. When
//     Redis is unreachable it decides on local counts and marks its
//     decisions Degraded.
//   - HTTPClassifier assigns priorities to HTTP requests (health checks are
//     CriticalPlus, writes Critical, reads SheddablePlus, test traffic
//     Sheddable), honouring a priority received in spillway.PriorityHeader
//     (the adapters propagate it downstream, see spillway.ContextWithPriority)
//     so that services shed the same way as their callers.
//
// Worker, Queue, Pool and Fleet implement spillway.Limiter. What they
// count is the cost of the work in flight (spillway.Request.EffectiveCost),
// per priority. A denial has Reason spillway.ReasonShed (answered with 503
// by the adapters) and a RetryAfter; a request that costs more than it
// could ever be given is denied with spillway.ReasonCostExceedsLimit, a
// malformed one with spillway.ReasonInvalid, and a tenant over its fair
// share of a Queue with spillway.ReasonConcurrency (429). None waits on the
// network inside Admit (the Queue and the Pool wait only for a slot of
// their own), and Admit never returns an error. What is guaranteed: each
// sheds the lower priorities first (see each type for how); a Worker
// admits work below CriticalPlus only while its work in flight stays
// within its capacity, a Queue or a Pool only while it stays within its
// slots. The Fleet holds the fleet to its thresholds to within the
// headroom one refresh hands out (none with FleetSettings.Reservations);
// while Redis cannot answer it falls back to deciding on this server's own
// counts against its share of the capacity, marked Degraded, and takes the
// fleet's view again once Redis answers.
//
// The shortest use:
//
//	w, err := shedder.NewWorker(64, shedder.WorkerSettings{}) // 64 requests in flight at most
//	if err != nil { return err }
//	chain := spillway.Chain(rateLimits, w)
//	d, done, _ := chain.Admit(ctx, &spillway.Request{Priority: shedder.ClassifyHTTP(req)})
//	if d.Allowed { defer done(spillway.Success) }
//
// Each constructor takes a settings struct of its own (WorkerSettings,
// QueueSettings for a Queue or a Pool, FleetSettings, WatcherSettings),
// whose zero value is the default, so a setting that does not apply does
// not compile; time is injected through their Clock fields. Each shedder
// has a Stats method for dashboards.
//
// Worker, Queue, Pool, Fleet, CapacityWatcher and HTTPClassifier are safe
// for concurrent use.
package shedder
