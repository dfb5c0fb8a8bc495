package main

import (
	"slices"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// TestRun runs the demo for three seconds against a real redis-server,
// the database losing half its 12 workers halfway. The chain holds:
//   - no window of the ceiling admits more than the ceiling, plus any
//     decisions made degraded (Redis answering slower than the demo's
//     50 ms budget on a loaded machine); admissions are counted in the
//     second (the ceiling's window, on the same client clock) that
//     contains the whole call, so a slow ticker cannot blur two windows;
//   - the database never has more than twice its workers' statements in
//     flight (its 48 request goroutines alone would put 48 there), never
//     refuses a connection, and no call fails;
//   - reports (SheddablePlus) are shed before writes (Critical): a larger
//     share of them is refused;
//   - every server's fleet shedder ends at the capacity the database's
//     gauge reports, 6.
//
// How close to the capacity it gets depends on the machine's load, so
// only these bounds are asserted.
func TestRun(t *testing.T) {
	srv := redistest.Start(t)
	c := config{redisAddr: srv.Addr, ceiling: 400, mode: "exact", servers: 3, workers: 16, pause: 2 * time.Millisecond,
		dbWorkers: 12, dbMaxConns: 60, service: 50 * time.Millisecond, duration: 3 * time.Second, halveAt: 1500 * time.Millisecond}
	sum, err := run(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.bySecond) == 0 || sum.admitted[spillway.Critical] == 0 {
		t.Fatalf("summary %+v: nothing measured", sum)
	}
	for sec, n := range sum.bySecond {
		if n > c.ceiling+sum.degraded {
			t.Fatalf("window %d admitted %d, more than the ceiling %d + %d degraded", sec, n, c.ceiling, sum.degraded)
		}
	}
	if sum.failed != 0 {
		t.Fatalf("summary %+v: %d calls failed", sum, sum.failed)
	}
	if sum.peakActive > 24 || sum.peakConns > c.dbMaxConns || sum.refusedConns != 0 {
		t.Fatalf("database: %d statements in flight at once (want ≤ 24), peak %d connections, refused %d", sum.peakActive, sum.peakConns, sum.refusedConns)
	}
	share := func(p spillway.Priority) float64 {
		return float64(sum.rejected[p]) / float64(sum.rejected[p]+sum.admitted[p])
	}
	if share(spillway.SheddablePlus) <= share(spillway.Critical) {
		t.Fatalf("refused: %.1f%% of reports, %.1f%% of writes; want reports shed first (%+v)", 100*share(spillway.SheddablePlus), 100*share(spillway.Critical), sum)
	}
	if !slices.Equal(sum.capacities, []int64{6, 6, 6}) {
		t.Fatalf("fleet capacities %v at the end, want the gauge's 6 on every server", sum.capacities)
	}
}

func TestParseMode(t *testing.T) {
	if _, err := parseMode("bogus"); err == nil {
		t.Fatal("no error for an unknown mode")
	}
}
