package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// The pretend model of the examples' generate calls: a request "generates"
// MinTokens to MaxTokens tokens, drawn from its seed.
const (
	MinTokens = 50
	MaxTokens = 500
	// TokensEstimate is a typical request: what is held at admission.
	TokensEstimate = 250
)

// Tokens returns how many tokens the request with seed generates.
func Tokens(seed uint64) int64 {
	return MinTokens + rand.New(rand.NewPCG(seed, 0x5eed)).Int64N(MaxTokens-MinTokens+1)
}

// TokensPerMinute limits the generate calls of one endpoint in tokens per
// minute per value of a dimension (the client). What a call costs is known
// only once it has run, so Admit holds the estimate (Request.Cost) on the
// client's bucket and done settles it to what the handler reported
// (Request.Usage): a refund when it used fewer, an extra charge — possibly
// into debt, which makes the client's next calls wait — when more. With
// nothing reported the estimate is charged, or nothing when the call was
// Ignored (a later block denied it, the client went away).
//
// A streaming call reports per chunk: a step that takes the call past
// what its client had when it was admitted is refused (Usage.Add returns a
// *Spent), and the handler stops. (Concurrent calls of one client each
// see what was left when they were admitted.)
//
// Calls to other endpoints, and calls without the dimension, pass without
// a decision.
type TokensPerMinute struct {
	l        *ratelimit.Limiter
	endpoint string
	dim      string
	perMin   int64
}

// NewTokensPerMinute limits endpoint to perMinute tokens per minute per
// value of dim, on store. Its decisions are named "generate_tokens".
func NewTokensPerMinute(store ratelimit.Store, endpoint, dim string, perMinute int64) (*TokensPerMinute, error) {
	l, err := ratelimit.New(store, ratelimit.Policy{Algorithm: ratelimit.TokenBucket, Limit: perMinute, Period: time.Minute},
		ratelimit.WithScope("generate_tokens"))
	if err != nil {
		return nil, err
	}
	return &TokensPerMinute{l: l, endpoint: endpoint, dim: dim, perMin: perMinute}, nil
}

// Spent is the error of a refused step: the call's tokens are spent. Its
// Decision is the denial to answer with (grpcx.UsageStatus uses it).
type Spent struct{ D spillway.Decision }

func (e *Spent) Error() string {
	return fmt.Sprintf("%s: %d tokens per minute spent", e.D.Limiter, e.D.Limit)
}

// Decision returns the denial.
func (e *Spent) Decision() spillway.Decision { return e.D }

// Admit implements spillway.Limiter.
func (t *TokensPerMinute) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	client, ok := r.Get(t.dim)
	if r.Endpoint != t.endpoint || !ok {
		return spillway.Decision{Allowed: true}, spillway.Noop, nil
	}
	estimate := r.EffectiveCost()
	hold, err := t.l.Reserve(ctx, client, estimate)
	if err != nil {
		return spillway.Decision{}, nil, &spillway.StoreError{Limiter: t.l.Scope(), Err: err}
	}
	d := hold.Decision()
	if !hold.Allowed() {
		return d, spillway.Noop, nil
	}
	usage := r.Usage
	if usage != nil {
		avail := d.Remaining + estimate // what the client had
		usage.OnStep(func(total int64) error {
			if total <= avail {
				return nil
			}
			// Settled at total, the bucket is total−avail in debt; the next
			// call's estimate needs that and itself back.
			need := estimate + total - avail
			wait := time.Duration(float64(need) / float64(t.perMin) * float64(time.Minute))
			return &Spent{spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: t.l.Scope(), Limit: t.perMin,
				Window: d.Window, RetryAfter: wait}}
		})
	}
	return d, spillway.Once(func(o spillway.Outcome) {
		actual := estimate
		if o == spillway.Ignored {
			actual = 0 // a later block denied, the client left, or a panic: no work to charge
		}
		if usage != nil {
			if n, ok := usage.Total(); ok {
				actual = n
			}
		}
		// Settling must not wait on a hung store for long; an unsettled
		// hold is released after its TTL.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = hold.Settle(ctx, actual)
	}), nil
}

// UnitCost passes requests to next with Cost 1 and no Usage: the
// concurrency limits, the shedders and the ceiling count calls, not
// tokens.
func UnitCost(next spillway.Limiter) spillway.Limiter {
	return spillway.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		if r == nil || ((r.Cost == 0 || r.Cost == 1) && r.Usage == nil) {
			return next.Admit(ctx, r)
		}
		c := *r
		c.Cost, c.Usage = 1, nil
		return next.Admit(ctx, &c)
	})
}
