package concurrency

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

// sample is one completed request, as an Algorithm sees it.
type sample struct {
	Start    time.Time        // when it was admitted
	RTT      time.Duration    // how long it ran
	InFlight int              // requests in flight when it was admitted or when it ended, whichever was more, itself included
	Outcome  spillway.Outcome // Success or Dropped; Ignored never reaches an Algorithm
}

// Algorithm computes a concurrency limit from completed requests: a
// *LatencyLimit (NewLatencyLimit) or an AIMD (NewAIMD); the interface is
// sealed. Adaptive calls it under its own lock.
type Algorithm interface {
	// value returns the current limit, at least 1.
	value() int
	// update records one completed request.
	update(s sample)
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

// NewAdaptive returns a limiter driven by alg (NewLatencyLimit or NewAIMD),
// named name in Decision.Limiter ("" is "adaptive"). It fails when alg is
// nil.
func NewAdaptive(alg Algorithm, name string) (*Adaptive, error) {
	if alg == nil || alg == (*LatencyLimit)(nil) {
		return nil, fmt.Errorf("concurrency: NewAdaptive: algorithm is nil")
	}
	if name == "" {
		name = "adaptive"
	}
	return &Adaptive{alg: alg, name: name, now: time.Now}, nil
}

// Limit returns the current limit.
func (a *Adaptive) Limit() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.alg.value()
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
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: a.name}, spillway.Noop, nil
	}
	a.mu.Lock()
	limit := a.alg.value()
	if a.inFlight >= limit {
		a.mu.Unlock()
		return spillway.Decision{Reason: spillway.ReasonShed, Limiter: a.name, Limit: int64(limit), RetryAfter: time.Second}, spillway.Noop, nil
	}
	a.inFlight++
	inFlight := a.inFlight
	a.mu.Unlock()
	start := a.now()
	d := spillway.Decision{Allowed: true, Limiter: a.name, Limit: int64(limit), Remaining: int64(limit - inFlight)}
	return d, block.Once(func(o spillway.Outcome) {
		rtt := a.now().Sub(start)
		a.mu.Lock()
		defer a.mu.Unlock()
		used := max(inFlight, a.inFlight)
		a.inFlight--
		if o == spillway.Success || o == spillway.Dropped {
			a.alg.update(sample{Start: start, RTT: rtt, InFlight: used, Outcome: o})
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

// aimd is NewAIMD's Algorithm. Drops of requests that started before the
// last decrease are ignored: the decrease already answered them.
type aimd struct {
	cfg          AIMDConfig
	limit        float64
	lastDecrease time.Time
}

// NewAIMD validates cfg and returns an Algorithm at cfg.Initial that is
// additive-increase, multiplicative-decrease, as TCP Reno: each success
// of a request that saw at least half the limit in use adds 1/limit (one
// per limit's worth of successes, i.e. about one per round trip); a drop
// (a Dropped outcome, or an RTT above Timeout) multiplies the limit by
// Backoff, at most once per round trip. It learns from failures only: for
// work whose latency says nothing about overload.
func NewAIMD(cfg AIMDConfig) (Algorithm, error) {
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
	return &aimd{cfg: cfg, limit: float64(cfg.Initial)}, nil
}

func (a *aimd) value() int { return int(a.limit) }

func (a *aimd) update(s sample) {
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
