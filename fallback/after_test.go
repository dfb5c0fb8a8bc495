package fallback_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
)

// While the health is not closed, a Limiter's releases (its inner
// limiter's done) never reach the backend: they are queued, up to
// MaxQueued per Health, the rest left to their TTL; user calls are never
// probes; once the health's own probe closes it, the queued releases run,
// in order.
func TestReleasesQueueWhileOpenAndRunWhenClosed(t *testing.T) {
	var down, probeDown atomic.Bool
	var probes atomic.Int64
	h, err := fallback.NewHealth(nil, fallback.HealthSettings{
		Failures: 1, OpenTimeout: 50 * time.Millisecond, Probes: 2, MaxQueued: 2,
		Probe: func(ctx context.Context) error {
			probes.Add(1)
			if probeDown.Load() {
				return errors.New("still down")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var admits atomic.Int64
	var released []int
	releasedCh := make(chan int, 8)
	lim, err := fallback.NewLimiter(spillway.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		admits.Add(1)
		if down.Load() {
			return spillway.Decision{}, spillway.Noop, errors.New("backend down")
		}
		n := int(r.Cost)
		return spillway.Decision{Allowed: true}, func(spillway.Outcome) { releasedCh <- n }, nil
	}), nil, fallback.Settings{Health: h})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var dones []spillway.Done
	for i := 1; i <= 3; i++ {
		d, done, err := lim.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: int64(i)})
		if err != nil || !d.Allowed || d.Degraded {
			t.Fatalf("admission %d: %+v %v", i, d, err)
		}
		dones = append(dones, done)
	}
	down.Store(true)
	probeDown.Store(true)
	if d, _, _ := lim.Admit(ctx, &spillway.Request{Priority: spillway.Critical}); !d.Degraded || h.State() != fallback.Open {
		t.Fatalf("after a failure with K = 1: %+v, health %v; want degraded, open", d, h.State())
	}
	for _, done := range dones {
		done(spillway.Success)
	}
	if st := h.Stats(); st.Queued != 2 || st.QueueDropped != 1 || len(releasedCh) != 0 {
		t.Fatalf("open: %d released, health %+v; want none released, 2 queued, 1 left to its TTL", len(releasedCh), st)
	}
	// Half-open time passes: requests are still not probes; the health
	// probes by itself and stays open while the probe fails.
	admitsBefore := admits.Load()
	deadline := time.Now().Add(5 * time.Second)
	for probes.Load() < 2 {
		if d, _, _ := lim.Admit(ctx, &spillway.Request{Priority: spillway.Critical}); !d.Degraded {
			t.Fatalf("open: %+v; want degraded", d)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no probes in 5 s: %+v", h.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if got := admits.Load() - admitsBefore; got != 0 {
		t.Fatalf("%d requests reached the inner limiter while the health was open; want 0 (no request is a probe)", got)
	}
	if h.State() == fallback.Closed {
		t.Fatalf("closed after failed probes")
	}
	// Back: two probes in a row close it; the queued releases run.
	down.Store(false)
	probeDown.Store(false)
	for len(released) < 2 {
		select {
		case n := <-releasedCh:
			released = append(released, n)
		case <-time.After(5 * time.Second):
			t.Fatalf("queued releases did not run: %v, health %+v", released, h.Stats())
		}
	}
	if released[0] != 1 || released[1] != 2 {
		t.Fatalf("released %v; want [1 2] in order (3 was left to its TTL)", released)
	}
	if st := h.Stats(); st.State != fallback.Closed || st.Queued != 0 || st.Probes < 4 || st.ProbesOK < 2 {
		t.Fatalf("health %+v; want closed, queue empty, probes counted", st)
	}
	if d, _, _ := lim.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: 9}); d.Degraded {
		t.Fatalf("after recovery: %+v; want decided by the inner limiter", d)
	}
}

func TestHealthSettingsErrors(t *testing.T) {
	if _, err := fallback.NewHealth(nil, fallback.HealthSettings{ProbeTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "probe timeout") {
		t.Fatalf("negative ProbeTimeout: %v; want an error naming it", err)
	}
}
