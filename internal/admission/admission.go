// Package admission is the one admission path of the server adapters
// (httpx, grpcx): it validates the request once, admits it through the
// limiter, applies the fail mode to a limiter error, classifies a denial
// (too many requests, unavailable, malformed), applies the no-retry rule,
// formats the rate-limit header values and releases the admission when the
// handler panics. The adapters keep only their mapping to HTTP or gRPC.
package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

// NewRequest returns a Request with room for three dimensions (ip, user,
// api_key) in the same allocation.
func NewRequest() *spillway.Request {
	buf := &struct {
		req  spillway.Request
		dims [3]spillway.Dimension
	}{}
	buf.req.Dims = buf.dims[:0]
	return &buf.req
}

// LimiterRequest and LimiterStore name the denials admission makes itself:
// a malformed request and a limiter error failed closed.
const (
	LimiterRequest = "request"
	LimiterStore   = "store"
)

// Result is the outcome of Admit.
type Result struct {
	// Decision is what to answer: allowed (run the handler) or a denial.
	// A limiter error failed open is allowed with no Limit (no rate-limit
	// headers); failed closed it is a ReasonFailClosed denial.
	Decision spillway.Decision
	// Done releases the admission; call it once when the handler ends (see
	// Guard). It is spillway.Noop unless Decision.Allowed.
	Done spillway.Done
	// Invalid is the validation error of a malformed request (Decision is
	// then a ReasonInvalid denial).
	Invalid error
	// Err is the limiter's error, for the adapters' error hooks; the fail
	// mode has already decided.
	Err error
}

// Admit validates r, admits it through l and applies fail to a limiter
// error: spillway.FailOpen admits, spillway.FailClosed denies with
// ReasonFailClosed, and a *spillway.StoreError asking for FailClosed denies
// whatever fail says. A denial's Done is called at once (a denial holds
// nothing; a sloppy block might).
func Admit(ctx context.Context, l spillway.Limiter, r *spillway.Request, fail spillway.FailMode) Result {
	if err := r.Validate(); err != nil {
		return Result{Decision: spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: LimiterRequest}, Done: spillway.Noop, Invalid: err}
	}
	d, done, err := l.Admit(ctx, r)
	if err != nil {
		if block.FailModeOf(err, fail) == spillway.FailClosed {
			return Result{Decision: spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: LimiterStore}, Done: spillway.Noop, Err: err}
		}
		return Result{Decision: spillway.Decision{Allowed: true}, Done: spillway.Noop, Err: err}
	}
	if done == nil {
		done = spillway.Noop
	}
	if !d.Allowed {
		done(spillway.Ignored)
		done = spillway.Noop
	}
	return Result{Decision: d, Done: done}
}

// Guard releases an admission when the handler ends, and with
// spillway.Ignored when it panics (the panic goes on with its stack
// intact: a panic is a bug, not overload):
//
//	g := admission.Guard{Done: res.Done}
//	defer g.Release()
//	… serve …
//	g.Finish(outcome)
type Guard struct {
	Done     spillway.Done
	finished bool
}

// Finish releases with the outcome of the work.
func (g *Guard) Finish(o spillway.Outcome) {
	g.finished = true
	g.Done(o)
}

// Release, deferred, releases with spillway.Ignored unless Finish ran.
func (g *Guard) Release() {
	if !g.finished {
		g.finished = true
		g.Done(spillway.Ignored)
	}
}

// Class is how a decision is answered, before the adapter maps it to a
// status code.
type Class uint8

const (
	// Allowed: the work runs.
	Allowed Class = iota
	// Invalid: the request was malformed (HTTP 400, gRPC InvalidArgument).
	Invalid
	// Unavailable: shedding, a ceiling or a failed-closed store
	// (Reason.IsShed; HTTP 503, gRPC Unavailable).
	Unavailable
	// TooMany: a rate or concurrency limit of this client (HTTP 429, gRPC
	// ResourceExhausted).
	TooMany
)

// ClassOf classifies d.
func ClassOf(d spillway.Decision) Class {
	switch {
	case d.Allowed:
		return Allowed
	case d.Reason == spillway.ReasonInvalid:
		return Invalid
	case d.Reason.IsShed():
		return Unavailable
	}
	return TooMany
}

// RetryAfter is the no-retry rule: it returns how long a denied client
// should wait before trying again — d.RetryAfter, or one second when the
// block gave none — and false when a retry can never succeed (a malformed
// request, a cost above what the limit can ever admit) or d allowed.
func RetryAfter(d spillway.Decision) (time.Duration, bool) {
	if d.Allowed || d.Reason == spillway.ReasonInvalid || d.Reason == spillway.ReasonCostExceedsLimit {
		return 0, false
	}
	if d.RetryAfter <= 0 {
		return time.Second, true
	}
	return d.RetryAfter, true
}

// CeilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RateValues returns the values of the limit, remaining and reset headers
// of d, in one backing array: the Limit, the Remaining (never negative) and
// the Unix time of ResetAfter after now in seconds, rounded up (never
// claiming a reset sooner than it comes). It returns nil when d carries no
// Limit: no limit applied, so no header is sent.
func RateValues(d spillway.Decision, now time.Time) []string {
	if d.Limit <= 0 {
		return nil
	}
	reset := now.Add(d.ResetAfter)
	epoch := reset.Unix()
	if reset.Nanosecond() > 0 {
		epoch++
	}
	v := make([]string, 3)
	v[0], v[1], v[2] = strconv.FormatInt(d.Limit, 10), strconv.FormatInt(max(d.Remaining, 0), 10), strconv.FormatInt(epoch, 10)
	return v
}

// ParseCost parses a cost carried in a header or metadata value: a
// decimal integer in [0, math.MaxInt64], surrounding spaces allowed. It
// returns an error naming what is wrong, never a clamped value, so a
// malformed estimate is answered as a malformed request.
func ParseCost(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New("cost is empty")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) && s[0] != '-' {
			return 0, fmt.Errorf("cost %.32q is above %d", s, int64(math.MaxInt64))
		}
		return 0, fmt.Errorf("cost %.32q is not a decimal integer", s)
	}
	if n < 0 {
		return 0, fmt.Errorf("cost %d is negative", n)
	}
	return n, nil
}
