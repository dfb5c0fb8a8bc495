package spillway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Priority orders work for shedding: lower priorities are shed first.
// The levels follow Google SRE's criticality classes. The zero value is
// Sheddable; use Request.Priority = Critical for ordinary user-facing work
// (adapters default to Critical when nothing classifies a request).
type Priority int8

const (
	// Sheddable is test-mode traffic, prefetch, retries of background work.
	Sheddable Priority = iota
	// SheddablePlus is batch work and most GETs.
	SheddablePlus
	// Critical is the default for user-facing work.
	Critical
	// CriticalPlus is never shed before everything else is: charges,
	// health checks.
	CriticalPlus
)

// NumPriorities is the number of priority levels, for arrays indexed by
// Priority.
const NumPriorities = 4

var priorityNames = [NumPriorities]string{"sheddable", "sheddable_plus", "critical", "critical_plus"}

// String returns the lowercase snake_case name of p ("critical_plus").
func (p Priority) String() string {
	if p.Valid() {
		return priorityNames[p]
	}
	return fmt.Sprintf("priority(%d)", int8(p))
}

// Valid reports whether p is one of the four defined levels.
func (p Priority) Valid() bool { return p >= Sheddable && p <= CriticalPlus }

// ParsePriority parses the name returned by String. It also accepts the
// SRE spellings "SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS"
// and hyphens instead of underscores; spaces around the name are ignored,
// so it reads the value of a PriorityHeader header or a
// PriorityMetadataKey metadata entry as it comes.
func ParsePriority(s string) (Priority, error) {
	s = strings.TrimSpace(s)
	norm := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c == '-':
			c = '_'
		}
		norm = append(norm, c)
	}
	for i, n := range priorityNames {
		if n == string(norm) {
			return Priority(i), nil
		}
	}
	return 0, fmt.Errorf("spillway: unknown priority %q (want one of sheddable, sheddable_plus, critical, critical_plus)", s)
}

// Well-known identity dimensions. Any other name a caller supplies works the
// same way.
//
// A missing dimension means one thing in every block: a block or a tiers
// rule keyed by a dimension the request does not carry does not limit that
// request. A tiers rule does not apply to it (the other rules still do); a
// ratelimit or concurrency adapter (ratelimit.PerKey, concurrency.PerKey) admits it
// uncharged, holding nothing, with Limit 0 and its name followed by
// ":absent" as the Limiter, so the gap shows in telemetry. It is never
// pooled with the other requests that lack it (one anonymous client would
// starve every other) and never an error. The adapters set DimIP on every request (the peer's address), so
// a per-IP limit in the chain catches requests that omit a user or an API
// key; put one in front when they must be limited.
const (
	DimIP       = "ip"
	DimUser     = "user"
	DimAPIKey   = "api_key"
	DimEndpoint = "endpoint"
)

// Dimension is one identity attribute of a request, such as ("ip", "10.0.0.1").
type Dimension struct {
	Name  string
	Value string
}

// Request describes one unit of work to admit. A Request is owned by the
// caller of Admit; limiters read it and never retain it after Admit returns.
type Request struct {
	Endpoint string   // route pattern or RPC full method
	Method   string   // HTTP method, empty for gRPC
	Priority Priority // see Priority; adapters default it to Critical
	Cost     int64    // tokens this request costs (the estimate when Usage is set); 0 means 1

	// Usage, when set, meters the actual cost of the work, reported by
	// the handler; blocks that charge the actual cost settle Cost (the
	// estimate) to it when done runs. See Usage.
	Usage *Usage

	// Dims holds the identity dimensions (ip, user, api_key, …). Use Set
	// and Get; a caller that builds many requests can reuse the backing
	// array to stay allocation-free.
	Dims []Dimension
}

// Set sets dimension name to value, replacing an earlier value.
func (r *Request) Set(name, value string) {
	for i := range r.Dims {
		if r.Dims[i].Name == name {
			r.Dims[i].Value = value
			return
		}
	}
	r.Dims = append(r.Dims, Dimension{Name: name, Value: value})
}

// Get returns the value of dimension name and whether it is set. The
// pseudo-dimension "endpoint" returns r.Endpoint when not set explicitly.
// See DimIP for what a block does with a dimension that is not set.
func (r *Request) Get(name string) (string, bool) {
	for i := range r.Dims {
		if r.Dims[i].Name == name {
			return r.Dims[i].Value, true
		}
	}
	if name == DimEndpoint && r.Endpoint != "" {
		return r.Endpoint, true
	}
	return "", false
}

// EffectiveCost returns r.Cost, with 0 meaning 1.
func (r *Request) EffectiveCost() int64 {
	if r.Cost == 0 {
		return 1
	}
	return r.Cost
}

// Validate reports a malformed request: a nil request, a negative cost or
// an unknown priority. The error wraps ErrInvalidRequest and says which.
// It builds no error for a well-formed request, so every block calls it to
// deny a malformed request with ReasonInvalid when it is called directly;
// Chain and the adapters validate a request once, before any block runs.
func (r *Request) Validate() error {
	if r == nil {
		return fmt.Errorf("%w: nil request", ErrInvalidRequest)
	}
	if r.Cost < 0 {
		return fmt.Errorf("%w: cost %d is negative", ErrInvalidRequest, r.Cost)
	}
	if !r.Priority.Valid() {
		return fmt.Errorf("%w: unknown priority %d", ErrInvalidRequest, int8(r.Priority))
	}
	return nil
}

// Reason says why a decision denied (or, for ReasonNone, that it did not).
// Adapters map it to an answer: rate and concurrency limits are 429 Too Many
// Requests, shedding, the ceiling and a failed-closed store are 503.
type Reason uint8

const (
	// ReasonNone: the request was allowed.
	ReasonNone Reason = iota
	// ReasonRateLimited: a request-rate limit has no room now; RetryAfter
	// says when it will.
	ReasonRateLimited
	// ReasonCostExceedsLimit: the request costs more than the policy can
	// ever admit (cost above burst). It can never succeed, so RetryAfter is
	// 0; retrying is pointless.
	ReasonCostExceedsLimit
	// ReasonConcurrency: too many requests of this key are in flight.
	ReasonConcurrency
	// ReasonShed: a load shedder dropped the request to protect the fleet.
	ReasonShed
	// ReasonCeiling: a global ceiling in front of a shared resource is reached.
	ReasonCeiling
	// ReasonFailClosed: the shared store is unavailable and the rule is
	// configured to fail closed.
	ReasonFailClosed
	// ReasonInvalid: the request was malformed (see Request.Validate).
	ReasonInvalid
)

var reasonNames = [...]string{"none", "rate_limited", "cost_exceeds_limit", "concurrency", "shed", "ceiling", "fail_closed", "invalid"}

// String returns the snake_case name of r, used in telemetry and problem
// bodies.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// IsShed reports whether the reason is load shedding rather than a
// per-client limit: shedding, the ceiling and a failed-closed store answer
// 503 Service Unavailable, the rest 429 Too Many Requests.
func (r Reason) IsShed() bool {
	return r == ReasonShed || r == ReasonCeiling || r == ReasonFailClosed
}

// Decision is the outcome of one admission check. Denial is not an error.
type Decision struct {
	Allowed    bool
	Reason     Reason        // why it was denied; ReasonNone when allowed
	Limiter    string        // the limiter or rule that decided
	Limit      int64         // the policy's limit (burst or capacity); 0 when the block has none
	Remaining  int64         // what is left after this decision
	ResetAfter time.Duration // until the state is back to full
	RetryAfter time.Duration // when a retry can succeed; 0 when allowed or when it never can
	Degraded   bool          // decided by a local fallback, not the shared store

	// Window is set by rate limits (ratelimit, tiers): the time their
	// policy takes to grant Limit from empty (Period for the windows,
	// Burst emission intervals for the bucket family: 12 s for
	// 1000/minute, burst 200). It is 0 for limits that are not rates
	// (concurrency, shedding, ceilings). Chain prefers decisions with a
	// Window, and adapters send it as the w= of RateLimit-Policy.
	Window time.Duration
}

// Outcome is how admitted work ended; adaptive limiters learn from it.
type Outcome uint8

const (
	// Success: the work completed normally.
	Success Outcome = iota
	// Dropped: the work failed because of overload (timeout, 503 from a
	// dependency); adaptive limits shrink.
	Dropped
	// Ignored: the outcome says nothing about load (the client went away,
	// a later limiter in a chain denied); adaptive limits do not learn.
	Ignored
)

var outcomeNames = [...]string{"success", "dropped", "ignored"}

// String returns the lowercase name of o.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Done releases what an admission acquired and reports how the work ended.
// It is never nil. Calling it more than once is harmless: only the first
// call counts.
type Done func(Outcome)

// Noop is the Done of an admission that acquired nothing.
func Noop(Outcome) {}

// Limiter is what every building block implements and what Chain composes.
//
// err != nil means only that a backend failed (it wraps the backend error;
// a *StoreError carries the FailMode the request's limits want); the
// decision is then the zero Decision and done is Noop. A nil or malformed
// request is not an error: it is denied with ReasonInvalid — Chain and the
// adapters validate a request once, up front, and every block checks it
// again (Request.Validate) so that it is safe to call directly.
// When d.Allowed, the caller must call done once when the work ends; done
// is never nil, and calling it again does nothing. A denial holds nothing.
// internal/contracttest checks every implementation in this module.
type Limiter interface {
	Admit(ctx context.Context, r *Request) (d Decision, done Done, err error)
}

// ErrInvalidRequest is wrapped by errors about malformed requests.
var ErrInvalidRequest = errors.New("spillway: invalid request")
