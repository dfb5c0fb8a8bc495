package httpx

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/internal/retryafter"
	"github.com/spillway-go/spillway/internal/sleep"
)

// Transport is an http.RoundTripper for calling a service that limits
// load. It
//
//   - rejects requests locally with clientside.ErrThrottled when the
//     Client's Throttle says the backend is rejecting most of them (Google
//     SRE adaptive throttling); a retry the Throttle refuses is not sent
//     either, and the caller gets the server's 429 or 503;
//   - retries a 429 or 503 answer, waiting the server's Retry-After plus
//     jitter (or an exponential backoff when there is none; see
//     clientside.Backoff), when the request is retryable, the Client's
//     budget has room, its MaxRetries is not reached and the context's
//     deadline leaves time for the wait;
//   - propagates the priority in the request's context
//     (spillway.ContextWithPriority; Middleware puts the served request's
//     priority there) in the spillway.PriorityHeader header, unless the
//     request already carries one.
//
// By default only idempotent methods (GET, HEAD, OPTIONS, TRACE, PUT,
// DELETE) and requests carrying an Idempotency-Key header are retried; a
// request with a body is retried only when it has GetBody (http.NewRequest
// sets it for in-memory bodies). The zero Transport uses
// http.DefaultTransport with no throttle, no budget and no retries (a nil
// Client); give it clientside.NewClient() for the defaults:
//
//	client := &http.Client{Transport: &httpx.Transport{Client: clientside.NewClient()}}
//
// Its fields must not change once it is in use. A Transport is safe for
// concurrent use.
type Transport struct {
	Base       http.RoundTripper            // nil means http.DefaultTransport
	Client     *clientside.Client           // throttle, retry budget, backoff, retries; nil: none
	Retryable  func(req *http.Request) bool // nil: idempotent methods or an Idempotency-Key header
	NoPriority bool                         // do not set spillway.PriorityHeader from the context
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
	r := t.Client
	retry := t.retryable(req)
	if !r.Begin() {
		closeBody(req)
		return nil, clientside.ErrThrottled
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
		retryAfter, _ := retryafter.Parse(resp.Header.Get("Retry-After"), time.Now())
		if !retry {
			return resp, nil
		}
		wait, ok := r.Next(ctx, attempt, retryAfter)
		if !ok {
			return resp, nil
		}
		// Drain a little so the connection can be reused, then wait.
		io.CopyN(io.Discard, resp.Body, 4<<10)
		resp.Body.Close()
		if err := sleep.Sleep(ctx, wait); err != nil {
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
