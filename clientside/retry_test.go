package clientside

import (
	"context"
	"testing"
	"time"
)

type countingThrottle struct {
	allow           []bool // answers, in order; true once exhausted
	asked, accepted int
}

func (c *countingThrottle) Allow() bool {
	c.asked++
	if len(c.allow) == 0 {
		return true
	}
	a := c.allow[0]
	c.allow = c.allow[1:]
	return a
}
func (c *countingThrottle) Accepted() { c.accepted++ }

type countingBudget struct {
	deposits, tries, left int
}

func (b *countingBudget) Deposit() { b.deposits++ }
func (b *countingBudget) TryRetry() bool {
	b.tries++
	if b.left == 0 {
		return false
	}
	b.left--
	return true
}

func TestRetriesZeroValueSendsOnce(t *testing.T) {
	var r Retries
	if !r.Begin() {
		t.Fatal("zero Retries refused the first attempt")
	}
	r.Accepted()
	if w, ok := r.Next(context.Background(), 0, time.Second); ok || w != 0 {
		t.Fatalf("zero Retries retried: %v %v", w, ok)
	}
}

func TestRetriesRules(t *testing.T) {
	noJitter := Backoff{Jitter: -1}
	ctx := context.Background()

	// The throttle refuses the first attempt: nothing is sent, the budget
	// still got its deposit.
	th, b := &countingThrottle{allow: []bool{false}}, &countingBudget{left: 5}
	r := Retries{Throttle: th, Budget: b, Backoff: noJitter, Max: 2}
	if r.Begin() || b.deposits != 1 || th.asked != 1 {
		t.Fatalf("throttled Begin: %+v %+v", th, b)
	}

	// Max retries, the server's delay exactly (no jitter), then no more.
	th, b = &countingThrottle{}, &countingBudget{left: 5}
	r = Retries{Throttle: th, Budget: b, Backoff: noJitter, Max: 2}
	if !r.Begin() {
		t.Fatal("Begin refused")
	}
	for attempt := range 2 {
		w, ok := r.Next(ctx, attempt, 300*time.Millisecond)
		if !ok || w != 300*time.Millisecond {
			t.Fatalf("attempt %d: %v %v, want a retry after 300ms", attempt, w, ok)
		}
	}
	if _, ok := r.Next(ctx, 2, 300*time.Millisecond); ok {
		t.Fatal("a third retry with Max 2")
	}
	if b.tries != 2 || th.asked != 3 {
		t.Fatalf("budget tries %d, throttle asked %d; want 2 and 3 (the refused retry spends nothing)", b.tries, th.asked)
	}

	// No server delay: the backoff's exponential delay (Base 100ms; the
	// second retry waits in [100ms, 200ms), here its middle).
	r = Retries{Backoff: Backoff{Rand: func() float64 { return 0.5 }}, Max: 3}
	if w, ok := r.Next(ctx, 1, 0); !ok || w != 150*time.Millisecond {
		t.Fatalf("second retry without a server delay: %v %v, want 150ms", w, ok)
	}

	// A server delay above MaxRetryAfter is not waited for.
	if _, ok := r.Next(ctx, 0, time.Minute); ok {
		t.Fatal("retried after a one-minute Retry-After (MaxRetryAfter 30s)")
	}

	// The deadline leaves no time for the wait: no retry, nothing spent.
	b = &countingBudget{left: 5}
	r = Retries{Budget: b, Backoff: noJitter, Max: 2}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, ok := r.Next(dctx, 0, time.Second); ok || b.tries != 0 {
		t.Fatalf("retried past the deadline (budget tries %d)", b.tries)
	}

	// An empty budget refuses the retry before the throttle is asked.
	th, b = &countingThrottle{}, &countingBudget{}
	r = Retries{Throttle: th, Budget: b, Backoff: noJitter, Max: 2}
	if _, ok := r.Next(ctx, 0, time.Millisecond); ok || th.asked != 0 {
		t.Fatalf("retried with an empty budget (throttle asked %d)", th.asked)
	}

	// A retry the throttle refuses is not sent.
	th = &countingThrottle{allow: []bool{false}}
	r = Retries{Throttle: th, Backoff: noJitter, Max: 2}
	if _, ok := r.Next(ctx, 0, time.Millisecond); ok {
		t.Fatal("retried although the throttle refused")
	}
	r.Accepted()
	if th.accepted != 1 {
		t.Fatalf("accepted %d, want 1", th.accepted)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("Sleep on a canceled context: %v", err)
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Sleep: %v", err)
	}
}
