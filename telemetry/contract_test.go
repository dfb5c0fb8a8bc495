package telemetry_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/contracttest"
	"github.com/spillway-go/spillway/telemetry"
)

// An instrumented limiter conforms as its inner limiter does, with real
// tracer and meter providers recording every decision (a nil request
// included).
func TestInstrumentContract(t *testing.T) {
	for _, child := range []bool{false, true} {
		name := "events"
		if child {
			name = "child spans"
		}
		t.Run(name, func(t *testing.T) {
			contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
				alg, err := concurrency.NewAIMD(concurrency.AIMDConfig{Initial: 4, Min: 4, Max: 4})
				if err != nil {
					t.Fatal(err)
				}
				a, err := concurrency.NewAdaptive(alg, "")
				if err != nil {
					t.Fatal(err)
				}
				tp := sdktrace.NewTracerProvider()
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
				set := telemetry.Settings{TracerProvider: tp, MeterProvider: mp, ChildSpan: child}
				return contracttest.Instance{
					Limiter: telemetry.Instrument(a, "adaptive", set),
					Held:    func() int64 { return int64(a.InFlight()) },
					Deny: func(t *testing.T) {
						for a.InFlight() < a.Limit() {
							if d, _, err := a.Admit(context.Background(), contracttest.Request()); err != nil || !d.Allowed {
								t.Fatalf("filling: %+v, %v", d, err)
							}
						}
					},
				}
			}})
		})
	}
}

var _ spillway.Limiter = telemetry.Instrument(spillway.Chain(), "x", telemetry.Settings{})
