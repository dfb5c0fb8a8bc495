package sim

import (
	"testing"
	"testing/synctest"
	"time"
)

// The database's gauge publishes, once per window, the queries it ran on
// average and its busy and idle workers on average: Busy + Idle is the
// capacity, overloaded or not.
func TestBackendGauge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &Backend{GaugeWindow: DefaultGaugeWindow}
		b.SetCapacity(4) // the first window starts
		if g := b.Gauge(); !g.To.IsZero() {
			t.Fatalf("a reading %+v before the first window ended", g)
		}
		b.change(2, 0)
		time.Sleep(DefaultGaugeWindow / 2)
		b.change(3, 0) // 5 in flight, one past the capacity
		time.Sleep(DefaultGaugeWindow / 2)
		g := b.Gauge()
		if g.Active != 3.5 || g.Busy != 3 || g.Idle != 1 || g.To.Sub(g.From) != DefaultGaugeWindow {
			t.Fatalf("first window %+v, want 3.5 active, 3 busy and 1 idle over %v", g, DefaultGaugeWindow)
		}
		// The capacity halves with 2 in flight: a full window at 2 of 2.
		b.change(-3, 0)
		b.SetCapacity(2)
		time.Sleep(DefaultGaugeWindow / 4)
		if g2 := b.Gauge(); g2 != g {
			t.Fatalf("a reading %+v within the window, want the last one %+v", g2, g)
		}
		time.Sleep(3 * DefaultGaugeWindow / 4)
		if g = b.Gauge(); g.Active != 2 || g.Busy != 2 || g.Idle != 0 {
			t.Fatalf("second window %+v, want 2 active and busy, none idle", g)
		}
		b.change(-2, 0)
		time.Sleep(DefaultGaugeWindow)
		if g = b.Gauge(); g.Active != 0 || g.Busy != 0 || g.Idle != 2 {
			t.Fatalf("third window %+v, want none active or busy, 2 idle", g)
		}
		// Overloaded for half a window: 4 of 2 in flight, then 1.
		b.change(4, 0)
		time.Sleep(DefaultGaugeWindow / 2)
		b.change(-3, 0)
		time.Sleep(DefaultGaugeWindow / 2)
		if g = b.Gauge(); g.Active != 2.5 || g.Busy != 1.5 || g.Idle != 0.5 {
			t.Fatalf("fourth window %+v, want 2.5 active, 1.5 busy, 0.5 idle", g)
		}
	})
}
