package spillway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBudget is how long one request's admission through a Chain may
// wait on shared stores (Redis), in total, across every block of the chain.
const DefaultBudget = 50 * time.Millisecond

// ErrBudgetSpent is the cause of a decision a block made locally, without
// calling its shared store, because the request's budget was already spent
// by the blocks before it. It says nothing about the store's health.
var ErrBudgetSpent = errors.New("spillway: admission budget spent")

// A budget is the time a request's admission may still wait on shared
// stores. It is a value carried by the context, not a context deadline:
// only the calls to shared stores are bounded by it, never the request's
// own work (a queue that waits for a worker slot, a handler), which the
// context's deadline governs as usual. A block that waits locally (a
// queue) pauses the budget while it waits (PauseBudget), so that the
// Redis-backed blocks after it still have what the blocks before them
// left.
type budgetCtx struct {
	context.Context
	end    time.Time
	total  time.Duration
	parent *budgetCtx // the budget this one was made inside, if any

	shift atomic.Int64 // nanoseconds added to end by finished pauses

	mu       sync.Mutex
	paused   int // pauses in progress
	pausedAt time.Time
}

func (c *budgetCtx) ends() time.Time { return c.end.Add(time.Duration(c.shift.Load())) }

func (c *budgetCtx) pause(now time.Time) {
	c.mu.Lock()
	if c.paused == 0 {
		c.pausedAt = now
	}
	c.paused++
	c.mu.Unlock()
}

func (c *budgetCtx) resume(now time.Time) {
	c.mu.Lock()
	c.paused--
	if c.paused == 0 {
		if d := now.Sub(c.pausedAt); d > 0 {
			c.shift.Add(int64(d))
		}
	}
	c.mu.Unlock()
}

type budgetKey struct{}

func (c *budgetCtx) Value(key any) any {
	if key == (budgetKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// WithBudget returns ctx carrying a budget that ends d from now: every
// Redis-backed block the request passes through then waits on its store for
// at most what is left of it (and at most its own budget), and a block that
// finds it spent decides locally at once. A budget already in ctx that ends
// sooner is kept: a budget is never extended. d <= 0 returns ctx unchanged.
//
// Chain starts a budget by itself (DefaultBudget, or ChainBudget's); use
// WithBudget when blocks are called directly or when nested chains must
// share one budget with code around them.
func WithBudget(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	end := time.Now().Add(d)
	old, _ := ctx.Value(budgetKey{}).(*budgetCtx)
	if old != nil && !old.ends().After(end) {
		return ctx
	}
	return &budgetCtx{Context: ctx, end: end, total: d, parent: old}
}

// PauseBudget stops the budget ctx carries from running until the returned
// resume is called: the time in between is not charged to it (nor to the
// budgets it was made inside). A block that waits locally, such as
// shedder.Queue waiting for a slot, pauses the budget for the wait, so a
// wait before a Redis-backed block does not leave that block nothing: the
// budget bounds the time spent waiting on shared stores, not the
// admission's wall time. Pauses may nest; a paused span counts once.
// resume may be called more than once; only the first call counts. With
// no budget in ctx, PauseBudget does nothing.
func PauseBudget(ctx context.Context) (resume func()) {
	b, _ := ctx.Value(budgetKey{}).(*budgetCtx)
	if b == nil {
		return func() {}
	}
	now := time.Now()
	for p := b; p != nil; p = p.parent {
		p.pause(now)
	}
	var done atomic.Bool
	return func() {
		if done.Swap(true) {
			return
		}
		now := time.Now()
		for p := b; p != nil; p = p.parent {
			p.resume(now)
		}
	}
}

// BudgetFrom returns when the budget ctx carries ends, and whether it
// carries one.
func BudgetFrom(ctx context.Context) (end time.Time, ok bool) {
	if b, ok := ctx.Value(budgetKey{}).(*budgetCtx); ok {
		return b.ends(), true
	}
	return time.Time{}, false
}

// BudgetTotal returns the length the budget ctx carries was given
// (WithBudget's d), or 0 when it carries none. A block uses it to tell a
// store that was too slow (it had most of the budget and did not answer)
// from a call cut short because the blocks before it spent the budget.
func BudgetTotal(ctx context.Context) time.Duration {
	if b, ok := ctx.Value(budgetKey{}).(*budgetCtx); ok {
		return b.total
	}
	return 0
}

// BudgetDeadline is the deadline a block sets on one call to its shared
// store: own from now (own <= 0: no bound of its own), or the end of ctx's
// budget when that is sooner. The zero time means no bound at all (no own
// bound and no budget). ok is false when the budget is already spent: the
// block must not call the store and decides locally (cause ErrBudgetSpent).
func BudgetDeadline(ctx context.Context, own time.Duration) (deadline time.Time, ok bool) {
	end, has := BudgetFrom(ctx)
	if !has && own <= 0 {
		return time.Time{}, true
	}
	now := time.Now()
	if own > 0 {
		deadline = now.Add(own)
	}
	if has && (deadline.IsZero() || end.Before(deadline)) {
		deadline = end
	}
	return deadline, deadline.After(now)
}
