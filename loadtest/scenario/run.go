package scenario

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/spillway-go/spillway/loadtest/chains"
	"github.com/spillway-go/spillway/loadtest/sim"
)

// Params are the harness's settings (the flags).
type Params struct {
	Scenario  string
	Duration  time.Duration // total load time of the scenario, over all its configurations
	Seed      uint64
	Servers   int
	Out       string
	RedisAddr string
	Retry     sim.RetryMode // how well-behaved clients retry (abusive ones retry naively)
	// Scale multiplies the backend capacity and every offered rate (1 by
	// default); the test suite runs a smaller system.
	Scale   float64
	Quiet   bool
	Configs []string // configurations to run, by name; empty: all
	// Ablation also runs, in every scenario but goodput, the full chain
	// without each of its blocks in turn.
	Ablation bool
	// GaugeWindow is how often the database publishes its utilization
	// gauge (0: sim.DefaultGaugeWindow).
	GaugeWindow time.Duration
	// Debug, when not nil, counts what -debug prints; Trace, when not
	// nil, receives every change of a learned limit (-trace); NoProxy
	// connects the fleet to Redis directly (-no-proxy).
	Debug   *sim.Debug
	Trace   io.Writer
	NoProxy bool
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
	Series           *sim.Series   `json:"series"`
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
	// SettledGoodputRPS is, for a phase whose database capacity is lower
	// than the phase before, the goodput from DropGrace after its start
	// to its end (0 for other phases).
	SettledGoodputRPS float64 `json:"settled_goodput_rps,omitempty"`
}

// DropGrace is how long after the database's capacity falls the full
// chain's goodput is not judged: the queries admitted before any reading
// could show the fall (the gauge publishes every 250 ms, and a reading
// that straddles the fall shows an average) run on a database past its
// new capacity at up to four times their service time, and end within
// this second; docs/loadtest.md has the figures. The goodput over the
// whole phase is reported beside it.
const DropGrace = time.Second

func bucketWidth(total time.Duration) time.Duration {
	w := total / 100
	return min(max(w, 100*time.Millisecond), time.Second)
}

// load is what every configuration of a load scenario gets: the same
// Redis, phases and offered schedule.
type load struct {
	p      Params
	redis  *sim.RedisEnv
	phases []sim.Phase
	sched  []sim.Arrival
	pop    sim.Population
	prog   *Progress
	spec   Scenario
}

// runConfiguration drives one configuration through the phases with the
// schedule and returns its figures.
func (l *load) runConfiguration(ctx context.Context, env *chains.Env, cfg chains.Configuration, label string) (*ConfigResult, error) {
	p, phases, prog := l.p, l.phases, l.prog
	total := phases[len(phases)-1].End()
	width := bucketWidth(total)
	nLoad := int((total + width - 1) / width)
	rec := sim.NewRecorder(width, nLoad+int(10*time.Second/width)+1)
	rec.Debug = p.Debug

	l.redis.Flush()
	l.redis.Set(sim.RedisHealthy)
	db := env.System.NewBackend(rec)
	env.DBGauge = db.Gauge
	f := &fleet{cfg: cfg, env: env, db: db, rec: rec, workers: env.Workers}
	for i := 0; i < env.Servers; i++ {
		if err := f.start(); err != nil {
			f.close()
			return nil, err
		}
	}
	f.clients = sim.NewClients(f.urls(), l.pop.Clients(), env.System.ClientTimeout, p.Retry, rec)
	f.clients.Deadline = l.spec.Deadlines

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	rec.Restart()
	start := time.Now()
	var bg sync.WaitGroup
	var phaseErr error
	bg.Go(func() { l.redis.Probe(runCtx, rec, 50*time.Millisecond) })
	bg.Go(func() { f.monitor(runCtx, start, phases, prog, label) })
	bg.Go(func() {
		if phaseErr = f.followPhases(runCtx, start, phases, l.redis); phaseErr != nil {
			stop()
		}
	})
	lateness := dispatch(ctx, runCtx, start, l.sched, f.clients)
	sleepUntil(ctx, start.Add(total))
	stop() // no retries after the load ends
	bg.Wait()
	l.redis.Set(sim.RedisHealthy)
	f.clients.Close()
	f.close()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if phaseErr != nil {
		return nil, phaseErr
	}
	prog.Finish(total)
	r := summarize(cfg, env.System, rec.Snapshot(nLoad), phases)
	r.RejectedByLimiter = rec.RejectedByLimiter()
	r.DispatchLagP99MS = sim.Percentile(lateness, 0.99)
	return r, nil
}

// dispatch is the open-loop load generator: every arrival is sent at its
// time, whether or not earlier ones were answered (with runCtx, which
// ends with the load). It returns once every logical request is done,
// with how late each was sent, in milliseconds.
func dispatch(ctx, runCtx context.Context, start time.Time, sched []sim.Arrival, clients *sim.Clients) []float32 {
	var logical sync.WaitGroup
	lateness := make([]float32, 0, len(sched))
	for _, a := range sched {
		if !sleepUntil(ctx, start.Add(a.At)) {
			break
		}
		lateness = append(lateness, float32(time.Since(start.Add(a.At)).Seconds()*1000))
		logical.Go(func() { clients.Do(runCtx, a) })
	}
	logical.Wait()
	return lateness
}

// fleet is one configuration's API servers: every server started (dead
// ones included), their chains, and which are live.
type fleet struct {
	cfg     chains.Configuration
	env     *chains.Env
	db      *sim.Backend
	rec     *sim.Recorder
	workers int
	clients *sim.Clients

	mu      sync.Mutex
	servers []*sim.APIServer
	chains  []chains.ServerChain
	live    []int // indexes of the live servers, in join order
}

// start builds one more server's chain and starts the server.
func (f *fleet) start() error {
	i := len(f.servers)
	c, err := f.cfg.Build(f.env, i)
	if err != nil {
		return fmt.Errorf("loadtest: %s: server %d: %w", f.cfg.Name, i, err)
	}
	s, err := sim.StartAPIServer(c.Limiter, f.db, f.rec, sim.ServerOptions{Workers: f.workers, Export: c.Export, Deadlines: c.Deadlines})
	if err != nil {
		if c.Close != nil {
			c.Close()
		}
		return err
	}
	f.mu.Lock()
	f.chains = append(f.chains, c)
	f.servers = append(f.servers, s)
	f.live = append(f.live, i)
	f.mu.Unlock()
	return nil
}

// urls returns the live servers' addresses.
func (f *fleet) urls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, i := range f.live {
		out = append(out, f.servers[i].URL)
	}
	return out
}

// setLive kills the oldest live servers or starts new ones until n are
// live. A killed server stops at once: its connections close, its
// requests in flight fail, and its chain is not closed (a crash: its
// fleet report stays until its TTL).
func (f *fleet) setLive(n int) error {
	for {
		f.mu.Lock()
		cur := len(f.live)
		f.mu.Unlock()
		switch {
		case cur > n:
			f.mu.Lock()
			dead := f.servers[f.live[0]]
			f.live = f.live[1:]
			f.mu.Unlock()
			f.clients.SetServers(f.urls())
			dead.Kill()
		case cur < n:
			if err := f.start(); err != nil {
				return err
			}
			f.clients.SetServers(f.urls())
		default:
			return nil
		}
	}
}

// breakersOpen counts the live servers with a breaker not closed.
func (f *fleet) breakersOpen() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	open := 0
	for _, i := range f.live {
		if c := f.chains[i]; c.BreakerOpen != nil && c.BreakerOpen() {
			open++
		}
	}
	return open
}

// sampleLearned records the live servers' learned limits, when their
// chains have one.
func (f *fleet) sampleLearned() {
	f.mu.Lock()
	defer f.mu.Unlock()
	top, slots, n := 0, int64(0), 0
	for _, i := range f.live {
		if l := f.chains[i].Learned; l != nil {
			lim, s := l()
			top, slots, n = max(top, lim), slots+s, n+1
		}
	}
	if n > 0 {
		f.rec.Learned(top, slots)
	}
}

// close stops every server and closes every chain.
func (f *fleet) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.servers {
		s.Close()
	}
	for _, c := range f.chains {
		if c.Close != nil {
			c.Close()
		}
	}
}

// monitor records the breakers and moves the progress bar every 50 ms
// until ctx ends.
func (f *fleet) monitor(ctx context.Context, start time.Time, phases []sim.Phase, prog *Progress, label string) {
	total := phases[len(phases)-1].End()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	ph := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.rec.Breakers(f.breakersOpen())
		f.sampleLearned()
		el := time.Since(start)
		for ph < len(phases)-1 && el >= phases[ph].End() {
			ph++
		}
		prog.Update(label, phases[ph].Name, min(el, total))
	}
}

// followPhases makes Redis, the database's capacity, the live servers and
// the balancer follow the phases until ctx ends.
func (f *fleet) followPhases(ctx context.Context, start time.Time, phases []sim.Phase, redis *sim.RedisEnv) error {
	for _, ph := range phases {
		if !sleepUntil(ctx, start.Add(ph.Start)) {
			return nil
		}
		redis.Set(ph.Redis)
		f.db.SetCapacity(ph.Capacity)
		f.db.SetSlow(ph.Slow)
		f.db.SetStuck(ph.Stuck)
		f.clients.SetHotShare(ph.HotShare)
		if err := f.setLive(ph.Servers); err != nil {
			return err
		}
	}
	return nil
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

func summarize(cfg chains.Configuration, sys sim.System, s *sim.Series, phases []sim.Phase) *ConfigResult {
	n := len(s.T)
	r := &ConfigResult{
		Name:               cfg.Name,
		Title:              cfg.Title,
		Offered:            s.Count(s.Offered, 0, n),
		OfferedLogical:     s.Count(s.Logical, 0, n),
		Admitted:           s.Count(s.Admitted, 0, n),
		Goodput:            s.Count(s.Goodput, 0, n),
		GoodputRPS:         sim.Mean(s.Goodput, 0, n),
		BackendCapacity:    sys.Capacity,
		BackendCapacityRPS: sys.CapacityRPS(),
		BackendP99MS:       s.BackendP99In(0, s.Latencies()),
		RejectedByReason:   s.TotalsRejected(),
		DegradedDecisions:  s.Count(s.Degraded, 0, n),
		StoreErrors:        s.Count(s.StoreErrors, 0, n),
		Series:             s,
	}
	r.Retries = r.Offered - r.OfferedLogical
	r.BackendPeakConcurrency = int64(sim.MaxOf(s.BackendConc, 0, n))
	var ok, fail float64
	for i := 0; i < n; i++ {
		ok += s.CriticalOK[i]
		fail += s.CriticalFail[i]
	}
	r.CriticalRequests = int64(ok + fail)
	if ok+fail > 0 {
		r.CriticalSuccess = ok / (ok + fail)
	}
	for k, ph := range phases {
		i, j := s.Window(ph.Start, ph.End())
		pr := PhaseResult{
			Name:          ph.Name,
			Capacity:      ph.Capacity,
			OfferedRPS:    sim.Mean(s.Offered, i, j),
			AdmittedRPS:   sim.Mean(s.Admitted, i, j),
			GoodputRPS:    sim.Mean(s.Goodput, i, j),
			BackendPeak:   sim.MaxOf(s.BackendConc, i, j),
			BackendP99MS:  s.BackendP99In(i, j),
			DegradedRPS:   sim.Mean(s.Degraded, i, j),
			CriticalP99MS: s.CriticalP99In(i, j),
		}
		if k > 0 && ph.Capacity < phases[k-1].Capacity {
			pr.SettledGoodputRPS = sim.Mean(s.Goodput, min(j, i+s.Buckets(DropGrace)), j)
		}
		var ok, fail float64
		for b := i; b < j; b++ {
			ok += s.CriticalOK[b]
			fail += s.CriticalFail[b]
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
func (r *ConfigResult) setRecovery(s *sim.Series, phases []sim.Phase, before, recoveryPhase string, sys sim.System) {
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
func recovery(s *sim.Series, from time.Duration, before, capRPS float64) *float64 {
	i, n := s.Window(from, time.Duration(float64(len(s.T))*s.BucketSec*float64(time.Second)))
	win := max(1, int(math.Round(1/s.BucketSec)))
	target := 0.9 * before
	if before <= 0 {
		target = 0.9 * capRPS
	}
	healthy := func(k int) bool {
		g := sim.Mean(s.Goodput, max(i, k-win+1), k+1)
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
