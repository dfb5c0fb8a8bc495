package telemetry_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/testclock"
)

// stepClock advances 150µs on every reading.
func stepClock() func() time.Time {
	c := testclock.New(time.Unix(1_800_000_000, 0))
	c.SetStep(150 * time.Microsecond)
	return c.Now
}

type script struct {
	ds   []spillway.Decision
	errs []error
	i    int
}

func (s *script) Admit(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
	d, err := s.ds[s.i], s.errs[s.i]
	s.i++
	return d, spillway.Noop, err
}

func setup() (*tracetest.SpanRecorder, *sdktrace.TracerProvider, *sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	return sr, tp, reader, mp
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, telemetry.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func TestSpanEventsAndMetrics(t *testing.T) {
	sr, tp, reader, mp := setup()
	storeDown := errors.New("redis: i/o timeout")
	inner := &script{
		ds: []spillway.Decision{
			{Allowed: true, Limiter: "per_ip", Limit: 10, Remaining: 9, ResetAfter: time.Second},
			{Reason: spillway.ReasonRateLimited, Limiter: "per_user", Limit: 5, RetryAfter: 1500 * time.Millisecond, Degraded: true},
			{},
			{Allowed: true, Limiter: "per_ip", Limit: 10, Remaining: 8},
		},
		errs: []error{nil, nil, storeDown, nil},
	}
	lim := telemetry.Instrument(inner, "api", telemetry.Settings{TracerProvider: tp, MeterProvider: mp, Clock: stepClock()})

	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	req := &spillway.Request{Endpoint: "GET /x", Priority: spillway.Critical, Dims: []spillway.Dimension{{Name: "ip", Value: "203.0.113.9"}}}
	for range 3 {
		_, _, _ = lim.Admit(ctx, req)
	}
	req.Priority = spillway.Sheddable
	d, done, err := lim.Admit(ctx, req)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NotNil(t, done)
	span.End()

	spans := sr.Ended()
	require.Len(t, spans, 1)
	events := spans[0].Events()
	require.Len(t, events, 4)
	for _, e := range events {
		require.Equal(t, telemetry.EventDecision, e.Name)
	}
	require.Equal(t, map[string]any{
		"spillway.limiter": "api", "spillway.decided_by": "per_ip", "spillway.outcome": "allowed",
		"spillway.reason": "none", "spillway.limit": int64(10), "spillway.remaining": int64(9),
		"spillway.degraded": false, "spillway.priority": "critical", "spillway.latency_us": int64(150),
	}, attrMap(events[0].Attributes))
	require.Equal(t, map[string]any{
		"spillway.limiter": "api", "spillway.decided_by": "per_user", "spillway.outcome": "denied",
		"spillway.reason": "rate_limited", "spillway.limit": int64(5), "spillway.remaining": int64(0),
		"spillway.degraded": true, "spillway.priority": "critical", "spillway.latency_us": int64(150),
		"spillway.retry_after_ms": int64(1500),
	}, attrMap(events[1].Attributes))
	require.Equal(t, map[string]any{
		"spillway.limiter": "api", "spillway.decided_by": "", "spillway.outcome": "error",
		"spillway.reason": "none", "spillway.limit": int64(0), "spillway.remaining": int64(0),
		"spillway.degraded": false, "spillway.priority": "critical", "spillway.latency_us": int64(150),
		"exception.message": "redis: i/o timeout",
	}, attrMap(events[2].Attributes))
	require.Equal(t, "sheddable", attrMap(events[3].Attributes)["spillway.priority"])

	ms := collect(t, reader)
	require.Len(t, ms, 2)
	sum := ms[telemetry.MetricDecisions].Data.(metricdata.Sum[int64])
	require.True(t, sum.IsMonotonic)
	type point struct {
		attrs map[string]any
		n     int64
	}
	var got []point
	for _, dp := range sum.DataPoints {
		got = append(got, point{attrMap(dp.Attributes.ToSlice()), dp.Value})
	}
	sort.Slice(got, func(i, j int) bool {
		a, b := got[i].attrs, got[j].attrs
		return a["spillway.outcome"].(string)+a["spillway.priority"].(string) < b["spillway.outcome"].(string)+b["spillway.priority"].(string)
	})
	base := func(outcome string, degraded bool, prio, reason string) map[string]any {
		return map[string]any{"spillway.limiter": "api", "spillway.outcome": outcome, "spillway.degraded": degraded, "spillway.priority": prio, "spillway.reason": reason}
	}
	require.Equal(t, []point{
		{base("allowed", false, "critical", "none"), 1},
		{base("allowed", false, "sheddable", "none"), 1},
		{base("denied", true, "critical", "rate_limited"), 1},
		{base("error", false, "critical", "none"), 1},
	}, got)

	hist := ms[telemetry.MetricDuration].Data.(metricdata.Histogram[float64])
	require.Equal(t, "s", ms[telemetry.MetricDuration].Unit)
	var total uint64
	for _, dp := range hist.DataPoints {
		keys := []string{}
		for _, kv := range dp.Attributes.ToSlice() {
			keys = append(keys, string(kv.Key))
		}
		require.ElementsMatch(t, []string{"spillway.limiter", "spillway.outcome", "spillway.degraded"}, keys)
		require.Equal(t, telemetry.DurationBuckets, dp.Bounds)
		require.InDelta(t, 0.00015*float64(dp.Count), dp.Sum, 1e-12)
		total += dp.Count
	}
	require.Equal(t, uint64(4), total)

	// No metric attribute ever carries a key.
	for _, m := range ms {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range data.DataPoints {
				for _, kv := range dp.Attributes.ToSlice() {
					require.NotContains(t, kv.Value.String(), "203.0.113.9")
				}
			}
		}
	}
}

func TestChildSpan(t *testing.T) {
	sr, tp, _, mp := setup()
	storeDown := errors.New("redis: connection refused")
	inner := &script{ds: []spillway.Decision{{Allowed: true, Limiter: "per_ip", Limit: 3, Remaining: 2}, {}}, errs: []error{nil, storeDown}}
	lim := telemetry.Instrument(inner, "api", telemetry.Settings{TracerProvider: tp, MeterProvider: mp, ChildSpan: true, Clock: stepClock()})
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	_, _, err := lim.Admit(ctx, &spillway.Request{Priority: spillway.CriticalPlus})
	require.NoError(t, err)
	_, _, err = lim.Admit(ctx, &spillway.Request{Priority: spillway.CriticalPlus})
	require.ErrorIs(t, err, storeDown)
	parent.End()

	spans := sr.Ended()
	require.Len(t, spans, 3)
	for _, s := range spans[:2] {
		require.Equal(t, telemetry.SpanAdmit, s.Name())
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
	}
	require.Empty(t, spans[0].Events())
	require.Len(t, spans[1].Events(), 1) // RecordError's exception event
	a := attrMap(spans[0].Attributes())
	require.Equal(t, "allowed", a["spillway.outcome"])
	require.Equal(t, "critical_plus", a["spillway.priority"])
	require.Equal(t, int64(2), a["spillway.remaining"])
	require.Equal(t, codes.Error, spans[1].Status().Code)
	require.Equal(t, "error", attrMap(spans[1].Attributes())["spillway.outcome"])
}

func TestNoSpanNoEvent(t *testing.T) {
	_, _, reader, mp := setup()
	inner := &script{ds: []spillway.Decision{{Allowed: true}}, errs: []error{nil}}
	lim := telemetry.Instrument(inner, "api", telemetry.Settings{MeterProvider: mp})
	d, _, err := lim.Admit(context.Background(), &spillway.Request{Priority: 7})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	sum := collect(t, reader)[telemetry.MetricDecisions].Data.(metricdata.Sum[int64])
	require.Len(t, sum.DataPoints, 1)
	require.Equal(t, "priority(7)", attrMap(sum.DataPoints[0].Attributes.ToSlice())["spillway.priority"])
}

func BenchmarkInstrumentedAdmit(b *testing.B) {
	_, tp, _, mp := setup()
	inner := block.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{Allowed: true, Limit: 10, Remaining: 5}, spillway.Noop, nil
	})
	lim := telemetry.Instrument(inner, "api", telemetry.Settings{TracerProvider: tp, MeterProvider: mp})
	req := &spillway.Request{Priority: spillway.Critical}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lim.Admit(ctx, req)
	}
}
