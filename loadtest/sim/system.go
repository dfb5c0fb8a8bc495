package sim

import (
	"math"
	"time"
)

// System is the simulated system's shape, derived from the harness's scale.
type System struct {
	Capacity      int           // backend concurrency capacity
	Service       time.Duration // backend mean service time
	ClientTimeout time.Duration // per attempt
	Baseline      float64       // baseline offered rate, logical req/s
	GaugeWindow   time.Duration // the database's utilization gauge's window
}

// SystemFor returns the system at scale (1: a capacity of 30 queries at
// once, 200 ms each).
func SystemFor(scale float64) System {
	s := System{
		Capacity:      30,
		Service:       200 * time.Millisecond,
		ClientTimeout: time.Second,
		GaugeWindow:   DefaultGaugeWindow,
	}
	s.Capacity = max(2, int(math.Round(float64(s.Capacity)*scale)))
	// Baseline: a quarter of the capacity; the spike is 10× that (2.5× the
	// capacity).
	s.Baseline = float64(s.Capacity) / s.Service.Seconds() / 4
	return s
}

// CapacityRPS is the most queries per second the database serves.
func (s System) CapacityRPS() float64 { return float64(s.Capacity) / s.Service.Seconds() }

// NewBackend returns the system's database, recording into rec.
func (s System) NewBackend(rec *Recorder) *Backend {
	b := &Backend{
		Service:          s.Service,
		Thrash:           1,
		MaxConns:         s.Capacity * 16,
		StatementTimeout: 2 * time.Second,
		GaugeWindow:      s.GaugeWindow,
		rec:              rec,
	}
	b.SetCapacity(s.Capacity)
	return b
}
