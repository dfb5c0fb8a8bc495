package shedder_test

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/contracttest"
	"github.com/spillway-go/spillway/shedder"
)

// fill admits requests of cost 1 at priority Critical, holding them (their
// done is never called), until one is denied.
func fill(t *testing.T, l spillway.Limiter) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		d, _, err := l.Admit(context.Background(), contracttest.Request())
		if err != nil {
			t.Fatalf("filling: %v", err)
		}
		if !d.Allowed {
			return
		}
	}
	t.Fatal("1000 requests held and still no denial")
}

func TestWorkerContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
		w, err := shedder.NewWorker(64, shedder.WorkerSettings{})
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{Limiter: w, Held: w.InFlight, Deny: func(t *testing.T) { fill(t, w) }}
	}})
}

func TestQueueContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
		q, err := shedder.NewQueue(64, shedder.QueueSettings{MaxWait: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{
			Limiter: q,
			Held:    func() int64 { return q.Stats().InFlight },
			Deny:    func(t *testing.T) { fill(t, q) },
		}
	}})
}

// The fleet shedder never returns an error: with its Redis gone it decides
// on local counts, marked Degraded, once its view is stale.
func TestFleetContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{Decides: true, New: func(t *testing.T) contracttest.Instance {
		c, brk := contracttest.Redis(t)
		f, err := shedder.NewFleet(c, "contract", 64, shedder.FleetSettings{Interval: 10 * time.Millisecond, TTL: 5 * time.Second, Timeout: time.Second}.With(shedder.Knobs{StaleAfter: 2 * time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{
			Limiter: f,
			Held: func() int64 {
				var n int64
				for _, v := range f.Stats().Local {
					n += v
				}
				return n
			},
			// A fresh view first: filling on the local share of a fleet
			// with no view yet would stop early, and the view that then
			// arrives would admit again.
			Deny: func(t *testing.T) {
				if err := f.Refresh(context.Background()); err != nil {
					t.Fatal(err)
				}
				fill(t, f)
			},
			Break: func(t *testing.T) {
				brk(t)
				for deadline := time.Now().Add(15 * time.Second); !f.Stats().Degraded; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the fleet view did not go stale within 15 s of Redis stopping")
					}
					_, done, _ := f.Admit(context.Background(), contracttest.Request()) // drives the refresh
					done(spillway.Ignored)
				}
			},
		}
	}})
}
