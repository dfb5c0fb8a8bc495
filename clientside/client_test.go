package clientside

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/testclock"
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

// budget returns a RetryBudget on a frozen clock holding left tokens
// (of 10 at most) that gains 0.5 per deposit and nothing with time; its
// balance tells deposits and spent retries.
func budget(t *testing.T, left float64) *RetryBudget {
	t.Helper()
	t0 := time.Unix(1000, 0)
	b, err := NewRetryBudget(RetryBudgetSettings{MaxTokens: 10, Ratio: 0.5, MinRetriesPerSecond: -1, Clock: testclock.New(t0).Now})
	if err != nil {
		t.Fatal(err)
	}
	for b.Balance() > left {
		b.TryRetry()
	}
	return b
}

func balance(b *RetryBudget) float64 { return b.Balance() }

func TestClientZeroValueSendsOnce(t *testing.T) {
	for _, r := range []*Client{{}, nil} {
		if !r.Begin() {
			t.Fatal("zero Client refused the first attempt")
		}
		r.Accepted()
		if w, ok := r.Next(context.Background(), 0, time.Second); ok || w != 0 {
			t.Fatalf("zero Client retried: %v %v", w, ok)
		}
	}
}

func TestNewClientDefaults(t *testing.T) {
	c := NewClient()
	if c.Throttle == nil || c.Budget == nil || c.MaxRetries != DefaultMaxRetries {
		t.Fatalf("NewClient: %+v", c)
	}
}

func TestClientRules(t *testing.T) {
	noJitter := Backoff{Jitter: -1}
	ctx := context.Background()

	// The throttle refuses the first attempt: nothing is sent, the budget
	// still got its deposit.
	th, b := &countingThrottle{allow: []bool{false}}, budget(t, 5)
	r := &Client{test: th, Budget: b, Backoff: noJitter, MaxRetries: 2}
	if r.Begin() || balance(b) != 5.5 || th.asked != 1 {
		t.Fatalf("throttled Begin: %+v, balance %v", th, balance(b))
	}

	// Max retries, the server's delay exactly (no jitter), then no more.
	th, b = &countingThrottle{}, budget(t, 5)
	r = &Client{test: th, Budget: b, Backoff: noJitter, MaxRetries: 2}
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
	if balance(b) != 3.5 || th.asked != 3 {
		t.Fatalf("budget %v, throttle asked %d; want 3.5 (a deposit, two retries) and 3 (the refused retry spends nothing)", balance(b), th.asked)
	}

	// No server delay: the backoff's exponential delay (Base 100ms; the
	// second retry waits in [100ms, 200ms), here its middle).
	r = &Client{Backoff: Backoff{Rand: func() float64 { return 0.5 }}, MaxRetries: 3}
	if w, ok := r.Next(ctx, 1, 0); !ok || w != 150*time.Millisecond {
		t.Fatalf("second retry without a server delay: %v %v, want 150ms", w, ok)
	}

	// A server delay above MaxRetryAfter is not waited for.
	if _, ok := r.Next(ctx, 0, time.Minute); ok {
		t.Fatal("retried after a one-minute Retry-After (MaxRetryAfter 30s)")
	}

	// The deadline leaves no time for the wait: no retry, nothing spent.
	b = budget(t, 5)
	r = &Client{Budget: b, Backoff: noJitter, MaxRetries: 2}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, ok := r.Next(dctx, 0, time.Second); ok || balance(b) != 5 {
		t.Fatalf("retried past the deadline (budget %v)", balance(b))
	}

	// An empty budget refuses the retry before the throttle is asked.
	th, b = &countingThrottle{}, budget(t, 0)
	r = &Client{test: th, Budget: b, Backoff: noJitter, MaxRetries: 2}
	if _, ok := r.Next(ctx, 0, time.Millisecond); ok || th.asked != 0 {
		t.Fatalf("retried with an empty budget (throttle asked %d)", th.asked)
	}

	// A retry the throttle refuses is not sent.
	th = &countingThrottle{allow: []bool{false}}
	r = &Client{test: th, Backoff: noJitter, MaxRetries: 2}
	if _, ok := r.Next(ctx, 0, time.Millisecond); ok {
		t.Fatal("retried although the throttle refused")
	}
	r.Accepted()
	if th.accepted != 1 {
		t.Fatalf("accepted %d, want 1", th.accepted)
	}
}
