package main

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
)

// TestRun runs the demo for two windows against a real redis-server: no
// window admits more than the ceiling (Exact mode on one node) — plus the
// 24 calls that can be in flight across a window boundary (the demo counts
// a call when it returns) and any decisions made degraded (Redis answering
// slower than the demo's 50 ms budget on a loaded machine) — nothing
// fails, and the database never sees more connections than the pools
// hold. How close to the ceiling it gets depends on the machine's load, so
// only the bound is asserted.
func TestRun(t *testing.T) {
	srv := redistest.Start(t)
	sum, err := run(srv.Addr, 200, "exact", 3, 8, 5*time.Millisecond, 4, 30, 2*time.Millisecond, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.perWindow) == 0 || sum.admitted == 0 {
		t.Fatalf("summary %+v: nothing measured", sum)
	}
	for i, n := range sum.perWindow {
		if n > 200+24+sum.degraded {
			t.Fatalf("window %d admitted %d, more than the ceiling 200 + 24 in flight + %d degraded", i, n, sum.degraded)
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
