package fallback_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"
)

// `fail: closed` in a tiers config works behind a fallback.Store over a
// Redis that is down, with no wiring between the two: the rule's items
// carry the mode to the store. A shadow rule marked fail: closed never
// denies, and a fail-open rule is decided by the local share.
func TestTiersFailClosedRuleBehindStore(t *testing.T) {
	const yml = `
limits:
  - id: login
    endpoint: /login
    by: ip
    bucket: 10/hour
    fail: closed
  - id: search
    endpoint: /search
    by: ip
    bucket: 100/hour
  - id: dark
    endpoint: /search
    by: ip
    bucket: 1/hour
    fail: closed
    shadow: true
`
	b := newBed(t)
	st := b.fallback(t, fallback.Settings{})
	cfg, err := tiers.Parse("limits.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := tiers.New(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	admit := func(endpoint string) spillway.Decision {
		t.Helper()
		r := &spillway.Request{Endpoint: endpoint, Method: "POST", Priority: spillway.Critical}
		r.Set(spillway.DimIP, "10.1.2.3")
		d, done, err := lim.Admit(context.Background(), r)
		if err != nil {
			t.Fatalf("%s: %v", endpoint, err)
		}
		done(spillway.Success)
		return d
	}

	// Redis up: the store decides.
	if d := admit("/login"); !d.Allowed || d.Degraded || d.Limiter != "login" || d.Remaining != 9 {
		t.Fatalf("/login, Redis up = %+v; want allowed by the store, 9 left", d)
	}

	b.setMode(t, faultproxy.Refuse)
	d := admit("/login")
	want := spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: "login", Limit: 10, RetryAfter: d.RetryAfter, Degraded: true, Window: time.Hour}
	if d != want || d.RetryAfter <= 0 {
		t.Fatalf("/login, Redis down = %+v; want %+v with a RetryAfter", d, want)
	}
	// The fail-open rule is decided by its 20% share (100/hour → 20);
	// the shadow rule, though fail: closed, does not deny.
	for i := 0; i < 20; i++ {
		if d := admit("/search"); !d.Allowed || !d.Degraded || d.Limiter != "search" {
			t.Fatalf("/search #%d, Redis down = %+v; want allowed by the local share", i+1, d)
		}
	}
	if d := admit("/search"); d.Allowed || d.Reason != spillway.ReasonRateLimited || !d.Degraded {
		t.Fatalf("/search #21, Redis down = %+v; want the share exhausted", d)
	}

	// The same rule over the bare Redis store: the error says fail closed.
	bare, err := tiers.New(cfg, ratelimit.NewRedisStore(b.client))
	if err != nil {
		t.Fatal(err)
	}
	r := &spillway.Request{Endpoint: "/login", Priority: spillway.Critical}
	r.Set(spillway.DimIP, "10.1.2.3")
	_, _, err = bare.Admit(context.Background(), r)
	var se *spillway.StoreError
	if !errors.Is(err, spillway.ErrStoreUnavailable) || !errors.As(err, &se) || se.Fail != spillway.FailClosed || spillway.FailModeOf(err, spillway.FailOpen) != spillway.FailClosed {
		t.Fatalf("bare store, Redis down: err = %v; want a fail-closed StoreError", err)
	}
}
