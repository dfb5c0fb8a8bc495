package spillway

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway/internal/budget"
)

type chain struct {
	ls     []Limiter
	budget time.Duration
}

// Chain runs limiters in order (put the cheapest first: rate → concurrency →
// fleet shedder → worker shedder → global ceiling) and stops at the first
// denial or error, releasing what the earlier limiters acquired (their Done
// is called with Ignored). An allowed chain returns the most restrictive
// decision (a rate limit's before any other, then the
// lowest Remaining among the decisions that carry a Limit) so that headers
// tell the truth, and a Done that releases every limiter in
// reverse order. A decision is Degraded when any limiter's was.
//
// A malformed request (Request.Validate) is denied with ReasonInvalid before
// any limiter runs. Nil limiters are skipped.
//
// One budget per request: the chain passes its limiters a context that
// carries a budget of DefaultBudget, so the admission as a
// whole waits on shared stores (Redis) for at most one budget, not one per
// block; a block that finds the budget spent decides locally at once. A
// budget the caller's context already carries is kept when it ends sooner.
// Under a request's budget (httpx and grpcx start one per request) the
// chain spends what is left of it, never a fresh one,
// however chains and guards nest — the first chain starts it with its
// length — and it runs only while a chain admits. ChainBudget sets
// another budget.
func Chain(limiters ...Limiter) Limiter { return ChainBudget(DefaultBudget, limiters...) }

// ChainBudget is Chain with a budget of its own instead of DefaultBudget.
// budget <= 0 starts none: the blocks then wait on their stores for their
// own budgets each (or for what a budget in the caller's context leaves).
func ChainBudget(budget time.Duration, limiters ...Limiter) Limiter {
	c := &chain{ls: make([]Limiter, 0, len(limiters)), budget: budget}
	for _, l := range limiters {
		if l != nil {
			c.ls = append(c.ls, l)
		}
	}
	return c
}

// chainDone releases an allowed chain's limiters in reverse order, once.
// One allocation per admitted request holds the Done of every limiter.
type chainDone struct {
	called atomic.Bool
	dones  []Done
	buf    [6]Done
}

func (cd *chainDone) release(o Outcome) {
	for i := len(cd.dones) - 1; i >= 0; i-- {
		cd.dones[i](o)
	}
}

func (cd *chainDone) done(o Outcome) {
	if cd.called.Swap(true) {
		return
	}
	cd.release(o)
}

func (c *chain) Admit(ctx context.Context, r *Request) (Decision, Done, error) {
	if err := r.Validate(); err != nil {
		return Decision{Reason: ReasonInvalid, Limiter: "request"}, Noop, nil
	}
	if len(c.ls) == 0 {
		return Decision{Allowed: true}, Noop, nil
	}
	ctx, exit := budget.Enter(ctx, c.budget)
	defer exit()
	if len(c.ls) == 1 {
		return c.ls[0].Admit(ctx, r)
	}
	var (
		best     Decision
		haveBest bool
		degraded bool
	)
	cd := &chainDone{}
	cd.dones = cd.buf[:0]
	for _, l := range c.ls {
		d, done, err := l.Admit(ctx, r)
		if err != nil {
			cd.release(Ignored)
			return Decision{}, Noop, err
		}
		degraded = degraded || d.Degraded
		if !d.Allowed {
			cd.release(Ignored)
			d.Degraded = degraded
			return d, Noop, nil
		}
		if done == nil {
			done = Noop
		}
		cd.dones = append(cd.dones, done)
		if !haveBest || moreRestrictive(d, best) {
			best, haveBest = d, true
		}
	}
	best.Degraded = degraded
	return best, cd.done, nil
}
