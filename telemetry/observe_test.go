package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/telemetry"
)

// downStore is a store whose backend always fails.
type downStore struct{ ratelimit.Store }

func (downStore) Decide(context.Context, []ratelimit.Item, []spillway.Decision) (bool, error) {
	return false, errors.New("connection refused")
}

func gaugeValue(t *testing.T, rm *metricdata.ResourceMetrics, breaker string) (int64, bool) {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != telemetry.MetricBreakerState {
				continue
			}
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok {
				t.Fatalf("%s is %T; want an int64 gauge", m.Name, m.Data)
			}
			for _, dp := range g.DataPoints {
				if v, _ := dp.Attributes.Value(telemetry.KeyBreaker); v.AsString() == breaker {
					return dp.Value, true
				}
			}
		}
	}
	return 0, false
}

func TestObserveBreakerReadsTheSharedHealth(t *testing.T) {
	_, _, reader, mp := setup()
	h, err := fallback.NewHealth(nil, fallback.HealthSettings{Name: "redis", Failures: 2, OpenTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := telemetry.ObserveBreaker("redis", h.State, mp)
	if err != nil {
		t.Fatal(err)
	}
	collect := func() (int64, bool) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		return gaugeValue(t, &rm, "redis")
	}
	// Published before any transition: closed.
	if v, ok := collect(); !ok || v != int64(fallback.Closed) {
		t.Fatalf("gauge before any failure = %d, %v; want 0 (closed)", v, ok)
	}
	st, err := fallback.NewStore(downStore{}, fallback.Settings{Health: h})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]spillway.Decision, 1)
	for range 2 {
		st.Decide(context.Background(), []ratelimit.Item{{Scope: "s", Key: "k", Policy: ratelimit.Policy{Limit: 10, Period: time.Second}, Cost: 1}}, out)
	}
	if v, ok := collect(); !ok || v != int64(fallback.Open) {
		t.Fatalf("gauge after K failures = %d, %v; want 2 (open)", v, ok)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := collect(); ok {
		t.Fatal("gauge still observed after stop")
	}
	if _, err := telemetry.ObserveBreaker("x", nil, nil); err == nil {
		t.Fatal("nil state func accepted")
	}
}
