package telemetry_test

import (
	"context"
	"fmt"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/telemetry"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func ExampleInstrument() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	lim, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Limit: 1, Period: time.Minute}, ratelimit.Settings{})
	if err != nil {
		panic(err)
	}
	chain := telemetry.Instrument(spillway.Chain(ratelimit.PerKey(lim, spillway.DimIP)), "api", telemetry.Settings{MeterProvider: mp})
	req := &spillway.Request{Priority: spillway.Critical, Dims: []spillway.Dimension{{Name: spillway.DimIP, Value: "192.0.2.1"}}}
	for range 2 {
		chain.Admit(context.Background(), req)
	}

	var rm metricdata.ResourceMetrics
	reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, dp := range sum.DataPoints {
				outcome, _ := dp.Attributes.Value(telemetry.KeyOutcome)
				reason, _ := dp.Attributes.Value(telemetry.KeyReason)
				fmt.Println(m.Name, outcome.AsString(), reason.AsString(), dp.Value)
			}
		}
	}
	// Unordered output:
	// spillway.decisions allowed none 1
	// spillway.decisions denied rate_limited 1
}
