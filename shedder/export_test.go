package shedder

import (
	"context"
	"runtime"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/learn"
)

// Test-only knobs and introspection, for the tests of package shedder_test.

// Knobs are the settings fixed at their defaults outside the tests (the
// Worker's and the Fleet's rand, the Worker's tick, band and steps, the
// Fleet's stale limit and auto refresh); zero values keep the defaults.
type Knobs = knobs

// With returns s with the test knobs k.
func (s WorkerSettings) With(k Knobs) WorkerSettings { s.knobs = k; return s }

// With returns s with the test knobs k.
func (s FleetSettings) With(k Knobs) FleetSettings { s.knobs = k; return s }

// SourceFunc adapts a function to Source.
type SourceFunc = sourceFunc

// ErrNoCgroup and ErrBadReading are the errors NewCgroupCPU and a
// watcher's Poll return.
var (
	ErrNoCgroup   = errNoCgroup
	ErrBadReading = errBadReading
)

// CgroupOption configures NewCgroupCPUWith.
type CgroupOption func(*cgroupConfig)

// WithRoot sets where the cgroup filesystem is mounted.
func WithRoot(dir string) CgroupOption { return func(c *cgroupConfig) { c.root = dir } }

// WithProcFile sets the file that names this process's cgroups.
func WithProcFile(path string) CgroupOption { return func(c *cgroupConfig) { c.procFile = path } }

// WithHostCPUs sets the limit used when no quota is set.
func WithHostCPUs(n int) CgroupOption { return func(c *cgroupConfig) { c.hostCPUs = n } }

// WithCgroupClock sets the clock that times usage deltas.
func WithCgroupClock(now func() time.Time) CgroupOption { return func(c *cgroupConfig) { c.now = now } }

// CgroupCPU is the Source NewCgroupCPU returns.
type CgroupCPU = cgroupCPU

// NewCgroupCPUWith is NewCgroupCPU with the defaults changed by opts.
func NewCgroupCPUWith(opts ...CgroupOption) (*CgroupCPU, error) {
	cfg := cgroupConfig{root: "/sys/fs/cgroup", procFile: "/proc/self/cgroup", now: time.Now, hostCPUs: runtime.NumCPU()}
	for _, o := range opts {
		o(&cfg)
	}
	return newCgroupCPU(cfg)
}

// LearnedLimit and Baseline read a LatencyLimit's learned limit and
// baseline.
func LearnedLimit(l *concurrency.LatencyLimit) int       { return learn.Of(l).Limit() }
func Baseline(l *concurrency.LatencyLimit) time.Duration { return learn.Of(l).Baseline() }

// Test access to what a user does not call.
func (f *Fleet) Run(ctx context.Context) error            { return f.run(ctx) }
func (f *Fleet) SetCapacity(n int64) error                { return f.setCapacity(n) }
func (f *Fleet) Allowance(p spillway.Priority) int64      { return f.allowance(p) }
func (f *Fleet) ServerID() string                         { return f.o.serverID }
func (p *Pool) Observe(r Reading)                         { p.observe(r) }
func (p *Pool) Slots() int64                              { return p.q.Stats().Slots }
func (q *Queue) SetSlots(n int64) error                   { return q.setSlots(n) }
func (q *Queue) Hold() time.Duration                      { return q.meanHold() }
func (q *Queue) Slots() int64                             { return q.Stats().Slots }
func (w *CapacityWatcher) Poll(ctx context.Context) error { return w.poll(ctx) }
func (w *CapacityWatcher) Last() Reading                  { return w.lastReading() }
func (w *CapacityWatcher) Errors() int64                  { return w.failures() }
func (w *Worker) Level() float64                          { return w.shedLevel() }
func (w *Worker) InFlight() int64                         { return w.inflight.Load() }
func (w *Worker) ShedProbability(p spillway.Priority) float64 {
	return shedProbability(w.shedLevel(), p)
}

// Knobs returns the test knobs of s.
func (s FleetSettings) Knobs() Knobs { return s.knobs }

func (f *Fleet) Capacity() int64       { return f.capacity.Load() }
func (w *Worker) Utilization() float64 { return w.Stats().Utilization }
func (w *Worker) SourceErrors() int64  { return w.Stats().SourceErrors }
