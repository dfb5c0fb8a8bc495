package fallback_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/ratelimit"
)

// slowLimiter answers after delay, or fails when its context ends first,
// like a Redis-backed limiter whose client honours deadlines.
type slowLimiter struct {
	delay atomic.Int64 // ns
	fail  atomic.Bool
	calls atomic.Int64
}

func (s *slowLimiter) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	s.calls.Add(1)
	if s.fail.Load() {
		return spillway.Decision{}, spillway.Noop, errors.New("backend down")
	}
	t := time.NewTimer(time.Duration(s.delay.Load()))
	defer t.Stop()
	select {
	case <-t.C:
		return spillway.Decision{Allowed: true, Limiter: "inner", Limit: 100, Remaining: 99}, spillway.Noop, nil
	case <-ctx.Done():
		return spillway.Decision{}, spillway.Noop, ctx.Err()
	}
}

// The budget, the breaker's K, its open timeout and the half-open probes,
// in fake time: every duration is exact.
func TestLimiterBudgetBreakerProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := &slowLimiter{}
		inner.delay.Store(int64(time.Second)) // far over the budget
		local, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), fallback.ScalePolicy(hourly, 0.2), ratelimit.Settings{Scope: "local"})
		if err != nil {
			t.Fatal(err)
		}
		var rec states
		var degraded atomic.Int64
		l, err := fallback.NewLimiter(inner, ratelimit.PerKey(local, spillway.DimUser), fallback.Settings{
			Budget: 50 * time.Millisecond, Failures: 3, OpenTimeout: time.Second, Probes: 2,
			OnStateChange: rec.hook,
			OnDegraded:    func(fallback.DegradedEvent) { degraded.Add(1) },
		})
		if err != nil {
			t.Fatal(err)
		}
		r := &spillway.Request{Endpoint: "/v1/charges", Priority: spillway.Critical}
		r.Set(spillway.DimUser, "alice")
		admit := func() (spillway.Decision, time.Duration) {
			start := time.Now()
			d, done, err := l.Admit(context.Background(), r)
			if err != nil {
				t.Fatalf("Admit: %v", err)
			}
			done(spillway.Success)
			return d, time.Since(start)
		}
		for i := 0; i < 3; i++ {
			d, took := admit()
			if took != 50*time.Millisecond || !d.Degraded || !d.Allowed || d.Limiter != "local:user" || d.Remaining != int64(19-i) {
				t.Fatalf("slow call %d: %+v after %v; want the local share after exactly 50ms", i, d, took)
			}
		}
		if l.State() != fallback.Open || inner.calls.Load() != 3 {
			t.Fatalf("after 3 failures: state %v, %d inner calls; want open, 3", l.State(), inner.calls.Load())
		}
		for i := 0; i < 30; i++ {
			if d, took := admit(); took != 0 || !d.Degraded {
				t.Fatalf("open breaker call %d: %+v after %v; want local, no wait", i, d, took)
			}
		}
		if inner.calls.Load() != 3 {
			t.Fatalf("inner called %d times while open; want 3", inner.calls.Load())
		}
		time.Sleep(time.Second + time.Nanosecond) // gobreaker: open until strictly after the timeout
		inner.delay.Store(int64(10 * time.Millisecond))
		for i := 0; i < 2; i++ {
			d, took := admit()
			if d.Degraded || took != 10*time.Millisecond {
				t.Fatalf("probe %d: %+v after %v; want the inner decision after 10ms", i, d, took)
			}
		}
		want := []string{"closed→open", "open→half_open", "half_open→closed"}
		got := rec.get()
		if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Fatalf("transitions %v; want %v", got, want)
		}
		if degraded.Load() != 33 {
			t.Fatalf("degraded events %d; want 33", degraded.Load())
		}
	})
}

// A failed probe opens the breaker again for another OpenTimeout.
func TestLimiterFailedProbeReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := &slowLimiter{}
		inner.fail.Store(true)
		l, err := fallback.NewLimiter(inner, nil, fallback.Settings{Failures: 1, OpenTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		r := &spillway.Request{Endpoint: "/x"}
		d, _, err := l.Admit(context.Background(), r)
		if err != nil || !d.Allowed || !d.Degraded || d.Limiter != "fallback" {
			t.Fatalf("fail-open without local = %+v, %v; want allowed, degraded", d, err)
		}
		time.Sleep(time.Second + time.Nanosecond)
		if l.State() != fallback.HalfOpen {
			t.Fatalf("state %v; want half_open", l.State())
		}
		_, _, _ = l.Admit(context.Background(), r)
		if l.State() != fallback.Open || inner.calls.Load() != 2 {
			t.Fatalf("after a failed probe: %v, %d calls; want open, 2", l.State(), inner.calls.Load())
		}
		time.Sleep(999 * time.Millisecond)
		if l.State() != fallback.Open {
			t.Fatalf("state %v 999ms after reopening; want open", l.State())
		}
	})
}

func TestLimiterFailClosed(t *testing.T) {
	inner := &slowLimiter{}
	inner.fail.Store(true)
	l, err := fallback.NewLimiter(inner, nil, fallback.Settings{Fail: spillway.FailClosed, OpenTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d, done, err := l.Admit(context.Background(), &spillway.Request{Endpoint: "/login"})
	if err != nil || d.Allowed || d.Reason != spillway.ReasonFailClosed || !d.Degraded || d.RetryAfter != 3*time.Second || done == nil {
		t.Fatalf("/login = %+v, %v; want denied fail_closed, RetryAfter 3s", d, err)
	}
	open, err := fallback.NewLimiter(inner, nil, fallback.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	d, _, err = open.Admit(context.Background(), &spillway.Request{Endpoint: "/search"})
	if err != nil || !d.Allowed || !d.Degraded {
		t.Fatalf("/search, fail open = %+v, %v; want admitted, degraded", d, err)
	}
	if _, err := fallback.NewLimiter(inner, nil, fallback.Settings{Fail: 7}); err == nil || err.Error() != "fallback: unknown fail mode 7 (want spillway.FailOpen or spillway.FailClosed)" {
		t.Fatalf("Fail 7: err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	inner.fail.Store(false)
	inner.delay.Store(int64(time.Hour))
	if _, _, err := l.Admit(ctx, &spillway.Request{Endpoint: "/search"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Admit err = %v; want context.Canceled", err)
	}
}
