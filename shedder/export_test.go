package shedder

import (
	"runtime"
	"time"

	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/learn"
)

// Test-only knobs, for the tests of package shedder_test.

// WithRand sets the Worker's and the Fleet's source of uniform random
// numbers.
func WithRand(f func() float64) interface {
	WorkerOption
	FleetOption
} {
	return withRand(f)
}

// WithoutAutoRefresh stops a Fleet's Admit from starting refreshes.
var WithoutAutoRefresh = withoutAutoRefresh

// The Worker's tick, band and steps and the Fleet's stale limit, fixed
// at their defaults outside the tests.
var (
	WithTick       = withTick
	WithBand       = withBand
	WithSteps      = withSteps
	WithStaleAfter = withStaleAfter
)

// SourceFunc adapts a function to Source.
type SourceFunc = sourceFunc

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
