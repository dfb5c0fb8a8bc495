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
	"github.com/spillway-go/spillway/internal/budget"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/ratelimit"
)

func TestHealthOnePerClient(t *testing.T) {
	b := newBed(t)
	h, err := fallback.NewHealth(b.client, fallback.HealthSettings{Name: "primary"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fallback.HealthOf(b.client); got != h {
		t.Fatalf("HealthOf = %p; want the Health NewHealth returned (%p)", got, h)
	}
	if _, err := fallback.NewHealth(b.client, fallback.HealthSettings{}); err == nil || !strings.Contains(err.Error(), "already has a Health (primary)") {
		t.Fatalf("second NewHealth on one client: %v; want an error naming the first", err)
	}
	if got := fallback.HealthOf(b.srv.Client(t)); got != nil {
		t.Fatalf("HealthOf(another client) = %p; want nil", got)
	}
	for field, s := range map[string]fallback.Settings{
		"Failures":      {Health: h, Failures: 3},
		"OpenTimeout":   {Health: h, OpenTimeout: time.Second},
		"Probes":        {Health: h, Probes: 2},
		"OnStateChange": {Health: h, OnStateChange: func(string, fallback.State, fallback.State) {}},
	} {
		if _, err := fallback.NewStore(b.redisStore(), s); err == nil || !strings.Contains(err.Error(), field+" is set together with Health") {
			t.Errorf("NewStore with Health and %s: %v; want an error naming %s", field, err, field)
		}
	}
	if _, err := fallback.NewHealth(nil, fallback.HealthSettings{OpenTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "open timeout") {
		t.Fatalf("negative open timeout: %v", err)
	}
}

// countingStore counts the Decide calls that reach it.
type countingStore struct {
	ratelimit.Store
	calls atomic.Int64
}

func (c *countingStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	c.calls.Add(1)
	return c.Store.Decide(ctx, items, out)
}

func TestSpentBudgetDecidesLocallyWithoutACall(t *testing.T) {
	h, err := fallback.NewHealth(nil, fallback.HealthSettings{Failures: 1})
	if err != nil {
		t.Fatal(err)
	}
	inner := &countingStore{Store: ratelimit.NewMemoryStore(ratelimit.MemorySettings{})}
	var causes []error
	// No ledger: the local decision below would otherwise be reconciled
	// by a background pass after the first call that reaches the store,
	// whose calls race with the count checked there.
	st, err := fallback.NewStore(inner, fallback.Settings{Health: h, LedgerSize: -1, OnDegraded: func(ev fallback.DegradedEvent) { causes = append(causes, ev.Cause) }})
	if err != nil {
		t.Fatal(err)
	}
	spent := budget.With(context.Background(), time.Nanosecond)
	time.Sleep(time.Millisecond)
	out := make([]spillway.Decision, 1)
	ok, err := st.Decide(spent, []ratelimit.Item{{Scope: "api", Key: "k", Policy: hourly, Cost: 1}}, out)
	if err != nil || !ok || !out[0].Degraded || out[0].Limit != 20 || out[0].Remaining != 19 {
		t.Fatalf("store, budget spent: %v %v %+v; want allowed by the local share (20), degraded", ok, err, out[0])
	}
	if inner.calls.Load() != 0 {
		t.Fatalf("inner called %d times with the budget spent; want 0", inner.calls.Load())
	}
	if len(causes) != 1 || !errors.Is(causes[0], spillway.ErrBudgetSpent) {
		t.Fatalf("degraded causes %v; want ErrBudgetSpent", causes)
	}
	// A spent budget says nothing about the store: K = 1 and still closed.
	if s := h.Stats(); s.State != fallback.Closed || s.Failures != 0 || s.Rejected != 0 || s.Successes != 0 {
		t.Fatalf("health %+v; want closed, nothing counted", s)
	}
	// With budget left the store is called, and the call's deadline is
	// the budget's end, not the Store's own 50ms.
	ctx := budget.With(context.Background(), time.Hour)
	if _, err := st.Decide(ctx, []ratelimit.Item{{Scope: "api", Key: "k", Policy: hourly, Cost: 1}}, out); err != nil || out[0].Degraded || inner.calls.Load() != 1 {
		t.Fatalf("budget left: %v %+v, %d calls; want one call by the store", err, out[0], inner.calls.Load())
	}
}

func TestHealthSharedByBlocksOnOneClient(t *testing.T) {
	b := newBed(t)
	var rec states
	h, err := fallback.NewHealth(b.client, fallback.HealthSettings{Failures: 3, OpenTimeout: time.Hour, OnStateChange: rec.hook})
	if err != nil {
		t.Fatal(err)
	}
	sent := &sentCounter{}
	b.client.AddHook(sent)
	a := b.fallback(t, fallback.Settings{Name: "a", Health: h})
	c := b.fallback(t, fallback.Settings{Name: "c", Health: h})
	b.warm(t)
	warmSent := sent.n.Load()
	if d := decide(t, a, "api", "k", hourly, 1); d.Degraded {
		t.Fatalf("healthy: %+v", d)
	}
	b.setMode(t, faultproxy.Refuse)
	// Two failures through a, one through a plain command: K = 3 is
	// reached by the three together, and c never called.
	decide(t, a, "api", "k", hourly, 1)
	decide(t, a, "api", "k", hourly, 1)
	if st := h.State(); st != fallback.Closed {
		t.Fatalf("after 2 failures: %v", st)
	}
	if err := b.client.Ping(context.Background()).Err(); err == nil {
		t.Fatal("ping through a refusing proxy succeeded")
	}
	if st := c.State(); st != fallback.Open {
		t.Fatalf("c's state after 3 failures seen by others: %v; want open", st)
	}
	before := sent.n.Load()
	if d := decide(t, c, "api", "k", hourly, 1); !d.Degraded || !d.Allowed {
		t.Fatalf("c while open: %+v; want allowed by the local share, degraded", d)
	}
	if err := b.client.Ping(context.Background()).Err(); !errors.Is(err, fallback.ErrOpen) {
		t.Fatalf("ping while open: %v; want ErrOpen", err)
	}
	if got := sent.n.Load() - before; got != 0 {
		t.Fatalf("%d calls sent while open; want 0", got)
	}
	s := h.Stats()
	// Successes: the warm-up's calls and the healthy decision.
	if s.Failures != 3 || s.Opened != 1 || s.Rejected != 2 || s.Successes != warmSent+1 {
		t.Fatalf("health %+v; want 3 failures, opened once, 2 rejected, %d successes", s, warmSent+1)
	}
	if got := rec.get(); len(got) != 1 || got[0] != "closed→open" {
		t.Fatalf("transitions %v; want closed→open", got)
	}
}
