package tiers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/usagestep"
	"github.com/spillway-go/spillway/ratelimit"
)

// Rules whose cost comes from the response ("cost: response"): the
// request's cost is known only while or after the work runs (tokens a
// model generated, bytes streamed), so Admit holds an estimate on the
// rule's key (reserver) and done settles it to the actual cost
// (spillway.Usage). See Limiter.Admit for the whole contract.

// HoldObserver is told about the holds of "cost: response" rules, one
// call per rule: Held when a request's estimate is held for it, Settled
// when that hold ends. It must be safe for concurrent use and quick.
type HoldObserver interface {
	// Held: units (the estimate) are held for rule.
	Held(ctx context.Context, rule string, units int64)
	// Settled: the hold of rule ended. result is "applied" (settled to
	// the actual cost), "already_settled", "expired" (the store had
	// released it at its TTL: only what the steps charged counts) or
	// "error" (the store did not answer: it releases the hold at its
	// TTL). units is what the request was charged for rule in the end:
	// the actual cost when applied, else what its steps charged.
	Settled(ctx context.Context, rule string, units int64, result string)
}

// SpentError is the error spillway.Usage.Add (and Set) returns when a
// step of the work takes a "cost: response" rule past what its key has:
// the work should stop. The step is charged all the same (the work was
// done): when done runs the hold settles to the total, putting the key
// into debt. D is the denial to answer with: Limiter names the rule,
// RetryAfter is when a new request holding the same estimate can be
// admitted once this one is settled, if nothing else charges the key
// meanwhile (to the millisecond on a shared store; a local share's
// decision behind a fallback.Store, Degraded, is in its own scale).
// grpcx.UsageStatus answers with it.
type SpentError struct {
	D spillway.Decision
}

func (e *SpentError) Error() string {
	return fmt.Sprintf("tiers: limit %q spent (%d per %v); retry in %v", e.D.Limiter, e.D.Limit, e.D.Window, e.D.RetryAfter)
}

// Decision returns the denial.
func (e *SpentError) Decision() spillway.Decision { return e.D }

// admitHeld is Admit for a batch with "cost: response" rules. items,
// rules and out belong to Admit's scratch: what the hold needs after
// Admit returns is copied.
func (l *Limiter) admitHeld(ctx context.Context, r *spillway.Request, items []ratelimit.Item, rules []*crule, out []spillway.Decision, shadows int) (spillway.Decision, spillway.Done, error) {
	if l.reserver == nil { // New and Swap refuse such a config; a Limiter built otherwise
		return spillway.Decision{}, spillway.Noop, l.storeError(rules, fmt.Errorf("tiers: %w: store %T", ratelimit.ErrHoldUnsupported, l.store))
	}
	var h *hold
	reserve := func(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (allowed bool, err error) {
		// decideEnforced drops shadow rules in place, so the rules of
		// the batch it passes are the first len(items).
		allowed, h, err = l.reserveBatch(ctx, items, rules[:len(items)], out)
		return allowed, err
	}
	allowed, pass, items, rules, out, err := l.decideEnforced(ctx, r, items, rules, out, shadows, reserve)
	if err != nil {
		return spillway.Decision{}, spillway.Noop, err
	}
	if pass {
		return spillway.Decision{Allowed: true, Limiter: l.name}, spillway.Noop, nil
	}
	res, err := l.answer(items, rules, out, allowed)
	if err != nil {
		return spillway.Decision{}, spillway.Noop, err
	}
	if !allowed || h == nil {
		return res, spillway.Noop, nil
	}
	hs := l.newHeld(ctx, h, items, rules, r.Usage)
	return res, block.Once(hs.done), nil
}

// reserveBatch decides items all or nothing, holding the bucket-family
// ones in one Reserve: the "cost: response" items hold their estimate;
// the others are charged their cost there and then (ratelimit.Item.Fixed),
// or, when the batch has window items, hold their cost (done settles
// them to it, so they are charged as Decide would have charged them). A store holds only the bucket
// family, so the window items of the batch (rules with cost: request; a
// bucket too wide for holds too) are decided after the hold, by Decide:
// when they deny, the hold is cancelled (settled to 0). h is nil when
// nothing is held (no "cost: response" item: the shadow-free retry of a
// batch whose only response rules were shadows).
func (l *Limiter) reserveBatch(ctx context.Context, items []ratelimit.Item, rules []*crule, out []spillway.Decision) (allowed bool, h *hold, err error) {
	var hi, wi []int // indices of the held items and of the window items
	response := false
	for i := range items {
		if p := items[i].Policy; holds(p.Algorithm) && (rules[i].response || rateHooks.EffectiveBurst(p) <= maxHoldSpan/rateHooks.EmissionInterval(p)) {
			hi = append(hi, i)
		} else {
			wi = append(wi, i)
		}
		response = response || rules[i].response
	}
	if !response {
		allowed, err = l.store.Decide(ctx, items, out)
		return allowed, nil, err
	}
	held := make([]ratelimit.Item, len(hi))
	for j, i := range hi {
		held[j] = items[i]
		// Without window items nothing can deny the batch after the
		// reservation: the rules charged on the request are charged
		// there and then (fixed), only the "cost: response" ones hold.
		// With window items each is held, so that a denial by the
		// windows gives it back (cancel).
		held[j].Fixed = !rules[i].response && len(wi) == 0
	}
	rh, err := l.reserver.Reserve(ctx, held, l.holdTTL)
	if err != nil {
		return false, nil, err
	}
	for j, i := range hi {
		out[i] = rateHooks.Decisions(rh)[j]
	}
	if len(wi) == 0 {
		if !rateHooks.Allowed(rh) {
			return false, nil, nil
		}
		return true, &hold{h: rh, items: held, idx: hi}, nil
	}
	win := make([]ratelimit.Item, len(wi))
	for j, i := range wi {
		win[j] = items[i]
		if !rateHooks.Allowed(rh) {
			win[j].Cost = 0 // peek: what the window rules have left
		}
	}
	wout := make([]spillway.Decision, len(wi))
	ok, err := l.store.Decide(ctx, win, wout)
	if err != nil {
		if rateHooks.Allowed(rh) {
			l.cancel(rh)
			return false, nil, err
		}
		// The batch is denied anyway: the window rules' decisions are
		// unknown, which no choice depends on.
		for j, i := range wi {
			out[i] = spillway.Decision{Allowed: true, Limit: win[j].Policy.Capacity()}
		}
		return false, nil, nil
	}
	for j, i := range wi {
		out[i] = wout[j]
	}
	if !rateHooks.Allowed(rh) {
		return false, nil, nil
	}
	if !ok {
		l.cancel(rh)
		return false, nil, nil
	}
	return true, &hold{h: rh, items: held, idx: hi}, nil
}

// cancel gives back a hold whose batch was denied after it was made: a
// settle of every item to 0, off the request path, refunds
// exactly what it held. If the store does not answer, the hold is
// released at its TTL.
func (l *Limiter) cancel(h *ratelimit.Hold) {
	l.settling.Add(1)
	if err := rateHooks.SettleAsync(h, make([]int64, len(rateHooks.Decisions(h))), func([]ratelimit.SettleResult, error) { l.settling.Done() }); err != nil {
		l.settling.Done()
	}
}

// hold is what reserveBatch held: the Hold, its items (copies) and their
// index in the batch.
type hold struct {
	h     *ratelimit.Hold
	items []ratelimit.Item
	idx   []int
}

// held is the state of an admitted request that holds: what its steps
// charge and what done settles.
type held struct {
	l     *Limiter
	ctx   context.Context // the admission's, detached: for the observer
	h     *ratelimit.Hold
	items []ratelimit.Item // the held items; Cost is the estimate (a plain item's cost)
	rules []*crule         // their rules
	usage *spillway.Usage

	mu      sync.Mutex
	extra   []int64 // per item: what steps charged beyond the estimate
	refused *SpentError
	settled bool
}

func (l *Limiter) newHeld(ctx context.Context, h *hold, items []ratelimit.Item, rules []*crule, usage *spillway.Usage) *held {
	hs := &held{l: l, h: h.h, items: h.items, usage: usage}
	if l.observer != nil {
		hs.ctx = context.WithoutCancel(ctx)
	}
	hs.extra = make([]int64, len(h.idx))
	hs.rules = make([]*crule, len(h.idx))
	steps := false
	for j, i := range h.idx {
		ru := rules[i]
		hs.rules[j] = ru
		if ru.response {
			steps = steps || !ru.shadow
			if l.observer != nil {
				l.observer.Held(hs.ctx, ru.id, hs.items[j].Cost)
			}
		}
	}
	if usage != nil && steps {
		usagestep.OnStep(usage, hs.step)
	}
	return hs
}

// step charges, as the work reports it, what the running total takes
// each enforced "cost: response" rule beyond what it holds: one Decide of
// the overruns, all or nothing. Within the estimate it calls no store.
// When a rule has no room the step is refused (a *SpentError), and so is
// every later one; the refused units are charged by the settle, as debt.
// A step the store cannot answer is not refused: the settle charges it.
func (hs *held) step(total int64) error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.settled {
		return nil
	}
	if hs.refused != nil {
		return hs.refused
	}
	for i := range hs.items {
		if ru := hs.rules[i]; ru.response && !ru.shadow && total > hs.items[i].Cost+hs.extra[i] {
			return hs.charge(total)
		}
	}
	return nil // within what is held: no store call
}

// charge is step's store call: one Decide of every enforced response
// item's overrun (called with hs.mu held).
func (hs *held) charge(total int64) error {
	var over []ratelimit.Item
	var idx []int
	for i := range hs.items {
		if ru := hs.rules[i]; !ru.response || ru.shadow {
			continue
		}
		if covered := hs.items[i].Cost + hs.extra[i]; total > covered {
			it := hs.items[i]
			it.Cost = total - covered
			over, idx = append(over, it), append(idx, i)
		}
	}
	out := make([]spillway.Decision, len(over))
	ctx, stop := context.WithTimeout(context.Background(), hs.l.settleTimeout)
	defer stop()
	ok, err := hs.l.store.Decide(ctx, over, out)
	if err != nil {
		return nil
	}
	if ok {
		for j, i := range idx {
			hs.extra[i] += over[j].Cost
		}
		return nil
	}
	var worst spillway.Decision
	for j, i := range idx {
		if out[j].Allowed {
			continue
		}
		d := refusal(&over[j], out[j], hs.items[i].Cost)
		d.Limiter = hs.rules[i].id
		if worst.Limiter == "" || d.RetryAfter > worst.RetryAfter {
			worst = d
		}
	}
	hs.refused = &SpentError{D: worst}
	return hs.refused
}

// refusal is the denial of a step whose overrun it.Cost the store denied
// (d) on a rule holding estimate est. Once the request settles, its key
// is in debt by the overrun (at most one burst: the store forgives what
// is beyond), so a new request holding est can be admitted after what d
// says the overrun needs beyond the burst, plus est's own time.
func refusal(it *ratelimit.Item, d spillway.Decision, est int64) spillway.Decision {
	p := it.Policy
	T := time.Duration(rateHooks.EmissionInterval(p)) * time.Microsecond
	burst := rateHooks.EffectiveBurst(p)
	tau := time.Duration(burst) * T // ≤ 2^51 µs: no overflow in ns
	// wait + overrun·T − τ: what the debt will be beyond a full burst.
	excess := d.RetryAfter
	if d.Reason == spillway.ReasonCostExceedsLimit { // overrun > burst: d says only wait
		excess = tau
		if it.Cost <= 2*burst {
			excess = max(d.ResetAfter+time.Duration(it.Cost)*T-tau, 0)
		}
	}
	excess = min(excess, tau)
	return spillway.Decision{
		Reason:     spillway.ReasonRateLimited,
		Limit:      d.Limit,
		ResetAfter: excess + tau,
		RetryAfter: excess + time.Duration(est)*T,
		Degraded:   d.Degraded,
		Window:     rateHooks.Window(p),
	}
}

// done settles the hold: each "cost: response" item to the actual cost
// (Usage.Total; the estimate when nothing was reported, 0 when nothing
// was reported and the work was Ignored), less what its steps charged;
// each other item to its cost.
func (hs *held) done(o spillway.Outcome) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.settled {
		return
	}
	hs.settled = true
	total, reported := hs.usage.Total()
	var buf, cbuf [batchStack]int64
	actual, charged := buf[:0], cbuf[:0]
	for i := range hs.items {
		a := hs.items[i].Cost
		if hs.rules[i].response {
			switch {
			case reported:
				a = total
			case o == spillway.Ignored:
				a = 0 // a later block denied, or the client left: no work to charge
			}
			charged = append(charged, max(a, hs.extra[i]))
			a = max(a-hs.extra[i], 0)
		} else {
			charged = append(charged, a)
		}
		actual = append(actual, a)
	}
	// The settle leaves the request path: the store sends it in the
	// background (the hold's settle off the request path) and then reports. steps no
	// longer touch extra (settled is set), so then may read it.
	charged = append([]int64(nil), charged...)
	hs.l.settling.Add(1)
	err := rateHooks.SettleAsync(hs.h, actual, func(res []ratelimit.SettleResult, err error) { hs.settled2(res, err, charged) })
	if err != nil { // bad input cannot happen here (Admit built the hold); the TTL releases it
		hs.settled2(nil, err, charged)
	}
}

// settled2 is what follows a settle, on the store's background path:
// the recharge of expired cost: request items and the observer.
func (hs *held) settled2(res []ratelimit.SettleResult, err error, charged []int64) {
	defer hs.l.settling.Done()
	if err == nil {
		hs.rechargeExpired(res)
	}
	obs := hs.l.observer
	if obs == nil {
		return
	}
	for i, ru := range hs.rules {
		if !ru.response {
			continue
		}
		result, units := "error", hs.extra[i]
		if err == nil {
			result = res[i].String()
			if res[i] == ratelimit.SettleApplied {
				units = charged[i]
			}
		}
		obs.Settled(hs.ctx, ru.id, units, result)
	}
}

// rechargeExpired charges again the cost: request items whose hold the
// store released before the settle (a request that outlived the hold
// TTL): their cost belongs to the admission, not to the work, so it is
// charged after the fact when there is room (a key that has none is not
// charged; nothing else is touched).
func (hs *held) rechargeExpired(res []ratelimit.SettleResult) {
	var again []ratelimit.Item
	for i, r := range res {
		if r == ratelimit.SettleExpired && !hs.rules[i].response {
			again = append(again, hs.items[i])
		}
	}
	if len(again) == 0 {
		return
	}
	// off the store's background path, which must not wait on a call
	hs.l.recharges.Go(func() {
		ctx, stop := context.WithTimeout(context.Background(), hs.l.settleTimeout)
		defer stop()
		for i := range again {
			var out [1]spillway.Decision
			_, _ = hs.l.store.Decide(ctx, again[i:i+1], out[:])
		}
	})
}

// Flush waits until the settles of the requests whose done has run so
// far were answered by the store (or given up: see
// the store's background path), and what followed them (see
// Settings.HoldObserver) is done, or ctx ends (it then returns ctx.Err()). done
// hands a settle to the store's background path and returns; the store
// (a ratelimit.RedisStore, or a fallback.Store over one) is flushed
// first, so that nothing waits for its linger. Call it before reading a
// key's state right after a request, or at shutdown (then close the
// store: ratelimit.RedisStore.Close).
func (l *Limiter) Flush(ctx context.Context) error {
	if err := rateHooks.Flush(ctx, l.store); err != nil {
		return fmt.Errorf("tiers: flush: %w", err)
	}
	idle := make(chan struct{})
	go func() { l.settling.Wait(); l.recharges.Wait(); close(idle) }()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("tiers: flush: %w", ctx.Err())
	}
}
