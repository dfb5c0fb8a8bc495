package clientside

import (
	"context"
	"errors"
	"time"

	"github.com/spillway-go/spillway/internal/clienthook"
)

// ErrThrottled is returned by spillway's client adapters (httpx.Transport,
// grpcx's client interceptors) when the Client's throttle rejected a call
// locally; it was not sent. Compare with errors.Is.
var ErrThrottled = errors.New("clientside: request throttled locally: the backend is rejecting most requests")

func init() {
	clienthook.Throttle = func(c any) clienthook.Throttler { return c.(*Client).throttle() }
	clienthook.SetThrottle = func(c any, t clienthook.Throttler) { c.(*Client).test = t }
}

// DefaultMaxRetries is the MaxRetries of NewClient.
const DefaultMaxRetries = 2

// Client is the client side of calls to a service that limits load, as
// spillway's adapters (httpx.Transport, grpcx.UnaryClientInterceptor and
// StreamClientInterceptor) apply it: a call is sent only when the throttle
// allows it, and an overloaded answer is retried at most MaxRetries times,
// after the server's delay plus jitter (Backoff), only when the context's
// deadline leaves time for the wait, the budget has room and the throttle
// allows the retry.
//
// The zero Client (and a nil *Client) sends every call once, with no
// throttle and no budget; NewClient has the defaults. Its fields must not
// change once it is in use; a Client is safe for concurrent use when its
// Throttle and Budget are (the package's are). One Client per backend:
// the throttle learns that backend's rejections.
type Client struct {
	Throttle   *Throttle    // nil: no client-side throttling
	Budget     *RetryBudget // nil: retries capped only by MaxRetries
	Backoff    Backoff
	MaxRetries int // retries after the first attempt; 0 or negative: none

	test clienthook.Throttler // replaces Throttle in tests
}

// throttle returns the throttle the client asks, nil when none.
func (c *Client) throttle() clienthook.Throttler {
	switch {
	case c == nil:
		return nil
	case c.test != nil:
		return c.test
	case c.Throttle != nil:
		return c.Throttle
	}
	return nil
}

// NewClient returns a Client with the default Throttle (K = 2 over two
// minutes), RetryBudget (10% of requests, at least one retry a second)
// and DefaultMaxRetries retries.
func NewClient() *Client {
	th, err := NewThrottle(ThrottleSettings{})
	if err != nil {
		panic(err) // defaults are valid; unreachable
	}
	b, err := NewRetryBudget(RetryBudgetSettings{})
	if err != nil {
		panic(err)
	}
	return &Client{Throttle: th, Budget: b, MaxRetries: DefaultMaxRetries}
}

// Begin starts a call: it deposits in the budget and reports whether the
// throttle lets the call be sent (false: reject it locally, unsent, with
// ErrThrottled).
func (c *Client) Begin() bool {
	if c == nil {
		return true
	}
	if c.Budget != nil {
		c.Budget.Deposit()
	}
	th := c.throttle()
	return th == nil || th.Allow()
}

// Accepted records that the backend accepted an attempt (it did not
// answer overloaded).
func (c *Client) Accepted() {
	if th := c.throttle(); th != nil {
		th.Accepted()
	}
}

// Next decides whether the call whose attempt (0 for the first) was
// answered overloaded is retried, and after how long; retryAfter is the
// server's delay (0: none given, Backoff's exponential delay applies). It
// spends from the budget and asks the throttle only when every other rule
// allows the retry. A refused retry leaves the caller with the server's
// answer.
func (c *Client) Next(ctx context.Context, attempt int, retryAfter time.Duration) (time.Duration, bool) {
	if c == nil || attempt >= c.MaxRetries {
		return 0, false
	}
	wait, ok := c.Backoff.Delay(attempt+1, retryAfter)
	if !ok {
		return 0, false
	}
	if dl, has := ctx.Deadline(); has && time.Until(dl) < wait {
		return 0, false // the answer would come too late anyway
	}
	if c.Budget != nil && !c.Budget.TryRetry() {
		return 0, false
	}
	if th := c.throttle(); th != nil && !th.Allow() {
		return 0, false
	}
	return wait, true
}
