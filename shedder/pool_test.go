package shedder_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/shedder"
)

func newLatency(t *testing.T, cfg concurrency.LatencyConfig) *concurrency.LatencyLimit {
	t.Helper()
	l, err := concurrency.NewLatencyLimit(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newPool(t *testing.T, l *concurrency.LatencyLimit, fleet *shedder.Fleet, s shedder.QueueSettings) *shedder.Pool {
	t.Helper()
	p, err := shedder.NewPool(l, fleet, s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// admitN admits n requests of priority pr that must be allowed at once.
func admitN(t *testing.T, p *shedder.Pool, n int, pr spillway.Priority) []spillway.Done {
	t.Helper()
	var dones []spillway.Done
	for i := 0; i < n; i++ {
		d, done, err := p.Admit(context.Background(), &spillway.Request{Priority: pr})
		if err != nil || !d.Allowed {
			t.Fatalf("admission %d of %d: %+v, %v", i+1, n, d, err)
		}
		dones = append(dones, done)
	}
	return dones
}

func finish(dones []spillway.Done, o spillway.Outcome) {
	for _, done := range dones {
		done(o)
	}
}

// A Pool's slots follow the learned limit: slow start doubles them while
// queries keep their latency and use the slots; a freed slot goes to the
// highest priority waiting, each priority waits as long as its own
// maximum wait; Ignored work teaches nothing, a failure halves the slots.
func TestPoolLearnsAndQueues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(t, newLatency(t, concurrency.LatencyConfig{Initial: 2}), nil, shedder.QueueSettings{Name: "db_pool", MaxWait: 300 * time.Millisecond, PriorityWait: map[spillway.Priority]time.Duration{spillway.SheddablePlus: 100 * time.Millisecond}})
		if p.Slots() != 2 {
			t.Fatalf("slots %d, want the initial 2", p.Slots())
		}
		round := func(n int) {
			dones := admitN(t, p, n, spillway.Critical)
			time.Sleep(200 * time.Millisecond)
			finish(dones, spillway.Success)
		}
		// 12 queries of 200 ms set the baseline; the next 12, two at a
		// time, used the whole limit: it doubles; 12 more at 4: 8.
		for i := 0; i < 12; i++ {
			round(2)
		}
		if p.Slots() != 4 {
			t.Fatalf("after two windows: %d slots, want 4", p.Slots())
		}
		for i := 0; i < 3; i++ {
			round(4)
		}
		if s := p.Stats(); s.Slots != 8 || s.Limit != 8 || s.Admitted != 36 || s.Waited != 0 {
			t.Fatalf("after three windows: %+v, want 8 slots, 36 admitted", s)
		}

		// The pool full, a SheddablePlus request waits 100 ms and a
		// Critical one 300 ms; the slot freed at 150 ms goes to the
		// Critical one, the other having given up at 100 ms.
		busy := admitN(t, p, 8, spillway.Critical)
		type result struct {
			d    spillway.Decision
			done spillway.Done
			at   time.Duration
		}
		start := time.Now()
		wait := func(pr spillway.Priority) chan result {
			ch := make(chan result, 1)
			go func() {
				d, done, _ := p.Admit(context.Background(), &spillway.Request{Priority: pr})
				ch <- result{d, done, time.Since(start)}
			}()
			return ch
		}
		low, high := wait(spillway.SheddablePlus), wait(spillway.Critical)
		synctest.Wait()
		if s := p.Stats(); s.Waiting != 2 {
			t.Fatalf("waiting %d, want 2", s.Waiting)
		}
		time.Sleep(150 * time.Millisecond)
		busy[0](spillway.Ignored) // frees a slot, teaches nothing
		lr, hr := <-low, <-high
		if lr.d.Allowed || lr.d.Reason != spillway.ReasonShed || lr.d.Limiter != "db_pool" || lr.d.RetryAfter != time.Second || lr.at != 100*time.Millisecond {
			t.Fatalf("SheddablePlus waiter: %+v after %v, want shed after 100ms", lr.d, lr.at)
		}
		if !hr.d.Allowed || hr.at != 150*time.Millisecond {
			t.Fatalf("Critical waiter: %+v after %v, want allowed after 150ms", hr.d, hr.at)
		}
		if s := p.Stats(); s.TimedOut != 1 || s.Waited != 1 || s.InFlight != 8 || s.Slots != 8 {
			t.Fatalf("after the wait: %+v", s)
		}
		// Ignored work that took a second says nothing about the
		// dependency: the slots stay at 8.
		finish(busy[1:], spillway.Ignored)
		hr.done(spillway.Ignored)
		if s := p.Stats(); s.Slots != 8 || s.InFlight != 0 {
			t.Fatalf("after ignored work: %+v, want 8 slots, none in flight", s)
		}
		// A failed query halves them.
		dones := admitN(t, p, 1, spillway.Critical)
		dones[0](spillway.Dropped)
		if p.Slots() != 4 {
			t.Fatalf("after a failure: %d slots, want 4", p.Slots())
		}
		dones[0](spillway.Dropped) // a second call is a no-op
		if s := p.Stats(); s.Slots != 4 || s.InFlight != 0 {
			t.Fatalf("after done twice: %+v", s)
		}
	})
}

// Work in flight far past the baseline cuts the slots before it ends.
func TestPoolOverdue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(t, newLatency(t, concurrency.LatencyConfig{Initial: 8}), nil, shedder.QueueSettings{})
		for i := 0; i < 12; i++ { // a baseline of 10 ms, under half the limit used: no growth
			dones := admitN(t, p, 3, spillway.Critical)
			time.Sleep(10 * time.Millisecond)
			finish(dones, spillway.Success)
		}
		stuck := admitN(t, p, 3, spillway.Critical)
		time.Sleep(21 * time.Millisecond) // past twice the baseline
		if p.Slots() != 8 {
			t.Fatalf("slots %d before the next decision, want 8", p.Slots())
		}
		admitN(t, p, 1, spillway.Critical) // the decision sees three overdue
		if p.Slots() != 4 {
			t.Fatalf("slots %d with three queries overdue, want 4", p.Slots())
		}
		finish(stuck, spillway.Ignored)
	})
}

func TestPoolValidation(t *testing.T) {
	lim := newLatency(t, concurrency.LatencyConfig{})
	if _, err := shedder.NewPool(nil, nil, shedder.QueueSettings{}); err == nil {
		t.Error("nil learner: no error")
	}
	for name, set := range map[string]shedder.QueueSettings{
		"negative priority wait": {PriorityWait: map[spillway.Priority]time.Duration{spillway.Critical: -1}},
		"priority out of range":  {PriorityWait: map[spillway.Priority]time.Duration{7: time.Second}},
		"negative priority":      {PriorityWait: map[spillway.Priority]time.Duration{-1: time.Second}},
		"negative depth":         {Depth: -1},
		"negative retry after":   {RetryAfter: -time.Second},
	} {
		if _, err := shedder.NewPool(lim, nil, set); err == nil {
			t.Errorf("%s: no error", name)
		}
		if _, err := shedder.NewQueue(4, set); err == nil {
			t.Errorf("queue, %s: no error", name)
		}
	}
	p := newPool(t, lim, nil, shedder.QueueSettings{})
	if d, _, _ := p.Admit(context.Background(), nil); d.Allowed || d.Reason != spillway.ReasonInvalid || d.Limiter != "pool" {
		t.Fatalf("nil request: %+v", d)
	}
}

// Without a fleet, a reading that began after the last cut and shows idle
// capacity raises the limit by it, once per reading however many
// decisions follow; a reading from before the cut does nothing.
func TestPoolRaiseWithoutFleet(t *testing.T) {
	clk := newClock()
	p := newPool(t, newLatency(t, concurrency.LatencyConfig{Initial: 4}), nil, shedder.QueueSettings{Clock: clk.Now})
	before := clk.Now()
	clk.Advance(time.Second)
	dones := admitN(t, p, 1, spillway.Critical)
	dones[0](spillway.Dropped) // a cut: 4 → 2, at clk.Now()
	if p.Slots() != 2 {
		t.Fatalf("after a failure: %d slots, want 2", p.Slots())
	}
	p.Observe(shedder.Reading{Since: before, At: clk.Now(), Busy: 1, Idle: 5})
	admitN(t, p, 1, spillway.Critical)
	if p.Slots() != 2 {
		t.Fatalf("a reading from before the cut: %d slots, want 2", p.Slots())
	}
	clk.Advance(time.Second)
	p.Observe(shedder.Reading{Since: clk.Now().Add(-time.Millisecond), At: clk.Now(), Busy: 1, Idle: 5})
	for i := 0; i < 3; i++ {
		admitN(t, p, 1, spillway.Critical)
	}
	if s := p.Stats(); s.Slots != 7 || s.Limit != 7 || s.Allowance != 0 {
		t.Fatalf("after a reading with 5 idle: %+v, want 7 slots", s)
	}
}

// A reading that measures the work at the dependency (Reading.Active)
// reaches the learned limit through the Pool: with every worker busy and
// nothing waiting, slow work is the dependency's own slowness and moves
// the baseline; with a queue, the same slowness cuts. The watcher refuses
// a reading whose Active is negative or NaN.
func TestPoolQueuedReading(t *testing.T) {
	clk := newClock()
	l := newLatency(t, concurrency.LatencyConfig{Initial: 4})
	p := newPool(t, l, nil, shedder.QueueSettings{Clock: clk.Now})
	run := func(n int, rtt time.Duration) {
		t.Helper()
		for range n {
			done := admitN(t, p, 1, spillway.Critical)[0]
			clk.Advance(rtt)
			done(spillway.Success)
		}
	}
	read := func(busy, active float64) {
		since := clk.Now()
		clk.Advance(250 * time.Millisecond)
		p.Observe(shedder.Reading{Since: since, At: clk.Now(), Busy: busy, Active: active})
	}
	run(48, 100*time.Millisecond) // the baseline; one in flight of 4: no growth
	if shedder.LearnedLimit(l) != 4 || shedder.Baseline(l) != 100*time.Millisecond {
		t.Fatalf("limit %d, baseline %v; want 4, 100ms", shedder.LearnedLimit(l), shedder.Baseline(l))
	}
	read(4, 4.2) // every worker busy, 0.2 waiting
	run(3, 300*time.Millisecond)
	if s := p.Stats(); s.Limit != 4 || s.Slots != 4 || shedder.Baseline(l) != 300*time.Millisecond {
		t.Fatalf("slow work, nothing waiting: %+v, baseline %v; want limit 4, baseline 300ms", s, shedder.Baseline(l))
	}
	read(4, 7) // 3 waiting
	run(3, 900*time.Millisecond)
	if s := p.Stats(); s.Limit != 2 || s.Slots != 2 || shedder.Baseline(l) != 300*time.Millisecond {
		t.Fatalf("slow work, 3 waiting: %+v, baseline %v; want limit 2 (a cut by half), baseline 300ms", s, shedder.Baseline(l))
	}

	var reading atomic.Pointer[shedder.Reading]
	w, err := shedder.NewCapacityWatcher(shedder.Gauge(func(context.Context) (shedder.Reading, error) {
		return *reading.Load(), nil
	}), nil, p, shedder.WatcherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	for i, active := range []float64{-1, math.NaN(), math.Inf(1)} {
		clk.Advance(time.Second)
		reading.Store(&shedder.Reading{Since: clk.Now(), At: clk.Now().Add(time.Second), Busy: 4, Active: active})
		if err := w.Poll(context.Background()); !errors.Is(err, shedder.ErrBadReading) || w.Errors() != int64(i+1) {
			t.Fatalf("active %v: %v, %d errors", active, err, w.Errors())
		}
	}
}

// poolFleets returns a maker of the pool tests' fleet servers: a fleet
// "db" of 10 on client, refreshed only by hand, on clk, with no reserve.
func poolFleets(t *testing.T, client redis.UniversalClient, clk *testclock.Clock) func(id string) *shedder.Fleet {
	return func(id string) *shedder.Fleet {
		f, err := shedder.NewFleet(client, "db", 10, shedder.FleetSettings{ServerID: id, Clock: clk.Now, Reserve: -1, Timeout: 2 * time.Second}.With(shedder.Knobs{NoAutoRefresh: true, Rand: func() float64 { return 0 }}))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
}

// With a fleet, the slots are capped by what the fleet shedder allows this
// server, and the capacity watcher sets the fleet's capacity from the
// dependency's gauge; idle capacity raises the limit to the allowance.
// Real redis-server.
func TestPoolWithFleetAndCapacity(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	fleet := poolFleets(t, client, clk)
	a, b := fleet("a"), fleet("b")
	refresh(t, a, b, a)
	// Two servers on an idle fleet of 10: half each.
	if got := a.Allowance(spillway.Critical); got != 5 {
		t.Fatalf("a's allowance %d, want 5", got)
	}
	lim := newLatency(t, concurrency.LatencyConfig{Initial: 8})
	p := newPool(t, lim, a, shedder.QueueSettings{Clock: clk.Now, MaxWait: -1})
	dones := admitN(t, p, 5, spillway.Critical)
	d, _, _ := p.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
	if d.Allowed || d.Reason != spillway.ReasonShed || d.Limit != 5 || d.Remaining != 0 {
		t.Fatalf("sixth request: %+v, want shed at the allowance of 5", d)
	}
	if s := p.Stats(); s.Slots != 5 || s.Limit != 8 || s.Allowance != 5 {
		t.Fatalf("capped pool: %+v, want 5 slots of a learned 8", s)
	}
	finish(dones, spillway.Ignored)

	// The database reports 3 busy and 1 idle: the fleet's capacity is 4,
	// a's half of it 2.
	var reading atomic.Pointer[shedder.Reading]
	reads := 0
	g := shedder.Gauge(func(context.Context) (shedder.Reading, error) {
		reads++
		return *reading.Load(), nil
	})
	w, err := shedder.NewCapacityWatcher(g, a, p, shedder.WatcherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	set := func(busy, idle float64) {
		clk.Advance(time.Millisecond)
		since := clk.Now()
		clk.Advance(time.Second)
		reading.Store(&shedder.Reading{Since: since, At: clk.Now(), Busy: busy, Idle: idle})
		if err := w.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	set(3, 1)
	refresh(t, b, a, b, a) // twice: after a second without a refresh, the first only rejoins
	admitN(t, p, 1, spillway.Critical)[0](spillway.Ignored)
	if a.Capacity() != 4 || p.Slots() != 2 {
		t.Fatalf("after a reading of 3 busy, 1 idle: fleet capacity %d, slots %d; want 4, 2", a.Capacity(), p.Slots())
	}
	// The same reading again is not new: nothing changes, even if the
	// fleet's capacity was set meanwhile.
	if err := a.SetCapacity(7); err != nil {
		t.Fatal(err)
	}
	if err := w.Poll(context.Background()); err != nil || a.Capacity() != 7 || reads != 2 {
		t.Fatalf("the same reading: %v, capacity %d, %d reads", err, a.Capacity(), reads)
	}
	// Never above the fleet's configured capacity, never below 1.
	set(40, 2)
	if a.Capacity() != 10 {
		t.Fatalf("a reading of 42: capacity %d, want the configured 10", a.Capacity())
	}
	set(0, 0)
	if a.Capacity() != 1 || w.Last().Busy != 0 {
		t.Fatalf("a reading of 0: capacity %d, want 1", a.Capacity())
	}
	// A bad reading or a failing gauge changes nothing.
	clk.Advance(time.Second)
	reading.Store(&shedder.Reading{Since: clk.Now(), At: clk.Now().Add(time.Second), Busy: -1, Idle: 3})
	if err := w.Poll(context.Background()); !errors.Is(err, shedder.ErrBadReading) || a.Capacity() != 1 || w.Errors() != 1 {
		t.Fatalf("a negative reading: %v, capacity %d, %d errors", err, a.Capacity(), w.Errors())
	}

	// A cut, then a reading that began after it with 6 idle of 10: the
	// limit rises at once to what the fleet allows a (half of 10).
	set(4, 6)
	refresh(t, b, a, b, a)                                  // twice: after a second without a refresh, the first only rejoins
	admitN(t, p, 1, spillway.Critical)[0](spillway.Dropped) // 8 capped at 5, halved: 2.5
	if s := p.Stats(); s.Limit != 2 || s.Slots != 2 {
		t.Fatalf("after a failure: %+v, want 2", s)
	}
	set(4, 6)
	refresh(t, b, a, b, a) // twice: after a second without a refresh, the first only rejoins
	admitN(t, p, 1, spillway.Critical)[0](spillway.Ignored)
	if s := p.Stats(); s.Limit != 5 || s.Slots != 5 || s.Allowance != 5 {
		t.Fatalf("after a reading with 6 idle: %+v, want 5", s)
	}
	// A fleet that lost Redis (degraded) does not raise: its share is a
	// guess.
	admitN(t, p, 1, spillway.Critical)[0](spillway.Dropped) // 2.5
	set(4, 6)
	clk.Advance(2 * time.Second) // the last refresh stale: degraded
	admitN(t, p, 1, spillway.Critical)[0](spillway.Ignored)
	if s := p.Stats(); s.Limit != 2 {
		t.Fatalf("degraded fleet: %+v, want the limit held at 2", s)
	}
}

func TestCapacityWatcher(t *testing.T) {
	lim := newLatency(t, concurrency.LatencyConfig{})
	p := newPool(t, lim, nil, shedder.QueueSettings{})
	g := shedder.Gauge(func(context.Context) (shedder.Reading, error) { return shedder.Reading{}, nil })
	if _, err := shedder.NewCapacityWatcher(nil, nil, p, shedder.WatcherSettings{}); err == nil {
		t.Error("nil gauge: no error")
	}
	if _, err := shedder.NewCapacityWatcher(g, nil, nil, shedder.WatcherSettings{}); err == nil {
		t.Error("nothing to feed: no error")
	}
	if _, err := shedder.NewCapacityWatcher(g, nil, p, shedder.WatcherSettings{Interval: -1}); err == nil {
		t.Error("negative interval: no error")
	}
	if _, err := shedder.NewCapacityWatcher(g, nil, p, shedder.WatcherSettings{Timeout: -1}); err == nil {
		t.Error("negative timeout: no error")
	}
	// Run polls every interval, each Read within the timeout, until the
	// context ends.
	synctest.Test(t, func(t *testing.T) {
		var polls atomic.Int64
		var deadline atomic.Int64
		g := shedder.Gauge(func(ctx context.Context) (shedder.Reading, error) {
			polls.Add(1)
			d, _ := ctx.Deadline()
			deadline.Store(int64(time.Until(d)))
			return shedder.Reading{At: time.Now(), Busy: 1, Idle: 2}, nil
		})
		w, err := shedder.NewCapacityWatcher(g, nil, p, shedder.WatcherSettings{Interval: time.Second, Timeout: 30 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- w.Run(ctx) }()
		time.Sleep(3500 * time.Millisecond)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) || polls.Load() != 3 || time.Duration(deadline.Load()) != 30*time.Millisecond || w.Last().Idle != 2 {
			t.Fatalf("Run: %v after %d polls (deadline %v), last %+v", err, polls.Load(), time.Duration(deadline.Load()), w.Last())
		}
	})
}

// The full chain when the server's own workers are what saturates: a
// Worker sized to the server's workers before the Pool. A slow handler
// that does not use the database holds workers, not database slots: the
// Worker turns work away at once past its caps (SheddablePlus at 80% of
// the workers, Critical at all of them), and the Pool, which the slow
// route does not pass (its chain is the Worker alone), learns nothing from
// the handler's time.
func TestWorkerBeforePoolWhenWorkersSaturate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := shedder.NewWorker(10, shedder.WorkerSettings{}.With(shedder.Knobs{Rand: func() float64 { return 0.99 }}))
		if err != nil {
			t.Fatal(err)
		}
		p := newPool(t, newLatency(t, concurrency.LatencyConfig{Initial: 4}), nil, shedder.QueueSettings{})
		chain := spillway.Chain(w, p)
		ctx := context.Background()
		admitted := map[spillway.Priority]int{}
		shed := map[spillway.Priority]int{}
		var dones []spillway.Done
		// 30 slow requests (each holds a worker for 5 s), 20 SheddablePlus
		// then 10 Critical, arriving together.
		for i := 0; i < 30; i++ {
			pr := spillway.SheddablePlus
			if i >= 20 {
				pr = spillway.Critical
			}
			d, done, _ := w.Admit(ctx, &spillway.Request{Priority: pr})
			if d.Allowed {
				admitted[pr]++
				dones = append(dones, done)
			} else if d.Reason == spillway.ReasonShed && d.Limiter == "worker" {
				shed[pr]++
			}
		}
		if admitted[spillway.SheddablePlus] != 8 || admitted[spillway.Critical] != 2 || shed[spillway.SheddablePlus] != 12 || shed[spillway.Critical] != 8 {
			t.Fatalf("admitted %v, shed %v; want 8 SheddablePlus and 2 Critical of 10 workers", admitted, shed)
		}
		// A database request in the full chain meanwhile: no worker left.
		if d, _, _ := chain.Admit(ctx, &spillway.Request{Priority: spillway.Critical}); d.Allowed || d.Limiter != "worker" {
			t.Fatalf("database request with every worker busy: %+v", d)
		}
		time.Sleep(5 * time.Second)
		finish(dones, spillway.Success)
		// Workers free again: it passes both, and the pool still has the
		// 4 slots it started with.
		d, done, _ := chain.Admit(ctx, &spillway.Request{Priority: spillway.Critical})
		if !d.Allowed || p.Slots() != 4 || w.InFlight() != 1 {
			t.Fatalf("after the slow requests: %+v, %d slots, %d workers busy", d, p.Slots(), w.InFlight())
		}
		done(spillway.Success)
	})
}

// A Pool with a fleet (NewPool's fleet) whose slots the fleet's allowance set tells its
// Fleet when it refuses Critical work, so that the fleet's other servers
// above their even share make room (Fleet, pressure); a Pool whose slots
// its learned limit set does not: the dependency, not the fleet, holds it
// back. Real redis-server.
func TestPoolFleetBoundRefusalIsReported(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := newClock()
	fleet := poolFleets(t, client, clk)
	// b, alone, fills 8 of the 10 with Sheddable work; then a joins: an
	// even share of 5 each, a's allowance floor(5/18 × 2) = 0, its pool
	// one slot (never fewer), below its learned 8.
	b := fleet("b")
	refresh(t, b)
	held := runFleet(t, b, []fleetStep{{spillway.Sheddable, 8, true, 0}})
	a := fleet("a")
	refresh(t, b, a)
	p := newPool(t, newLatency(t, concurrency.LatencyConfig{Initial: 8}), a, shedder.QueueSettings{Clock: clk.Now, MaxWait: -1})
	first := admitN(t, p, 1, spillway.Critical)
	if d, _, _ := p.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical}); d.Allowed || d.Reason != spillway.ReasonShed {
		t.Fatalf("second Critical request: %+v, want shed (one slot)", d)
	}
	refresh(t, a, b)
	if !b.Stats().Pressure {
		t.Fatal("b: no pressure after a's pool, bound by the fleet, refused Critical work")
	}
	runFleet(t, b, []fleetStep{{spillway.Sheddable, 1, false, 0}})
	finish(first, spillway.Ignored)

	// b's work ends and a reports again without a refusal: a's allowance
	// is 5, more than a pool whose learned limit is 2 uses.
	finish(held, spillway.Success)
	refresh(t, b, a, b)
	if b.Stats().Pressure {
		t.Fatal("b: pressure after a's report without a refusal")
	}
	q := newPool(t, newLatency(t, concurrency.LatencyConfig{Initial: 2}), a, shedder.QueueSettings{Clock: clk.Now, MaxWait: -1})
	two := admitN(t, q, 2, spillway.Critical)
	if d, _, _ := q.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical}); d.Allowed || d.Reason != spillway.ReasonShed || q.Stats().Allowance != 5 {
		t.Fatalf("third Critical request: %+v (allowance %d), want shed at the learned 2 of an allowance of 5", d, q.Stats().Allowance)
	}
	refresh(t, a, b)
	if b.Stats().Pressure {
		t.Fatal("b: pressure from a pool that its learned limit, not the fleet, held back")
	}
	finish(two, spillway.Ignored)
}
