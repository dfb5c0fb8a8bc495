package fallback_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/tierstest"
	"github.com/spillway-go/spillway/internal/tiersview"
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
	lim := tiersLimiter(t, yml, st)
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
	bare := tiersLimiter(t, yml, mustRedisStore(b.client))
	r := &spillway.Request{Endpoint: "/login", Priority: spillway.Critical}
	r.Set(spillway.DimIP, "10.1.2.3")
	_, _, err := bare.Admit(context.Background(), r)
	var se *spillway.StoreError
	if !errors.Is(err, spillway.ErrStoreUnavailable) || !errors.As(err, &se) || se.Fail != spillway.FailClosed || block.FailModeOf(err, spillway.FailOpen) != spillway.FailClosed {
		t.Fatalf("bare store, Redis down: err = %v; want a fail-closed StoreError", err)
	}
}

// A "cost: response" rule behind a fallback.Store: with Redis up the
// store holds and settles; while Redis is down the local share (20%)
// holds, the decisions Degraded, and the hold settles locally to the
// actual cost; what Redis holds is untouched meanwhile.
func TestTiersResponseCostBehindStore(t *testing.T) {
	const yml = `
limits:
  - id: tokens
    endpoint: /gen
    by: api_key
    bucket: 600/minute
    cost: response
    estimate: 100
`
	b := newBed(t)
	st := b.fallback(t, fallback.Settings{})
	lim := tiersLimiter(t, yml, st)
	ctx := context.Background()
	gen := func(cost int64) *spillway.Request {
		r := &spillway.Request{Endpoint: "/gen", Method: "POST", Priority: spillway.Critical, Cost: cost, Usage: new(spillway.Usage)}
		r.Set(spillway.DimAPIKey, "k-fb")
		return r
	}
	tokens := ratelimit.Policy{Limit: 600, Period: time.Minute}
	ms, err := tiersview.Items(ctx, lim, gen(0))
	if err != nil || len(ms) != 1 {
		t.Fatalf("matches %v %v", ms, err)
	}
	scope := ms[0].Scope
	redisLeft := func() int64 {
		t.Helper()
		return decide(t, b.directStore(t), scope, ms[0].Key, tokens, 0).Remaining
	}

	r := gen(0)
	d, done, err := lim.Admit(ctx, r)
	if want := (spillway.Decision{Allowed: true, Limiter: "tokens", Limit: 600, Remaining: 500, ResetAfter: 10 * time.Second, Window: time.Minute}); err != nil || d != want {
		t.Fatalf("Redis up: %+v %v, want %+v", d, err, want)
	}
	if err := r.Usage.Set(50); err != nil {
		t.Fatal(err)
	}
	done(spillway.Success)
	// The settle is sent off the request path: Flush (through the Store)
	// sends it now.
	if err := lim.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := redisLeft(); got != 550 {
		t.Fatalf("Redis after the settle: %d left, want 550", got)
	}

	b.setMode(t, faultproxy.Refuse)
	r = gen(0)
	d, done, err = lim.Admit(ctx, r)
	if err != nil || !d.Allowed || !d.Degraded || d.Limiter != "tokens" || d.Remaining != 20 {
		t.Fatalf("Redis down: %+v %v, want held by the local share (120), 20 left", d, err)
	}
	if err := r.Usage.Add(30); err != nil {
		t.Fatal(err)
	}
	done(spillway.Success) // settled locally: 30 of the share's 120
	d, _, err = lim.Admit(ctx, gen(0))
	if err != nil || d.Allowed || !d.Degraded || d.Reason != spillway.ReasonRateLimited || d.Remaining != 90 {
		t.Fatalf("Redis down, 90 left locally: %+v %v, want a degraded denial", d, err)
	}
	r = gen(90)
	d, done, err = lim.Admit(ctx, r)
	if err != nil || !d.Allowed || !d.Degraded || d.Remaining != 0 {
		t.Fatalf("Redis down, an estimate of 90: %+v %v", d, err)
	}
	// A step past the share is refused locally.
	var se *tiers.SpentError
	if err := r.Usage.Add(100); !errors.As(err, &se) || !se.Decision().Degraded || se.Decision().Limiter != "tokens" {
		t.Fatalf("step past the local share: %v", err)
	}
	done(spillway.Success)

	b.setMode(t, faultproxy.Pass)
	if got := redisLeft(); got != 550 {
		t.Fatalf("Redis after the outage: %d left, want 550 (the local holds stay local)", got)
	}
}

// plainInner is a store that cannot hold.
type plainInner struct{ ratelimit.Store }

// A fallback.Store over a store that cannot hold refuses a "cost:
// response" config when tiers.New builds it (CanReserve), instead of
// failing every such request.
func TestTiersResponseCostOverStoreThatCannotHold(t *testing.T) {
	cfg, err := tiers.Parse("limits.yaml", []byte("limits:\n  - id: tokens\n    by: api_key\n    bucket: 600/minute\n    cost: response\n    estimate: 100\n"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := fallback.NewStore(plainInner{ratelimit.NewMemoryStore(ratelimit.MemorySettings{})}, fallback.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CanReserve(); !errors.Is(err, ratelimit.ErrHoldUnsupported) {
		t.Fatalf("CanReserve = %v", err)
	}
	_, err = tiers.New(cfg, st, tiers.Settings{})
	want := `tiers: limits.yaml:2: rule "tokens": cost: response needs a store that holds estimates (one with a Reserve method); fallback: ratelimit: holds are not supported: inner store fallback_test.plainInner has no Reserve method`
	if err == nil || err.Error() != want || !errors.Is(err, ratelimit.ErrHoldUnsupported) {
		t.Fatalf("tiers.New = %v\nwant %s", err, want)
	}
	ok, err := fallback.NewStore(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), fallback.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ok.CanReserve(); err != nil {
		t.Fatalf("CanReserve over a memory store = %v", err)
	}
	if _, err := tiers.New(cfg, ok, tiers.Settings{}); err != nil {
		t.Fatal(err)
	}
}

// tiersLimiter is a tiers limiter over store from the YAML config yml.
func tiersLimiter(t testing.TB, yml string, store ratelimit.Store) *tiers.Limiter {
	return tierstest.Limiter(t, yml, store)
}
