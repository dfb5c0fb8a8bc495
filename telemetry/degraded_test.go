package telemetry_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// storeDown is a limiter whose store fails on every call.
var storeDown = spillway.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
	return spillway.Decision{}, spillway.Noop, &spillway.StoreError{Limiter: "db", Err: fmt.Errorf("%w: connection refused", spillway.ErrStoreUnavailable)}
})

// decisionCounts reads spillway.decisions as "limiter outcome degraded
// reason" → count.
func decisionCounts(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		a := attrMap(dp.Attributes.ToSlice())
		out[fmt.Sprintf("%v %v %v %v", a["spillway.limiter"], a["spillway.outcome"], a["spillway.degraded"], a["spillway.reason"])] += dp.Value
	}
	return out
}

// Every local decision shows as degraded in the decisions metric,
// whichever way Instrument wraps the chain: inside a fallback.Limiter it
// saw the store's error (and counted outcome="error"); now it counts the
// local decision that replaced the error. (The Redis blocks decide locally
// by themselves, so an Instrument around them sees their Degraded
// decisions directly.) Without a fallback the error stays an error.
func TestLocalDecisionsCountAsDegraded(t *testing.T) {
	_, tp, reader, mp := setup()
	opts := []telemetry.Option{telemetry.WithTracerProvider(tp), telemetry.WithMeterProvider(mp), telemetry.WithClock(stepClock())}
	ctx := context.Background()
	req := func() *spillway.Request { return &spillway.Request{Priority: spillway.Critical} }

	// Instrument inside a fallback.Limiter without a local limiter: the
	// request is admitted, degraded.
	fl, err := fallback.NewLimiter(telemetry.Instrument(storeDown, "wrapped", opts...), nil, fallback.Settings{Name: "db_fallback"})
	require.NoError(t, err)
	d, _, err := fl.Admit(ctx, req())
	require.NoError(t, err)
	require.True(t, d.Allowed && d.Degraded)

	// A Guard without a fallback fails closed: an error, for both.
	g3, err := globalceiling.NewGuard(telemetry.Instrument(storeDown, "unguarded", opts...))
	require.NoError(t, err)
	_, _, err = g3.Admit(ctx, req())
	require.ErrorIs(t, err, spillway.ErrStoreUnavailable)

	got := decisionCounts(t, collect(t, reader)[telemetry.MetricDecisions])
	require.Equal(t, map[string]int64{
		"wrapped allowed true none":  1,
		"unguarded error false none": 1,
	}, got)
}
