package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/spillway-go/spillway"
)

// Params are the harness's settings (the flags).
type Params struct {
	Scenario  string
	Duration  time.Duration // total load time of the scenario, over all its configurations
	Seed      uint64
	Servers   int
	Out       string
	RedisAddr string
	Retry     RetryMode // how well-behaved clients retry (abusive ones retry naively)
	// Scale multiplies the backend capacity and every offered rate (1 by
	// default); the test suite runs a smaller system.
	Scale   float64
	Quiet   bool
	Configs []string // configurations to run, by name; empty: all
	// Ablation also runs, in every scenario but goodput, the full chain
	// without each of its blocks in turn.
	Ablation bool
}

// System is the simulated system's shape, derived from Params.
type System struct {
	Capacity      int           // backend concurrency capacity
	Service       time.Duration // backend mean service time
	ClientTimeout time.Duration // per attempt
	Baseline      float64       // baseline offered rate, logical req/s
}

func systemFor(p Params) System {
	s := System{
		Capacity:      30,
		Service:       200 * time.Millisecond,
		ClientTimeout: time.Second,
	}
	s.Capacity = max(2, int(math.Round(float64(s.Capacity)*p.Scale)))
	// Baseline: a quarter of the capacity; the spike is 10× that (2.5× the
	// capacity).
	s.Baseline = float64(s.Capacity) / s.Service.Seconds() / 4
	return s
}

func (s System) capacityRPS() float64 { return float64(s.Capacity) / s.Service.Seconds() }

func (s System) newBackend(rec *Recorder) *Backend {
	b := &Backend{
		Service:          s.Service,
		Thrash:           1,
		MaxConns:         s.Capacity * 16,
		StatementTimeout: 2 * time.Second,
		rec:              rec,
	}
	b.SetCapacity(s.Capacity)
	return b
}

// Env is what a configuration builds its servers' chains from.
type Env struct {
	Redis   *RedisEnv
	Servers int
	System  System
	Prefix  string // Redis key prefix of this configuration
	// DBGauge reads the database's utilization gauge (what it publishes
	// about its last window, as a metrics endpoint would).
	DBGauge func() Gauge
}

// ServerChain is one server's limiter and its probes.
type ServerChain struct {
	Limiter     spillway.Limiter // nil: no limiter
	BreakerOpen func() bool      // nil: no breaker
	Close       func()           // nil: nothing to close
}

// Configuration is one of the systems a scenario compares.
type Configuration struct {
	Name    string
	Title   string
	Build   func(env *Env, server int) (ServerChain, error)
	removed string // ablation: the block the full chain runs without
}

// ConfigResult is one configuration's outcome in one scenario.
type ConfigResult struct {
	Name                   string           `json:"name"`
	Title                  string           `json:"title"`
	Offered                int64            `json:"offered"`                 // attempts sent, retries included
	Removed                string           `json:"removed_block,omitempty"` // ablation: the block left out of the full chain
	OfferedLogical         int64            `json:"offered_logical"`
	Retries                int64            `json:"retries"`
	Admitted               int64            `json:"admitted"`
	Goodput                int64            `json:"goodput"` // 200 answers within the client timeout
	GoodputRPS             float64          `json:"goodput_rps"`
	BackendPeakConcurrency int64            `json:"backend_peak_concurrency"`
	BackendCapacity        int              `json:"backend_capacity"`
	BackendCapacityRPS     float64          `json:"backend_capacity_rps"`
	BackendP99MS           float64          `json:"backend_p99_ms"`
	RejectedByReason       map[string]int64 `json:"rejected_by_reason"`
	RejectedByLimiter      map[string]int64 `json:"rejected_by_limiter"` // the block that denied → denials
	DegradedDecisions      int64            `json:"degraded_decisions"`
	StoreErrors            int64            `json:"store_errors"`
	RecoverySeconds        *float64         `json:"recovery_seconds"` // null: did not recover (or no recovery phase)
	CriticalRequests       int64            `json:"critical_requests"`
	CriticalSuccess        float64          `json:"critical_success"`
	// DispatchLagP99MS is how late the load generator sent its requests
	// (p99): a busy machine starves the harness itself, and past ~50 ms
	// the figures describe the machine more than the system under test.
	DispatchLagP99MS float64       `json:"dispatch_lag_p99_ms"`
	Phases           []PhaseResult `json:"phases"`
	Series           *Series       `json:"series"`
}

// PhaseResult is a configuration's figures over one phase.
type PhaseResult struct {
	Name             string  `json:"name"`
	Capacity         int     `json:"db_capacity"`
	OfferedRPS       float64 `json:"offered_rps"`
	AdmittedRPS      float64 `json:"admitted_rps"`
	GoodputRPS       float64 `json:"goodput_rps"`
	BackendPeak      float64 `json:"backend_peak_concurrency"`
	BackendP99MS     float64 `json:"backend_p99_ms"`
	DegradedRPS      float64 `json:"degraded_rps"`
	CriticalP99MS    float64 `json:"critical_p99_ms"`
	CriticalSuccess  float64 `json:"critical_success"`
	CriticalRequests int64   `json:"critical_requests"`
}

func bucketWidth(total time.Duration) time.Duration {
	w := total / 100
	return min(max(w, 100*time.Millisecond), time.Second)
}

// runConfiguration drives one configuration through the phases with the
// schedule and returns its figures.
func runConfiguration(ctx context.Context, p Params, env *Env, cfg Configuration, phases []Phase, sched []Arrival, pop Population, prog *Progress, label string) (*ConfigResult, error) {
	total := phases[len(phases)-1].End()
	width := bucketWidth(total)
	nLoad := int((total + width - 1) / width)
	rec := NewRecorder(width, nLoad+int(10*time.Second/width)+1)

	env.Redis.Flush()
	env.Redis.Set(redisHealthy)
	db := env.System.newBackend(rec)
	env.DBGauge = db.Gauge

	var (
		mu      sync.Mutex
		servers []*APIServer // every server started, dead ones included
		chains  []ServerChain
		live    []int // indexes of the live servers, in join order
	)
	cleanup := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range servers {
			s.Close()
		}
		for _, c := range chains {
			if c.Close != nil {
				c.Close()
			}
		}
	}
	start1 := func() error {
		i := len(servers)
		c, err := cfg.Build(env, i)
		if err != nil {
			return fmt.Errorf("loadtest: %s: server %d: %w", cfg.Name, i, err)
		}
		s, err := StartAPIServer(c.Limiter, db, rec)
		if err != nil {
			if c.Close != nil {
				c.Close()
			}
			return err
		}
		mu.Lock()
		chains = append(chains, c)
		servers = append(servers, s)
		live = append(live, i)
		mu.Unlock()
		return nil
	}
	urlsOf := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, i := range live {
			out = append(out, servers[i].URL)
		}
		return out
	}
	for i := 0; i < env.Servers; i++ {
		if err := start1(); err != nil {
			cleanup()
			return nil, err
		}
	}
	clients := NewClients(urlsOf(), pop.Clients(), env.System.ClientTimeout, p.Retry, rec)
	// setLive kills the oldest live servers or starts new ones until n
	// live. A killed server stops at once: its connections close, its
	// requests in flight fail, and its chain is not closed (a crash: its
	// fleet report stays until its TTL).
	setLive := func(n int) error {
		for {
			mu.Lock()
			cur := len(live)
			mu.Unlock()
			switch {
			case cur > n:
				mu.Lock()
				dead := servers[live[0]]
				live = live[1:]
				mu.Unlock()
				clients.SetServers(urlsOf())
				dead.Kill()
			case cur < n:
				if err := start1(); err != nil {
					return err
				}
				clients.SetServers(urlsOf())
			default:
				return nil
			}
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	rec.Restart()
	start := time.Now()
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); env.Redis.Probe(runCtx, rec, 50*time.Millisecond) }()
	go func() {
		defer bg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		ph := 0
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			open := 0
			mu.Lock()
			for _, i := range live {
				if c := chains[i]; c.BreakerOpen != nil && c.BreakerOpen() {
					open++
				}
			}
			mu.Unlock()
			rec.Breakers(open)
			el := time.Since(start)
			for ph < len(phases)-1 && el >= phases[ph].End() {
				ph++
			}
			prog.Update(label, phases[ph].Name, min(el, total))
		}
	}()

	// Phase changes: Redis, the database's capacity, the live servers and
	// the balancer follow the phase.
	var phaseErr error
	bg.Add(1)
	go func() {
		defer bg.Done()
		for _, ph := range phases {
			if !sleepUntil(runCtx, start.Add(ph.Start)) {
				return
			}
			env.Redis.Set(ph.Redis)
			db.SetCapacity(ph.Capacity)
			clients.SetHotShare(ph.HotShare)
			if err := setLive(ph.Servers); err != nil {
				phaseErr = err
				stop()
				return
			}
		}
	}()

	// The open-loop dispatcher: every arrival is sent at its time, whether
	// or not earlier ones were answered.
	var logical sync.WaitGroup
	lateness := make([]float32, 0, len(sched))
	for _, a := range sched {
		if !sleepUntil(ctx, start.Add(a.At)) {
			break
		}
		lateness = append(lateness, float32(time.Since(start.Add(a.At)).Seconds()*1000))
		logical.Add(1)
		go func(a Arrival) {
			defer logical.Done()
			clients.Do(runCtx, a)
		}(a)
	}
	sleepUntil(ctx, start.Add(total))
	stop() // no retries after the load ends
	logical.Wait()
	bg.Wait()
	env.Redis.Set(redisHealthy)
	clients.Close()
	cleanup()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if phaseErr != nil {
		return nil, phaseErr
	}
	prog.Finish(total)
	r := summarize(cfg, env.System, rec.Snapshot(nLoad), phases)
	r.RejectedByLimiter = rec.RejectedByLimiter()
	r.DispatchLagP99MS = percentile(lateness, 0.99)
	return r, nil
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	// Waking up costs more than a few milliseconds of accuracy on a busy
	// machine: arrivals due within 2 ms go out now, in one batch.
	if d <= 2*time.Millisecond {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

func summarize(cfg Configuration, sys System, s *Series, phases []Phase) *ConfigResult {
	n := len(s.T)
	r := &ConfigResult{
		Name:               cfg.Name,
		Title:              cfg.Title,
		Offered:            s.count(s.Offered, 0, n),
		OfferedLogical:     s.count(s.Logical, 0, n),
		Admitted:           s.count(s.Admitted, 0, n),
		Goodput:            s.count(s.Goodput, 0, n),
		GoodputRPS:         mean(s.Goodput, 0, n),
		BackendCapacity:    sys.Capacity,
		BackendCapacityRPS: sys.capacityRPS(),
		BackendP99MS:       s.backendP99(0, len(s.backendLat)),
		RejectedByReason:   s.totalsRejected,
		DegradedDecisions:  s.count(s.Degraded, 0, n),
		StoreErrors:        s.count(s.StoreErrors, 0, n),
		Series:             s,
	}
	r.Retries = r.Offered - r.OfferedLogical
	r.BackendPeakConcurrency = int64(maxOf(s.BackendConc, 0, n))
	var ok, fail float64
	for i := 0; i < n; i++ {
		ok += s.CriticalOK[i]
		fail += s.CriticalFail[i]
	}
	r.CriticalRequests = int64(ok + fail)
	if ok+fail > 0 {
		r.CriticalSuccess = ok / (ok + fail)
	}
	for _, ph := range phases {
		i, j := s.window(ph.Start, ph.End())
		pr := PhaseResult{
			Name:          ph.Name,
			Capacity:      ph.Capacity,
			OfferedRPS:    mean(s.Offered, i, j),
			AdmittedRPS:   mean(s.Admitted, i, j),
			GoodputRPS:    mean(s.Goodput, i, j),
			BackendPeak:   maxOf(s.BackendConc, i, j),
			BackendP99MS:  s.backendP99(i, j),
			DegradedRPS:   mean(s.Degraded, i, j),
			CriticalP99MS: s.criticalP99(i, j),
		}
		var ok, fail float64
		for k := i; k < j; k++ {
			ok += s.CriticalOK[k]
			fail += s.CriticalFail[k]
		}
		if ok+fail > 0 {
			pr.CriticalSuccess = ok / (ok + fail)
		}
		pr.CriticalRequests = int64(ok + fail)
		r.Phases = append(r.Phases, pr)
	}
	return r
}

// setRecovery measures recovery from the start of the phase named
// recoveryPhase back to the goodput of the phase named before.
func (r *ConfigResult) setRecovery(s *Series, phases []Phase, before, recoveryPhase string, sys System) {
	var b float64
	for k, ph := range phases {
		if ph.Name == before {
			b = r.Phases[k].GoodputRPS
		}
	}
	for _, ph := range phases {
		if ph.Name == recoveryPhase {
			capRPS := float64(ph.Capacity) / sys.Service.Seconds()
			r.RecoverySeconds = recovery(s, ph.Start, min(b, capRPS), capRPS)
		}
	}
}

// recovery returns how long after from the system was back, for good, to
// what it did before the fault: no degraded decision, no store error, no
// open breaker, and goodput (1 s moving average) at ≥ 90% of its mean in
// the phase before the fault (before, or the capacity when before is 0).
// nil when it never was.
func recovery(s *Series, from time.Duration, before, capRPS float64) *float64 {
	i, n := s.window(from, time.Duration(float64(len(s.T))*s.BucketSec*float64(time.Second)))
	win := max(1, int(math.Round(1/s.BucketSec)))
	target := 0.9 * before
	if before <= 0 {
		target = 0.9 * capRPS
	}
	healthy := func(k int) bool {
		g := mean(s.Goodput, max(i, k-win+1), k+1)
		return s.Degraded[k] == 0 && s.StoreErrors[k] == 0 && s.BreakersOpen[k] == 0 && g >= target
	}
	first := -1
	for k := n - 1; k >= i; k-- {
		if !healthy(k) {
			break
		}
		first = k
	}
	if first < 0 {
		return nil
	}
	v := math.Round((float64(first)*s.BucketSec-from.Seconds())*100) / 100
	v = max(0, v)
	return &v
}
