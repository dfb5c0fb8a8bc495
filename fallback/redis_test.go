package fallback_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

// tolerance is what a stalled call may take beyond the budget on a loaded
// two-core machine under -race (the scheduling delay of a timer; 171ms was
// seen at load average 20). The client's socket timeouts are 10s (see
// newBed), so only the budget can end a stalled call this early.
const tolerance = 450 * time.Millisecond

func TestStalledRedisBudgetBreakerShare(t *testing.T) {
	b := newBed(t)
	var degradedEvents atomic.Int64
	budget := 200 * time.Millisecond // well above a healthy call on a loaded machine
	st := b.fallback(t, fallback.Settings{
		Budget:      budget,
		OpenTimeout: time.Hour, // stays open for the whole test
		OnDegraded:  func(fallback.DegradedEvent) { degradedEvents.Add(1) },
	})
	b.warm(t)
	d := decide(t, st, "api", "k", hourly, 1)
	if !d.Allowed || d.Degraded || d.Remaining != 99 || d.Limit != 100 {
		t.Fatalf("healthy decision = %+v; want allowed by Redis, 99 of 100 left", d)
	}

	b.setMode(t, faultproxy.Stall)
	var slowest time.Duration
	for i := 0; i < 5; i++ {
		start := time.Now()
		d := decide(t, st, "api", "k", hourly, 1)
		el := time.Since(start)
		slowest = max(slowest, el)
		if el > budget+tolerance {
			t.Fatalf("call %d took %v; budget %v + tolerance %v", i, el, budget, tolerance)
		}
		if !d.Allowed || !d.Degraded || d.Limit != 20 || d.Remaining != int64(19-i) {
			t.Fatalf("call %d while stalled = %+v; want allowed by the local share, Limit 20, Remaining %d", i, d, 19-i)
		}
	}
	t.Logf("slowest stalled call: %v (budget %v)", slowest, budget)
	if got := st.State(); got != fallback.Open {
		t.Fatalf("after 5 failures the breaker is %v; want open", got)
	}

	// Breaker open: nothing reaches Redis, not a byte, not a connection.
	before := b.proxy.Stats()
	allowed, degraded := count(t, st, "api", "k", hourly, 100)
	after := b.proxy.Stats()
	if after.Received != before.Received || after.Accepted != before.Accepted {
		t.Fatalf("proxy saw traffic while the breaker was open: before %+v, after %+v", before, after)
	}
	// The share is exactly 20% of 100: 5 admitted during the failures,
	// 15 more now.
	if allowed != 15 || degraded != 100 {
		t.Fatalf("open breaker admitted %d of 100 (%d degraded); want 15, all degraded", allowed, degraded)
	}
	d = decide(t, st, "api", "k", hourly, 1)
	if d.Allowed || !d.Degraded || d.Reason != spillway.ReasonRateLimited || d.Limit != 20 || d.RetryAfter != 36*time.Second*5 {
		t.Fatalf("over the share = %+v; want denied, rate limited, Limit 20, RetryAfter 3m (one token at 20/h)", d)
	}
	if got := degradedEvents.Load(); got != 106 {
		t.Fatalf("degraded events = %d; want 106", got)
	}
	if s := st.Stats(); s.Calls != 1 || s.Degraded != 106 {
		t.Fatalf("stats = %+v; want 1 call, 106 degraded", s)
	}
}

func TestFleetDuringOutageAdmitsAtMostNShares(t *testing.T) {
	b := newBed(t)
	const servers = 4
	fleet := make([]*fallback.Store, servers)
	for i := range fleet {
		fleet[i] = b.fallback(t, fallback.Settings{Name: "server"})
	}
	b.setMode(t, faultproxy.Refuse)
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, st := range fleet {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				out := make([]spillway.Decision, 1)
				ok, err := st.Decide(context.Background(), []ratelimit.Item{{Scope: "api", Key: "tenant", Policy: hourly, Cost: 1}}, out)
				if err != nil {
					t.Errorf("Decide: %v", err)
					return
				}
				if ok {
					total.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// Each server admits its 20% alone: 4 × 20 = 80 of the quota of 100.
	if got := total.Load(); got != servers*20 {
		t.Fatalf("fleet admitted %d during the outage; want exactly %d (N × 20%% of 100)", got, servers*20)
	}
}

func TestRedisRestartedEmptyReconciles(t *testing.T) {
	b := newBed(t)
	events := make(chan fallback.ReconcileEvent, 4)
	st := b.fallback(t, fallback.Settings{
		OpenTimeout: 200 * time.Millisecond,
		OnReconcile: func(ev fallback.ReconcileEvent) { events <- ev },
	})
	if allowed, degraded := count(t, st, "api", "k", hourly, 50); allowed != 50 || degraded != 0 {
		t.Fatalf("healthy: %d allowed, %d degraded; want 50, 0", allowed, degraded)
	}
	b.srv.Kill()
	// Decisions continue: the local share admits 20 of 25.
	if allowed, degraded := count(t, st, "api", "k", hourly, 25); allowed != 20 || degraded != 25 {
		t.Fatalf("redis down: %d allowed, %d degraded; want 20, 25", allowed, degraded)
	}
	if got := st.State(); got != fallback.Open {
		t.Fatalf("breaker %v; want open", got)
	}
	if err := b.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// Probe until Redis answers (the open timeout is real time).
	redisCalls := 0
	waitFor(t, "a decision by Redis", func() bool {
		d := decide(t, st, "api", "k", hourly, 1)
		if !d.Degraded {
			redisCalls++
			if !d.Allowed || d.Remaining != 99 {
				t.Fatalf("first decision of the empty Redis = %+v; want allowed, 99 left", d)
			}
		}
		return redisCalls > 0
	})
	var ev fallback.ReconcileEvent
	select {
	case ev = <-events:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconcile pass")
	}
	if ev.Keys != 1 || ev.Charged != 20 || ev.Pending != 0 || ev.Err != nil {
		t.Fatalf("reconcile = %+v; want 1 key, 20 units charged", ev)
	}
	// The empty Redis now holds what the outage consumed: 100 − 1 − 20.
	if d := decide(t, b.directStore(t), "api", "k", hourly, 0); d.Remaining != 79 {
		t.Fatalf("after reconcile Redis has %d left; want 79", d.Remaining)
	}
	if s := st.Stats(); s.Reconciled != 20 {
		t.Fatalf("stats = %+v; want 20 reconciled", s)
	}
}

func TestScriptFlushIsInvisible(t *testing.T) {
	b := newBed(t)
	st := b.fallback(t, fallback.Settings{
		Budget:     time.Second, // this test is about scripts, not speed
		OnDegraded: func(ev fallback.DegradedEvent) { t.Logf("degraded: %v", ev.Cause) },
	})
	two := ratelimit.Policy{Algorithm: ratelimit.SlidingWindowCounter, Limit: 100, Period: time.Hour}
	batch := func() bool {
		out := make([]spillway.Decision, 2)
		ok, err := st.Decide(context.Background(), []ratelimit.Item{
			{Scope: "a", Key: "k", Policy: hourly, Cost: 1},
			{Scope: "b", Key: "k", Policy: two, Cost: 1},
		}, out)
		if err != nil || out[0].Degraded || out[1].Degraded {
			t.Fatalf("batch = %v, %+v", err, out)
		}
		return ok
	}
	if d := decide(t, st, "api", "k", hourly, 1); d.Degraded || d.Remaining != 99 {
		t.Fatalf("before flush %+v", d)
	}
	batch()
	if _, err := b.srv.Do(context.Background(), "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if d := decide(t, st, "api", "k", hourly, 1); !d.Allowed || d.Degraded || d.Remaining != 98 {
		t.Fatalf("after flush %+v; want allowed by Redis, 98 left", d)
	}
	if !batch() {
		t.Fatal("batch after flush denied")
	}
	if s := st.Stats(); s.Degraded != 0 || s.Calls != 4 {
		t.Fatalf("stats = %+v; want 4 calls, none degraded", s)
	}
}

func TestSlowRedisOpensAndProbesClose(t *testing.T) {
	b := newBed(t)
	var rec states
	st := b.fallback(t, fallback.Settings{
		Budget:        400 * time.Millisecond, // a healthy probe fits even on a loaded machine
		OpenTimeout:   200 * time.Millisecond,
		Probes:        3,
		LedgerSize:    -1, // no reconcile calls competing for the probes
		OnStateChange: rec.hook,
	})
	b.warm(t)
	b.proxy.SetLatency(0, 1200*time.Millisecond) // every answer comes after the budget
	if _, degraded := count(t, st, "api", "k", hourly, 5); degraded != 5 {
		t.Fatalf("slow Redis: %d of 5 degraded", degraded)
	}
	if got := st.State(); got != fallback.Open {
		t.Fatalf("breaker %v after 5 slow calls; want open", got)
	}
	b.proxy.SetLatency(0, 0)
	// The health's own probes (PINGs on the store's client), not
	// requests, find Redis back: every decision until it closes is local.
	calls := st.Stats().Calls
	start := time.Now()
	for st.State() != fallback.Closed {
		if d := decide(t, st, "api", "k", hourly, 1); !d.Degraded {
			// The probes may close the breaker between the check above
			// and this call: then, and only then, the call is Redis's.
			if st.State() != fallback.Closed {
				t.Fatalf("decided by Redis while the breaker is %v: %+v", st.State(), d)
			}
			calls++
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("breaker %v 3 s after the latency ended; want closed by the probes (%+v)", st.State(), st.Health().Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := st.Stats().Calls; got != calls {
		t.Fatalf("%d calls reached Redis before the breaker closed; want 0 (no request is a probe)", got-calls)
	}
	if hs := st.Health().Stats(); hs.ProbesOK != 3 || hs.Probes != 3 {
		t.Fatalf("health %+v; want closed by exactly 3 probes", hs)
	}
	if d := decide(t, st, "api", "k", hourly, 1); d.Degraded {
		t.Fatalf("closed: %+v; want decided by Redis", d)
	}
	want := []string{"closed→open", "open→half_open", "half_open→closed"}
	if got := rec.get(); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("transitions %v; want %v", got, want)
	}
}

func TestFailClosedAndFailOpenRules(t *testing.T) {
	b := newBed(t)
	st := b.fallback(t, fallback.Settings{OpenTimeout: 2 * time.Second})
	login := ratelimit.Item{Scope: "login", Key: "alice", Policy: hourly, Cost: 1, Fail: spillway.FailClosed}
	if d := decideItem(t, st, login); !d.Allowed || d.Degraded {
		t.Fatalf("fail-closed rule, store up = %+v; want allowed by the store", d)
	}
	b.setMode(t, faultproxy.Refuse)
	d := decideItem(t, st, login)
	if d.Allowed || d.Reason != spillway.ReasonFailClosed || !d.Degraded || d.RetryAfter != 2*time.Second || d.Limiter != "login" {
		t.Fatalf("fail-closed rule = %+v; want denied, fail_closed, degraded, RetryAfter 2s", d)
	}
	// A batch with a fail-closed item is denied and charges nothing.
	out := make([]spillway.Decision, 2)
	ok, err := st.Decide(context.Background(), []ratelimit.Item{
		{Scope: "api", Key: "alice", Policy: hourly, Cost: 1},
		login,
	}, out)
	if err != nil || ok || !out[0].Allowed || out[0].Remaining != 20 || out[1].Reason != spillway.ReasonFailClosed {
		t.Fatalf("mixed batch = %v, %v, %+v; want denied by login, api peeked with 20 left", ok, err, out)
	}
	allowed, degraded := count(t, st, "api", "alice", hourly, 30)
	if allowed != 20 || degraded != 30 {
		t.Fatalf("fail-open rule admitted %d of 30 (%d degraded); want 20, 30", allowed, degraded)
	}
}

func TestDenyCacheAnswersWithoutRoundTrip(t *testing.T) {
	b := newBed(t)
	st := b.fallback(t, fallback.Settings{})
	two := ratelimit.Policy{Limit: 2, Period: time.Hour} // one token per 30 min
	decide(t, st, "api", "k", two, 1)
	decide(t, st, "api", "k", two, 1)
	d := decide(t, st, "api", "k", two, 1)
	if d.Allowed || d.Degraded || d.RetryAfter != 30*time.Minute {
		t.Fatalf("Redis denial = %+v; want denied for 30m", d)
	}
	before := b.proxy.Stats().Received
	b.clock.Advance(10 * time.Minute)
	d = decide(t, st, "api", "k", two, 1)
	if d.Allowed || d.Degraded || d.Reason != spillway.ReasonRateLimited || d.RetryAfter != 20*time.Minute {
		t.Fatalf("cached denial = %+v; want denied for the 20m left", d)
	}
	if after := b.proxy.Stats().Received; after != before {
		t.Fatalf("a cached denial sent %d bytes to Redis", after-before)
	}
	if s := st.Stats(); s.CacheHits != 1 || s.Calls != 3 {
		t.Fatalf("stats = %+v; want 1 cache hit, 3 calls", s)
	}
	b.clock.Advance(20 * time.Minute)
	if d := decide(t, st, "api", "k", two, 1); !d.Allowed || d.Degraded {
		t.Fatalf("after RetryAfter = %+v; want allowed by Redis", d)
	}
	if s := st.Stats(); s.CacheHits != 1 || s.Calls != 4 {
		t.Fatalf("stats = %+v; want 1 cache hit, 4 calls", s)
	}
}

func TestCallerCancelIsNotAFailure(t *testing.T) {
	b := newBed(t)
	st := b.fallback(t, fallback.Settings{Failures: 2})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 10; i++ {
		out := make([]spillway.Decision, 1)
		_, err := st.Decide(ctx, []ratelimit.Item{{Scope: "api", Key: "k", Policy: hourly, Cost: 1}}, out)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled call: err = %v; want context.Canceled", err)
		}
	}
	if got := st.State(); got != fallback.Closed {
		t.Fatalf("breaker %v after canceled calls; want closed", got)
	}
	if s := st.Stats(); s.Degraded != 0 {
		t.Fatalf("stats = %+v; want nothing degraded", s)
	}
}

func TestSentinelFailoverUnderTraffic(t *testing.T) {
	s := redistest.StartSentinel(t)
	opt := s.FailoverOptions()
	fallback.TuneOptions(opt)
	client := redis.NewFailoverClient(opt)
	t.Cleanup(func() { client.Close() })
	st, err := fallback.NewStore(mustRedisStore(client), fallback.Settings{OpenTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := ratelimit.New(st, ratelimit.Policy{Limit: 1_000_000, Period: time.Second}, ratelimit.Settings{Scope: "api"})
	if err != nil {
		t.Fatal(err)
	}

	type sample struct {
		at       time.Time
		degraded bool
	}
	var (
		mu      sync.Mutex
		samples []sample
		errs    atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			d, err := lim.Allow(context.Background(), "tenant", 1)
			if err != nil || !d.Allowed {
				errs.Add(1)
			}
			mu.Lock()
			samples = append(samples, sample{time.Now(), d.Degraded})
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	s.Primary.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	promoted, err := s.WaitFailover(ctx, s.Primary.Addr)
	if err != nil {
		t.Fatal(err)
	}
	promotedAt := time.Now()
	resumed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := len(samples)
		return n > 0 && samples[n-1].at.After(promotedAt) && !samples[n-1].degraded
	}
	waitFor(t, "decisions by the promoted primary", resumed)
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()

	var lastBefore, firstAfter time.Time
	degraded := 0
	for _, sm := range samples {
		if sm.degraded {
			degraded++
			continue
		}
		if !sm.at.After(killed) {
			lastBefore = sm.at
		} else if firstAfter.IsZero() && sm.at.After(promotedAt) {
			firstAfter = sm.at
		}
	}
	if errs.Load() != 0 {
		t.Fatalf("%d decisions failed or were denied during the failover; want 0", errs.Load())
	}
	if lastBefore.IsZero() || firstAfter.IsZero() {
		t.Fatalf("no shared decisions before the kill or after the promotion")
	}
	t.Logf("failover to %s: %d decisions, %d degraded; promotion %v after the kill; shared-store gap %v (decisions kept flowing from the local share)",
		promoted, len(samples), degraded, promotedAt.Sub(killed).Round(time.Millisecond), firstAfter.Sub(lastBefore).Round(time.Millisecond))
}

// SIGSTOP: the kernel still accepts connections, the server answers
// nothing; SIGCONT: it answers again, and the breaker closes.
func TestRedisPausedThenResumed(t *testing.T) {
	b := newBed(t)
	budget := 200 * time.Millisecond
	st := b.fallback(t, fallback.Settings{Budget: budget, OpenTimeout: 200 * time.Millisecond, LedgerSize: -1})
	b.warm(t)
	if err := b.srv.Pause(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		start := time.Now()
		d := decide(t, st, "api", "k", hourly, 1)
		if el := time.Since(start); el > budget+tolerance || !d.Degraded || !d.Allowed {
			t.Fatalf("call %d while paused: %+v after %v; want the local share within the budget", i, d, el)
		}
	}
	if st.State() != fallback.Open {
		t.Fatalf("breaker %v; want open", st.State())
	}
	if err := b.srv.Resume(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the breaker to close", func() bool {
		decide(t, st, "api", "k", hourly, 1)
		return st.State() == fallback.Closed
	})
	if d := decide(t, st, "api", "k", hourly, 1); d.Degraded || !d.Allowed {
		t.Fatalf("after resume %+v; want decided by Redis", d)
	}
}

// Callers on a paused Redis that queue behind a call in flight (the
// RedisStore coalesces them) take the budget as a deadline without a
// context of their own (ratelimit.BoundedStore): they return within the
// budget, decided by the local share, even though the call they wait
// behind has a deadline of 5s; the share's count is exact.
func TestPausedRedisQueuedCallersKeepTheBudget(t *testing.T) {
	b := newBed(t)
	budget := 200 * time.Millisecond
	inner := b.redisStore()
	st, err := fallback.NewStore(inner, fallback.Settings{Budget: budget, OpenTimeout: time.Hour, LedgerSize: -1, Clock: b.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	b.warm(t)
	if err := b.srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.srv.Resume() }()
	// A patient caller of the bare store takes the place in flight.
	sent := b.proxy.Stats().Received
	slow := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out := make([]spillway.Decision, 1)
		_, err := inner.Decide(ctx, []ratelimit.Item{{Scope: "api", Key: "slow", Policy: hourly, Cost: 1}}, out)
		slow <- err
	}()
	waitFor(t, "the patient call to be sent", func() bool { return b.proxy.Stats().Received > sent })
	const callers = 30
	type res struct {
		d  spillway.Decision
		el time.Duration
	}
	results := make(chan res, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			start := time.Now()
			out := make([]spillway.Decision, 1)
			if _, err := st.Decide(context.Background(), []ratelimit.Item{{Scope: "api", Key: "k", Policy: hourly, Cost: 1}}, out); err != nil {
				t.Error(err)
			}
			results <- res{out[0], time.Since(start)}
		})
	}
	wg.Wait()
	close(results)
	allowed := 0
	for r := range results {
		if r.el > budget+tolerance || !r.d.Degraded {
			t.Fatalf("a caller on a paused Redis: %+v after %v; want the local share within the budget %v + %v", r.d, r.el, budget, tolerance)
		}
		if r.d.Allowed {
			allowed++
		}
	}
	if allowed != 20 {
		t.Fatalf("%d of %d callers admitted by the local share; want 20 (20%% of 100)", allowed, callers)
	}
	if s := st.Stats(); s.Calls != 0 || s.Degraded != callers {
		t.Fatalf("stats = %+v; want 0 calls, %d degraded", s, callers)
	}
	if err := b.srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-slow; err != nil {
		t.Fatalf("the patient call after resume: %v", err)
	}
}

// Reset and Blackhole: RSTs fail calls at once; a blackhole costs the
// budget. Either way the breaker opens and decisions stay local.
func TestResetAndBlackholeConnections(t *testing.T) {
	for _, mode := range []faultproxy.Mode{faultproxy.Reset, faultproxy.Blackhole} {
		t.Run(mode.String(), func(t *testing.T) {
			b := newBed(t)
			budget := 200 * time.Millisecond
			st := b.fallback(t, fallback.Settings{Budget: budget, OpenTimeout: time.Hour})
			b.warm(t)
			b.setMode(t, mode)
			for i := 0; i < 5; i++ {
				start := time.Now()
				d := decide(t, st, "api", "k", hourly, 1)
				if el := time.Since(start); el > budget+tolerance || !d.Degraded || !d.Allowed {
					t.Fatalf("call %d: %+v after %v; want the local share within the budget", i, d, el)
				}
			}
			if st.State() != fallback.Open {
				t.Fatalf("breaker %v; want open", st.State())
			}
			before := b.proxy.Stats()
			if allowed, degraded := count(t, st, "api", "k", hourly, 20); allowed != 15 || degraded != 20 {
				t.Fatalf("open: %d allowed, %d degraded; want 15, 20", allowed, degraded)
			}
			if after := b.proxy.Stats(); after.Received != before.Received || after.Accepted != before.Accepted {
				t.Fatalf("traffic while open: before %+v, after %+v", before, after)
			}
		})
	}
}

// Three servers reconcile one after the other into a Redis that kept its
// state: each carries its 20 local admissions, the last one only what is
// left, so the key ends empty, not over-drawn and not refilled.
func TestFleetReconcileIsCappedByRoom(t *testing.T) {
	b := newBed(t)
	const servers = 3
	fleet := make([]*fallback.Store, servers)
	events := make([]chan fallback.ReconcileEvent, servers)
	for i := range fleet {
		ch := make(chan fallback.ReconcileEvent, 4)
		events[i] = ch
		fleet[i] = b.fallback(t, fallback.Settings{
			OpenTimeout: 200 * time.Millisecond,
			OnReconcile: func(ev fallback.ReconcileEvent) { ch <- ev },
		})
	}
	if allowed, _ := count(t, fleet[0], "api", "k", hourly, 50); allowed != 50 {
		t.Fatalf("healthy: %d of 50 allowed", allowed)
	}
	b.setMode(t, faultproxy.Refuse)
	for i, st := range fleet {
		if allowed, degraded := count(t, st, "api", "k", hourly, 25); allowed != 20 || degraded != 25 {
			t.Fatalf("server %d during the outage: %d allowed, %d degraded; want 20, 25", i, allowed, degraded)
		}
	}
	b.setMode(t, faultproxy.Pass)
	time.Sleep(250 * time.Millisecond) // every breaker half-open
	wantRemaining := []int64{49, 28, 7}
	wantCharged := []int64{20, 20, 7}
	for i, st := range fleet {
		// Probe until Redis decides: after PoolSize failed dials go-redis
		// stops dialing and returns the last dial error until a background
		// dial, once a second, succeeds; until then probes fail and reopen
		// the breaker.
		var d spillway.Decision
		attempts := 0
		waitFor(t, "a decision by Redis", func() bool {
			attempts++
			d = decide(t, st, "api", "k", hourly, 1)
			return !d.Degraded
		})
		t.Logf("server %d: Redis decided after %d attempts", i, attempts)
		if !d.Allowed || d.Remaining != wantRemaining[i] {
			t.Fatalf("server %d probe = %+v; want allowed by Redis with %d left", i, d, wantRemaining[i])
		}
		select {
		case ev := <-events[i]:
			if ev.Keys != 1 || ev.Charged != wantCharged[i] || ev.Err != nil {
				t.Fatalf("server %d reconcile = %+v; want 1 key, %d charged", i, ev, wantCharged[i])
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("server %d: no reconcile pass", i)
		}
	}
	if d := decide(t, b.directStore(t), "api", "k", hourly, 0); d.Remaining != 0 {
		t.Fatalf("after the fleet reconciled Redis has %d left; want 0", d.Remaining)
	}
}
