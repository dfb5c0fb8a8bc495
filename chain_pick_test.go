package spillway_test

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

// An allowed chain answers with a rate limit's decision (Window > 0) even
// when a concurrency limit or a capacity has less left, so headers describe
// the rate the client is under; among rate limits the lowest Remaining wins.
func TestChainPrefersRateLimits(t *testing.T) {
	allow := func(d spillway.Decision) spillway.Limiter {
		d.Allowed = true
		return block.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
			return d, spillway.Noop, nil
		})
	}
	perMinute := spillway.Decision{Limiter: "per_minute", Limit: 100, Remaining: 90, Window: time.Minute}
	perSecond := spillway.Decision{Limiter: "per_second", Limit: 10, Remaining: 5, Window: time.Second}
	conc := spillway.Decision{Limiter: "concurrency", Limit: 20, Remaining: 1}
	ceiling := spillway.Decision{Limiter: "ceiling", Limit: 5, Remaining: 0}
	shed := spillway.Decision{Limiter: "worker"} // no Limit

	for _, c := range []struct {
		name  string
		chain []spillway.Limiter
		want  string
	}{
		{"rate before concurrency", []spillway.Limiter{allow(perMinute), allow(conc), allow(shed)}, "per_minute"},
		{"rate after concurrency", []spillway.Limiter{allow(conc), allow(ceiling), allow(perMinute)}, "per_minute"},
		{"lowest remaining among rates", []spillway.Limiter{allow(perMinute), allow(conc), allow(perSecond)}, "per_second"},
		{"no rate: lowest remaining", []spillway.Limiter{allow(conc), allow(ceiling), allow(shed)}, "ceiling"},
		{"no limit at all: the first", []spillway.Limiter{allow(shed), allow(spillway.Decision{Limiter: "other"})}, "worker"},
	} {
		d, done, err := spillway.Chain(c.chain...).Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
		if err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", c.name, d, err)
		}
		done(spillway.Success)
		if d.Limiter != c.want {
			t.Errorf("%s: answered by %q, want %q", c.name, d.Limiter, c.want)
		}
	}
}
