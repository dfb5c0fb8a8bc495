package main

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
)

// TestRun runs the demo for two windows against a real redis-server: no
// window of the ceiling admits more than the ceiling (Exact mode on one
// node), plus any decisions made degraded (Redis answering slower than the
// demo's 50 ms budget on a loaded machine); nothing fails; and the database
// never sees more connections than the pools hold. Admissions are counted
// in the second (the ceiling's window, on the same client clock) that
// contains the whole call; calls straddling a boundary are left out, so a
// slow ticker on a loaded machine cannot blur two windows into one. How
// close to the ceiling it gets depends on the machine's load, so only the
// bound is asserted.
func TestRun(t *testing.T) {
	srv := redistest.Start(t)
	sum, err := run(srv.Addr, 200, "exact", 3, 8, 5*time.Millisecond, 4, 30, 2*time.Millisecond, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.bySecond) == 0 || sum.admitted == 0 {
		t.Fatalf("summary %+v: nothing measured", sum)
	}
	for sec, n := range sum.bySecond {
		if n > 200+sum.degraded {
			t.Fatalf("window %d admitted %d, more than the ceiling 200 + %d degraded", sec, n, sum.degraded)
		}
	}
	if sum.failed != 0 {
		t.Fatalf("summary %+v: %d calls failed", sum, sum.failed)
	}
	if sum.peakConns > 12 || sum.refusedConns != 0 {
		t.Fatalf("database peak %d connections (3 pools × 4), refused %d", sum.peakConns, sum.refusedConns)
	}
}

func TestParseMode(t *testing.T) {
	if _, err := parseMode("bogus"); err == nil {
		t.Fatal("no error for an unknown mode")
	}
}
