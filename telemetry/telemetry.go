package telemetry

import (
	"context"
	"time"

	"github.com/spillway-go/spillway"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/spillway-go/spillway/telemetry"

// Attribute keys used on spans and metrics.
const (
	KeyLimiter   = attribute.Key("spillway.limiter")    // the name given to Instrument
	KeyDecidedBy = attribute.Key("spillway.decided_by") // Decision.Limiter; spans only
	KeyOutcome   = attribute.Key("spillway.outcome")    // allowed, denied, error
	KeyReason    = attribute.Key("spillway.reason")     // Reason.String()
	KeyLimit     = attribute.Key("spillway.limit")      // spans only
	KeyRemaining = attribute.Key("spillway.remaining")  // spans only
	KeyDegraded  = attribute.Key("spillway.degraded")
	KeyPriority  = attribute.Key("spillway.priority") // Priority.String()
	KeyLatency   = attribute.Key("spillway.latency_us")
	KeyRetry     = attribute.Key("spillway.retry_after_ms") // spans only, denials
	KeyBreaker   = attribute.Key("spillway.breaker")
)

// Metric and event names.
const (
	EventDecision      = "spillway.decision"
	SpanAdmit          = "spillway.admit"
	MetricDecisions    = "spillway.decisions"
	MetricDuration     = "spillway.decision.duration"
	MetricBreakerState = "spillway.breaker.state"
)

// Outcome values of KeyOutcome.
const (
	OutcomeAllowed = "allowed"
	OutcomeDenied  = "denied"
	OutcomeError   = "error"
)

// durationBuckets are the histogram bounds of spillway.decision.duration in
// seconds: decisions take microseconds (memory) to milliseconds (Redis).
var durationBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// Settings configures Instrument. The zero value uses the global
// providers and records each decision as an event on the request's span.
type Settings struct {
	// TracerProvider is used for child spans (ChildSpan); nil:
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider creates the instruments; nil: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// ChildSpan records each decision as a child span "spillway.admit"
	// (which times the decision) instead of an event on the request's
	// span.
	ChildSpan bool
	// Clock times decisions (default time.Now).
	Clock func() time.Time
}

// meterProvider is mp, or otel.GetMeterProvider() when mp is nil.
func meterProvider(mp metric.MeterProvider) metric.MeterProvider {
	if mp == nil {
		return otel.GetMeterProvider()
	}
	return mp
}

var outcomes = [3]string{OutcomeAllowed, OutcomeDenied, OutcomeError}

const numReasons = int(spillway.ReasonInvalid) + 1

type instrumented struct {
	next      spillway.Limiter
	name      string
	tracer    trace.Tracer
	childSpan bool
	now       func() time.Time
	decisions metric.Int64Counter
	duration  metric.Float64Histogram
	// Precomputed attribute sets, so the hot path allocates none:
	// counter by [outcome][degraded][priority][reason], histogram by
	// [outcome][degraded].
	counterAttrs [3][2][spillway.NumPriorities][numReasons]metric.MeasurementOption
	durAttrs     [3][2]metric.MeasurementOption
}

// Instrument wraps l so that every decision is traced and counted under
// name (bounded: a limiter or chain name, never a key). Instrument errors
// from the meter go to otel.Handle and leave that instrument a no-op.
//
// A decision a block made locally because Redis failed carries
// Decision.Degraded and is counted with degraded="true".
func Instrument(l spillway.Limiter, name string, s Settings) spillway.Limiter {
	tp := s.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	now := s.Clock
	if now == nil {
		now = time.Now
	}
	meter := meterProvider(s.MeterProvider).Meter(ScopeName)
	in := &instrumented{
		next:      l,
		name:      name,
		tracer:    tp.Tracer(ScopeName),
		childSpan: s.ChildSpan,
		now:       now,
	}
	var err error
	in.decisions, err = meter.Int64Counter(MetricDecisions,
		metric.WithDescription("Admission decisions by limiter, outcome, degraded, priority and reason."),
		metric.WithUnit("{decision}"))
	if err != nil {
		otel.Handle(err)
	}
	in.duration, err = meter.Float64Histogram(MetricDuration,
		metric.WithDescription("Time to decide one admission (store round trip included)."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		otel.Handle(err)
	}
	lim := KeyLimiter.String(name)
	for o := range 3 {
		for g := range 2 {
			in.durAttrs[o][g] = metric.WithAttributeSet(attribute.NewSet(lim, KeyOutcome.String(outcomes[o]), KeyDegraded.Bool(g == 1)))
			for p := range spillway.NumPriorities {
				for r := range numReasons {
					in.counterAttrs[o][g][p][r] = metric.WithAttributeSet(attribute.NewSet(lim,
						KeyOutcome.String(outcomes[o]), KeyDegraded.Bool(g == 1),
						KeyPriority.String(spillway.Priority(p).String()), KeyReason.String(spillway.Reason(r).String())))
				}
			}
		}
	}
	return in
}

func (in *instrumented) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	var span trace.Span
	if in.childSpan {
		ctx, span = in.tracer.Start(ctx, SpanAdmit, trace.WithSpanKind(trace.SpanKindInternal))
	} else {
		span = trace.SpanFromContext(ctx)
	}
	start := in.now()
	d, done, err := in.next.Admit(ctx, r)
	in.record(ctx, span, r, d, err, err, in.now().Sub(start))
	return d, done, err
}

// record counts and traces one decision: d, or the error err when not
// nil. cause is the error the limiter returned, for the span (a fallback
// replaced it with d when err is nil).
func (in *instrumented) record(ctx context.Context, span trace.Span, r *spillway.Request, d spillway.Decision, err, cause error, elapsed time.Duration) {
	o := 0
	switch {
	case err != nil:
		o = 2
	case !d.Allowed:
		o = 1
	}
	g := 0
	if d.Degraded {
		g = 1
	}
	// A nil request (denied by the block) is recorded with an invalid
	// priority rather than dereferenced.
	prio := spillway.Priority(-1)
	if r != nil {
		prio = r.Priority
	}
	if in.decisions != nil {
		if p, rs := int(prio), int(d.Reason); prio.Valid() && rs < numReasons {
			in.decisions.Add(ctx, 1, in.counterAttrs[o][g][p][rs])
		} else {
			in.decisions.Add(ctx, 1, metric.WithAttributes(KeyLimiter.String(in.name),
				KeyOutcome.String(outcomes[o]), KeyDegraded.Bool(d.Degraded),
				KeyPriority.String(prio.String()), KeyReason.String(d.Reason.String())))
		}
	}
	if in.duration != nil {
		in.duration.Record(ctx, elapsed.Seconds(), in.durAttrs[o][g])
	}
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 10)
		attrs = append(attrs,
			KeyLimiter.String(in.name),
			KeyDecidedBy.String(d.Limiter),
			KeyOutcome.String(outcomes[o]),
			KeyReason.String(d.Reason.String()),
			KeyLimit.Int64(d.Limit),
			KeyRemaining.Int64(d.Remaining),
			KeyDegraded.Bool(d.Degraded),
			KeyPriority.String(prio.String()),
			KeyLatency.Int64(elapsed.Microseconds()),
		)
		if o == 1 {
			attrs = append(attrs, KeyRetry.Int64(d.RetryAfter.Milliseconds()))
		}
		if in.childSpan {
			span.SetAttributes(attrs...)
			if cause != nil {
				span.RecordError(cause)
			}
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		} else {
			opts := []trace.EventOption{trace.WithAttributes(attrs...)}
			if cause != nil {
				opts = append(opts, trace.WithAttributes(attribute.String("exception.message", cause.Error())))
			}
			span.AddEvent(EventDecision, opts...)
		}
	} else if in.childSpan {
		span.End()
	}
}
