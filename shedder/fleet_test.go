package shedder_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/shedder"

	"github.com/spillway-go/spillway/internal/block"
)

// newFleet is a Fleet "api" of capacity 100 with the settings of set (at
// most one) and, where they leave them unset, server id id, clock clk, no
// auto refresh, grants rounded down and a 2s timeout.
func newFleet(t *testing.T, client redis.UniversalClient, id string, clk *testclock.Clock, set ...shedder.FleetSettings) *shedder.Fleet {
	t.Helper()
	var s shedder.FleetSettings
	if len(set) > 0 {
		s = set[0]
	}
	if s.ServerID == "" {
		s.ServerID = id
	}
	if s.Clock == nil {
		s.Clock = clk.Now
	}
	if s.Timeout == 0 {
		s.Timeout = 2 * time.Second // a loaded CI box, not a budget under test
	}
	k := s.Knobs()
	k.NoAutoRefresh = true
	if k.Rand == nil {
		k.Rand = func() float64 { return 0 } // grants rounded down
	}
	f, err := shedder.NewFleet(client, "api", 100, s.With(k))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// failFastClient is a client of addr that neither retries nor waits long
// to dial, for tests that stop, stall or never start its Redis.
func failFastClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

type fleetStep struct {
	p       spillway.Priority
	cost    int64
	allowed bool
	rem     int64 // Remaining of a denial
}

// testFleetNames are the names the tests give their fleets (NewFleet's
// name is the Limiter of its decisions).
var testFleetNames = map[string]bool{"api": true, "db": true}

func runFleet(t *testing.T, f *shedder.Fleet, steps []fleetStep) []spillway.Done {
	t.Helper()
	var dones []spillway.Done
	for i, s := range steps {
		d, done, err := f.Admit(context.Background(), &spillway.Request{Priority: s.p, Cost: s.cost})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != s.allowed || d.Degraded {
			t.Fatalf("step %d (%v cost %d): %+v, want allowed=%v, not degraded", i, s.p, s.cost, d, s.allowed)
		}
		if !d.Allowed {
			if d.Reason != spillway.ReasonShed || d.Remaining != s.rem || d.RetryAfter != time.Second || !testFleetNames[d.Limiter] {
				t.Fatalf("step %d: denial %+v, want shed with remaining %d and RetryAfter 1s", i, d, s.rem)
			}
		} else {
			dones = append(dones, done)
		}
	}
	return dones
}

func refresh(t *testing.T, fs ...*shedder.Fleet) {
	t.Helper()
	for _, f := range fs {
		if err := f.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Three servers share a fleet capacity of 100: Sheddable and SheddablePlus
// stop at 80, Critical at 100, CriticalPlus is never shed; a crashed
// server's work stops counting after the TTL; a server that leaves stops
// counting at once.
func TestFleetSharedUsage(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	a, b, c := newFleet(t, client, "a", clk), newFleet(t, client, "b", clk), newFleet(t, client, "c", clk)
	// Before its first refresh a server knows nothing of the fleet and is
	// degraded; join first (twice, so that every server sees all three).
	if d, _, _ := a.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical, Cost: 21}); d.Allowed || !d.Degraded || d.Limit != 20 {
		t.Fatalf("before joining: %+v, want degraded with 20%% of the capacity", d)
	}
	refresh(t, a, b, c, a, b)

	// Between refreshes a server may add its share of the headroom: on an
	// idle fleet a third each, so it sees the fleet at 3× its change.
	aDones := runFleet(t, a, []fleetStep{{spillway.Critical, 30, true, 0}}) // 0 + 3·30 = 90 <= 100
	runFleet(t, b, []fleetStep{
		{spillway.SheddablePlus, 10, true, 0},   // 30
		{spillway.SheddablePlus, 10, true, 0},   // 60
		{spillway.SheddablePlus, 10, false, 20}, // 90 > 80; 20 left below 80
	})
	refresh(t, a, b, c)
	if s := c.Stats(); s.Usage != 50 || s.Servers != 3 || s.Fleet != [4]int64{0, 20, 30, 0} || s.Degraded {
		t.Fatalf("c's view %+v, want usage 50 of 3 servers", s)
	}
	// c's share of the fleet is (0 + 100/3) / (50 + 100) = 2/9: it may
	// add 2/9 of the headroom, and sees the fleet at 50 + 4.5·its change.
	runFleet(t, c, []fleetStep{
		{spillway.Sheddable, 6, true, 0},      // 50 + 4.5·6 = 77
		{spillway.Sheddable, 1, false, 3},     // 81.5 > 80; 3 left below 80
		{spillway.SheddablePlus, 1, false, 3}, // the same threshold
		{spillway.Critical, 6, false, 23},     // 104 > 100: 23 left below 100
		{spillway.Critical, 5, true, 0},       // 99.5
		{spillway.Critical, 1, false, 0},      // 104
		{spillway.CriticalPlus, 500, true, 0}, // never shed
	})
	refresh(t, c, a)
	if s := a.Stats(); s.Usage != 561 || s.Fleet != [4]int64{6, 20, 35, 500} {
		t.Fatalf("a's view %+v, want usage 561", s)
	}
	runFleet(t, a, []fleetStep{{spillway.Sheddable, 1, false, 0}, {spillway.Critical, 1, false, 0}})
	// Dearer than the threshold of the whole capacity: never admissible.
	for _, c := range []struct {
		p     spillway.Priority
		cost  int64
		limit int64
	}{{spillway.Sheddable, 81, 80}, {spillway.Critical, 101, 100}} {
		d, _, _ := a.Admit(context.Background(), &spillway.Request{Priority: c.p, Cost: c.cost})
		if want := (spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "api", Limit: c.limit}); d != want {
			t.Fatalf("%v cost %d: %+v, want %+v", c.p, c.cost, d, want)
		}
	}

	// b crashes (stops reporting). 2s after its last report its 20 no
	// longer count; a and c keep reporting meanwhile.
	clk.Advance(time.Second)
	refresh(t, a, c)
	clk.Advance(500 * time.Millisecond) // a and c refresh within the stale limit
	refresh(t, a, c)
	clk.Advance(500*time.Millisecond + time.Millisecond)
	refresh(t, c, a)
	if s := a.Stats(); s.Servers != 2 || s.Fleet != [4]int64{6, 0, 35, 500} {
		t.Fatalf("after b's ttl: %+v, want b reaped", s)
	}
	// c leaves: its 516 stop counting at once.
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	refresh(t, a)
	if s := a.Stats(); s.Servers != 1 || s.Usage != 30 || s.Fleet != [4]int64{0, 0, 30, 0} {
		t.Fatalf("after c left: %+v", s)
	}
	for _, d := range aDones {
		d(spillway.Success)
	}
	// Alone, a counts its own change once: 30 − 30.
	if s := a.Stats(); s.Usage != 0 {
		t.Fatalf("after done: usage %d, want 0", s.Usage)
	}

	// Every key carries a TTL no longer than the report TTL, and shares
	// one hash tag.
	ctx := context.Background()
	ks, err := client.Keys(ctx, "spillway:fleet:*").Result()
	if err != nil || len(ks) != 3 {
		t.Fatalf("keys %v, %v; want 3", ks, err)
	}
	for _, k := range ks {
		if keys.Tag(k) != "api" {
			t.Errorf("key %q: tag %q, want api", k, keys.Tag(k))
		}
		// The script ran with the fake clock, so the TTL is relative to it.
		if ttl, _ := client.PTTL(ctx, k).Result(); ttl <= 0 || ttl > 2*time.Second {
			t.Errorf("key %q: pttl %v, want (0, 2s]", k, ttl)
		}
	}
	// The last server leaving deletes everything.
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := client.Exists(ctx, ks...).Result(); n != 0 {
		t.Fatalf("%d keys left after the last server left", n)
	}
}

// On an uneven fleet the server carrying most of the work gets most of
// the headroom, by measured usage, and its Critical work keeps the
// reserve: the shares of the three servers add up to the headroom, so
// together they stay within the thresholds. (Assuming an even spread, the
// hot server would see the fleet change three times as fast as it does
// and shed its Sheddable work at 73 of 80.)
func TestFleetUnevenShares(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	a, b, c := newFleet(t, client, "a", clk), newFleet(t, client, "b", clk), newFleet(t, client, "c", clk)
	refresh(t, a, b, c)
	runFleet(t, a, []fleetStep{{spillway.SheddablePlus, 40, true, 0}, {spillway.Critical, 20, true, 0}})
	runFleet(t, b, []fleetStep{{spillway.Critical, 5, true, 0}})
	runFleet(t, c, []fleetStep{{spillway.Critical, 5, true, 0}})
	refresh(t, a, b, c, a, b) // everyone sees 70 in flight: a 60, b 5, c 5
	// Shares: a (60 + 100/3) / 170 = 0.549, b and c 0.225 each.
	if s := a.Stats(); s.Usage != 70 || s.Share < 0.548 || s.Share > 0.55 {
		t.Fatalf("a's view %+v, want usage 70 and share 0.549", s)
	}
	runFleet(t, a, []fleetStep{
		{spillway.Sheddable, 5, true, 0},  // 70 + 5/0.549 = 79.1 <= 80
		{spillway.Sheddable, 1, false, 0}, // 80.9 > 80
		{spillway.Critical, 11, true, 0},  // 70 + 16/0.549 = 99.1: Critical keeps its reserve
		{spillway.Critical, 1, false, 0},  // 100.9 > 100
	})
	runFleet(t, b, []fleetStep{
		{spillway.Sheddable, 2, true, 0},  // 70 + 2/0.225 = 78.9
		{spillway.Sheddable, 1, false, 1}, // 83.3
		{spillway.Critical, 4, true, 0},   // 96.7
		{spillway.Critical, 1, false, 3},  // 101.1
	})
	dones := runFleet(t, c, []fleetStep{{spillway.Sheddable, 2, true, 0}, {spillway.Critical, 4, true, 0}})
	refresh(t, a, b, c)
	// All three used their shares: the fleet is at 98, within 100, and
	// the non-critical part within 80.
	if s := c.Stats(); s.Usage != 98 || s.Fleet[0] != 9 {
		t.Fatalf("c's view %+v, want 98 in flight, 9 of them Sheddable", s)
	}
	// Work that ends frees room for its own server at once.
	dones[1](spillway.Success)
	runFleet(t, c, []fleetStep{{spillway.Critical, 4, true, 0}})
}

// A share of the headroom is rounded to whole units at random once per
// refresh: rounded down, three servers with 2/3 of a unit each would leave
// the last 2 units of the threshold idle for good.
func TestFleetRoundsGrantsAtRandom(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	r := 0.0
	rnd := shedder.FleetSettings{}.With(shedder.Knobs{Rand: func() float64 { return r }})
	fs := []*shedder.Fleet{newFleet(t, client, "a", clk, rnd), newFleet(t, client, "b", clk, rnd), newFleet(t, client, "c", clk, rnd)}
	refresh(t, fs...)
	for _, f := range fs {
		runFleet(t, f, []fleetStep{{spillway.Sheddable, 26, true, 0}})
	}
	refresh(t, append(fs, fs...)...) // 78 of the 80 for Sheddable work: 2/3 of a unit each
	runFleet(t, fs[0], []fleetStep{{spillway.Sheddable, 1, false, 2}})
	r = 0.5 // floor(2/3 + 0.5) = 1
	refresh(t, append(fs, fs...)...)
	for _, f := range fs[:2] {
		runFleet(t, f, []fleetStep{{spillway.Sheddable, 1, true, 0}, {spillway.Sheddable, 1, false, 0}})
	}
	refresh(t, append(fs, fs...)...)
	if s := fs[2].Stats(); s.Usage != 80 {
		t.Fatalf("usage %d, want the threshold, 80", s.Usage)
	}
	runFleet(t, fs[2], []fleetStep{{spillway.Sheddable, 1, false, 0}})
}

// The sums key lost (evicted) is rebuilt from the live reports.
func TestFleetRebuildsSums(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	a, b := newFleet(t, client, "a", clk), newFleet(t, client, "b", clk)
	refresh(t, a, b)
	runFleet(t, a, []fleetStep{{spillway.Critical, 7, true, 0}})
	runFleet(t, b, []fleetStep{{spillway.Sheddable, 5, true, 0}})
	refresh(t, a, b)
	if err := client.Del(context.Background(), keys.Key("spillway:", "fleet:sums", "api")).Err(); err != nil {
		t.Fatal(err)
	}
	refresh(t, a)
	if s := a.Stats(); s.Fleet != [4]int64{5, 0, 7, 0} || s.Usage != 12 {
		t.Fatalf("after rebuild: %+v", s)
	}
}

// Redis down: decisions fall back to local counts against this server's
// share of the capacity and are marked Degraded; Redis back: shared again.
func TestFleetDegraded(t *testing.T) {
	srv := redistest.Start(t)
	client := failFastClient(t, srv.Addr)
	clk := newClock()
	a := newFleet(t, client, "a", clk, shedder.FleetSettings{Timeout: 500 * time.Millisecond})
	b := newFleet(t, client, "b", clk)
	refresh(t, a, b, a) // a sees two servers
	srv.Stop()
	if err := a.Refresh(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "shedder: fleet refresh: ") {
		t.Fatalf("refresh with Redis down: %v", err)
	}
	// Within the stale limit the last estimate still holds.
	d, _, _ := a.Admit(context.Background(), &spillway.Request{Priority: spillway.Sheddable})
	if !d.Allowed || d.Degraded {
		t.Fatalf("fresh estimate: %+v", d)
	}
	clk.Advance(time.Second + time.Millisecond)
	if s := a.Stats(); !s.Degraded || s.LastError == nil {
		t.Fatalf("stats %+v, want degraded with an error", s)
	}
	// Two servers were seen: a's share is 50, non-critical work stops at
	// 40, Critical at 50. One Sheddable is already in flight.
	steps := []struct {
		p       spillway.Priority
		cost    int64
		allowed bool
	}{
		{spillway.Sheddable, 39, true},
		{spillway.SheddablePlus, 1, false},
		{spillway.Critical, 10, true},
		{spillway.Critical, 1, false},
		{spillway.CriticalPlus, 100, true},
	}
	for i, s := range steps {
		d, _, err := a.Admit(context.Background(), &spillway.Request{Priority: s.p, Cost: s.cost})
		if err != nil || d.Allowed != s.allowed || !d.Degraded {
			t.Fatalf("degraded step %d: %+v, %v; want allowed=%v, degraded", i, d, err, s.allowed)
		}
	}
	// Dearer than the degraded share but not than the fleet: shed for
	// now, not "never".
	if d, _, _ := a.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical, Cost: 60}); d.Reason != spillway.ReasonShed || d.RetryAfter != time.Second || !d.Degraded {
		t.Fatalf("degraded cost 60: %+v, want shed with a RetryAfter", d)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The first refresh after the outage reports, but b's report expired
	// meanwhile and b has not reported again: a would see itself alone
	// and take the whole headroom. It stays degraded while the fleet has
	// fewer servers than before the outage, for one TTL (2 s) at most.
	for i, advance := range []time.Duration{0, 0, 1999 * time.Millisecond} {
		clk.Advance(advance)
		if err := a.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		if s := a.Stats(); !s.Degraded || s.LastError != nil || a.Allowance(spillway.Sheddable) != 40 {
			t.Fatalf("refresh %d after the outage: %+v, allowance %d; want still degraded at 40, no error", i, s, a.Allowance(spillway.Sheddable))
		}
	}
	clk.Advance(time.Millisecond) // b would have expired by now
	if err := a.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s.Degraded || s.Servers != 1 || s.Usage != 150 {
		t.Fatalf("after recovery %+v", s)
	}
	d, _, _ = a.Admit(context.Background(), &spillway.Request{Priority: spillway.Sheddable})
	if d.Allowed || d.Degraded || d.Limit != 80 {
		t.Fatalf("after recovery: %+v, want a shared (not degraded) denial at 80", d)
	}
}

// After an outage a server stays degraded until the servers it saw before
// have reported again: one whose refresh was still waiting out its timeout
// when Redis came back is not taken for gone, and its work in flight is
// not shared out as headroom.
func TestFleetRejoinWaitsForTheFleet(t *testing.T) {
	srv := redistest.Start(t)
	client := failFastClient(t, srv.Addr)
	clk := newClock()
	a := newFleet(t, client, "a", clk, shedder.FleetSettings{Timeout: 500 * time.Millisecond})
	b := newFleet(t, client, "b", clk, shedder.FleetSettings{Timeout: 500 * time.Millisecond})
	refresh(t, a, b, a)
	runFleet(t, b, []fleetStep{{spillway.Sheddable, 30, true, 0}})
	refresh(t, b, a)
	// a's share of the 50 left below 80 is (0 + 50) / (30 + 100).
	if got := a.Allowance(spillway.Sheddable); got != 19 {
		t.Fatalf("a's allowance before the outage %d, want 19", got)
	}
	srv.Stop()
	clk.Advance(time.Second + time.Millisecond)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// a is back twice before b: b's 30 in flight are not in the sums.
	refresh(t, a, a)
	// Alone in the view, a would allow itself all 80.
	if s := a.Stats(); !s.Degraded || s.Servers != 2 || s.LastError != nil {
		t.Fatalf("a before b reported again: %+v, want degraded, two servers last seen, no error", s)
	}
	if got := a.Allowance(spillway.Sheddable); got != 30 {
		t.Fatalf("a's allowance before b reported again %d, want its degraded share, 30 (0.8 x 100 x 50/130)", got)
	}
	refresh(t, b, a)
	if s := a.Stats(); s.Degraded || s.Servers != 2 || s.Usage != 30 {
		t.Fatalf("a after b reported again: %+v, want shared, two servers, usage 30", s)
	}
	if got := a.Allowance(spillway.Sheddable); got != 19 {
		t.Fatalf("a's allowance after b reported again %d, want 19", got)
	}
}

// A server that never reached Redis uses the client's default share (0.2) of the capacity.
func TestFleetNeverConnected(t *testing.T) {
	port, _ := redistest.FreePort()
	client := failFastClient(t, "127.0.0.1:"+itoa(port))
	clk := newClock()
	f := newFleet(t, client, "a", clk, shedder.FleetSettings{Timeout: 200 * time.Millisecond})
	if err := f.Refresh(context.Background()); err == nil {
		t.Fatal("refresh against nothing succeeded")
	}
	// 20% of 100 = 20; non-critical stops at 16.
	d, _, _ := f.Admit(context.Background(), &spillway.Request{Priority: spillway.Sheddable, Cost: 16})
	if !d.Allowed || !d.Degraded {
		t.Fatalf("%+v", d)
	}
	d, _, _ = f.Admit(context.Background(), &spillway.Request{Priority: spillway.Sheddable})
	if d.Allowed || !d.Degraded || d.Limit != 16 || d.Reason != spillway.ReasonShed {
		t.Fatalf("%+v", d)
	}
}

// With Redis TIME (no client clock) and Admit starting refreshes itself.
func TestFleetAutoRefreshWithRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	f, err := shedder.NewFleet(client, "api", 10, shedder.FleetSettings{ServerID: "x", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d, done, _ := f.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical, Cost: 2})
	if !d.Allowed || !d.Degraded {
		t.Fatalf("first admission before any refresh: %+v, want allowed and degraded (2 of 20%% of 10)", d)
	}
	defer done(spillway.Success)
	// The refresh runs in the background; wait for its report to land.
	deadline := time.Now().Add(10 * time.Second)
	for f.Stats().Degraded {
		if time.Now().After(deadline) {
			t.Fatalf("no refresh: %+v", f.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The background refresh may have read the counts just before Admit
	// added its own; the report is there either way, and an explicit
	// refresh carries the cost.
	rk := keys.Key("spillway:", "fleet:reports", "api")
	if ok, err := client.HExists(context.Background(), rk, "x").Result(); err != nil || !ok {
		t.Fatalf("no report after the auto refresh: %v, %v", ok, err)
	}
	if err := f.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, err := client.HGet(context.Background(), rk, "x").Result()
	if err != nil || v != "0:0:2:0" {
		t.Fatalf("report %q, %v; want 0:0:2:0", v, err)
	}
}

func TestNewFleetValidates(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	cases := []struct {
		name     string
		capacity int64
		set      shedder.FleetSettings
		field    string
	}{
		{"", 10, shedder.FleetSettings{}, "name"},
		{"x", 0, shedder.FleetSettings{}, "capacity"},
		{"x", 10, shedder.FleetSettings{Prefix: "a{"}, "prefix"},
		{"x", 10, shedder.FleetSettings{TTL: 50 * time.Millisecond}, "ttl"},
		{"x", 10, shedder.FleetSettings{Interval: -1}, "interval"},
		{"x", 10, shedder.FleetSettings{Thresholds: [4]float64{0.5, 0.4, 1, 1}}, "threshold"},
		{"x", 10, shedder.FleetSettings{Thresholds: [4]float64{-1, 0.4, 1, 1}}, "threshold"},
		{"x", 10, shedder.FleetSettings{Reserve: 1.5}, "reserve"},
		{"x", 10, shedder.FleetSettings{Timeout: -1}, "timeout"},
	}
	for _, c := range cases {
		_, err := shedder.NewFleet(client, c.name, c.capacity, c.set)
		if err == nil || !strings.Contains(err.Error(), c.field) || !strings.HasPrefix(err.Error(), "shedder: ") {
			t.Errorf("%q/%d: err %v, want one naming %q", c.name, c.capacity, err, c.field)
		}
	}
	if _, err := shedder.NewFleet(nil, "x", 1, shedder.FleetSettings{}); err == nil {
		t.Error("nil client accepted")
	}
}

// simFleet spreads requests at random over n servers of one fleet whose
// capacity is simCapacity, and refreshes every server every 100ms of the
// simulation.
func simFleet(t *testing.T, client redis.UniversalClient, clk *testclock.Clock, name string, n int) (spillway.Limiter, func(step int)) {
	t.Helper()
	servers := make([]*shedder.Fleet, n)
	for i := range servers {
		f, err := shedder.NewFleet(client, name, simCapacity, shedder.FleetSettings{ServerID: fmt.Sprint("s", i), Clock: clk.Now, Timeout: 5 * time.Second}.With(shedder.Knobs{NoAutoRefresh: true}))
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = f
	}
	refreshAll := func() {
		for _, f := range servers {
			if err := f.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	refreshAll()
	pick := seeded(7) // a load balancer spreading requests at random
	lim := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		f := servers[int(pick()*float64(n))]
		d, done, err := f.Admit(ctx, r)
		if d.Degraded {
			t.Fatalf("degraded decision in the simulation: %+v", d)
		}
		return d, done, err
	})
	return lim, func(step int) {
		if step%simService == simService-1 {
			refreshAll()
		}
	}
}

// TestFleetGoodputTable offers 0.5× to 4× the fleet capacity to three
// servers sharing one fleet shedder on a real Redis and prints goodput per
// priority: go test ./shedder -run TestFleetGoodputTable -v
func TestFleetGoodputTable(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	var b strings.Builder
	b.WriteString("| offered load | sheddable | sheddable_plus | critical | critical_plus | fleet usage |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for i, x := range []float64{0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4} {
		clk := newClock()
		lim, refresh := simFleet(t, client, clk, fmt.Sprint("sim", i), 3)
		var usage float64
		var n int
		var inflight int64
		counting := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
			d, done, err := lim.Admit(ctx, r)
			if d.Allowed {
				inflight += r.Cost
				inner := done
				done = func(o spillway.Outcome) { inflight -= r.Cost; inner(o) }
			}
			return d, done, err
		})
		res := simulate(t, counting, clk, 1500, 500, func(int) float64 { return x }, func(s int) {
			refresh(s)
			if s >= 500 {
				usage += float64(inflight) / simCapacity
				n++
			}
		})
		fmt.Fprintf(&b, "| %.1f× | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.0f%% |\n", x,
			100*res.goodput(0), 100*res.goodput(1), 100*res.goodput(2), 100*res.goodput(3), 100*usage/float64(n))
		if g := res.goodput(spillway.Critical); g < 0.95 {
			t.Errorf("load %v×: Critical goodput %.3f, want >= 0.95", x, g)
		}
		if res.admitted[spillway.CriticalPlus] != res.offered[spillway.CriticalPlus] {
			t.Errorf("load %v×: CriticalPlus shed", x)
		}
		// At half load a server that drew more than its share of requests
		// in one interval extrapolates that to the fleet and sheds a
		// little (the price of not overshooting under symmetric load).
		if x <= 0.5 && res.goodput(spillway.Sheddable) < 0.99 {
			t.Errorf("load %v×: shed %v of %v", x, res.admitted, res.offered)
		}
		for p := spillway.SheddablePlus; p <= spillway.CriticalPlus; p++ {
			if res.goodput(p)+0.02 < res.goodput(p-1) {
				t.Errorf("load %v×: goodput of %v %.3f below %v's %.3f", x, p, res.goodput(p), p-1, res.goodput(p-1))
			}
		}
	}
	t.Log("goodput per priority (fleet shedder, 3 servers, mix 60/20/15/5):\n" + b.String())
}

// Run reports until its context ends, then removes this server's report.
func TestFleetRun(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	f, err := shedder.NewFleet(client, "api", 10, shedder.FleetSettings{ServerID: "r", Timeout: 2 * time.Second}.With(shedder.Knobs{NoAutoRefresh: true}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- f.Run(ctx) }()
	rk := keys.Key("spillway:", "fleet:reports", "api")
	deadline := time.Now().Add(10 * time.Second)
	// The report lands in Redis before the refresh publishes its view
	// (Stats reads the view without waiting on a refresh in flight), so
	// wait for both.
	for {
		ok, _ := client.HExists(context.Background(), rk, "r").Result()
		if s := f.Stats(); ok && !s.Degraded && s.Servers == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run never reported: report in Redis %v, stats %+v", ok, f.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-ran; err != context.Canceled {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
	if n, _ := client.Exists(context.Background(), rk).Result(); n != 0 {
		t.Fatal("report left after Run ended")
	}
}

// With reservations the servers' grants never add up past a threshold,
// however their refreshes are staggered: a server reserves its share of
// the headroom below the lowest threshold in Redis with its report, and
// uses no more than its reservation and no more than the others' reports
// and reservations leave. Without them, a server that refreshes after
// the others used their grants, but before they reported it, hands itself
// headroom they already took (51 below, the fleet at 103 of 80).
func TestFleetReservationsBoundStaleness(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	res := shedder.FleetSettings{Reservations: true}
	a, b, c := newFleet(t, client, "a", clk, res), newFleet(t, client, "b", clk, res), newFleet(t, client, "c", clk, res)
	// a alone reserves all 80; b, joining, half (a's 80 leave it nothing
	// to use); c a third. Their next reports bring each to a third of the
	// 80, floor(26.7) = 26, but what a's grant of 80 left it stays
	// reserved until a reports again (its carry: work it may admit while
	// that report is on its way); one more round, and each holds 26.
	refresh(t, a, b, c, a, b, c, a, b, c, a)
	for i, f := range []*shedder.Fleet{a, b, c} {
		// Critical: the 26 reserved plus a third of the band between 80
		// and 100 (nobody reserves it): 26 + floor(20/3) = 32.
		if s, cr := f.Allowance(spillway.Sheddable), f.Allowance(spillway.Critical); s != 26 || cr != 32 {
			t.Fatalf("server %d: allowances %d, %d; want 26, 32", i, s, cr)
		}
		runFleet(t, f, []fleetStep{{spillway.Sheddable, 26, true, 0}, {spillway.Sheddable, 1, false, 0}})
	}
	// The fleet is at 78 of 80, but only a's 26 are reported. a's share
	// is (26 + 100/3) / (26 + 100) = 0.471 of the 54 it sees below 80:
	// 25 reserved, of which the others' reservations (52) leave 2.
	refresh(t, a)
	if s, cr := a.Allowance(spillway.Sheddable), a.Allowance(spillway.Critical); s != 28 || cr != 37 {
		t.Fatalf("a after its report: allowances %d, %d; want 28, 37 (26 + 2, + floor(0.471·20) = 9 of the band)", s, cr)
	}
	runFleet(t, a, []fleetStep{
		{spillway.Sheddable, 2, true, 0},  // 80 of 80
		{spillway.Sheddable, 1, false, 0}, // 81
		{spillway.Critical, 9, true, 0},   // 89 of 100
		{spillway.Critical, 1, false, 0},  // past a's part of the band
	})
	refresh(t, b, c, a)
	if s := a.Stats(); s.Fleet != [4]int64{80, 0, 9, 0} || s.Servers != 3 {
		t.Fatalf("fleet %+v, want 80 Sheddable and 9 Critical", s)
	}

	// The same steps without reservations (another fleet on the same
	// Redis): a's grant after its report is its share of the headroom
	// its stale view shows, 25 on top of its 26.
	plain := shedder.FleetSettings{Prefix: "plain:"}
	pa, pb, pc := newFleet(t, client, "a", clk, plain), newFleet(t, client, "b", clk, plain), newFleet(t, client, "c", clk, plain)
	refresh(t, pa, pb, pc, pa, pb, pc, pa)
	for _, f := range []*shedder.Fleet{pa, pb, pc} {
		runFleet(t, f, []fleetStep{{spillway.Sheddable, 26, true, 0}})
	}
	refresh(t, pa)
	if s := pa.Allowance(spillway.Sheddable); s != 51 {
		t.Fatalf("without reservations: allowance %d, want 51", s)
	}
}

// Work a server admits under its old reservation while its report is on
// its way stays reserved (its carry) until its next report: the report
// holds a snapshot taken before that work, and the reservation the script
// computes for a fleet near its threshold would not cover it, so another
// server could be granted the same units.
func TestFleetCarryCoversWorkDuringReport(t *testing.T) {
	srv := redistest.Start(t)
	p, err := faultproxy.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	slow := failFastClient(t, p.Addr())
	clk := newClock()
	res := shedder.FleetSettings{Reservations: true}
	a, b := newFleet(t, slow, "a", clk, res), newFleet(t, srv.Client(t), "b", clk, res)
	refresh(t, a, b, a, b, a, b)
	if ga, gb := a.Allowance(spillway.Sheddable), b.Allowance(spillway.Sheddable); ga != 40 || gb != 40 {
		t.Fatalf("allowances %d, %d; want 40 each", ga, gb)
	}
	runFleet(t, b, []fleetStep{{spillway.Sheddable, 40, true, 0}})
	refresh(t, b)

	// a's report leaves with a snapshot of 0 and is held on its way.
	before := p.Stats().Received
	_ = p.SetMode(faultproxy.Stall)
	errc := make(chan error, 1)
	go func() { errc <- a.Refresh(context.Background()) }()
	for deadline := time.Now().Add(5 * time.Second); p.Stats().Received == before; {
		if time.Now().After(deadline) {
			t.Fatal("a's report never reached the proxy")
		}
		time.Sleep(time.Millisecond)
	}
	// Meanwhile a uses the 40 its old reservation granted: 80 of 80.
	runFleet(t, a, []fleetStep{{spillway.Sheddable, 40, true, 0}, {spillway.Sheddable, 1, false, 0}})
	_ = p.SetMode(faultproxy.Pass)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// The script saw 40 of b's and a's 0; a's share of the 40 left would
	// be floor(50/140 x 40) = 14, leaving b 26 more (106 of 80). The
	// carry keeps a's 40 reserved: b may add nothing.
	refresh(t, b)
	if got := b.Allowance(spillway.Sheddable); got != 40 {
		t.Fatalf("b's allowance %d, want its 40 in flight and nothing more", got)
	}
	runFleet(t, b, []fleetStep{{spillway.Sheddable, 1, false, 0}})
	// a's next report shows its 40; the carry is gone.
	refresh(t, a, b)
	if s := b.Stats(); s.Fleet != [4]int64{80, 0, 0, 0} || b.Allowance(spillway.Sheddable) != 40 {
		t.Fatalf("after a's next report: %+v, allowance %d; want 80 Sheddable in flight, b at 40", s, b.Allowance(spillway.Sheddable))
	}
}

// TestFleetSetCapacity: a capacity lowered at run time holds new work
// under the new thresholds at once (work in flight is not revoked), one
// raised again admits up to them after the next refresh, and a capacity
// out of range is refused without changing anything.
func TestFleetSetCapacity(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	a := newFleet(t, client, "a", clk, shedder.FleetSettings{Reservations: true})
	refresh(t, a, a)
	dones := runFleet(t, a, []fleetStep{{spillway.Sheddable, 50, true, 0}})

	if err := a.SetCapacity(50); err != nil {
		t.Fatal(err)
	}
	if c := a.Capacity(); c != 50 {
		t.Fatalf("capacity %d, want 50", c)
	}
	// Thresholds are now 40 (Sheddable, SheddablePlus) and 50 (Critical):
	// the 50 in flight stay, nothing below CriticalPlus is added.
	runFleet(t, a, []fleetStep{
		{spillway.Sheddable, 1, false, 0},
		{spillway.Critical, 1, false, 0},
		{spillway.CriticalPlus, 1, true, 0},
	})
	for _, bad := range []int64{0, -1, shedder.MaxFleetCapacity + 1} {
		if err := a.SetCapacity(bad); err == nil || !strings.Contains(err.Error(), "fleet capacity") {
			t.Fatalf("SetCapacity(%d): %v, want an error naming the fleet capacity", bad, err)
		}
	}
	if c := a.Capacity(); c != 50 {
		t.Fatalf("capacity %d after refused changes, want 50", c)
	}
	for _, d := range dones {
		d(spillway.Success)
	}
	refresh(t, a, a)
	if s := a.Stats(); s.Usage != 1 {
		t.Fatalf("usage %d, want the CriticalPlus 1", s.Usage)
	}
	runFleet(t, a, []fleetStep{
		{spillway.Sheddable, 39, true, 0}, // 40 of 40
		{spillway.Sheddable, 1, false, 0},
		{spillway.Critical, 10, true, 0}, // 50 of 50
		{spillway.Critical, 1, false, 0},
	})

	if err := a.SetCapacity(100); err != nil {
		t.Fatal(err)
	}
	refresh(t, a)
	runFleet(t, a, []fleetStep{
		{spillway.Sheddable, 30, true, 0}, // 80 of 80
		{spillway.Sheddable, 1, false, 0},
		{spillway.Critical, 20, true, 0}, // 100 of 100
		{spillway.Critical, 1, false, 0},
	})
}

// TestFleetPressureFromCriticalRefusal: a server below its even share of
// the capacity that refused Critical work tells the fleet with its next
// report, and a server above its even share admits no Sheddable or
// SheddablePlus work past that share (not even into what its own finished
// work freed) until a report of the other shows no refusal: a server that
// joined a full fleet gets room for its Critical work instead of
// watching the others refill the fleet with their least important work.
// A refusal by a server at or above its even share is not reported.
func TestFleetPressureFromCriticalRefusal(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	// capacity 100, every priority but CriticalPlus shed at 100; two
	// servers: an even share of 50
	a := newFleet(t, client, "a", clk, shedder.FleetSettings{Reserve: -1})
	b := newFleet(t, client, "b", clk, shedder.FleetSettings{Reserve: -1})
	refresh(t, a, b)
	sheddable := runFleet(t, a, []fleetStep{{spillway.Sheddable, 30, true, 0}, {spillway.Sheddable, 30, true, 0}})
	runFleet(t, b, []fleetStep{{spillway.Critical, 40, true, 0}})
	refresh(t, a, b, a)

	// The fleet is full: b refuses Critical work, while a, which nobody
	// has told yet, reuses what its finished Sheddable work freed.
	runFleet(t, b, []fleetStep{{spillway.Critical, 1, false, 0}})
	sheddable[0](spillway.Success)
	sheddable = append(sheddable[1:], runFleet(t, a, []fleetStep{{spillway.Sheddable, 30, true, 0}})...)
	if s := a.Stats(); s.Pressure || s.Local != [4]int64{60, 0, 0, 0} {
		t.Fatalf("a before b's report: %+v; want no pressure, 60 Sheddable in flight", s)
	}

	// b (40 in flight, under its 50) reports its refusal; a's next
	// refresh sees it.
	refresh(t, b, a)
	if !a.Stats().Pressure || b.Stats().Pressure {
		t.Fatalf("pressure a %v, b %v; want a true (b refused), b false (its own refusal)", a.Stats().Pressure, b.Stats().Pressure)
	}
	// a's finished work no longer makes room for its Sheddable work past
	// its even share; Critical work may still reuse it.
	sheddable[0](spillway.Success) // a: 30 in flight
	runFleet(t, a, []fleetStep{
		{spillway.Sheddable, 21, false, 0}, {spillway.SheddablePlus, 21, false, 0},
		{spillway.Sheddable, 20, true, 0}, {spillway.Critical, 10, true, 0}, {spillway.Critical, 1, false, 0},
	})

	// One report of b without a refusal ends the pressure.
	refresh(t, b, a)
	if a.Stats().Pressure {
		t.Fatal("a: pressure still on after b's report without a refusal")
	}

	// A refusal by a server at or above its even share is not reported:
	// a (60 in flight) refuses Critical work, b never sees pressure.
	runFleet(t, a, []fleetStep{{spillway.Critical, 1, false, 0}})
	refresh(t, a, b)
	if b.Stats().Pressure {
		t.Fatal("b: pressure from a, which holds more than its even share")
	}
}
