package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/spillway-go/spillway/fallback"
)

// ObserveBreaker publishes the state of the breaker named breaker on the
// gauge spillway.breaker.state (0 closed, 1 half-open, 2 open: the
// numbers of fallback.State) with the attribute spillway.breaker, by
// reading it at every collection: state is called by the meter's reader,
// so the gauge is right even when no transition happened since the
// process started. Use it with a shared health:
//
//	stop, err := telemetry.ObserveBreaker("redis", health.State, nil)
//
// The name must be one of few (one per breaker, never a key). mp is the
// meter provider (nil: otel.GetMeterProvider()). stop unregisters the
// callback.
func ObserveBreaker(breaker string, state func() fallback.State, mp metric.MeterProvider) (stop func() error, err error) {
	if state == nil {
		return nil, fmt.Errorf("telemetry: ObserveBreaker %q: state func is nil", breaker)
	}
	m := meterProvider(mp).Meter(ScopeName)
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
