package shedder_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/shedder"
)

func TestNewWorkerValidates(t *testing.T) {
	cases := []struct {
		capacity int64
		set      shedder.WorkerSettings
		field    string
	}{
		{0, shedder.WorkerSettings{}, "capacity"},
		{-1, shedder.WorkerSettings{}, "capacity -1"},
		{10, shedder.WorkerSettings{}.With(shedder.Knobs{Low: 0.9, High: 0.8}), "band"},
		{10, shedder.WorkerSettings{}.With(shedder.Knobs{Low: 0, High: 0.8}), "band"},
		{10, shedder.WorkerSettings{}.With(shedder.Knobs{StepUp: 0, StepDown: 0.1}), "steps"},
		{10, shedder.WorkerSettings{}.With(shedder.Knobs{Tick: -1}), "tick"},
		{10, shedder.WorkerSettings{Reserve: 1}, "reserve"},
		{10, shedder.WorkerSettings{Sources: []shedder.Source{nil}}, "source"},
		{10, shedder.WorkerSettings{RetryAfter: -time.Second}, "retry after"},
	}
	for _, c := range cases {
		_, err := shedder.NewWorker(c.capacity, c.set)
		if err == nil || !strings.Contains(err.Error(), c.field) || !strings.HasPrefix(err.Error(), "shedder: ") {
			t.Errorf("capacity %d: err %v, want one naming %q", c.capacity, err, c.field)
		}
	}
}

// The hard cap: Sheddable and SheddablePlus use at most capacity×(1−reserve),
// Critical the whole capacity, CriticalPlus is not capped.
func TestWorkerHardCap(t *testing.T) {
	clk := newClock()
	w, err := shedder.NewWorker(10, shedder.WorkerSettings{Clock: clk.Now, RetryAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admit := func(p spillway.Priority, cost int64) (spillway.Decision, spillway.Done) {
		t.Helper()
		d, done, err := w.Admit(ctx, &spillway.Request{Priority: p, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return d, done
	}
	var dones []spillway.Done
	for i := 0; i < 8; i++ {
		d, done := admit(spillway.Sheddable, 1)
		if !d.Allowed || d.Limit != 0 || d.Limiter != "worker" {
			t.Fatalf("sheddable #%d: %+v", i, d)
		}
		dones = append(dones, done)
	}
	want := spillway.Decision{Reason: spillway.ReasonShed, Limiter: "worker", Limit: 10, Remaining: 2, RetryAfter: 2 * time.Second}
	if d, _ := admit(spillway.SheddablePlus, 1); d != want {
		t.Fatalf("sheddable_plus at the cap: %+v, want %+v", d, want)
	}
	if d, _ := admit(spillway.Critical, 3); d.Allowed {
		t.Fatal("critical of cost 3 admitted past capacity")
	}
	d, done := admit(spillway.Critical, 2)
	if !d.Allowed {
		t.Fatalf("critical within capacity denied: %+v", d)
	}
	if d, _ := admit(spillway.CriticalPlus, 5); !d.Allowed {
		t.Fatalf("critical_plus denied by the hard cap: %+v", d)
	}
	if got := w.InFlight(); got != 15 {
		t.Fatalf("in flight %d, want 15", got)
	}
	done(spillway.Success)
	done(spillway.Success) // idempotent
	if got := w.InFlight(); got != 13 {
		t.Fatalf("in flight after done %d, want 13", got)
	}
	for _, d := range dones {
		d(spillway.Success)
	}
	if got := w.InFlight(); got != 5 {
		t.Fatalf("in flight %d, want 5", got)
	}
	if d, _ := admit(spillway.Priority(7), 1); d.Reason != spillway.ReasonInvalid {
		t.Fatalf("invalid priority: %+v", d)
	}
}

// The level follows the band in steps: up while utilization >= high, hold
// inside the band, down when below low; a failing source is skipped.
func TestWorkerLevelSteps(t *testing.T) {
	clk := newClock()
	util := 0.0
	var fail bool
	src := shedder.SourceFunc(func() (float64, error) {
		if fail {
			return 0, errors.New("boom")
		}
		return util, nil
	})
	w, err := shedder.NewWorker(100, shedder.WorkerSettings{Clock: clk.Now, Sources: []shedder.Source{src}}.With(shedder.Knobs{Rand: seeded(3)}))
	if err != nil {
		t.Fatal(err)
	}
	tick := func(u float64) float64 {
		util = u
		clk.Advance(100 * time.Millisecond)
		// Admit a CriticalPlus request (never shed) to drive the tick.
		_, done, _ := w.Admit(context.Background(), &spillway.Request{Priority: spillway.CriticalPlus})
		done(spillway.Success)
		return w.Level()
	}
	// The first Admit runs the first tick with util 0.95: up one step.
	if l := tick(0.95); l != 0.25 {
		t.Fatalf("level %v, want 0.25", l)
	}
	if l := tick(0.95); l != 0.5 {
		t.Fatalf("level %v, want 0.5", l)
	}
	// Inside the band and the offered load (all CriticalPlus, all
	// admitted) estimates 0.8 < high: the level falls one step.
	if l := tick(0.8); l != 0.45 {
		t.Fatalf("level %v, want 0.45", l)
	}
	if got := w.ShedProbability(spillway.Sheddable); got != 0.45 {
		t.Fatalf("P(shed sheddable) = %v, want 0.45", got)
	}
	if got := w.ShedProbability(spillway.SheddablePlus); got != 0 {
		t.Fatalf("P(shed sheddable_plus) = %v, want 0", got)
	}
	for i := 0; i < 20; i++ {
		tick(1.5)
	}
	if l := w.Level(); l != 4 {
		t.Fatalf("level %v after saturation, want 4 (clamped)", l)
	}
	fail = true
	if l := tick(1.5); l != 3.95 {
		t.Fatalf("level %v with a failing source, want 3.95", l)
	}
	if w.SourceErrors() != 1 {
		t.Fatalf("source errors %d, want 1", w.SourceErrors())
	}
	fail = false
	// Ten idle seconds give back 100 steps at once.
	util = 0
	clk.Advance(10 * time.Second)
	w.Admit(context.Background(), &spillway.Request{Priority: spillway.CriticalPlus})
	if l := w.Level(); l != 0 {
		t.Fatalf("level %v after idling, want 0", l)
	}
}

func criticalPlus() *spillway.Request { return &spillway.Request{Priority: spillway.CriticalPlus} }

// A request dearer than its priority's cap can never be admitted: it is
// denied as such, with no RetryAfter, and leaves no trace.
func TestWorkerCostExceedsLimit(t *testing.T) {
	w, err := shedder.NewWorker(10, shedder.WorkerSettings{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		p     spillway.Priority
		cost  int64
		limit int64
	}{
		{spillway.Sheddable, 9, 8},
		{spillway.SheddablePlus, 9, 8},
		{spillway.Critical, 11, 10},
	}
	for _, c := range cases {
		d, _, err := w.Admit(context.Background(), &spillway.Request{Priority: c.p, Cost: c.cost})
		want := spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "worker", Limit: c.limit}
		if err != nil || d != want {
			t.Errorf("%v cost %d: %+v, %v; want %+v", c.p, c.cost, d, err, want)
		}
	}
	if d, done, _ := w.Admit(context.Background(), &spillway.Request{Priority: spillway.CriticalPlus, Cost: 1000}); !d.Allowed {
		t.Errorf("critical_plus cost 1000: %+v, want allowed (no cap)", d)
	} else {
		done(spillway.Success)
	}
	if w.InFlight() != 0 {
		t.Fatalf("in flight %d, want 0", w.InFlight())
	}
}

// Time going backwards neither ticks nor breaks the next tick.
func TestWorkerTimeGoesBackwards(t *testing.T) {
	clk := newClock()
	util := 0.95
	w, err := shedder.NewWorker(100, shedder.WorkerSettings{Clock: clk.Now, Sources: []shedder.Source{shedder.SourceFunc(func() (float64, error) { return util, nil })}})
	if err != nil {
		t.Fatal(err)
	}
	admit := func() {
		_, done, _ := w.Admit(context.Background(), criticalPlus())
		done(spillway.Success)
	}
	admit() // first tick: up
	if w.Level() != 0.25 {
		t.Fatalf("level %v, want 0.25", w.Level())
	}
	clk.Advance(-time.Hour)
	admit() // before the next tick: nothing moves
	if w.Level() != 0.25 {
		t.Fatalf("level %v after time went back, want 0.25", w.Level())
	}
	clk.Advance(time.Hour + 100*time.Millisecond)
	admit()
	if w.Level() != 0.5 {
		t.Fatalf("level %v at the next tick, want 0.5", w.Level())
	}
}

// A malformed or nil request is denied with ReasonInvalid by both
// shedders, never a panic; nothing is counted in flight.
func TestAdmitMalformedRequests(t *testing.T) {
	w, err := shedder.NewWorker(10, shedder.WorkerSettings{})
	if err != nil {
		t.Fatal(err)
	}
	// Never refreshed: the Fleet decides on its local share, no Redis
	// needed for the validation path.
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { client.Close() })
	f, err := shedder.NewFleet(client, "api", 10, shedder.FleetSettings{}.With(shedder.Knobs{NoAutoRefresh: true}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		l    spillway.Limiter
	}{{"worker", w}, {"api", f}} {
		for _, r := range []*spillway.Request{nil, {Cost: -1}, {Priority: 7}, {Priority: -1}} {
			d, done, err := c.l.Admit(context.Background(), r)
			if want := (spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: c.name}); d != want || err != nil || done == nil {
				t.Errorf("%s.Admit(%+v) = %+v, %v; want %+v", c.name, r, d, err, want)
			}
		}
	}
	if got := w.InFlight(); got != 0 {
		t.Errorf("worker in flight %d after malformed requests, want 0", got)
	}
}
