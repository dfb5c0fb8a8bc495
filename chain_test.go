package spillway_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

// counting is a limiter with a fixed answer that counts acquisitions and
// releases, and records the outcomes it was released with.
type counting struct {
	name     string
	d        spillway.Decision
	err      error
	acquired int
	released []spillway.Outcome
	log      *[]string
}

func (c *counting) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if c.log != nil {
		*c.log = append(*c.log, "admit "+c.name)
	}
	if c.err != nil {
		return spillway.Decision{}, spillway.Noop, c.err
	}
	d := c.d
	d.Limiter = c.name
	if !d.Allowed {
		return d, spillway.Noop, nil
	}
	c.acquired++
	return d, func(o spillway.Outcome) {
		if c.log != nil {
			*c.log = append(*c.log, "release "+c.name)
		}
		c.released = append(c.released, o)
	}, nil
}

func allow(limit, remaining int64) spillway.Decision {
	return spillway.Decision{Allowed: true, Limit: limit, Remaining: remaining}
}

func TestChainStopsAtFirstDenialAndReleasesEarlierInReverse(t *testing.T) {
	var log []string
	a := &counting{name: "rate", d: allow(10, 9), log: &log}
	b := &counting{name: "concurrency", d: allow(5, 4), log: &log}
	c := &counting{name: "shed", d: spillway.Decision{Reason: spillway.ReasonShed, RetryAfter: time.Second}, log: &log}
	d := &counting{name: "ceiling", d: allow(100, 1), log: &log}
	got, done, err := spillway.Chain(a, b, c, d).Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
	if err != nil {
		t.Fatal(err)
	}
	want := spillway.Decision{Reason: spillway.ReasonShed, Limiter: "shed", RetryAfter: time.Second}
	if got != want {
		t.Fatalf("decision = %+v, want %+v", got, want)
	}
	done(spillway.Success) // a denial's done is a harmless no-op
	wantLog := []string{"admit rate", "admit concurrency", "admit shed", "release concurrency", "release rate"}
	if fmt.Sprint(log) != fmt.Sprint(wantLog) {
		t.Fatalf("calls = %v, want %v", log, wantLog)
	}
	if fmt.Sprint(a.released, b.released) != fmt.Sprint([]spillway.Outcome{spillway.Ignored}, []spillway.Outcome{spillway.Ignored}) {
		t.Fatalf("released with %v and %v, want [ignored] each", a.released, b.released)
	}
	if d.acquired != 0 {
		t.Fatalf("limiter after the denial was asked: acquired %d", d.acquired)
	}
}

func TestChainAllowedReturnsMostRestrictiveAndReleasesOnce(t *testing.T) {
	var log []string
	a := &counting{name: "rate", d: allow(10, 7), log: &log}
	b := &counting{name: "shed", d: allow(0, 0), log: &log} // shedders carry no Limit
	c := &counting{name: "user", d: allow(5, 2), log: &log}
	e := &counting{name: "ceiling", d: allow(1000, 900), log: &log}
	e.d.Degraded = true
	got, done, err := spillway.Chain(a, b, nil, c, e).Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
	if err != nil {
		t.Fatal(err)
	}
	want := spillway.Decision{Allowed: true, Limiter: "user", Limit: 5, Remaining: 2, Degraded: true}
	if got != want {
		t.Fatalf("decision = %+v, want %+v", got, want)
	}
	log = log[:0]
	done(spillway.Dropped)
	done(spillway.Success) // second call is ignored
	wantLog := []string{"release ceiling", "release user", "release shed", "release rate"}
	if fmt.Sprint(log) != fmt.Sprint(wantLog) {
		t.Fatalf("release order = %v, want %v", log, wantLog)
	}
	for _, l := range []*counting{a, b, c, e} {
		if len(l.released) != 1 || l.released[0] != spillway.Dropped {
			t.Fatalf("%s released %v, want exactly [dropped]", l.name, l.released)
		}
	}
}

func TestChainErrorReleasesEarlier(t *testing.T) {
	boom := errors.New("redis: connection refused")
	a := &counting{name: "rate", d: allow(10, 9)}
	b := &counting{name: "conc", err: boom}
	got, done, err := spillway.Chain(a, b).Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	if got != (spillway.Decision{}) || done == nil {
		t.Fatalf("decision = %+v, done nil = %v; want the zero decision and a non-nil done", got, done == nil)
	}
	if len(a.released) != 1 || a.released[0] != spillway.Ignored {
		t.Fatalf("rate released %v, want [ignored]", a.released)
	}
}

func TestChainRejectsMalformedRequests(t *testing.T) {
	a := &counting{name: "rate", d: allow(10, 9)}
	ch := spillway.Chain(a)
	for _, r := range []*spillway.Request{
		nil,
		{Cost: -1, Priority: spillway.Critical},
		{Priority: spillway.Priority(9)},
	} {
		d, _, err := ch.Admit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.Reason != spillway.ReasonInvalid {
			t.Fatalf("request %+v: decision %+v, want denied with ReasonInvalid", r, d)
		}
	}
	if a.acquired != 0 {
		t.Fatalf("a malformed request reached a limiter (%d acquisitions)", a.acquired)
	}
}

func TestEmptyChainAllows(t *testing.T) {
	d, done, err := spillway.Chain().Admit(context.Background(), &spillway.Request{})
	if err != nil || !d.Allowed || done == nil {
		t.Fatalf("empty chain: %+v, done nil %v, err %v", d, done == nil, err)
	}
}

func TestOnceCallsOnlyFirst(t *testing.T) {
	var got []spillway.Outcome
	done := block.Once(func(o spillway.Outcome) { got = append(got, o) })
	done(spillway.Dropped)
	done(spillway.Success)
	if len(got) != 1 || got[0] != spillway.Dropped {
		t.Fatalf("calls = %v, want [dropped]", got)
	}
	block.Once(nil)(spillway.Success) // nil becomes Noop, no panic
}

func TestPriorityNames(t *testing.T) {
	for p := spillway.Sheddable; p <= spillway.CriticalPlus; p++ {
		back, err := spillway.ParsePriority(p.String())
		if err != nil || back != p {
			t.Fatalf("ParsePriority(%q) = %v, %v", p.String(), back, err)
		}
	}
	if p, err := spillway.ParsePriority("CRITICAL-PLUS"); err != nil || p != spillway.CriticalPlus {
		t.Fatalf("SRE spelling: %v, %v", p, err)
	}
	if _, err := spillway.ParsePriority("urgent"); err == nil || err.Error() != `spillway: unknown priority "urgent" (want one of sheddable, sheddable_plus, critical, critical_plus)` {
		t.Fatalf("unknown priority error = %v", err)
	}
	if s := spillway.Priority(7).String(); s != "priority(7)" {
		t.Fatalf("String of an invalid priority = %q", s)
	}
}

func TestReasonIsShed(t *testing.T) {
	shed := map[spillway.Reason]bool{spillway.ReasonShed: true, spillway.ReasonCeiling: true, spillway.ReasonFailClosed: true}
	for r := spillway.ReasonNone; r <= spillway.ReasonInvalid; r++ {
		if r.IsShed() != shed[r] {
			t.Fatalf("%s.IsShed() = %v", r, r.IsShed())
		}
	}
}

func TestRequestDimensions(t *testing.T) {
	r := &spillway.Request{Endpoint: "/api/v1/search"}
	r.Set(spillway.DimIP, "10.0.0.1")
	r.Set(spillway.DimUser, "alice")
	r.Set(spillway.DimIP, "10.0.0.2") // replaces
	if v, ok := r.Get(spillway.DimIP); !ok || v != "10.0.0.2" {
		t.Fatalf("ip = %q, %v", v, ok)
	}
	if len(r.Dims) != 2 {
		t.Fatalf("dims = %v, want 2 entries", r.Dims)
	}
	if v, ok := r.Get(spillway.DimEndpoint); !ok || v != "/api/v1/search" {
		t.Fatalf("endpoint = %q, %v", v, ok)
	}
	if _, ok := r.Get(spillway.DimAPIKey); ok {
		t.Fatal("api_key reported present")
	}
	if r.EffectiveCost() != 1 {
		t.Fatalf("EffectiveCost of cost 0 = %d, want 1", r.EffectiveCost())
	}
}

func ExampleChain() {
	rate := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{Allowed: true, Limiter: "rate", Limit: 10, Remaining: 3}, spillway.Noop, nil
	})
	shed := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		if r.Priority < spillway.Critical {
			return spillway.Decision{Reason: spillway.ReasonShed, Limiter: "shed", RetryAfter: time.Second}, spillway.Noop, nil
		}
		return spillway.Decision{Allowed: true, Limiter: "shed"}, spillway.Noop, nil
	})
	chain := spillway.Chain(rate, shed)
	for _, p := range []spillway.Priority{spillway.Critical, spillway.Sheddable} {
		d, done, _ := chain.Admit(context.Background(), &spillway.Request{Priority: p})
		fmt.Printf("%s: allowed=%v by=%s reason=%s remaining=%d\n", p, d.Allowed, d.Limiter, d.Reason, d.Remaining)
		done(spillway.Success)
	}
	// Output:
	// critical: allowed=true by=rate reason=none remaining=3
	// sheddable: allowed=false by=shed reason=shed remaining=0
}

func BenchmarkChainAllowed(b *testing.B) {
	allowAll := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{Allowed: true, Limit: 10, Remaining: 5}, spillway.Noop, nil
	})
	ch := spillway.Chain(allowAll, allowAll, allowAll)
	r := &spillway.Request{Priority: spillway.Critical}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, done, _ := ch.Admit(ctx, r)
		done(spillway.Success)
	}
}
