package shedder

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/spillway-go/spillway"
)

// WorkerOption configures a Worker (NewWorker).
type WorkerOption interface{ worker(*options) }

// PoolOption configures a Pool (NewPool). Every QueueOption is one too:
// it configures the Pool's queue.
type PoolOption interface{ pool(*options) }

// QueueOption configures a Queue (NewQueue) or the queue of a Pool.
type QueueOption interface {
	PoolOption
	queue(*options)
}

// FleetOption configures a Fleet (NewFleet).
type FleetOption interface{ fleet(*options) }

// WatcherOption configures a CapacityWatcher (NewCapacityWatcher).
type WatcherOption interface{ watcher(*options) }

// option is every option type; each With function returns it as the
// option types of the constructors it applies to, so an option given to
// a constructor it does not apply to does not compile.
type option func(*options)

func (f option) worker(o *options)  { f(o) }
func (f option) pool(o *options)    { f(o) }
func (f option) queue(o *options)   { f(o) }
func (f option) fleet(o *options)   { f(o) }
func (f option) watcher(o *options) { f(o) }

type options struct {
	name       string
	now        func() time.Time
	rand       func() float64
	retryAfter time.Duration
	reserve    float64

	// Worker.
	sources  []Source
	tick     time.Duration
	low      float64
	high     float64
	stepUp   float64
	stepDown float64

	// Queue.
	maxWait time.Duration
	waits   [4]time.Duration // WithPriorityWait; valid where waitSet
	waitSet [4]bool
	depth   int

	tenantDim string             // WithTenant; "": no tenants
	weights   map[string]float64 // WithTenantWeights

	lifoAfter       time.Duration // WithLIFO; 0: FIFO always
	sojournTarget   time.Duration // WithSojourn; 0: none
	sojournInterval time.Duration

	badWait  bool   // WithPriorityWait of a priority out of range
	badQueue string // a bad Queue option, described

	// Pool.
	fleet *Fleet

	// Fleet.
	thresholds  [4]float64 // fractions of capacity; 0 means derive from reserve
	prefix      string
	serverID    string
	interval    time.Duration
	ttl         time.Duration
	timeout     time.Duration
	staleAfter  time.Duration
	serverClock bool // send the client clock to the script
	autoRefresh bool
	reserveHead bool // reserve each grant in Redis before using it
}

func defaultOptions(name string) options {
	return options{
		name:        name,
		now:         time.Now,
		rand:        rand.Float64,
		retryAfter:  time.Second,
		reserve:     0.2,
		tick:        100 * time.Millisecond,
		low:         0.75,
		high:        0.9,
		stepUp:      0.25,
		stepDown:    0.05,
		maxWait:     100 * time.Millisecond,
		prefix:      "spillway:",
		interval:    100 * time.Millisecond,
		ttl:         2 * time.Second,
		timeout:     50 * time.Millisecond,
		staleAfter:  time.Second,
		autoRefresh: true,
	}
}

// WithName sets the name reported in Decision.Limiter by a Worker, Queue
// or Pool (default "worker", "queue", "pool"). A Fleet is named by
// NewFleet's name argument alone.
func WithName(name string) interface {
	WorkerOption
	QueueOption
} {
	return option(func(o *options) { o.name = name })
}

// WithClock sets the clock (default time.Now). For a Fleet it also makes
// the Redis script use this clock instead of Redis TIME, so every server of
// the fleet must then have synchronized clocks; use it for tests.
func WithClock(now func() time.Time) interface {
	WorkerOption
	QueueOption
	FleetOption
} {
	return option(func(o *options) { o.now = now; o.serverClock = true })
}

// withRand sets the source of uniform random numbers in [0, 1) that decides
// probabilistic shedding in a Worker and rounds a Fleet's share of the
// headroom (default math/rand/v2.Float64). It must be safe for concurrent
// use if the shedder is. Worker and Fleet; for tests.
func withRand(f func() float64) option {
	return option(func(o *options) { o.rand = f })
}

// WithRetryAfter sets Decision.RetryAfter of a denial (default 1s).
func WithRetryAfter(d time.Duration) interface {
	WorkerOption
	QueueOption
	FleetOption
} {
	return option(func(o *options) { o.retryAfter = d })
}

// WithReserve sets the fraction of capacity reserved for Critical and
// CriticalPlus work (default 0.2): Sheddable and SheddablePlus work is shed
// once usage passes the rest. It must be in [0, 1).
func WithReserve(f float64) interface {
	WorkerOption
	FleetOption
} {
	return option(func(o *options) { o.reserve = f })
}

// WithSource adds a utilization source (for example a CgroupCPU). The
// Worker's utilization is the largest of its in-flight ratio and every
// source's reading; a source that fails is skipped for that tick. Worker
// only; may be given more than once.
func WithSource(s Source) WorkerOption {
	return option(func(o *options) { o.sources = append(o.sources, s) })
}

// withTick sets how often the Worker re-evaluates its shed level (default
// 100ms). Worker only.
func withTick(d time.Duration) WorkerOption { return option(func(o *options) { o.tick = d }) }

// withBand sets the hysteresis band of the Worker (default 0.75, 0.9): the
// shed level rises while utilization is at or above high, falls while it is
// at or below low, and in between falls only when one step less shedding
// would keep utilization under the middle of the band. Worker only.
func withBand(low, high float64) WorkerOption {
	return option(func(o *options) { o.low, o.high = low, high })
}

// withSteps sets how far the Worker's shed level moves per tick (default
// 0.25 up, 0.05 down): the level runs from 0 (nothing shed) to 4 (all
// shed), one unit per priority, so the defaults shed a whole priority in
// four ticks and give it back in twenty. The down step is also the gentle
// step up taken when only the reserve turned work away. Worker only.
func withSteps(up, down float64) WorkerOption {
	return option(func(o *options) { o.stepUp, o.stepDown = up, down })
}

// WithMaxWait sets how long a request may wait in a Queue for a slot
// (default 100ms); 0 denies at once when no slot is free. Keep it well
// under the clients' timeout. Queue and Pool.
func WithMaxWait(d time.Duration) QueueOption { return option(func(o *options) { o.maxWait = d }) }

// WithPriorityWait sets how long a request of priority p may wait in a
// Queue for a slot, in place of WithMaxWait's for that priority: Critical
// work, which waits only behind other Critical work, can be given a
// longer wait than work that is shed first. Queue and Pool.
func WithPriorityWait(p spillway.Priority, d time.Duration) QueueOption {
	return option(func(o *options) {
		if p >= 0 && int(p) < len(o.waits) {
			o.waits[p], o.waitSet[p] = d, true
		} else {
			o.badWait = true
		}
	})
}

// WithQueueDepth sets how many requests may wait in a Queue at once
// (default its number of slots; 64 for a Pool). Queue and Pool.
func WithQueueDepth(n int) QueueOption { return option(func(o *options) { o.depth = n }) }

// WithTenant makes a Queue (or a Pool) share its capacity fairly between
// the tenants of each priority, a tenant being the value of the request
// dimension dim (spillway.DimAPIKey, spillway.DimUser, or any other;
// requests without it are one tenant together). Priorities still come
// first: a freed slot goes to the highest priority waiting, and the
// capacity a priority shares is what higher priorities leave. Within a
// priority, each active tenant (work in flight or waiting, or idle for
// less than one mean hold time) gets a max-min fair share of that
// capacity, in proportion to its weight (WithTenantWeights; 1 by default):
// a tenant that wants less keeps what it wants and the rest goes to the
// others. A request whose tenant already holds its share (in flight and
// waiting, the share rounded up; a tenant holding nothing may always ask)
// is denied at once with spillway.ReasonConcurrency (429) and a RetryAfter
// of its own; a tenant that got less service than the mean lately may
// have one request more waiting, which gets that 429 too if no slot frees
// for it in time. A freed slot goes to the waiter whose tenant got the
// least service for its weight lately (over about 5 seconds). State: one
// entry per active tenant and priority, dropped one mean hold time after
// it has nothing in flight or waiting (about slots + depth entries), and
// an idle tenant's record of service until it fades (about 15 s; at most
// 4,096 per priority).
// Queue and Pool; by default there are no tenants.
func WithTenant(dim string) QueueOption {
	return option(func(o *options) {
		o.tenantDim = dim
		if dim == "" {
			o.badQueue = "tenant dimension is empty"
		}
	})
}

// WithTenantWeights gives tenants (values of the WithTenant dimension)
// weights for their fair shares: a tenant of weight 2 gets twice the
// share of one of weight 1 when both want more; tenants not listed weigh
// 1. Weights must be positive and finite. Queue and Pool, with WithTenant.
func WithTenantWeights(weights map[string]float64) QueueOption {
	return option(func(o *options) {
		o.weights = make(map[string]float64, len(weights))
		for k, w := range weights {
			if !(w > 0) || math.IsInf(w, 1) {
				o.badQueue = fmt.Sprintf("weight %v of tenant %q must be positive and finite", w, k)
			}
			o.weights[k] = w
		}
	})
}

// WithLIFO makes a Queue serve the newest waiter of a priority first
// while its oldest has waited at least after (a standing queue), and the
// oldest first otherwise (adaptive LIFO): under a standing queue the
// oldest waiters are those whose clients are the likeliest to have given
// up, and the newest can still be served in time; without one, arrival
// order is fairest. after must be positive; by default a Queue is FIFO.
// Queue and Pool.
func WithLIFO(after time.Duration) QueueOption {
	return option(func(o *options) {
		o.lifoAfter = after
		if after <= 0 {
			o.badQueue = fmt.Sprintf("LIFO threshold %v must be positive", after)
		}
	})
}

// WithSojourn bounds a Queue's wait by its sojourn time, CoDel-style: while
// the queue has not been empty for interval (a standing queue), a request
// waits at most target, and a waiter that has waited longer than target is
// denied when its turn comes, before any work; otherwise a request waits
// at most interval (and never longer than its priority's maximum wait).
// A burst is absorbed by a queue that drains within interval; a queue that
// stays is kept short, so its waiters' latency stays at about target.
// Typical values: target 5–20 ms, interval 100 ms. 0 < target ≤
// interval; by default there is no sojourn bound, only the maximum wait.
// Queue and Pool.
func WithSojourn(target, interval time.Duration) QueueOption {
	return option(func(o *options) {
		o.sojournTarget, o.sojournInterval = target, interval
		if target <= 0 || interval < target {
			o.badQueue = fmt.Sprintf("sojourn target %v, interval %v: want 0 < target <= interval", target, interval)
		}
	})
}

// WithFleet caps a Pool's slots at what the fleet shedder f allows this
// server now (f.Allowance(spillway.Critical)) and gives the Pool this
// server's share of the fleet (f.Stats().Share) when a capacity reading
// reports idle capacity. Pool only.
func WithFleet(f *Fleet) PoolOption { return option(func(o *options) { o.fleet = f }) }

// WithThresholds sets, as fractions of the fleet capacity, the usage at
// which each priority is shed (default 1−reserve, 1−reserve, 1, +Inf):
// a request of priority p is shed when fleet usage plus its cost would
// exceed thresholds[p]×capacity. Thresholds must be positive and
// non-decreasing in priority; math.Inf(1) means never. It overrides
// WithReserve. Fleet only.
func WithThresholds(sheddable, sheddablePlus, critical, criticalPlus float64) FleetOption {
	return option(func(o *options) { o.thresholds = [4]float64{sheddable, sheddablePlus, critical, criticalPlus} })
}

// WithPrefix sets the prefix of the Redis keys (default "spillway:"); it
// must not contain '{' or '}'. Fleet only.
func WithPrefix(p string) FleetOption { return option(func(o *options) { o.prefix = p }) }

// WithServerID sets this server's id in the fleet (default hostname, pid
// and a random suffix). Ids must be unique across the fleet. Fleet only.
func WithServerID(id string) FleetOption { return option(func(o *options) { o.serverID = id }) }

// WithInterval sets how often a Fleet reports its in-flight counts and
// refreshes its estimate of the fleet's (default 100ms), and how often a
// CapacityWatcher polls its gauge (default 100ms). Fleet and
// CapacityWatcher.
func WithInterval(d time.Duration) interface {
	FleetOption
	WatcherOption
} {
	return option(func(o *options) { o.interval = d })
}

// WithTTL sets how long a server's report counts after it was made
// (default 2s): a crashed server's in-flight work stops counting this long
// after its last report. It must exceed the interval. Fleet only.
func WithTTL(d time.Duration) FleetOption { return option(func(o *options) { o.ttl = d }) }

// WithTimeout sets the time budget of one Redis refresh, or of one read
// of a CapacityWatcher's gauge (default 50ms). Fleet and CapacityWatcher.
func WithTimeout(d time.Duration) interface {
	FleetOption
	WatcherOption
} {
	return option(func(o *options) { o.timeout = d })
}

// withStaleAfter sets how old the last successful refresh may be before the
// Fleet decides in degraded mode on local counts (default 1s). Fleet only.
func withStaleAfter(d time.Duration) FleetOption {
	return option(func(o *options) { o.staleAfter = d })
}

// WithReservations makes each Fleet server reserve its grant in Redis, in
// the same script call as its report, before it uses it: its share of the
// headroom below the highest finite threshold, stored with its report, is
// what the other servers see of it until its next report. A server uses
// no more than its reservation and no more than what the others' reports
// and reservations leave below a threshold, so the servers' grants never
// add up past a threshold, however their refreshes are staggered (what a
// server may admit while its own report is on its way stays reserved
// until its next). Without
// it a server's growth is seen only at its next report, and the fleet can
// pass a threshold by the headroom handed out in one interval (see
// Fleet). Fleet only.
func WithReservations() FleetOption { return option(func(o *options) { o.reserveHead = true }) }

// withoutAutoRefresh stops Admit from starting refreshes when the estimate
// is older than the interval; the caller then drives Refresh or Run. For
// tests. Fleet only.
func withoutAutoRefresh() FleetOption { return option(func(o *options) { o.autoRefresh = false }) }

func (o *options) validateCommon() error {
	if o.now == nil {
		return fmt.Errorf("shedder: clock is nil")
	}
	if o.rand == nil {
		return fmt.Errorf("shedder: rand is nil")
	}
	if o.retryAfter < 0 {
		return fmt.Errorf("shedder: retry after %v is negative", o.retryAfter)
	}
	if !(o.reserve >= 0 && o.reserve < 1) {
		return fmt.Errorf("shedder: reserve %v must be in [0, 1)", o.reserve)
	}
	return nil
}

func (o *options) validateWorker() error {
	if err := o.validateCommon(); err != nil {
		return err
	}
	if o.tick <= 0 {
		return fmt.Errorf("shedder: tick %v must be positive", o.tick)
	}
	if !(o.low > 0 && o.low < o.high) || math.IsInf(o.high, 0) || math.IsNaN(o.high) {
		return fmt.Errorf("shedder: band low %v, high %v: want 0 < low < high", o.low, o.high)
	}
	if !(o.stepUp > 0 && o.stepUp <= 4) || !(o.stepDown > 0 && o.stepDown <= 4) {
		return fmt.Errorf("shedder: steps up %v, down %v: each must be in (0, 4]", o.stepUp, o.stepDown)
	}
	for i, s := range o.sources {
		if s == nil {
			return fmt.Errorf("shedder: source %d is nil", i)
		}
	}
	return nil
}
