// Package budget is the admission budget the blocks share: the time one
// request's admission may still wait on shared stores (Redis), carried by
// the context. spillway.Chain and spillway.ChainBudget start one; the
// server adapters start one per request (Request); the blocks bound each
// store call by it (Deadline) and pause it while they wait locally
// (Pause).
package budget

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A budget is the time a request's admission may still wait on shared
// stores. It is a value carried by the context, not a context deadline:
// only the calls to shared stores are bounded by it, never the request's
// own work (a queue that waits for a worker slot, a handler), which the
// context's deadline governs as usual. A block that waits locally (a
// queue) pauses the budget while it waits (Pause), so that the
// Redis-backed blocks after it still have what the blocks before them
// left.
type budgetCtx struct {
	context.Context
	end    time.Time
	total  time.Duration
	parent *budgetCtx // the budget this one was made inside, if any

	shift   atomic.Int64 // nanoseconds added to end by finished pauses
	stopped atomic.Int64 // UnixNano when the running pause began; 0 while running

	// A request's budget (Request): started by the first chain
	// under it (end and total set then), stopped between admissions.
	request bool
	started atomic.Bool

	mu       sync.Mutex
	paused   int // pauses in progress, less the admissions under way (request budgets)
	pausedAt time.Time
}

// ends returns when the budget ends, counting a pause in progress as
// time not spent: a stopped budget keeps what it had left.
func (c *budgetCtx) ends() time.Time {
	e := c.end.Add(time.Duration(c.shift.Load()))
	if p := c.stopped.Load(); p != 0 {
		if d := time.Now().UnixNano() - p; d > 0 {
			e = e.Add(time.Duration(d))
		}
	}
	return e
}

func (c *budgetCtx) pause(now time.Time) {
	c.mu.Lock()
	c.paused++
	if c.paused == 1 {
		c.pausedAt = now
		c.stopped.Store(now.UnixNano())
	}
	c.mu.Unlock()
}

func (c *budgetCtx) resume(now time.Time) {
	c.mu.Lock()
	c.paused--
	if c.paused == 0 {
		if d := now.Sub(c.pausedAt); d > 0 {
			c.shift.Add(int64(d))
		}
		c.stopped.Store(0)
	}
	c.mu.Unlock()
}

// Request returns ctx carrying one budget for a whole request,
// however the chains, guards and blocks that admit inside it nest: the
// first Chain that runs under it starts it with its own length
// (spillway.DefaultBudget, or spillway.ChainBudget's), and every later
// Chain, Guard or block under it — a database guard in the handler, say — spends what is
// left of it, never a fresh one. It runs only while an admission is under
// way: the handler's own work between admissions does not spend it. So a
// request waits on shared stores for at most one budget in all, the
// first request of an outage included. httpx.Middleware and grpcx's
// server interceptors call it for every request. A ctx that already
// carries a budget is returned unchanged.
func Request(ctx context.Context) context.Context {
	if _, ok := ctx.Value(budgetKey{}).(*budgetCtx); ok {
		return ctx
	}
	b := &budgetCtx{Context: ctx, request: true, paused: 1}
	b.pausedAt = time.Now()
	b.stopped.Store(b.pausedAt.UnixNano())
	return b
}

// Enter makes the budget ctx carries run for one admission (a
// Chain's) and returns the context to admit with and the call that ends
// the admission's share of it. A request budget (Request) is
// started by the first admission, with d, and runs only while an
// admission is under way; within it, or within any other budget, the
// admission's own budget d applies when it ends sooner (With).
func Enter(ctx context.Context, d time.Duration) (context.Context, func()) {
	b, _ := ctx.Value(budgetKey{}).(*budgetCtx)
	for p := b; p != nil; p = p.parent {
		if p.request {
			b = p
			break
		}
	}
	if b == nil || !b.request {
		return With(ctx, d), func() {}
	}
	now := time.Now()
	if !b.started.Load() {
		b.mu.Lock()
		if !b.started.Load() && d > 0 {
			b.end, b.total = now, d
			// The pause since Request does not count.
			b.shift.Store(int64(d) - int64(now.Sub(b.pausedAt)))
			b.started.Store(true)
		}
		b.mu.Unlock()
	}
	b.resume(now)
	var once atomic.Bool
	return With(ctx, d), func() {
		if !once.Swap(true) {
			b.pause(time.Now())
		}
	}
}

type budgetKey struct{}

func (c *budgetCtx) Value(key any) any {
	if key == (budgetKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// With returns ctx carrying a budget that ends d from now: every
// Redis-backed block the request passes through then waits on its store for
// at most what is left of it (and at most its own budget), and a block that
// finds it spent decides locally at once. A budget already in ctx that ends
// sooner is kept: a budget is never extended. d <= 0 returns ctx unchanged.
//
// spillway.Chain starts a budget by itself (spillway.DefaultBudget, or
// spillway.ChainBudget's); With serves blocks called directly (tests).
func With(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	end := time.Now().Add(d)
	old, _ := ctx.Value(budgetKey{}).(*budgetCtx)
	if old != nil && old.live() && !old.ends().After(end) {
		return ctx
	}
	return &budgetCtx{Context: ctx, end: end, total: d, parent: old}
}

// Pause stops the budget ctx carries from running until the returned
// resume is called: the time in between is not charged to it (nor to the
// budgets it was made inside). A block that waits locally, such as
// shedder.Queue waiting for a slot, pauses the budget for the wait, so a
// wait before a Redis-backed block does not leave that block nothing: the
// budget bounds the time spent waiting on shared stores, not the
// admission's wall time. Pauses may nest; a paused span counts once.
// resume may be called more than once; only the first call counts. With
// no budget in ctx, Pause does nothing.
func Pause(ctx context.Context) (resume func()) {
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

// End returns when the budget ctx carries ends, and whether it
// carries one.
func End(ctx context.Context) (end time.Time, ok bool) {
	if b, ok := ctx.Value(budgetKey{}).(*budgetCtx); ok && b.live() {
		return b.ends(), true
	}
	return time.Time{}, false
}

// live reports whether the budget has a length: a request budget that no
// chain has started yet has none.
func (c *budgetCtx) live() bool { return !c.request || c.started.Load() }

// Total returns the length the budget ctx carries was given
// (With's d), or 0 when it carries none. A block uses it to tell a
// store that was too slow (it had most of the budget and did not answer)
// from a call cut short because the blocks before it spent the budget.
func Total(ctx context.Context) time.Duration {
	if b, ok := ctx.Value(budgetKey{}).(*budgetCtx); ok && b.live() {
		return b.total
	}
	return 0
}

// Deadline is the deadline a block sets on one call to its shared
// store: own from now (own <= 0: no bound of its own), or the end of ctx's
// budget when that is sooner. The zero time means no bound at all (no own
// bound and no budget). ok is false when the budget is already spent: the
// block must not call the store and decides locally (cause spillway.ErrBudgetSpent).
func Deadline(ctx context.Context, own time.Duration) (deadline time.Time, ok bool) {
	deadline, _, ok = DeadlineAt(ctx, own, time.Time{})
	return deadline, ok
}

// DeadlineAt is Deadline at now (the zero time: read the clock when
// needed), for a caller that has read the clock already, and it returns
// Total(ctx) too: one walk of ctx's values, one read of the clock, per
// call on a hot path.
func DeadlineAt(ctx context.Context, own time.Duration, now time.Time) (deadline time.Time, total time.Duration, ok bool) {
	var end time.Time
	b, has := ctx.Value(budgetKey{}).(*budgetCtx)
	if has = has && b.live(); has {
		end, total = b.ends(), b.total
	}
	if !has && own <= 0 {
		return time.Time{}, 0, true
	}
	if now.IsZero() {
		now = time.Now()
	}
	if own > 0 {
		deadline = now.Add(own)
	}
	if has && (deadline.IsZero() || end.Before(deadline)) {
		deadline = end
	}
	return deadline, total, deadline.After(now)
}
