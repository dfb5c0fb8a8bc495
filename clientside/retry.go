package clientside

import (
	"context"
	"time"
)

// Throttler is client-side adaptive throttling: Allow counts a request and
// says whether to send it, Accepted records that the backend did the work
// rather than reject it as overloaded. *Throttle implements it.
type Throttler interface {
	Allow() bool
	Accepted()
}

// Spender caps retries at a fraction of requests: Deposit per request,
// TryRetry spends for one retry. *RetryBudget implements it.
type Spender interface {
	Deposit()
	TryRetry() bool
}

// Retries is the retry rule of spillway's client adapters (httpx.Transport,
// grpcx's client interceptors), in one place: a call is sent only when the
// throttle allows it, and an overloaded answer is retried at most Max
// times, after the server's delay plus jitter (Backoff), only when the
// context's deadline leaves time for the wait, the budget has room and the
// throttle allows the retry. The zero value sends every call once.
type Retries struct {
	Throttle Throttler // nil: no throttling
	Budget   Spender   // nil: retries capped only by Max
	Backoff  Backoff
	Max      int // retries after the first attempt; 0 or negative: none
}

// Begin starts a call: it deposits in the budget and reports whether the
// throttle lets the call be sent (false: reject it locally, unsent).
func (r *Retries) Begin() bool {
	if r.Budget != nil {
		r.Budget.Deposit()
	}
	return r.Throttle == nil || r.Throttle.Allow()
}

// Accepted records that the backend accepted an attempt (it did not
// answer overloaded).
func (r *Retries) Accepted() {
	if r.Throttle != nil {
		r.Throttle.Accepted()
	}
}

// Next decides whether the call whose attempt (0 for the first) was
// answered overloaded is retried, and after how long; retryAfter is the
// server's delay (0: none given, Backoff's exponential delay applies). It
// spends from the budget and asks the throttle only when every other rule
// allows the retry. A refused retry leaves the caller with the server's
// answer.
func (r *Retries) Next(ctx context.Context, attempt int, retryAfter time.Duration) (time.Duration, bool) {
	if attempt >= r.Max {
		return 0, false
	}
	wait, ok := r.Backoff.Delay(attempt+1, retryAfter)
	if !ok {
		return 0, false
	}
	if dl, has := ctx.Deadline(); has && time.Until(dl) < wait {
		return 0, false // the answer would come too late anyway
	}
	if r.Budget != nil && !r.Budget.TryRetry() {
		return 0, false
	}
	if r.Throttle != nil && !r.Throttle.Allow() {
		return 0, false
	}
	return wait, true
}

// Sleep waits d, or returns ctx's error when it ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
