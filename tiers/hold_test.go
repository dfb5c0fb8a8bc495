package tiers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/ratelimit"
)

// tokensConfig: 600 tokens a minute per API key (one token per 100 ms,
// burst 600), charged on the response with an estimate of 100, and a
// request count on the same calls.
const tokensConfig = `
limits:
  - id: tokens
    endpoint: /gen
    by: api_key
    bucket: 600/minute
    cost: response
    estimate: 100
  - id: calls
    endpoint: /gen
    by: api_key
    bucket: 1000/minute
`

// obsLog records what a HoldObserver is told.
type obsLog struct {
	mu sync.Mutex
	ev []string
}

func (o *obsLog) Held(_ context.Context, rule string, units int64) {
	o.mu.Lock()
	o.ev = append(o.ev, fmt.Sprintf("held %s %d", rule, units))
	o.mu.Unlock()
}

func (o *obsLog) Settled(_ context.Context, rule string, units int64, result string) {
	o.mu.Lock()
	o.ev = append(o.ev, fmt.Sprintf("settled %s %d %s", rule, units, result))
	o.mu.Unlock()
}

// take returns the events since the last take.
func (o *obsLog) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	ev := o.ev
	o.ev = nil
	return ev
}

// holdStore is a store under test, on a fake clock.
type holdStore struct {
	name string
	new  func(t *testing.T, clk *testclock.Clock) ratelimit.Store
}

// holdStores are the memory store and a real redis-server (the client's
// clock: the fake one), one server for the whole test.
func holdStores(t *testing.T) []holdStore {
	srv := redistest.Start(t)
	return []holdStore{
		{"memory", func(t *testing.T, clk *testclock.Clock) ratelimit.Store {
			return ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
		}},
		{"redis", func(t *testing.T, clk *testclock.Clock) ratelimit.Store {
			c := srv.Client(t)
			if err := c.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			return mustRedisStore(c, ratelimit.RedisSettings{Clock: clk.Now})
		}},
	}
}

// metered is a request to /gen of key, with a Usage.
func metered(key string) *spillway.Request {
	r := req("POST", "/gen", "api_key", key, "ip", "10.0.0.1")
	r.Usage = new(spillway.Usage)
	return r
}

func admitOK(t *testing.T, l *Limiter, r *spillway.Request, want spillway.Decision) spillway.Done {
	t.Helper()
	d, done, err := l.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	d.Window = 0
	if d != want {
		t.Fatalf("Admit:\n got %+v\nwant %+v", d, want)
	}
	return done
}

func wantLeft(t *testing.T, l *Limiter, store ratelimit.Store, key string, want map[string]int64) {
	t.Helper()
	if got := peek(t, l, store, metered(key)); !mapsEqualInt(got, want) {
		t.Fatalf("left %v, want %v", got, want)
	}
}

func mapsEqualInt(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func allowed(rule string, limit, remaining int64, reset time.Duration) spillway.Decision {
	return spillway.Decision{Allowed: true, Limiter: rule, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

const tok = 100 * time.Millisecond // one token of 600/minute

// The estimate is held at admission and settled to what was reported:
// a refund, the estimate when nothing was reported, nothing when the
// work was Ignored, an extra charge into debt that makes the next
// request wait exactly as long as the debt says; the request count rule
// of the same batch is charged once per request, all or nothing.
func TestResponseCost(t *testing.T) {
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			obs := &obsLog{}
			l := mustLimiter(t, tokensConfig, store, Settings{HoldObserver: obs})
			const key = "k1"

			// 100 held: 500 left; the response used 30: 570.
			r := metered(key)
			done := admitOK(t, l, r, allowed("tokens", 600, 500, 100*tok))
			wantLeft(t, l, store, key, map[string]int64{"tokens": 500, "calls": 999})
			if err := r.Usage.Set(30); err != nil {
				t.Fatal(err)
			}
			done(spillway.Success)
			flushT(t, l)
			done(spillway.Success) // once only
			flushT(t, l)
			wantLeft(t, l, store, key, map[string]int64{"tokens": 570, "calls": 999})
			if got, want := obs.take(), []string{"held tokens 100", "settled tokens 30 applied"}; !slices.Equal(got, want) {
				t.Fatalf("observer: %q, want %q", got, want)
			}

			// Nothing reported: the estimate stands.
			admitOK(t, l, metered(key), allowed("tokens", 600, 470, 130*tok))(spillway.Success)
			flushT(t, l)
			wantLeft(t, l, store, key, map[string]int64{"tokens": 470, "calls": 998})
			// Nothing reported and Ignored (a later block denied): the
			// tokens are given back, the call stays counted.
			admitOK(t, l, metered(key), allowed("tokens", 600, 370, 230*tok))(spillway.Ignored)
			flushT(t, l)
			wantLeft(t, l, store, key, map[string]int64{"tokens": 470, "calls": 997})
			// Reported and Ignored (the client left mid-way): charged.
			r = metered(key)
			done = admitOK(t, l, r, allowed("tokens", 600, 370, 230*tok))
			if err := r.Usage.Add(400); err != nil {
				t.Fatal(err)
			}
			done(spillway.Ignored)
			flushT(t, l)
			wantLeft(t, l, store, key, map[string]int64{"tokens": 70, "calls": 996})
			obs.take()

			// 70 left, 100 needed: denied, neither rule charged.
			d, done, err := l.Admit(context.Background(), metered(key))
			if err != nil {
				t.Fatal(err)
			}
			done(spillway.Success)
			flushT(t, l)
			if want := (spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "tokens", Limit: 600, Remaining: 70, ResetAfter: 530 * tok, RetryAfter: 30 * tok, Window: time.Minute}); d != want {
				t.Fatalf("denial:\n got %+v\nwant %+v", d, want)
			}
			wantLeft(t, l, store, key, map[string]int64{"tokens": 70, "calls": 996})
			if got := obs.take(); len(got) != 0 {
				t.Fatalf("observer after a denial: %q", got)
			}

			// The caller's own estimate (Request.Cost 50) fits; the
			// response used 300: 250 over the estimate, 230 beyond the
			// burst in debt.
			r = metered(key)
			r.Cost = 50
			done = admitOK(t, l, r, allowed("tokens", 600, 20, 580*tok))
			wantLeft(t, l, store, key, map[string]int64{"tokens": 20, "calls": 946})
			// The report is a step too: 250 over, 20 left: refused (a
			// request that stops here settles at 300 all the same).
			var se *SpentError
			if err := r.Usage.Set(300); !errors.As(err, &se) || se.Decision().RetryAfter != 280*tok {
				t.Fatalf("Set(300) = %v, want a refusal, retry in 28 s (230 of debt, an estimate of 50)", err)
			}
			done(spillway.Success)
			flushT(t, l)
			wantLeft(t, l, store, key, map[string]int64{"tokens": 0, "calls": 946})
			// The next request needs the debt (230) and its estimate (100)
			// back: 33 s.
			d, _, err = l.Admit(context.Background(), metered(key))
			if err != nil {
				t.Fatal(err)
			}
			if want := (spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "tokens", Limit: 600, ResetAfter: 830 * tok, RetryAfter: 330 * tok, Window: time.Minute}); d != want {
				t.Fatalf("in debt:\n got %+v\nwant %+v", d, want)
			}
			clk.Advance(330*tok - time.Millisecond)
			if d, _, _ := l.Admit(context.Background(), metered(key)); d.Allowed || d.RetryAfter != time.Millisecond {
				t.Fatalf("1ms before the debt is paid: %+v", d)
			}
			clk.Advance(time.Millisecond)
			admitOK(t, l, metered(key), allowed("tokens", 600, 0, 600*tok))(spillway.Success)
			flushT(t, l)
			if got, want := obs.take(), []string{"held tokens 50", "settled tokens 300 applied", "held tokens 100", "settled tokens 100 applied"}; !slices.Equal(got, want) {
				t.Fatalf("observer: %q, want %q", got, want)
			}
		})
	}
}

// A streaming response reports its steps: within the estimate no store
// is called; beyond it each step charges its overrun, and the step that
// finds no room is refused with a *SpentError whose denial says when a
// new request can get in once this one settles, and whose overrun is
// charged by the settle, as debt.
func TestResponseCostSteps(t *testing.T) {
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			obs := &obsLog{}
			l := mustLimiter(t, tokensConfig, store, Settings{HoldObserver: obs})
			const key = "k2"
			r := metered(key)
			done := admitOK(t, l, r, allowed("tokens", 600, 500, 100*tok))
			if err := r.Usage.Set(450); err != nil {
				t.Fatal(err) // 350 over the estimate, charged as the step comes
			}
			wantLeft(t, l, store, key, map[string]int64{"tokens": 150, "calls": 999})
			done(spillway.Success)
			flushT(t, l)
			wantLeft(t, l, store, key, map[string]int64{"tokens": 150, "calls": 999})

			// 150 left; the stream holds 100.
			r = metered(key)
			done = admitOK(t, l, r, allowed("tokens", 600, 50, 550*tok))
			for i, step := range []struct {
				add  int64
				left int64 // tokens left after the step
			}{{60, 50}, {40, 50}, {20, 30}} {
				if err := r.Usage.Add(step.add); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				wantLeft(t, l, store, key, map[string]int64{"tokens": step.left, "calls": 998})
			}
			// 180: 60 more than covered, 30 left: refused.
			err := r.Usage.Add(60)
			var se *SpentError
			if !errors.As(err, &se) {
				t.Fatalf("step past the limit: %v, want a *SpentError", err)
			}
			want := spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "tokens", Limit: 600, ResetAfter: 630 * tok, RetryAfter: 130 * tok, Window: time.Minute}
			if se.Decision() != want {
				t.Fatalf("refusal:\n got %+v\nwant %+v", se.Decision(), want)
			}
			if got := err.Error(); got != `tiers: limit "tokens" spent (600 per 1m0s); retry in 13s` {
				t.Fatalf("error text %q", got)
			}
			wantLeft(t, l, store, key, map[string]int64{"tokens": 30, "calls": 998}) // the refused step charged nothing yet
			done(spillway.Success)
			flushT(t, l)
			// Settled at 180: the refused 60 as debt (30 beyond the burst).
			// The refusal's RetryAfter is what the next request sees.
			d, _, err := l.Admit(context.Background(), metered(key))
			if err != nil {
				t.Fatal(err)
			}
			want = spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "tokens", Limit: 600, ResetAfter: 630 * tok, RetryAfter: 130 * tok, Window: time.Minute}
			if d != want {
				t.Fatalf("after the refused stream:\n got %+v\nwant %+v", d, want)
			}
			if got, want := obs.take(), []string{"held tokens 100", "settled tokens 450 applied", "held tokens 100", "settled tokens 180 applied"}; !slices.Equal(got, want) {
				t.Fatalf("observer: %q, want %q", got, want)
			}
			// A step after done charges nothing and refuses nothing.
			if err := r.Usage.Add(1000); err != nil {
				t.Fatalf("step after done: %v", err)
			}
			wantLeft(t, l, store, key, map[string]int64{"tokens": 0, "calls": 998})
		})
	}
}

// A refused stream that goes on is refused again without a store call,
// and everything it reported is charged (up to one burst of debt); a Set
// below what the steps already charged settles the hold to nothing.
func TestResponseCostStepsEdges(t *testing.T) {
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			l := mustLimiter(t, tokensConfig, store)

			r := metered("k3")
			done := admitOK(t, l, r, allowed("tokens", 600, 500, 100*tok))
			if err := r.Usage.Add(550); err != nil { // 450 over: fits
				t.Fatal(err)
			}
			err1 := r.Usage.Add(100) // 100 over, none left
			err2 := r.Usage.Add(100)
			var s1, s2 *SpentError
			if !errors.As(err1, &s1) || !errors.As(err2, &s2) || s1 != s2 {
				t.Fatalf("refusals %v, %v: want the same *SpentError twice", err1, err2)
			}
			if d := s1.Decision(); d.RetryAfter != 150*tok || d.ResetAfter != 650*tok {
				t.Fatalf("refusal %+v", d)
			}
			done(spillway.Success)
			flushT(t, l)
			// Reported 750, 600 charged: 150 of debt.
			d, _, _ := l.Admit(context.Background(), metered("k3"))
			if d.Allowed || d.RetryAfter != 250*tok || d.ResetAfter != 750*tok {
				t.Fatalf("after 750 on 600: %+v", d)
			}

			// Steps charged 200 beyond the estimate, then Set(50): the
			// hold settles to 0, the steps' 200 stay.
			r = metered("k4")
			done = admitOK(t, l, r, allowed("tokens", 600, 500, 100*tok))
			if err := r.Usage.Add(300); err != nil {
				t.Fatal(err)
			}
			if err := r.Usage.Set(50); err != nil {
				t.Fatal(err)
			}
			done(spillway.Success)
			flushT(t, l)
			wantLeft(t, l, store, "k4", map[string]int64{"tokens": 400, "calls": 999})
		})
	}
}

// Hostile numbers never panic, wrap or leave anything charged that
// should not be.
func TestResponseCostHostile(t *testing.T) {
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			obs := &obsLog{}
			l := mustLimiter(t, tokensConfig, store, Settings{HoldObserver: obs})

			// An estimate no bucket can hold: denied, nothing charged.
			r := metered("h1")
			r.Cost = math.MaxInt64
			d, done, err := l.Admit(context.Background(), r)
			done(spillway.Success)
			flushT(t, l)
			if err != nil || d.Allowed || d.Reason != spillway.ReasonCostExceedsLimit || d.Limiter != "tokens" {
				t.Fatalf("MaxInt64 estimate: %+v %v", d, err)
			}
			wantLeft(t, l, store, "h1", map[string]int64{"tokens": 600, "calls": 1000})

			// A negative report changes nothing; MaxInt64 as the actual
			// cost is at most one burst of debt.
			r = metered("h2")
			done = admitOK(t, l, r, allowed("tokens", 600, 500, 100*tok))
			if err := r.Usage.Add(-1); !errors.Is(err, spillway.ErrInvalidUsage) {
				t.Fatalf("Add(-1) = %v", err)
			}
			if err := r.Usage.Set(-5); !errors.Is(err, spillway.ErrInvalidUsage) {
				t.Fatalf("Set(-5) = %v", err)
			}
			wantLeft(t, l, store, "h2", map[string]int64{"tokens": 500, "calls": 999})
			var se *SpentError
			if err := r.Usage.Add(math.MaxInt64); !errors.As(err, &se) {
				t.Fatalf("Add(MaxInt64) = %v, want a refusal", err)
			}
			if d := se.Decision(); d.RetryAfter != 700*tok || d.ResetAfter != 1200*tok {
				t.Fatalf("refusal of MaxInt64: %+v", d)
			}
			if err := r.Usage.Add(math.MaxInt64); !errors.As(err, &se) { // saturates
				t.Fatalf("Add(MaxInt64) again = %v", err)
			}
			done(spillway.Success)
			flushT(t, l)
			d, _, _ = l.Admit(context.Background(), metered("h2"))
			if d.Allowed || d.RetryAfter != 700*tok || d.ResetAfter != 1200*tok {
				t.Fatalf("after MaxInt64: %+v (want the debt at its bound, one burst)", d)
			}
			clk.Advance(700 * tok)
			admitOK(t, l, metered("h2"), allowed("tokens", 600, 0, 600*tok))(spillway.Success)
			flushT(t, l)
			if got := obs.take(); len(got) != 4 || got[1] != fmt.Sprintf("settled tokens %d applied", int64(math.MaxInt64)) {
				t.Fatalf("observer: %q", got)
			}
		})
	}
}

// A hold whose request outlives its TTL is released by the store; the
// late settle reports it expired and changes nothing. The request count
// rule, charged at admission (fixed, not held), stays charged: it has
// refilled since, and is not charged again.
func TestResponseCostSettleAfterTTL(t *testing.T) {
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			obs := &obsLog{}
			l := mustLimiter(t, tokensConfig, store, Settings{HoldObserver: obs, HoldTTL: 10 * time.Second})
			r := metered("t1")
			done := admitOK(t, l, r, allowed("tokens", 600, 500, 100*tok))
			if err := r.Usage.Add(150); err != nil { // 50 over: charged now
				t.Fatal(err)
			}
			clk.Advance(10 * time.Second) // 100 tokens and the calls token refill
			// The store released both holds at their TTL: the bucket is
			// full again; the step charges its 20 all the same.
			if err := r.Usage.Add(20); err != nil {
				t.Fatal(err)
			}
			wantLeft(t, l, store, "t1", map[string]int64{"tokens": 580, "calls": 1000})
			done(spillway.Success)
			flushT(t, l)
			// Only the steps' 70 stay; the call, charged once at
			// admission, is not charged again.
			wantLeft(t, l, store, "t1", map[string]int64{"tokens": 580, "calls": 1000})
			if got, want := obs.take(), []string{"held tokens 100", "settled tokens 70 expired"}; !slices.Equal(got, want) {
				t.Fatalf("observer: %q, want %q", got, want)
			}
		})
	}
}

// A window rule cannot hold: it is decided after the hold, and when it
// denies the hold is given back exactly; when the hold is denied the
// window rule is only peeked.
func TestResponseCostWithWindowRule(t *testing.T) {
	const yml = `
limits:
  - id: tokens
    endpoint: /gen
    by: api_key
    bucket: 6000/minute
    cost: response
    estimate: 100
  - id: daily
    endpoint: /gen
    by: ip
    bucket: 2/day
    algorithm: fixed_window
`
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			l := mustLimiter(t, yml, store)
			left := func(want map[string]int64) { t.Helper(); wantLeft(t, l, store, "w1", want) }
			admitOK(t, l, metered("w1"), allowed("daily", 2, 1, 6400*time.Second))(spillway.Success)
			flushT(t, l)
			admitOK(t, l, metered("w1"), allowed("daily", 2, 0, 6400*time.Second))(spillway.Success)
			flushT(t, l)
			left(map[string]int64{"tokens": 5800, "daily": 0})
			// The window denies after the hold was made: given back.
			d, done, err := l.Admit(context.Background(), metered("w1"))
			done(spillway.Success)
			flushT(t, l)
			want := spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "daily", Limit: 2, ResetAfter: 6400 * time.Second, RetryAfter: 6400 * time.Second, Window: 24 * time.Hour}
			if err != nil || d != want {
				t.Fatalf("window denial: %+v %v, want %+v", d, err, want)
			}
			left(map[string]int64{"tokens": 5800, "daily": 0})
			// The hold denies: the window rule is peeked, not charged.
			clk.Advance(6400 * time.Second)
			r := metered("w1")
			r.Cost = 6001
			d, _, err = l.Admit(context.Background(), r)
			if err != nil || d.Allowed || d.Limiter != "tokens" || d.Reason != spillway.ReasonCostExceedsLimit {
				t.Fatalf("hold denial: %+v %v", d, err)
			}
			left(map[string]int64{"tokens": 6000, "daily": 2})
		})
	}
}

// A shadow "cost: response" rule is held and settled with the rest, never
// refuses a step, and when only it would deny the request is decided
// without it.
func TestResponseCostShadow(t *testing.T) {
	const yml = `
limits:
  - id: tokens
    endpoint: /gen
    by: api_key
    bucket: 600/minute
    cost: response
    estimate: 100
  - id: dark
    endpoint: /gen
    by: api_key
    bucket: 150/minute
    cost: response
    estimate: 100
    shadow: true
`
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			obs := &obsLog{}
			var shadowed []string
			l := mustLimiter(t, yml, store, Settings{HoldObserver: obs, Shadow: func(_ context.Context, _ *spillway.Request, d spillway.Decision) {
				shadowed = append(shadowed, fmt.Sprintf("%s %v %d", d.Limiter, d.Allowed, d.Remaining))
			}})
			r := metered("s1")
			done := admitOK(t, l, r, allowed("tokens", 600, 500, 100*tok))
			if err := r.Usage.Add(200); err != nil { // dark has 50 left: never refuses
				t.Fatal(err)
			}
			done(spillway.Success)
			flushT(t, l)
			wantLeft(t, l, store, "s1", map[string]int64{"tokens": 400, "dark": 0})
			// dark would deny: the request is held on tokens alone.
			r = metered("s1")
			done = admitOK(t, l, r, allowed("tokens", 600, 300, 300*tok))
			if err := r.Usage.Set(10); err != nil {
				t.Fatal(err)
			}
			done(spillway.Success)
			flushT(t, l)
			wantLeft(t, l, store, "s1", map[string]int64{"tokens": 390, "dark": 0})
			if want := []string{"dark true 50", "dark false 0"}; !slices.Equal(shadowed, want) {
				t.Fatalf("shadow hook: %q, want %q", shadowed, want)
			}
			if got, want := obs.take(), []string{"held tokens 100", "held dark 100", "settled tokens 200 applied", "settled dark 200 applied", "held tokens 100", "settled tokens 10 applied"}; !slices.Equal(got, want) {
				t.Fatalf("observer: %q, want %q", got, want)
			}
			if st := l.stats()["dark"]; st.ShadowDenied != 1 || st.Matched != 2 {
				t.Fatalf("dark stats %+v", st)
			}
		})
	}
}

// plainStore is a Store that does not hold.
type plainStore struct{ ratelimit.Store }

// A "cost: response" rule needs a store that holds: New and Swap say so
// with the rule's line; the config in use stays.
func TestResponseCostNeedsReserver(t *testing.T) {
	cfg, err := Parse("limits.yaml", []byte(tokensConfig))
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(cfg, plainStore{ratelimit.NewMemoryStore(ratelimit.MemorySettings{})}, Settings{})
	want := `tiers: limits.yaml:3: rule "tokens": cost: response needs a store that holds estimates (one with a Reserve method); tiers.plainStore is not one`
	if err == nil || err.Error() != want || !errors.Is(err, ratelimit.ErrHoldUnsupported) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New = %v, want %s", err, want)
	}
	l := mustLimiter(t, loginConfig, plainStore{ratelimit.NewMemoryStore(ratelimit.MemorySettings{})})
	if err := l.Swap(cfg); err == nil || err.Error() != want {
		t.Fatalf("Swap = %v, want %s", err, want)
	}
	if l.config() == cfg {
		t.Fatal("the rejected config is in use")
	}
	for _, o := range []Settings{{HoldTTL: -1}, {HoldTTL: ratelimit.MaxHoldTTL + 1}, {SettleTimeout: -1}} {
		if _, err := New(cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), o); err == nil {
			t.Fatal("a bad hold option was accepted")
		}
	}
	// Built in Go, the same checks.
	bad := &Config{Rules: []Rule{{ID: "w", By: []string{"ip"}, Bucket: Bucket{Limit: 10, Period: time.Minute}, Algorithm: ratelimit.FixedWindow, Cost: CostResponse, Estimate: 1}}}
	if _, err := New(bad, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{}); err == nil || !errors.Is(err, ratelimit.ErrHoldUnsupported) || !strings.Contains(err.Error(), `rule "w": cost: response: fixed_window keeps no holds`) {
		t.Fatalf("window rule built in Go: %v", err)
	}
	bad.Rules[0].Algorithm, bad.Rules[0].Estimate = ratelimit.GCRA, 0
	if _, err := New(bad, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{}); err == nil || err.Error() != `tiers: rule "w": estimate 0 must be at least 1 (holding nothing, a request would be admitted even while its key is in debt)` {
		t.Fatalf("estimate 0 built in Go: %v", err)
	}
	bad.Rules[0].Estimate = 11
	if _, err := New(bad, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{}); err == nil || err.Error() != `tiers: rule "w": estimate 11 is above the burst 10: no request could ever be admitted` {
		t.Fatalf("estimate 11 built in Go: %v", err)
	}
	bad.Rules[0].Cost = CostRequest
	if _, err := New(bad, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{}); err == nil || err.Error() != `tiers: rule "w": estimate: only a rule with cost: response holds an estimate` {
		t.Fatalf("estimate without cost: response: %v", err)
	}
}

// matches says which rules charge the response and what they hold.
func TestMatchesResponse(t *testing.T) {
	l := mustLimiter(t, tokensConfig, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
	ms, err := l.matches(context.Background(), metered("m"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Cost != CostResponse || ms[0].Item.Cost != 100 || ms[1].Cost != CostRequest || ms[1].Item.Cost != 1 {
		t.Fatalf("matches %+v", ms)
	}
}

// Concurrent steps of one request and concurrent requests of one key add
// up exactly: every unit reported is charged once.
func TestResponseCostConcurrent(t *testing.T) {
	const yml = `
limits:
  - id: tokens
    endpoint: /gen
    by: api_key
    bucket: 60000/minute
    cost: response
    estimate: 100
`
	for _, s := range holdStores(t) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			store := s.new(t, clk)
			l := mustLimiter(t, yml, store)
			r := metered("c1")
			done := admitOK(t, l, r, allowed("tokens", 60000, 59900, 100*time.Millisecond))
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 20 {
						if err := r.Usage.Add(10); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			done(spillway.Success)
			flushT(t, l)
			if got := peek(t, l, store, metered("c1"))["tokens"]; got != 60000-1600 {
				t.Fatalf("after 8×20 steps of 10: %d left, want %d", got, 60000-1600)
			}
			for range 20 {
				wg.Go(func() {
					r := metered("c2")
					d, done, err := l.Admit(context.Background(), r)
					if err != nil || !d.Allowed {
						t.Errorf("%+v %v", d, err)
						return
					}
					_ = r.Usage.Set(150)
					done(spillway.Success)
				})
			}
			wg.Wait()
			if got := peek(t, l, store, metered("c2"))["tokens"]; got != 60000-20*150 {
				t.Fatalf("after 20 requests of 150: %d left, want %d", got, 60000-20*150)
			}
		})
	}
}
