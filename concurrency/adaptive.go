package concurrency

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/spillway-go/spillway"
)

// Sample is one completed request, as an Algorithm sees it.
type Sample struct {
	Start    time.Time        // when it was admitted
	RTT      time.Duration    // how long it ran
	InFlight int              // requests in flight when it was admitted or when it ended, whichever was more, itself included
	Outcome  spillway.Outcome // Success or Dropped; Ignored never reaches an Algorithm
}

// Algorithm computes a concurrency limit from completed requests. Adaptive
// calls it under its own lock, so implementations need not be safe for
// concurrent use.
type Algorithm interface {
	// Limit returns the current limit, at least 1.
	Limit() int
	// Update records one completed request.
	Update(s Sample)
}

// Adaptive is a local (per-process) concurrency limit whose value an
// Algorithm adapts from the latency and the outcome of completed requests.
// It counts requests, not their Cost (see Admit).
// It implements spillway.Limiter; its Done reports the outcome: Success and
// Dropped (timeout, overload) teach the algorithm, Ignored only releases.
type Adaptive struct {
	mu       sync.Mutex
	alg      Algorithm
	inFlight int
	name     string
	now      func() time.Time
}

// AdaptiveOption configures an Adaptive.
type AdaptiveOption func(*Adaptive)

// WithAdaptiveName sets Decision.Limiter (default "adaptive").
func WithAdaptiveName(name string) AdaptiveOption { return func(a *Adaptive) { a.name = name } }

// WithAdaptiveClock sets the clock that measures RTTs (default time.Now).
func WithAdaptiveClock(now func() time.Time) AdaptiveOption { return func(a *Adaptive) { a.now = now } }

// NewAdaptive returns a limiter driven by alg (NewAIMD or NewGradient).
func NewAdaptive(alg Algorithm, opts ...AdaptiveOption) (*Adaptive, error) {
	if alg == nil {
		return nil, fmt.Errorf("concurrency: NewAdaptive: algorithm is nil")
	}
	a := &Adaptive{alg: alg, name: "adaptive", now: time.Now}
	for _, o := range opts {
		o(a)
	}
	if a.now == nil || a.name == "" {
		return nil, fmt.Errorf("concurrency: NewAdaptive: clock and name must be set")
	}
	return a, nil
}

// Limit returns the current limit.
func (a *Adaptive) Limit() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.alg.Limit()
}

// InFlight returns the number of admitted requests not yet done.
func (a *Adaptive) InFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight
}

// Admit admits r when fewer than Limit requests are in flight in this
// process. A denial has Reason spillway.ReasonShed (the server protects
// itself: answer 503) and a RetryAfter of 1 s. A malformed (or nil)
// request is denied with spillway.ReasonInvalid. err is always nil.
//
// r.Cost does not weigh here: every request is one, whatever its cost.
// The algorithms learn a limit in requests from each request's latency;
// counting a cost-c request as c in flight, while its RTT stays one
// sample that is not divided by c, would mix units (a heavy request's
// longer RTT reads as queueing). Weigh costs against a server's own
// capacity with shedder.Worker or shedder.Queue, which count units.
func (a *Adaptive) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if !r.Valid() {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: a.name}, spillway.Noop, nil
	}
	a.mu.Lock()
	limit := a.alg.Limit()
	if a.inFlight >= limit {
		a.mu.Unlock()
		return spillway.Decision{Reason: spillway.ReasonShed, Limiter: a.name, Limit: int64(limit), RetryAfter: time.Second}, spillway.Noop, nil
	}
	a.inFlight++
	inFlight := a.inFlight
	a.mu.Unlock()
	start := a.now()
	d := spillway.Decision{Allowed: true, Limiter: a.name, Limit: int64(limit), Remaining: int64(limit - inFlight)}
	return d, spillway.Once(func(o spillway.Outcome) {
		rtt := a.now().Sub(start)
		a.mu.Lock()
		defer a.mu.Unlock()
		used := max(inFlight, a.inFlight)
		a.inFlight--
		if o == spillway.Success || o == spillway.Dropped {
			a.alg.Update(Sample{Start: start, RTT: rtt, InFlight: used, Outcome: o})
		}
	}), nil
}

// AIMDConfig configures NewAIMD. Zero values mean the documented defaults.
type AIMDConfig struct {
	Initial int           // starting limit; default 20
	Min     int           // floor; default 1
	Max     int           // ceiling; default 1000
	Backoff float64       // multiplicative decrease on a drop, in (0,1); default 0.9
	Timeout time.Duration // an RTT above it counts as a drop; 0: RTT never does
}

// AIMD is additive-increase, multiplicative-decrease, as TCP Reno: each
// success of a request that saw at least half the limit in use adds 1/limit
// (one per limit's worth of successes, i.e. about one per round trip); a
// drop multiplies the limit by Backoff, at most once per round trip (drops
// of requests that started before the last decrease are ignored: the
// decrease already answered them).
type AIMD struct {
	cfg          AIMDConfig
	limit        float64
	lastDecrease time.Time
}

// NewAIMD validates cfg and returns an AIMD at cfg.Initial.
func NewAIMD(cfg AIMDConfig) (*AIMD, error) {
	if cfg.Initial == 0 {
		cfg.Initial = 20
	}
	if cfg.Min == 0 {
		cfg.Min = 1
	}
	if cfg.Max == 0 {
		cfg.Max = 1000
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 0.9
	}
	switch {
	case cfg.Min < 1 || cfg.Max < cfg.Min:
		return nil, fmt.Errorf("concurrency: NewAIMD: need 1 <= Min (%d) <= Max (%d)", cfg.Min, cfg.Max)
	case cfg.Initial < cfg.Min || cfg.Initial > cfg.Max:
		return nil, fmt.Errorf("concurrency: NewAIMD: Initial %d outside [Min %d, Max %d]", cfg.Initial, cfg.Min, cfg.Max)
	case !(cfg.Backoff > 0 && cfg.Backoff < 1):
		return nil, fmt.Errorf("concurrency: NewAIMD: Backoff %v must be in (0,1)", cfg.Backoff)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("concurrency: NewAIMD: Timeout %v is negative", cfg.Timeout)
	}
	return &AIMD{cfg: cfg, limit: float64(cfg.Initial)}, nil
}

// Limit implements Algorithm.
func (a *AIMD) Limit() int { return int(a.limit) }

// Update implements Algorithm.
func (a *AIMD) Update(s Sample) {
	dropped := s.Outcome == spillway.Dropped || (a.cfg.Timeout > 0 && s.RTT > a.cfg.Timeout)
	if dropped {
		if s.Start.Before(a.lastDecrease) {
			return
		}
		a.lastDecrease = s.Start.Add(s.RTT)
		a.limit = math.Max(float64(a.cfg.Min), math.Floor(a.limit*a.cfg.Backoff))
		return
	}
	if 2*s.InFlight < int(a.limit) {
		return // the limit was not in use: no evidence that more would work
	}
	a.limit = math.Min(float64(a.cfg.Max), a.limit+1/a.limit)
}

// GradientConfig configures NewGradient. Zero values mean the documented
// defaults.
type GradientConfig struct {
	Initial   int     // starting limit, where slow start begins; default 4
	Min       int     // floor, and the limit during a probe; default 2
	Max       int     // ceiling; default 1000
	Tolerance float64 // RTT up to Tolerance × baseline is not queueing, >= 1; default 1.5
	Smoothing float64 // weight of a new estimate, in (0,1]; default 0.2
	Backoff   float64 // multiplicative decrease when a window has drops, in (0,1); default 0.9
	// WindowSamples is how many samples (of requests admitted after the
	// previous update) make one update; default 10.
	WindowSamples int
	// ProbeInterval is how often the baseline is re-measured (default
	// 30 s): the limit drops to Min until ProbeSamples requests admitted
	// with at most Min in flight have completed; the least of their RTTs
	// becomes the baseline, and the limit returns to its value before the
	// probe. Negative disables probing.
	ProbeInterval time.Duration
	ProbeSamples  int // default 5
	// Queue is the headroom added to limit × gradient on each update;
	// default ⌈√limit⌉.
	Queue func(limit int) int
}

// Gradient is a latency-gradient limit in the family of Netflix's Gradient
// and TCP Vegas, with slow start.
//
// Each window of samples yields its mean RTT. The gradient is
// min(1, Tolerance × baseline / RTT); the new estimate is limit × gradient
// + Queue(limit), blended into the limit with weight Smoothing. A window
// with a drop multiplies the limit by Backoff instead. In slow start (from
// Initial) the limit doubles each window until the RTT exceeds
// Tolerance × baseline or a drop arrives. A window whose requests never
// used half the limit does not raise it.
//
// The baseline is the least window RTT seen — not a long-term average.
// That is the difference from Gradient2, whose baseline is an average of
// recent RTTs: under steady overload that average rises to the overloaded
// RTT, the gradient returns to 1 and the queue term makes the limit creep
// up without end. A minimum cannot rise under overload. To follow a
// dependency that really became slower, the baseline is re-measured by a
// probe (ProbeInterval) that empties this server's own queue first, as
// BBR's ProbeRTT does, so the measurement is the unloaded RTT even while
// the server is overloaded. Under steady overload the limit settles near
// Tolerance × capacity + Queue, and stays there.
type Gradient struct {
	cfg GradientConfig

	limit     float64
	baseline  time.Duration
	slowStart bool

	// current window
	winStart   time.Time
	winN       int
	winSum     time.Duration
	winDrops   int
	winMaxUsed int

	nextProbe   time.Time
	probing     bool
	probeStart  time.Time
	probeSaved  float64
	probeN      int
	probeDrops  int
	probeMinRTT time.Duration
	started     bool
}

// NewGradient validates cfg and returns a Gradient in slow start at
// cfg.Initial.
func NewGradient(cfg GradientConfig) (*Gradient, error) {
	if cfg.Initial == 0 {
		cfg.Initial = 4
	}
	if cfg.Min == 0 {
		cfg.Min = 2
	}
	if cfg.Max == 0 {
		cfg.Max = 1000
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = 1.5
	}
	if cfg.Smoothing == 0 {
		cfg.Smoothing = 0.2
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 0.9
	}
	if cfg.WindowSamples == 0 {
		cfg.WindowSamples = 10
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 30 * time.Second
	}
	if cfg.ProbeSamples == 0 {
		cfg.ProbeSamples = 5
	}
	if cfg.Queue == nil {
		cfg.Queue = func(limit int) int { return int(math.Ceil(math.Sqrt(float64(limit)))) }
	}
	switch {
	case cfg.Min < 1 || cfg.Max < cfg.Min:
		return nil, fmt.Errorf("concurrency: NewGradient: need 1 <= Min (%d) <= Max (%d)", cfg.Min, cfg.Max)
	case cfg.Initial < cfg.Min || cfg.Initial > cfg.Max:
		return nil, fmt.Errorf("concurrency: NewGradient: Initial %d outside [Min %d, Max %d]", cfg.Initial, cfg.Min, cfg.Max)
	case !(cfg.Tolerance >= 1):
		return nil, fmt.Errorf("concurrency: NewGradient: Tolerance %v must be at least 1", cfg.Tolerance)
	case !(cfg.Smoothing > 0 && cfg.Smoothing <= 1):
		return nil, fmt.Errorf("concurrency: NewGradient: Smoothing %v must be in (0,1]", cfg.Smoothing)
	case !(cfg.Backoff > 0 && cfg.Backoff < 1):
		return nil, fmt.Errorf("concurrency: NewGradient: Backoff %v must be in (0,1)", cfg.Backoff)
	case cfg.WindowSamples < 1:
		return nil, fmt.Errorf("concurrency: NewGradient: WindowSamples %d must be at least 1", cfg.WindowSamples)
	case cfg.ProbeSamples < 1:
		return nil, fmt.Errorf("concurrency: NewGradient: ProbeSamples %d must be at least 1", cfg.ProbeSamples)
	}
	return &Gradient{cfg: cfg, limit: float64(cfg.Initial), slowStart: true}, nil
}

// Limit implements Algorithm.
func (g *Gradient) Limit() int {
	if g.probing {
		return g.cfg.Min
	}
	return int(g.limit)
}

// Baseline returns the RTT the gradient compares against (0 before the
// first window).
func (g *Gradient) Baseline() time.Duration { return g.baseline }

// InSlowStart reports whether the limit is still doubling.
func (g *Gradient) InSlowStart() bool { return g.slowStart }

// Update implements Algorithm.
func (g *Gradient) Update(s Sample) {
	end := s.Start.Add(s.RTT)
	if !g.started {
		g.started = true
		g.winStart = s.Start
		if g.cfg.ProbeInterval > 0 {
			g.nextProbe = end.Add(g.cfg.ProbeInterval)
		}
	}
	if g.probing {
		g.probe(s, end)
		return
	}
	if s.Start.Before(g.winStart) {
		return // admitted under an older limit: says nothing about this one
	}
	g.winN++
	if s.Outcome == spillway.Dropped {
		g.winDrops++
	} else {
		g.winSum += s.RTT
	}
	g.winMaxUsed = max(g.winMaxUsed, s.InFlight)
	if g.winN < g.cfg.WindowSamples {
		return
	}
	g.endWindow(end)
	if g.cfg.ProbeInterval > 0 && !end.Before(g.nextProbe) {
		g.probing, g.probeStart, g.probeSaved = true, end, g.limit
		g.probeN, g.probeDrops, g.probeMinRTT = 0, 0, 0
	}
}

func (g *Gradient) endWindow(end time.Time) {
	successes := g.winN - g.winDrops
	limit := g.limit
	switch {
	case g.winDrops > 0:
		g.slowStart = false
		limit *= g.cfg.Backoff
	case successes > 0:
		// A zero RTT (a coarse clock) would make the gradient 0/0.
		rtt := max(g.winSum/time.Duration(successes), time.Microsecond)
		if g.baseline == 0 || rtt < g.baseline {
			g.baseline = rtt
		}
		tolerated := float64(rtt) <= g.cfg.Tolerance*float64(g.baseline)
		used := 2*g.winMaxUsed >= int(g.limit)
		switch {
		case g.slowStart && tolerated:
			if used {
				limit *= 2
			}
		default:
			g.slowStart = false
			gradient := math.Min(1, g.cfg.Tolerance*float64(g.baseline)/float64(rtt))
			estimate := limit*gradient + float64(g.cfg.Queue(int(limit)))
			if estimate > limit && !used {
				estimate = limit
			}
			limit = limit*(1-g.cfg.Smoothing) + estimate*g.cfg.Smoothing
		}
	}
	g.limit = math.Min(float64(g.cfg.Max), math.Max(float64(g.cfg.Min), limit))
	g.winStart, g.winN, g.winSum, g.winDrops, g.winMaxUsed = end, 0, 0, 0, 0
}

// probe collects the RTTs of requests admitted during the probe with at
// most Min in flight: the server's own queue has drained for them. A probe
// that sees ProbeSamples drops ends without a new baseline: the dependency
// is failing, not slow, and the limit must not stay at Min.
func (g *Gradient) probe(s Sample, end time.Time) {
	if s.Start.Before(g.probeStart) {
		return
	}
	if s.Outcome != spillway.Success {
		g.probeDrops++
		if g.probeDrops >= g.cfg.ProbeSamples {
			g.endProbe(end)
		}
		return
	}
	if s.InFlight > g.cfg.Min {
		return
	}
	if rtt := max(s.RTT, time.Microsecond); g.probeN == 0 || rtt < g.probeMinRTT {
		g.probeMinRTT = rtt
	}
	g.probeN++
	if g.probeN < g.cfg.ProbeSamples {
		return
	}
	g.baseline = g.probeMinRTT
	g.endProbe(end)
}

func (g *Gradient) endProbe(end time.Time) {
	g.probing = false
	g.limit = g.probeSaved
	g.nextProbe = end.Add(g.cfg.ProbeInterval)
	g.winStart, g.winN, g.winSum, g.winDrops, g.winMaxUsed = end, 0, 0, 0, 0
}
