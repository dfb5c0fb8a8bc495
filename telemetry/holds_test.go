package telemetry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/tiers"
)

// holdSums returns the data points of an int64 sum by "rule" or
// "rule/result", and whether it is monotonic.
func holdSums(t *testing.T, m metricdata.Metrics) (map[string]int64, bool) {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is %T", m.Name, m.Data)
	out := map[string]int64{}
	for _, dp := range s.DataPoints {
		a := attrMap(dp.Attributes.ToSlice())
		require.Equal(t, "api", a[string(telemetry.KeyLimiter)], "%s: %v", m.Name, a)
		k, n := fmt.Sprint(a[string(telemetry.KeyRule)]), 2
		if r, ok := a[string(telemetry.KeySettleResult)]; ok {
			k, n = k+"/"+fmt.Sprint(r), 3
		}
		require.Len(t, a, n, "%s: %v (no other attribute, no key)", m.Name, a)
		out[k] = dp.Value
	}
	return out, s.IsMonotonic
}

// The holds of a tiers "cost: response" rule, counted exactly: outstanding
// while a request runs, settles by result, the units charged, and the
// holds that ended by their TTL.
func TestHoldMetrics(t *testing.T) {
	_, _, reader, mp := setup()
	hm := telemetry.NewHoldMetrics("api", mp)
	clk := testclock.New(time.Unix(1_800_000_000, 0))
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	cfg, err := tiers.Parse("limits.yaml", []byte(`
limits:
  - id: tokens
    by: api_key
    bucket: 600/minute
    cost: response
    estimate: 100
  - id: calls
    by: api_key
    bucket: 1000/minute
`))
	require.NoError(t, err)
	lim, err := tiers.New(cfg, store, tiers.Settings{HoldObserver: hm, HoldTTL: 10 * time.Second})
	require.NoError(t, err)
	admit := func() (*spillway.Request, spillway.Done) {
		r := &spillway.Request{Endpoint: "/gen", Priority: spillway.Critical, Usage: new(spillway.Usage)}
		r.Set(spillway.DimAPIKey, "k")
		d, done, err := lim.Admit(context.Background(), r)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		return r, done
	}
	sums := func(name string) (map[string]int64, bool) {
		m, ok := collect(t, reader)[name]
		if !ok {
			return nil, false
		}
		return holdSums(t, m)
	}

	r, done := admit()
	require.NoError(t, r.Usage.Set(30))
	done(spillway.Success) // applied, 30
	_, done = admit()      // outstanding
	got, mono := sums(telemetry.MetricHoldsOutstanding)
	require.False(t, mono)
	require.Equal(t, map[string]int64{"tokens": 1}, got)
	got, mono = sums(telemetry.MetricHoldSettles)
	require.True(t, mono)
	require.Equal(t, map[string]int64{"tokens/applied": 1}, got)
	got, _ = sums(telemetry.MetricHoldSettledUnits)
	require.Equal(t, map[string]int64{"tokens": 30}, got)
	_, ok := sums(telemetry.MetricHoldsExpired)
	require.False(t, ok, "expired holds before any expired")

	done(spillway.Success) // nothing reported: the estimate, 100
	// Outlives the TTL: its step charged 50 beyond the estimate, the
	// hold itself expired.
	r, done = admit()
	require.NoError(t, r.Usage.Add(150))
	clk.Advance(10 * time.Second)
	done(spillway.Success)
	// What tiers reports when the store does not answer, and a result
	// no store gives.
	hm.Held(context.Background(), "tokens", 5)
	hm.Settled(context.Background(), "tokens", 0, "error")
	hm.Held(context.Background(), "other", 5)
	hm.Settled(context.Background(), "other", 7, ratelimit.SettleAlreadySettled.String())
	hm.Held(context.Background(), "other", 5)
	hm.Settled(context.Background(), "other", 0, "bogus")

	got, _ = sums(telemetry.MetricHoldsOutstanding)
	require.Equal(t, map[string]int64{"tokens": 0, "other": 0}, got)
	got, _ = sums(telemetry.MetricHoldSettles)
	require.Equal(t, map[string]int64{"tokens/applied": 2, "tokens/expired": 1, "tokens/error": 1, "other/already_settled": 1, "other/error": 1}, got)
	got, _ = sums(telemetry.MetricHoldSettledUnits)
	require.Equal(t, map[string]int64{"tokens": 180, "other": 7}, got)
	got, mono = sums(telemetry.MetricHoldsExpired)
	require.True(t, mono)
	require.Equal(t, map[string]int64{"tokens": 2, "other": 1}, got)
}
