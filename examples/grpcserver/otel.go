package main

// The demo's OpenTelemetry SDK. telemetry.Instrument only talks to the
// OpenTelemetry API; without an SDK every span and metric is a no-op. This
// file installs a real one with the stdout exporters, so that `go run` shows
// spillway's decisions. A service swaps the two exporters for OTLP and keeps
// the rest (docs/telemetry.md).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spillway-go/spillway/telemetry"
	"go.opentelemetry.io/otel/attribute"
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
	"google.golang.org/grpc"
)

// otelProviders are the providers handed to telemetry.Instrument (never
// installed as the otel globals) and how to flush them.
type otelProviders struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	shutdown func(context.Context) error
}

// setupOTel builds the providers for -otel. "none" gives no-op providers.
// "stdout" writes JSON to w (one line per document, indented when pretty),
// chosen so a terminal stays readable:
//
//   - spans: only the request spans whose spillway.decision event is a
//     denial or an error, as soon as the request ends (allowed requests are
//     counted in the metrics, not printed);
//   - metrics: every interval, what was recorded in that interval (delta
//     temporality), and nothing at all for an idle interval.
//
// shutdown exports what is left; call it before exiting.
func setupOTel(mode string, w io.Writer, interval time.Duration, pretty bool) (*otelProviders, error) {
	switch mode {
	case "none":
		return &otelProviders{tp: tracenoop.NewTracerProvider(), mp: metricnoop.NewMeterProvider(),
			shutdown: func(context.Context) error { return nil }}, nil
	case "stdout":
	default:
		return nil, fmt.Errorf("-otel %q: want stdout or none", mode)
	}
	if interval <= 0 {
		return nil, fmt.Errorf("-otel-interval %v: must be positive", interval)
	}
	res := resource.NewSchemaless(attribute.String("service.name", "spillway-grpcserver"))

	spanOpts := []stdouttrace.Option{stdouttrace.WithWriter(w)}
	metricOpts := []stdoutmetric.Option{stdoutmetric.WithWriter(w),
		stdoutmetric.WithTemporalitySelector(func(sdkmetric.InstrumentKind) metricdata.Temporality {
			return metricdata.DeltaTemporality
		})}
	if pretty {
		spanOpts = append(spanOpts, stdouttrace.WithPrettyPrint())
		metricOpts = append(metricOpts, stdoutmetric.WithPrettyPrint())
	}

	spans, err := stdouttrace.New(spanOpts...)
	if err != nil {
		return nil, err
	}
	// A simple (synchronous) processor prints a denial at once; a service
	// uses sdktrace.WithBatcher(otlpExporter) instead.
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(deniedOnly{sdktrace.NewSimpleSpanProcessor(spans)}))

	metrics, err := stdoutmetric.New(metricOpts...)
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
		sdkmetric.WithReader(sdkmetric.NewPeriodicReader(skipEmpty{metrics}, sdkmetric.WithInterval(interval))))

	return &otelProviders{tp: tp, mp: mp, shutdown: func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}}, nil
}

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

// The interceptors start the call's server span, as otelgrpc's stats
// handler would in a service, so that telemetry.Instrument has a span to add
// its spillway.decision event to. They go before grpcx's.
func tracedUnary(tracer trace.Tracer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := tracer.Start(ctx, info.FullMethod, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		return h(ctx, req)
	}
}

func tracedStream(tracer trace.Tracer) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, span := tracer.Start(ss.Context(), info.FullMethod, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		return h(srv, &tracedServerStream{ss, ctx})
	}
}

type tracedServerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedServerStream) Context() context.Context { return s.ctx }
