package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// The generate route: a pretend model that "generates" 50 to 500 tokens
// per request and is limited in tokens per minute per client. What a
// request costs is known only once it has run, so the limit holds an
// estimate when the request is admitted and settles it to the tokens
// used when the handler returns: a refund when fewer were used, an extra
// charge — possibly into debt, which makes the client's next requests
// wait — when more were.
const (
	generateRoute    = "POST /api/v1/generate"
	generateEndpoint = "/api/v1/generate"
	minTokens        = 50
	maxTokens        = 500
	tokensEstimate   = 250 // a typical request; what is held at admission
)

// tokensPerMinute holds the estimate on the client's bucket and settles it
// to the reported usage in done. Requests to other endpoints, and
// requests without a client, pass without a decision.
type tokensPerMinute struct{ l *ratelimit.Limiter }

func newTokensPerMinute(store ratelimit.Store, perMinute int64) (*tokensPerMinute, error) {
	l, err := ratelimit.New(store, ratelimit.Policy{Algorithm: ratelimit.TokenBucket, Limit: perMinute, Period: time.Minute},
		ratelimit.WithScope("generate_tokens"))
	if err != nil {
		return nil, err
	}
	return &tokensPerMinute{l: l}, nil
}

func (t *tokensPerMinute) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	client, ok := r.Get(dimClient)
	if r.Endpoint != generateEndpoint || !ok {
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
	return d, spillway.Once(func(spillway.Outcome) {
		actual := estimate
		if usage != nil {
			if n, ok := usage.Total(); ok {
				actual = n
			}
		}
		// Settling must not wait on a hung store: it is bounded like an
		// admission. An unsettled hold is released after its TTL.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = hold.Settle(ctx, actual)
	}), nil
}

// unitCost passes requests to next with Cost 1: the concurrency limit,
// the shedders and the ceiling count requests, not tokens.
func unitCost(next spillway.Limiter) spillway.Limiter {
	return spillway.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		if r == nil || r.Cost == 0 || r.Cost == 1 {
			return next.Admit(ctx, r)
		}
		c := *r
		c.Cost, c.Usage = 1, nil
		return next.Admit(ctx, &c)
	})
}

// generate answers how many tokens it "generated": a number from 50 to 500
// drawn from ?seed=N (any unsigned integer; without it, a server-wide
// sequence), and reports it in the X-Tokens-Used header, which the
// middleware reads as the request's actual cost.
func generate(seq *atomic.Uint64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		seed := seq.Add(1)
		if v := r.URL.Query().Get("seed"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "seed=" + strconv.Quote(v) + ": want an unsigned integer"})
				return
			}
			seed = n
		}
		tokens := tokensFor(seed)
		w.Header().Set("X-Tokens-Used", strconv.FormatInt(tokens, 10))
		writeJSON(w, http.StatusOK, map[string]any{"seed": seed, "tokens_used": tokens})
	}
}

// tokensFor is the pretend model: seed → tokens in [minTokens, maxTokens].
func tokensFor(seed uint64) int64 {
	return minTokens + rand.New(rand.NewPCG(seed, 0x5eed)).Int64N(maxTokens-minTokens+1)
}
