package httpx

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
)

// Throttle is client-side adaptive throttling (clientside.Throttler):
// Allow counts a request and says whether to send it, Accepted records
// that the backend did the work rather than reject it as overloaded.
// *clientside.Throttle implements it.
type Throttle = clientside.Throttler

// RetryBudget caps retries at a fraction of requests (clientside.Spender):
// Deposit per request, TryRetry spends for one retry.
// *clientside.RetryBudget implements it.
type RetryBudget = clientside.Spender

// ErrThrottled is returned by Transport when client-side throttling
// rejected the request locally; it was not sent.
var ErrThrottled = fmt.Errorf("httpx: request throttled locally: the backend is rejecting most requests")

// Transport is an http.RoundTripper for calling a service that limits
// load. It
//
//   - rejects requests locally with ErrThrottled when the Throttle says the
//     backend is rejecting most of them (Google SRE adaptive throttling); a
//     retry the Throttle refuses is not sent either, and the caller gets
//     the server's 429 or 503;
//   - retries a 429 or 503 answer, waiting the server's Retry-After plus
//     jitter (or an exponential backoff when there is none; see Backoff),
//     when the request is retryable, the RetryBudget has room, MaxRetries
//     is not reached and the context's deadline leaves time for the wait;
//   - propagates the priority in the request's context
//     (spillway.ContextWithPriority; Middleware puts the served request's
//     priority there) in the spillway.PriorityHeader header, unless the
//     request already carries one.
//
// By default only idempotent methods (GET, HEAD, OPTIONS, TRACE, PUT,
// DELETE) and requests carrying an Idempotency-Key header are retried; a
// request with a body is retried only when it has GetBody (http.NewRequest
// sets it for in-memory bodies). The zero Transport uses
// http.DefaultTransport with no throttle, no budget and no retries
// (MaxRetries 0); NewTransport adds the clientside defaults and
// DefaultMaxRetries. Its fields must not change once it is in use. A
// Transport is safe for concurrent use.
type Transport struct {
	Base       http.RoundTripper // nil means http.DefaultTransport
	Throttle   Throttle          // nil: no client-side throttling
	Budget     RetryBudget       // nil: retries capped only by MaxRetries
	Backoff    clientside.Backoff
	MaxRetries int                          // retries after the first attempt; 0 (or negative) means none
	Retryable  func(req *http.Request) bool // nil: idempotent methods or an Idempotency-Key header
	NoPriority bool                         // do not set spillway.PriorityHeader from the context
}

// DefaultMaxRetries is the MaxRetries of NewTransport.
const DefaultMaxRetries = 2

// NewTransport returns a Transport over base (nil: http.DefaultTransport)
// with clientside's default Throttle (K = 2 over two minutes) and
// RetryBudget (10% of requests, at least one retry a second), and
// DefaultMaxRetries retries. Set MaxRetries to 0 to turn retries off.
func NewTransport(base http.RoundTripper) *Transport {
	th, err := clientside.NewThrottle()
	if err != nil {
		panic(err) // defaults are valid; unreachable
	}
	b, err := clientside.NewRetryBudget()
	if err != nil {
		panic(err)
	}
	return &Transport{Base: base, Throttle: th, Budget: b, MaxRetries: DefaultMaxRetries}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	ctx := req.Context()
	if !t.NoPriority {
		if p, ok := spillway.PriorityFromContext(ctx); ok && req.Header.Get(spillway.PriorityHeader) == "" {
			req = req.Clone(ctx) // a RoundTripper must not modify the caller's request
			req.Header.Set(spillway.PriorityHeader, p.String())
		}
	}
	r := clientside.Retries{Throttle: t.Throttle, Budget: t.Budget, Backoff: t.Backoff, Max: t.MaxRetries}
	if !t.retryable(req) {
		r.Max = 0
	}
	if !r.Begin() {
		closeBody(req)
		return nil, ErrThrottled
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			req = req.Clone(ctx)
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, fmt.Errorf("httpx: retry: get body: %w", err)
				}
				req.Body = body
			}
		}
		resp, err := base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
			r.Accepted()
			return resp, nil
		}
		retryAfter, _ := clientside.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		wait, ok := r.Next(ctx, attempt, retryAfter)
		if !ok {
			return resp, nil
		}
		// Drain a little so the connection can be reused, then wait.
		io.CopyN(io.Discard, resp.Body, 4<<10)
		resp.Body.Close()
		if err := clientside.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

func (t *Transport) retryable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	if t.Retryable != nil {
		return t.Retryable(req)
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete, "":
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
