// Package demo is what the example servers share: their OpenTelemetry SDK
// (Prometheus /metrics, optional stdout export) and its command-line flags,
// and their connection to Redis with the health its blocks share.
package demo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spillway-go/spillway/telemetry"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Flags are the telemetry flags every example takes.
type Flags struct {
	Stdout   *string        // -otel: "none" or "stdout"
	Interval *time.Duration // -otel-interval
	Pretty   *bool          // -otel-pretty
}

// RegisterFlags adds -otel, -otel-interval and -otel-pretty to fs.
func RegisterFlags(fs *flag.FlagSet) Flags {
	return Flags{
		Stdout:   fs.String("otel", "none", "stdout: also print denied requests' spans and, every -otel-interval, the metrics as JSON on stdout; none: do not"),
		Interval: fs.Duration("otel-interval", 10*time.Second, "how often -otel stdout prints the metrics"),
		Pretty:   fs.Bool("otel-pretty", false, "indent the -otel stdout JSON instead of one line per document"),
	}
}

// Telemetry is an example's OpenTelemetry SDK. Its providers are handed to
// telemetry.Instrument (Settings) and never installed as the otel globals.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Metrics serves the Prometheus text format of every metric
	// (spillway_decisions_total, spillway_decision_duration_seconds, …);
	// nil when Prometheus is off.
	Metrics  http.Handler
	shutdown func(context.Context) error
}

// Setup builds the SDK for service (the service.name resource attribute).
// With prometheus, Metrics serves every metric, cumulative, as Prometheus
// scrapes it. With f's -otel stdout, w gets JSON, chosen so that a terminal
// stays readable:
//
//   - spans: only the request spans whose spillway.decision event is a
//     denial or an error, as soon as the request ends (allowed requests are
//     counted in the metrics, not printed);
//   - metrics: every interval, what was recorded in that interval (delta
//     temporality), and nothing at all for an idle interval.
//
// Shutdown exports what is left; call it before exiting. A service keeps
// this shape and swaps the stdout exporters for OTLP (docs/telemetry.md).
func Setup(service string, f Flags, prom bool, w io.Writer) (*Telemetry, error) {
	stdout := false
	switch *f.Stdout {
	case "none":
	case "stdout":
		stdout = true
	default:
		return nil, fmt.Errorf("-otel %q: want stdout or none", *f.Stdout)
	}
	if *f.Interval <= 0 {
		return nil, fmt.Errorf("-otel-interval %v: must be positive", *f.Interval)
	}
	t := &Telemetry{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider(),
		shutdown: func(context.Context) error { return nil }}
	if !stdout && !prom {
		return t, nil
	}
	res := resource.NewSchemaless(attribute.String("service.name", service))
	var readers []sdkmetric.Option
	var shutdowns []func(context.Context) error

	if prom {
		// A registry of our own, not Prometheus' global one: two servers in
		// one process (tests) must not collide.
		reg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, err
		}
		readers = append(readers, sdkmetric.WithReader(exp))
		t.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	if stdout {
		spanOpts := []stdouttrace.Option{stdouttrace.WithWriter(w)}
		metricOpts := []stdoutmetric.Option{stdoutmetric.WithWriter(w),
			stdoutmetric.WithTemporalitySelector(func(sdkmetric.InstrumentKind) metricdata.Temporality {
				return metricdata.DeltaTemporality
			})}
		if *f.Pretty {
			spanOpts = append(spanOpts, stdouttrace.WithPrettyPrint())
			metricOpts = append(metricOpts, stdoutmetric.WithPrettyPrint())
		}
		spans, err := stdouttrace.New(spanOpts...)
		if err != nil {
			return nil, err
		}
		// A simple (synchronous) processor prints a denial at once; a
		// service uses sdktrace.WithBatcher(otlpExporter) instead.
		tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res),
			sdktrace.WithSpanProcessor(deniedOnly{sdktrace.NewSimpleSpanProcessor(spans)}))
		t.TracerProvider = tp
		shutdowns = append(shutdowns, tp.Shutdown)
		metrics, err := stdoutmetric.New(metricOpts...)
		if err != nil {
			return nil, err
		}
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(skipEmpty{metrics}, sdkmetric.WithInterval(*f.Interval))))
	}
	mp := sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
	t.MeterProvider = mp
	shutdowns = append(shutdowns, mp.Shutdown)
	t.shutdown = func(ctx context.Context) error {
		var errs []error
		for _, s := range shutdowns {
			errs = append(errs, s(ctx))
		}
		return errors.Join(errs...)
	}
	return t, nil
}

// Settings returns the telemetry.Instrument settings that use t's providers.
func (t *Telemetry) Settings() telemetry.Settings {
	return telemetry.Settings{TracerProvider: t.TracerProvider, MeterProvider: t.MeterProvider}
}

// Shutdown flushes what is left: the spans and the last interval's metrics.
func (t *Telemetry) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }

// deniedOnly passes on only the spans that carry a spillway.decision event
// whose outcome is not "allowed".
type deniedOnly struct{ sdktrace.SpanProcessor }

func (p deniedOnly) OnEnd(s sdktrace.ReadOnlySpan) {
	for _, e := range s.Events() {
		if e.Name != telemetry.EventDecision {
			continue
		}
		for _, a := range e.Attributes {
			if a.Key == telemetry.KeyOutcome && a.Value.AsString() != telemetry.OutcomeAllowed {
				p.SpanProcessor.OnEnd(s)
				return
			}
		}
	}
}

// skipEmpty drops the exports of intervals in which nothing was recorded.
type skipEmpty struct{ sdkmetric.Exporter }

func (e skipEmpty) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	for _, sm := range rm.ScopeMetrics {
		if len(sm.Metrics) > 0 {
			return e.Exporter.Export(ctx, rm)
		}
	}
	return nil
}

// MaxWork caps the work a demo request may ask for.
const MaxWork = 10 * time.Second

// Work stands for a handler's real work: it waits d (at most MaxWork), or
// until ctx ends (the client went away, the server stops).
func Work(ctx context.Context, d time.Duration) {
	t := time.NewTimer(min(d, MaxWork))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
