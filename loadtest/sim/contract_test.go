package sim

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/contracttest"
)

// The harness's recording wrapper conforms as the chain it wraps does.
func TestRecordingContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
		alg, err := concurrency.NewAIMD(concurrency.AIMDConfig{Initial: 4, Min: 4, Max: 4})
		if err != nil {
			t.Fatal(err)
		}
		a, err := concurrency.NewAdaptive(alg, "")
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{
			Limiter: recording{inner: spillway.Chain(a), rec: NewRecorder(time.Second, 60)},
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
}
