package telemetry_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/spillway-go/spillway/internal/block"
)

// storeDown is a limiter whose store fails on every call.
var storeDown = block.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
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

// A store's error is counted as an error, not as a decision: the blocks
// of the library that fall back mark their local decisions Degraded
// themselves, so an Instrument around them sees those directly.
func TestStoreErrorCountsAsError(t *testing.T) {
	_, tp, reader, mp := setup()
	set := telemetry.Settings{TracerProvider: tp, MeterProvider: mp, Clock: stepClock()}
	ctx := context.Background()
	req := func() *spillway.Request { return &spillway.Request{Priority: spillway.Critical} }

	// A Guard around a failing limiter fails closed: an error.
	g3, err := globalceiling.NewGuard(telemetry.Instrument(storeDown, "unguarded", set))
	require.NoError(t, err)
	_, _, err = g3.Admit(ctx, req())
	require.ErrorIs(t, err, spillway.ErrStoreUnavailable)

	got := decisionCounts(t, collect(t, reader)[telemetry.MetricDecisions])
	require.Equal(t, map[string]int64{
		"unguarded error false none": 1,
	}, got)
}
