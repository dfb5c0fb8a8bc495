package shedder

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/spillway-go/spillway"
)

// WorkerSettings configures a Worker (NewWorker). The zero value is the
// default.
type WorkerSettings struct {
	// Name is the Decision.Limiter of its decisions ("": "worker").
	Name string
	// Clock replaces time.Now.
	Clock func() time.Time
	// RetryAfter is the RetryAfter of a denial (0: 1s).
	RetryAfter time.Duration
	// Reserve is the fraction of capacity kept for Critical and
	// CriticalPlus work (0: 0.2; negative: none): Sheddable and
	// SheddablePlus work is capped once in-flight work passes the rest.
	// It must be below 1.
	Reserve float64
	// Sources are utilization sources (NewCgroupCPU, say). The Worker's
	// utilization is the largest of its in-flight ratio and every
	// source's reading; a source that fails is skipped for that tick.
	Sources []Source

	knobs knobs
}

// QueueSettings configures a Queue (NewQueue) or the queue of a Pool
// (NewPool). The zero value is the default.
type QueueSettings struct {
	// Name is the Decision.Limiter of its decisions ("": "queue", or
	// "pool" for a Pool).
	Name string
	// Clock replaces time.Now (a Pool's RTTs too).
	Clock func() time.Time
	// RetryAfter is the RetryAfter of a denial (0: 1s).
	RetryAfter time.Duration
	// MaxWait is how long a request may wait for a slot (0: 100ms;
	// negative: no wait, a full queue denies at once). Keep it well under
	// the clients' timeout.
	MaxWait time.Duration
	// PriorityWait replaces MaxWait for the priorities it lists (0: no
	// wait; a negative wait is an error): Critical work, which waits only behind other Critical work,
	// can be given a longer wait than work that is shed first.
	PriorityWait map[spillway.Priority]time.Duration
	// Depth is how many requests may wait at once (0: the number of
	// slots for a Queue, 64 for a Pool).
	Depth int
	// Tenant, when set, shares the capacity fairly between the tenants of
	// each priority, a tenant being the value of the request dimension
	// Tenant (spillway.DimAPIKey, spillway.DimUser, or any other; requests
	// without it are one tenant together). Priorities still come first: a
	// freed slot goes to the highest priority waiting, and the capacity a
	// priority shares is what higher priorities leave. Within a priority,
	// each active tenant (work in flight or waiting, or idle for less
	// than one mean hold time) gets a max-min fair share of that capacity,
	// in proportion to its weight (TenantWeights; 1 by default): a tenant
	// that wants less keeps what it wants and the rest goes to the
	// others. A request whose tenant already holds its share (in flight
	// and waiting, the share rounded up; a tenant holding nothing may
	// always ask) is denied at once with spillway.ReasonConcurrency (429)
	// and a RetryAfter of its own; a tenant that got less service than
	// the mean lately may have one request more waiting, which gets that
	// 429 too if no slot frees for it in time. A freed slot goes to the
	// waiter whose tenant got the least service for its weight lately
	// (over about 5 seconds). State: one entry per active tenant and
	// priority, dropped one mean hold time after it has nothing in flight
	// or waiting (about slots + depth entries), and an idle tenant's
	// record of service until it fades (about 15 s; at most 4,096 per
	// priority).
	Tenant string
	// TenantWeights gives tenants weights for their fair shares: a tenant
	// of weight 2 gets twice the share of one of weight 1 when both want
	// more; tenants not listed weigh 1. Weights must be positive and
	// finite.
	TenantWeights map[string]float64
	// LIFO, when positive, serves the newest waiter of a priority first
	// while its oldest has waited at least LIFO (a standing queue), and
	// the oldest first otherwise (adaptive LIFO): under a standing queue
	// the oldest waiters are those whose clients are the likeliest to have
	// given up. 0: FIFO always.
	LIFO time.Duration
	// SojournTarget and SojournInterval, when set (0 < target ≤
	// interval), bound the wait by its sojourn time, CoDel-style: while
	// the queue has not been empty for SojournInterval (a standing queue),
	// a request waits at most SojournTarget, and a waiter that has waited
	// longer than that is denied when its turn comes, before any work;
	// otherwise a request waits at most SojournInterval (and never longer
	// than its priority's maximum wait). Typical values: 5–20 ms, 100 ms.
	SojournTarget, SojournInterval time.Duration
}

// FleetSettings configures a Fleet (NewFleet). Every server of one fleet
// uses the same. The zero value is the default.
type FleetSettings struct {
	// Clock replaces time.Now; it also makes the Redis script use this
	// clock instead of Redis TIME, so every server of the fleet must then
	// have synchronized clocks (for tests).
	Clock func() time.Time
	// RetryAfter is the RetryAfter of a denial (0: 1s).
	RetryAfter time.Duration
	// Reserve is the fraction of capacity kept for Critical and
	// CriticalPlus work (0: 0.2; negative: none). It must be below 1.
	Reserve float64
	// Thresholds are, as fractions of the capacity, the fleet usage at
	// which each priority (Sheddable, SheddablePlus, Critical,
	// CriticalPlus) is shed (zero: 1−Reserve, 1−Reserve, 1, +Inf): a
	// request of priority p is shed when fleet usage plus its cost would
	// exceed Thresholds[p]×capacity. They must be positive and
	// non-decreasing in priority; math.Inf(1) means never. They override
	// Reserve.
	Thresholds [spillway.NumPriorities]float64
	// Prefix is the prefix of the Redis keys ("": "spillway:"); it must
	// not contain '{' or '}'.
	Prefix string
	// ServerID is this server's id in the fleet ("": hostname, pid and a
	// random suffix). Ids must be unique across the fleet.
	ServerID string
	// Interval is how often a server reports its in-flight counts and
	// refreshes its estimate of the fleet's (0: 100ms).
	Interval time.Duration
	// TTL is how long a server's report counts after it was made (0: 2s):
	// a crashed server's in-flight work stops counting this long after its
	// last report. It must exceed the interval.
	TTL time.Duration
	// Timeout is the time budget of one Redis refresh (0: 50ms).
	Timeout time.Duration
	// Reservations makes each server reserve its grant in Redis, in the
	// same script call as its report, before it uses it: its share of the
	// headroom below the highest finite threshold, stored with its report,
	// is what the other servers see of it until its next report. A server
	// uses no more than its reservation and no more than what the others'
	// reports and reservations leave below a threshold, so the servers'
	// grants never add up past a threshold, however their refreshes are
	// staggered. Without it a server's growth is seen only at its next
	// report, and the fleet can pass a threshold by the headroom handed
	// out in one interval (see Fleet).
	Reservations bool

	knobs knobs
}

// WatcherSettings configures a CapacityWatcher (NewCapacityWatcher). The
// zero value is the default.
type WatcherSettings struct {
	// Interval is how often the gauge is read (0: 100ms).
	Interval time.Duration
	// Timeout is the time budget of one read of the gauge (0: 50ms).
	Timeout time.Duration
}

// knobs are the settings fixed at their defaults outside the tests (see
// export_test.go); zero values are the defaults.
type knobs struct {
	Rand          func() float64 // Worker, Fleet: uniform in [0, 1)
	Tick          time.Duration  // Worker: how often the level moves
	Low, High     float64        // Worker: the hysteresis band
	StepUp        float64        // Worker: the level's step up per tick
	StepDown      float64        // Worker: and down
	StaleAfter    time.Duration  // Fleet: the age of the last refresh past which it is degraded
	NoAutoRefresh bool           // Fleet: Admit starts no refreshes
}

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
	waits   [4]time.Duration // PriorityWait; valid where waitSet
	waitSet [4]bool
	depth   int

	tenantDim string             // Tenant; "": no tenants
	weights   map[string]float64 // TenantWeights

	lifoAfter       time.Duration // LIFO; 0: FIFO always
	sojournTarget   time.Duration // SojournTarget; 0: none
	sojournInterval time.Duration

	badWait  bool   // a PriorityWait of a priority out of range
	badQueue string // a bad Queue setting, described

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

// orDur is d, or def when d is 0.
func orDur(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// reserveOf is a Reserve setting as a fraction: 0 is the default, a
// negative value none.
func reserveOf(r, def float64) float64 {
	switch {
	case r == 0:
		return def
	case r < 0:
		return 0
	}
	return r
}

// apply sets the knobs that are set.
func (k knobs) apply(o *options) {
	if k.Rand != nil {
		o.rand = k.Rand
	}
	if k.Tick != 0 {
		o.tick = k.Tick
	}
	if k.Low != 0 || k.High != 0 {
		o.low, o.high = k.Low, k.High
	}
	if k.StepUp != 0 || k.StepDown != 0 {
		o.stepUp, o.stepDown = k.StepUp, k.StepDown
	}
	if k.StaleAfter != 0 {
		o.staleAfter = k.StaleAfter
	}
	if k.NoAutoRefresh {
		o.autoRefresh = false
	}
}

func workerOptions(s WorkerSettings) options {
	o := defaultOptions("worker")
	if s.Name != "" {
		o.name = s.Name
	}
	if s.Clock != nil {
		o.now = s.Clock
	}
	o.retryAfter = orDur(s.RetryAfter, o.retryAfter)
	o.reserve = reserveOf(s.Reserve, o.reserve)
	o.sources = s.Sources
	s.knobs.apply(&o)
	return o
}

func queueOptions(s QueueSettings, name string, depth int) options {
	o := defaultOptions(name)
	if s.Name != "" {
		o.name = s.Name
	}
	if s.Clock != nil {
		o.now = s.Clock
	}
	o.retryAfter = orDur(s.RetryAfter, o.retryAfter)
	switch {
	case s.MaxWait < 0:
		o.maxWait = 0
	case s.MaxWait > 0:
		o.maxWait = s.MaxWait
	}
	for p, d := range s.PriorityWait {
		if p < 0 || int(p) >= len(o.waits) {
			o.badWait = true
			continue
		}
		o.waits[p], o.waitSet[p] = d, true
	}
	o.depth = depth
	switch {
	case s.Depth < 0:
		o.badQueue = fmt.Sprintf("queue depth %d is negative", s.Depth)
	case s.Depth > 0:
		o.depth = s.Depth
	}
	o.tenantDim = s.Tenant
	if len(s.TenantWeights) > 0 {
		o.weights = make(map[string]float64, len(s.TenantWeights))
		for k, w := range s.TenantWeights {
			if !(w > 0) || math.IsInf(w, 1) {
				o.badQueue = fmt.Sprintf("weight %v of tenant %q must be positive and finite", w, k)
			}
			o.weights[k] = w
		}
	}
	o.lifoAfter = s.LIFO
	if s.LIFO < 0 {
		o.badQueue = fmt.Sprintf("LIFO threshold %v is negative", s.LIFO)
	}
	o.sojournTarget, o.sojournInterval = s.SojournTarget, s.SojournInterval
	if (s.SojournTarget != 0 || s.SojournInterval != 0) && (s.SojournTarget <= 0 || s.SojournInterval < s.SojournTarget) {
		o.badQueue = fmt.Sprintf("sojourn target %v, interval %v: want 0 < target <= interval", s.SojournTarget, s.SojournInterval)
	}
	return o
}

func fleetOptions(s FleetSettings, name string) options {
	o := defaultOptions(name)
	if s.Clock != nil {
		o.now, o.serverClock = s.Clock, true
	}
	o.retryAfter = orDur(s.RetryAfter, o.retryAfter)
	o.reserve = reserveOf(s.Reserve, o.reserve)
	o.thresholds = s.Thresholds
	if s.Prefix != "" {
		o.prefix = s.Prefix
	}
	o.serverID = s.ServerID
	o.interval = orDur(s.Interval, o.interval)
	o.ttl = orDur(s.TTL, o.ttl)
	o.timeout = orDur(s.Timeout, o.timeout)
	o.reserveHead = s.Reservations
	s.knobs.apply(&o)
	return o
}

func (o *options) validateCommon() error {
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
