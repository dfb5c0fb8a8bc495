package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// BreakerState is a circuit breaker's state as published by BreakerGauge.
// The gauge's value is the number: 0 closed, 1 half-open, 2 open.
type BreakerState int64

const (
	BreakerClosed   BreakerState = 0 // calls go to the store
	BreakerHalfOpen BreakerState = 1 // probing the store
	BreakerOpen     BreakerState = 2 // the store is skipped; decisions are local
)

var breakerNames = [...]string{"closed", "half_open", "open"}

// String returns "closed", "half_open" or "open".
func (s BreakerState) String() string {
	if s >= 0 && int(s) < len(breakerNames) {
		return breakerNames[s]
	}
	return fmt.Sprintf("breaker_state(%d)", int64(s))
}

// ParseBreakerState parses a state name: "closed", "half_open" (or
// "half-open") or "open", the spellings sony/gobreaker's State.String uses
// included.
func ParseBreakerState(s string) (BreakerState, error) {
	switch s {
	case "closed":
		return BreakerClosed, nil
	case "half_open", "half-open":
		return BreakerHalfOpen, nil
	case "open":
		return BreakerOpen, nil
	}
	return 0, fmt.Errorf("telemetry: unknown breaker state %q (want closed, half_open or open)", s)
}

// BreakerGauge publishes the state of named circuit breakers as the gauge
// spillway.breaker.state (0 closed, 1 half-open, 2 open) with the attribute
// spillway.breaker. Feed it from a breaker's state-change hook; the names
// must be few (one per breaker, never a key).
type BreakerGauge struct {
	gauge metric.Int64Gauge
}

// NewBreakerGauge creates the gauge from the meter provider in opts
// (default otel.GetMeterProvider()).
func NewBreakerGauge(opts ...Option) *BreakerGauge {
	c := newConfig(opts)
	g, err := c.mp.Meter(ScopeName).Int64Gauge(MetricBreakerState,
		metric.WithDescription("Circuit breaker state: 0 closed, 1 half-open, 2 open."),
		metric.WithUnit("{state}"))
	if err != nil {
		otel.Handle(err)
		return &BreakerGauge{}
	}
	return &BreakerGauge{gauge: g}
}

// Record publishes that breaker is now in state s.
func (g *BreakerGauge) Record(ctx context.Context, breaker string, s BreakerState) {
	if g == nil || g.gauge == nil {
		return
	}
	g.gauge.Record(ctx, int64(s), metric.WithAttributes(attribute.String(string(KeyBreaker), breaker)))
}

// OnStateChange returns a hook for a breaker named breaker that takes state
// names (as sony/gobreaker's State.String gives them: "closed", "half-open",
// "open"); an unknown name is ignored.
func (g *BreakerGauge) OnStateChange(breaker string) func(from, to string) {
	return func(_, to string) {
		if s, err := ParseBreakerState(to); err == nil {
			g.Record(context.Background(), breaker, s)
		}
	}
}

// ObserveBreaker publishes the state of the breaker named breaker on the
// gauge spillway.breaker.state by reading it at every collection: state is
// called by the meter's reader, so the gauge is right even when no
// transition happened since the process started (a hook-fed gauge shows
// nothing until the first change). Use it with a shared health:
//
//	telemetry.ObserveBreaker("redis", func() telemetry.BreakerState {
//		return telemetry.BreakerState(health.State())
//	})
//
// fallback.State and BreakerState number the states alike. The meter
// provider comes from opts (default otel.GetMeterProvider()). stop
// unregisters the callback.
func ObserveBreaker(breaker string, state func() BreakerState, opts ...Option) (stop func() error, err error) {
	if state == nil {
		return nil, fmt.Errorf("telemetry: ObserveBreaker %q: state func is nil", breaker)
	}
	c := newConfig(opts)
	m := c.mp.Meter(ScopeName)
	g, err := m.Int64ObservableGauge(MetricBreakerState,
		metric.WithDescription("Circuit breaker state: 0 closed, 1 half-open, 2 open."),
		metric.WithUnit("{state}"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: ObserveBreaker %q: %w", breaker, err)
	}
	attrs := metric.WithAttributes(attribute.String(string(KeyBreaker), breaker))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g, int64(state()), attrs)
		return nil
	}, g)
	if err != nil {
		return nil, fmt.Errorf("telemetry: ObserveBreaker %q: %w", breaker, err)
	}
	return reg.Unregister, nil
}
