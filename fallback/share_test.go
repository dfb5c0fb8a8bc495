package fallback_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
)

// shareBed is one server's blocks on one client with its Health, wired as
// the README says — the health, nothing else: a rate limit of 50 an hour
// per IP (through a fallback.Store), 5 in flight per key on Redis, a
// ceiling of 30 an hour, and the fleet shedder.
type shareBed struct {
	srv   *redistest.Server
	rate  *ratelimit.Limiter
	conc  *concurrency.Limiter
	ceil  *globalceiling.Ceiling
	fleet *shedder.Fleet
}

func newShareBed(t *testing.T, hs fallback.HealthSettings) *shareBed {
	t.Helper()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	if _, err := fallback.NewHealth(client, hs); err != nil {
		t.Fatal(err)
	}
	rstore, err := ratelimit.NewRedisStore(client, ratelimit.RedisSettings{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := fallback.NewStore(rstore, fallback.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	rate, err := ratelimit.New(store, ratelimit.Policy{Limit: 50, Period: time.Hour}, ratelimit.Settings{Scope: "per_ip"})
	if err != nil {
		t.Fatal(err)
	}
	cstore, err := concurrency.NewRedisStore(client, concurrency.RedisSettings{})
	if err != nil {
		t.Fatal(err)
	}
	conc, err := concurrency.New(cstore, 5, concurrency.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	ceil, err := globalceiling.New(client, fmt.Sprintf("db-%p", client), 30, time.Hour, globalceiling.Settings{Reserve: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ceil.Close() })
	fleet, err := shedder.NewFleet(client, fmt.Sprintf("fleet-%p", client), 100, shedder.FleetSettings{})
	if err != nil {
		t.Fatal(err)
	}
	return &shareBed{srv: srv, rate: rate, conc: conc, ceil: ceil, fleet: fleet}
}

// outage stops Redis (SIGSTOP) until the test ends.
func (b *shareBed) outage(t *testing.T) {
	t.Helper()
	if err := b.srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.srv.Resume() })
}

// counts admits rate-limited requests, concurrent slots and ceiling units
// until each block denies, and returns how many each admitted (all
// Degraded, or it fails).
func (b *shareBed) counts(t *testing.T) (rate, conc, ceil int) {
	t.Helper()
	ctx := context.Background()
	for ; rate <= 100; rate++ {
		d, err := b.rate.Allow(ctx, "192.0.2.7", 1)
		if err != nil || !d.Degraded {
			t.Fatalf("rate %d: %+v %v; want a Degraded decision", rate, d, err)
		}
		if !d.Allowed {
			break
		}
	}
	var dones []spillway.Done
	for ; conc <= 10; conc++ {
		d, done, err := b.conc.Acquire(ctx, "key", 1)
		if err != nil || !d.Degraded {
			t.Fatalf("concurrency %d: %+v %v; want a Degraded decision", conc, d, err)
		}
		if !d.Allowed {
			break
		}
		dones = append(dones, done)
	}
	for _, done := range dones {
		done(spillway.Success)
	}
	r := &spillway.Request{Priority: spillway.Critical}
	for ; ceil <= 60; ceil++ {
		d, _, err := b.ceil.Admit(ctx, r)
		if err != nil || !d.Degraded {
			t.Fatalf("ceiling %d: %+v %v; want a Degraded decision", ceil, d, err)
		}
		if !d.Allowed {
			break
		}
	}
	return rate, conc, ceil
}

// A lone server keeps its whole limit during an outage: its fleet shedder
// saw one server alive, so every block on the client decides locally at
// a share of 1, with nothing wired but the client's Health.
func TestLoneServerKeepsItsWholeLimitDuringAnOutage(t *testing.T) {
	b := newShareBed(t, fallback.HealthSettings{})
	if err := b.fleet.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := b.fleet.Stats(); s.Servers != 1 {
		t.Fatalf("fleet saw %d servers, want 1", s.Servers)
	}
	b.outage(t)
	rate, conc, ceil := b.counts(t)
	if rate != 50 || conc != 5 || ceil != 30 {
		t.Fatalf("admitted during the outage: rate %d, concurrency %d, ceiling %d; want the whole limits 50, 5, 30", rate, conc, ceil)
	}
}

// Without a fleet shedder's count the share is 0.2 (five servers
// assumed); HealthSettings.Share overrides either.
func TestShareUnknownFleetAndOverride(t *testing.T) {
	b := newShareBed(t, fallback.HealthSettings{})
	b.outage(t)
	if rate, conc, ceil := b.counts(t); rate != 10 || conc != 1 || ceil != 6 {
		t.Fatalf("unknown fleet: rate %d, concurrency %d, ceiling %d; want 10, 1, 6", rate, conc, ceil)
	}
	o := newShareBed(t, fallback.HealthSettings{Share: 0.5})
	if err := o.fleet.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	o.outage(t)
	if rate, conc, ceil := o.counts(t); rate != 25 || conc != 2 || ceil != 15 {
		t.Fatalf("override 0.5: rate %d, concurrency %d, ceiling %d; want 25, 2, 15", rate, conc, ceil)
	}
	if _, err := fallback.NewHealth(nil, fallback.HealthSettings{Share: 1.5}); err == nil || err.Error() != "fallback: HealthSettings.Share 1.5 must be in (0, 1]" {
		t.Fatalf("Share 1.5: %v", err)
	}
}
