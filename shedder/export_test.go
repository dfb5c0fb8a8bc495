package shedder

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

// SourceFunc adapts a function to Source.
type SourceFunc = sourceFunc
