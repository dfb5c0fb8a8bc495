package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/ratecore"
)

// Reserve-then-settle: a request whose cost is known only after the work
// (tokens generated, bytes streamed, rows scanned) holds an estimate up
// front and settles the actual cost when it is known.
//
// Only the bucket family (TokenBucket, GCRA, LeakyBucket) holds: its state
// is one arrival time that a refund moves back and an extra charge moves
// forward, at any time. The windows return ErrHoldUnsupported: a window's
// charge belongs to the window it was made in, so a refund after the
// window rolled over gives back nothing real, and an overrun settled in a
// later window either vanishes at the window's end (a caller overrunning
// at the end of each window would never pay) or needs a second state per
// key; the sliding log would also store one member per unit of a debt.
//
// The arithmetic, shared by both stores (the Redis scripts follow it line
// by line), in the notation of algorithms.go:
//
//   - A key with holds outstanding, or in debt, is "marked". A marked key's
//     clamp for time going backwards is TAT − 2τ instead of TAT − τ (a debt
//     legitimately puts TAT up to 2τ ahead of now), its wait is in [0, 2τ],
//     and Remaining is max(0, τ − wait)/T. An unmarked key decides exactly
//     as before holds existed.
//   - Reserve(e) decides like Allow(e) (all or nothing over the batch) and,
//     when allowed, records the hold (id, e, expiry now + ttl) on the key,
//     even for e = 0.
//   - Every touch of a marked key (a decision, a reserve, a settle) first
//     releases the holds whose expiry is ≤ now: each gives back e·T,
//     TAT = max(TAT − e·T, t) when TAT > t (t is now after the clamp):
//     a released hold costs what a settle of 0 would. These releases are
//     kept even when the decision that made them is denied.
//   - Settle(a) of a live hold removes it and applies δ = a − e: δ < 0
//     gives back |δ|·T as above (never past full); δ > 0 charges
//     TAT = min(max(TAT, t) + δ·T, t + 2τ): the key may go up to one Burst
//     into debt, and what is beyond is forgiven (the bound keeps every
//     number exact). A settle that finds no live hold of its name changes
//     nothing and reports by the hold's release time, which it carries:
//     before it, SettleAlreadySettled (a second settle of the same hold,
//     a retry after a timeout included, or a Reset meanwhile); after it,
//     SettleExpired (the hold was released). No tombstone is kept.
//   - After each write, the key is marked iff it has live holds or
//     TAT − t > τ.

// DefaultHoldTTL is how long a hold lives unsettled before the store
// releases it, when the caller does not say (see Settings.HoldTTL).
const DefaultHoldTTL = time.Minute

// MaxHoldTTL is the longest hold TTL accepted: 2^51 µs (about 71 years),
// so that now + ttl stays exact in the Redis scripts' doubles.
const MaxHoldTTL = time.Duration(maxHoldSpan) * time.Microsecond

// maxHoldSpan bounds τ (Burst·T) of a policy that holds, and the TTL, in
// µs: with a debt of up to τ a marked TAT reaches now + 2τ ≤ 2^52 + 2^52,
// exact in a double until the year 2112.
const maxHoldSpan = 1 << 51

// ErrHoldUnsupported is returned by Reserve for a policy whose algorithm
// cannot hold (the windows; see the package doc) and for a store that
// has no Reserve method.
var ErrHoldUnsupported = errors.New("ratelimit: holds are not supported")

// errNotHeld is returned by Settle on a hold whose reservation was denied:
// nothing was held, so there is nothing to settle.
var errNotHeld = errors.New("ratelimit: nothing held: the reservation was denied")

// reserver is a Store that can hold estimates. *MemoryStore and
// *RedisStore are, with the same semantics.
type reserver interface {
	Store
	// Reserve decides items all or nothing, as Decide does, each with its
	// Cost as the estimate; when the batch is allowed, each item's
	// estimate stays held on its key under one hold id until the returned
	// Hold is settled or ttl passes, whichever comes first (a hold not
	// settled within ttl is released by the store itself, on the next
	// touch of its key: nothing stays charged if the process dies). ttl 0
	// means DefaultHoldTTL. Every item must be of the bucket family
	// (ErrHoldUnsupported otherwise) with Burst·T ≤ 2^51 µs. A denied
	// batch returns a Hold that is not Allowed and charges nothing; err
	// != nil only when the input is invalid or the backend failed (nothing
	// is held then; a Redis store that held part of a Cluster batch gives
	// it back).
	Reserve(ctx context.Context, items []Item, ttl time.Duration) (*Hold, error)
}

// holdSettler is what a Hold calls to settle: the store that made it.
type holdSettler interface {
	settle(ctx context.Context, h *Hold, actual []int64, res []SettleResult) error
	// settleAsync settles in the background and calls then (never nil)
	// once with the results or the error; actual is the Hold's own copy.
	settleAsync(h *Hold, actual []int64, then func([]SettleResult, error))
}

// errNotSent is wrapped by the error a settle handed to a store's
// background path (Hold.settleAsync) reports when the store did not send
// it: the queue was full, the store was closed, or Redis could not be
// reached before the hold's TTL. The hold is then left to its TTL.
var errNotSent = errors.New("ratelimit: settle not sent; the hold is left to its TTL")

// SettleResult says what a Settle did.
type SettleResult uint8

const (
	// SettleApplied: the hold was replaced by the actual cost.
	SettleApplied SettleResult = iota + 1
	// SettleAlreadySettled: no live hold was found before the hold's
	// release time: it had been settled before (a second Settle, or a
	// retry of one whose reply was lost), or its key was reset; nothing
	// changed.
	SettleAlreadySettled
	// SettleExpired: the hold had passed its TTL and was released;
	// nothing changed.
	SettleExpired
)

var settleNames = [...]string{SettleApplied: "applied", SettleAlreadySettled: "already_settled", SettleExpired: "expired"}

// String returns "applied", "already_settled" or "expired".
func (r SettleResult) String() string {
	if r >= SettleApplied && int(r) < len(settleNames) {
		return settleNames[r]
	}
	return fmt.Sprintf("settle_result(%d)", uint8(r))
}

// Hold is a reservation made by Reserve: the decisions, and when allowed,
// the estimates held until Settle. Settle it exactly once when the actual
// cost is known (0 when the work was not done); a Hold dropped without
// settling is released by the store after its TTL. A Hold is safe for
// concurrent use; a second Settle reports SettleAlreadySettled.
type Hold struct {
	store   holdSettler
	id      string
	ttl     time.Duration
	items   []Item   // copies; Cost is the estimate
	exps    []int64  // each item's release time (µs, the store's clock: Redis's on a RedisStore)
	rkeys   []string // Redis: each item's key
	members []string // Redis: each item's hold member, "<id>/<i>=<estimate>"
	dec     []spillway.Decision
	allowed bool
	until   time.Time // the client's estimate of the end of the TTL (RedisStore)

	mu      sync.Mutex
	settled bool
	results []SettleResult
}

// Decision returns the decision of the reservation (of its first item, on
// a store's batch): what Allow of the estimate would have said. When it
// is not Allowed nothing is held.
func (h *Hold) Decision() spillway.Decision {
	if len(h.dec) == 0 {
		return spillway.Decision{Allowed: h.allowed}
	}
	return h.dec[0]
}

// estimates appends each item's estimate to dst and returns it.
func (h *Hold) estimates(dst []int64) []int64 {
	for i := range h.items {
		dst = append(dst, h.items[i].Cost)
	}
	return dst
}

// Settle replaces the hold by the actual cost, on every item of the
// reservation, in one round trip per Cluster slot group: it refunds what
// the estimate held beyond actual (never past a full bucket), or charges
// the overrun, which may put the key into debt of at most one Burst: a key
// in debt denies every request until time repays it, and their RetryAfter
// says when. Settle with 0 when the work was not done.
//
// The result is SettleApplied; SettleAlreadySettled for a second Settle
// (which changes nothing and calls no store); SettleExpired when the
// store had already released the hold at its TTL (only what the
// reservation charged stays charged); with several items, SettleExpired
// if any item expired. An error means the store did not answer (a
// timeout, say): the settle may or may not have been applied, and
// retrying it is safe, since the store settles each hold at most once; an
// unsettled hold is released at its TTL. Settling a denied reservation
// (nothing held) or a negative actual is an error that changes nothing
// (the latter wrapping ErrInvalidCost); an actual above estimate +
// 2·Burst is charged as estimate + 2·Burst (the debt is bounded anyway).
func (h *Hold) Settle(ctx context.Context, actual int64) (SettleResult, error) {
	if !h.allowed {
		return 0, errNotHeld
	}
	var buf [batchStack]int64
	a := buf[:0]
	for range h.items {
		a = append(a, actual)
	}
	res, err := h.settleEach(ctx, a)
	if err != nil {
		return 0, err
	}
	return worst(res), nil
}

// settleEach replaces the hold of item i by actual[i] (len(actual) must be
// the number of items) in one round trip per Cluster slot group: a refund
// when actual[i] is below the estimate, an extra charge when above, which
// may put the key into debt (up to one Burst: see the package doc) so that
// the following requests wait. It returns one result per item. A call
// after a successful one changes nothing and calls no store: it reports
// SettleAlreadySettled for the items the first applied and SettleExpired
// for those it found expired; a call that failed (err !=
// nil, a timeout say) may have been applied or not, and retrying it is
// safe: the store settles each hold id at most once. A negative actual is
// an error wrapping ErrInvalidCost and changes nothing; an actual above
// estimate + 2·Burst charges as much as estimate + 2·Burst (the debt is
// bounded anyway).
func (h *Hold) settleEach(ctx context.Context, actual []int64) ([]SettleResult, error) {
	if !h.allowed {
		return nil, errNotHeld
	}
	if len(actual) != len(h.items) {
		return nil, fmt.Errorf("ratelimit: settle: %d actual costs for %d items", len(actual), len(h.items))
	}
	for i, a := range actual {
		if a < 0 {
			return nil, wrapf(fmt.Errorf("%w: actual cost %d is negative", ErrInvalidCost, a), "settle: item %d", i)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	res := make([]SettleResult, len(h.items))
	if len(h.items) == 0 {
		h.settled = true
		return res, nil
	}
	if h.settled {
		return h.again(), nil
	}
	if err := h.store.settle(ctx, h, actual, res); err != nil {
		return nil, err
	}
	h.settled = true
	h.results = res
	return res, nil
}

// settleAsync is settleEach handed to the store's background path: it
// returns at once, and then, when given, is called once with what
// settleEach would have returned (on the store's own goroutine: keep it
// quick). The memory store settles at once, before returning, and calls
// then before returning too. A RedisStore queues the settle and sends it
// with the next of its calls or after at most two milliseconds, many settles
// in one script call per Cluster slot; see docs/ratelimit.md for the
// bound of its queue, Close, and what happens while Redis cannot be
// reached (the settle is left to the hold's TTL and then gets an error
// wrapping errNotSent). The error returned is only that of bad input
// (errNotHeld, a length that is not the number of items, a negative
// cost), which calls nothing. A Hold settles once: a settleAsync after a
// settle, or a settle after settleAsync, changes nothing and reports
// SettleAlreadySettled for every item whose first settle is still on its
// way or was applied.
func (h *Hold) settleAsync(actual []int64, then func([]SettleResult, error)) error {
	if !h.allowed {
		return errNotHeld
	}
	if len(actual) != len(h.items) {
		return fmt.Errorf("ratelimit: settle: %d actual costs for %d items", len(actual), len(h.items))
	}
	for i, a := range actual {
		if a < 0 {
			return wrapf(fmt.Errorf("%w: actual cost %d is negative", ErrInvalidCost, a), "settle: item %d", i)
		}
	}
	if then == nil {
		then = func([]SettleResult, error) {}
	}
	h.mu.Lock()
	if h.settled || len(h.items) == 0 {
		res := h.again()
		h.settled = true
		h.mu.Unlock()
		then(res, nil)
		return nil
	}
	h.settled = true // the results arrive with then
	h.mu.Unlock()
	a := make([]int64, len(actual))
	copy(a, actual)
	h.store.settleAsync(h, a, func(res []SettleResult, err error) {
		h.mu.Lock()
		if err == nil {
			h.results = res
		} else {
			h.settled = false // a synchronous retry may try again (safe: see settleEach)
		}
		h.mu.Unlock()
		then(res, err)
	})
	return nil
}

// again is what a settle of a Hold already settled reports (h.mu held):
// SettleAlreadySettled for an item the first applied or whose first
// settle is still on its way, SettleExpired for one it found expired.
func (h *Hold) again() []SettleResult {
	res := make([]SettleResult, len(h.items))
	for i := range res {
		res[i] = SettleAlreadySettled
		if i < len(h.results) && h.results[i] == SettleExpired {
			res[i] = SettleExpired
		}
	}
	return res
}

// worst is the summary of per-item results: SettleApplied only if every
// item was applied, else SettleExpired if one expired, else
// SettleAlreadySettled.
func worst(res []SettleResult) SettleResult {
	w := SettleApplied
	for _, r := range res {
		if r == SettleExpired {
			return SettleExpired
		}
		if r != SettleApplied {
			w = r
		}
	}
	return w
}

// settleCost is the actual cost of item it sent to a store: actual,
// capped at estimate + 2·Burst, beyond which the debt is at its bound
// whatever the state (the estimate is at most Burst ≤ 2^51, so the cap
// is at most 3·2^51 < 2^53: exact in a script).
func settleCost(it *Item, actual int64) int64 {
	return min(actual, it.Cost+2*it.Policy.effectiveBurst())
}

// Reserve holds estimate units of key until the returned Hold is settled
// with the actual cost (Hold.Settle) or its TTL passes (Settings.HoldTTL). The
// reservation is decided like Allow(ctx, key, estimate): the Hold's
// Decision is what Allow would say, and when it is not Allowed nothing is
// held (estimate above Capacity is denied with
// spillway.ReasonCostExceedsLimit). Estimate 0 holds nothing but lets
// Settle charge the actual cost afterwards. A negative estimate is an
// error wrapping ErrInvalidCost; a policy of the window family, and a
// store without a Reserve method, return an error wrapping
// ErrHoldUnsupported. Any other error means the store did not answer (or
// ctx ended) and nothing is held (behind a fallback.Store, its local
// share holds instead, marked Degraded).
func (l *Limiter) Reserve(ctx context.Context, key string, estimate int64) (*Hold, error) {
	r, ok := l.store.(reserver)
	if !ok {
		return nil, fmt.Errorf("%w: store %T has no Reserve method", ErrHoldUnsupported, l.store)
	}
	items := []Item{{Scope: l.scope, Key: key, Policy: l.policy, Cost: estimate, Fail: l.fail}}
	h, err := r.Reserve(ctx, items, l.holdTTL)
	if err != nil {
		return nil, wrapf(err, "%s", l.name)
	}
	for i := range h.dec {
		h.dec[i].Window, h.dec[i].Limiter = l.window, l.name
	}
	return h, nil
}

func init() {
	ratecore.Register(ratecore.Hooks[Item, *Hold, Policy, SettleResult]{
		ValidateReserve: validateReserve,
		DeniedHold:      deniedHold,
		ErrNotHeld:      errNotHeld,
		ErrNotSent:      errNotSent,
		Allowed:         func(h *Hold) bool { return h.allowed },
		Decisions:       func(h *Hold) []spillway.Decision { return h.dec },
		SettleEach: func(ctx context.Context, h *Hold, actual []int64) ([]SettleResult, error) {
			return h.settleEach(ctx, actual)
		},
		SettleAsync: func(h *Hold, actual []int64, then func([]SettleResult, error)) error {
			return h.settleAsync(actual, then)
		},
		EffectiveBurst:   Policy.effectiveBurst,
		EmissionInterval: Policy.emissionInterval,
		EffectiveBuckets: Policy.effectiveBuckets,
		Window:           Policy.window,
		Client: func(store any) redis.UniversalClient {
			if s, ok := store.(*RedisStore); ok {
				return s.client
			}
			return nil
		},
		SetGate: func(store any, gate func() bool) bool {
			s, ok := store.(*RedisStore)
			if ok {
				s.setGate(gate)
			}
			return ok
		},
		Flush: func(ctx context.Context, store any) error {
			switch s := store.(type) {
			case *RedisStore:
				return s.flushSettles(ctx)
			case interface{ Flush(context.Context) error }: // a wrapping store (fallback.Store)
				return s.Flush(ctx)
			}
			return nil
		},
		Len: func(store any) int {
			if s, ok := store.(*MemoryStore); ok {
				return s.keyCount()
			}
			return -1
		},
	})
}

// validateReserve reports what is wrong with a Reserve of items
// for ttl, as the stores do before touching any state: the errors of
// Policy.Validate and of a negative cost, ErrHoldUnsupported for an
// algorithm that cannot hold, ErrInvalidPolicy for Burst·T above 2^51 µs,
// and a ttl out of range. A store that wraps another (a fallback) calls it
// so that bad input is never mistaken for a failing backend.
func validateReserve(items []Item, ttl time.Duration) error {
	if _, _, err := holdTTLOf(ttl); err != nil {
		return err
	}
	return validateHold(items)
}

// deniedHold returns a Hold that holds nothing, with these decisions (at
// least one not allowed): what a store that wraps another returns when it
// denies a reservation itself (a fail-closed rule while the backend is
// down, say). Its Settle returns errNotHeld.
func deniedHold(decisions []spillway.Decision) *Hold {
	return &Hold{dec: decisions}
}

// holdTTLOf validates a Reserve's ttl (0: DefaultHoldTTL) and returns it
// in µs.
func holdTTLOf(ttl time.Duration) (int64, time.Duration, error) {
	if ttl == 0 {
		ttl = DefaultHoldTTL
	}
	if ttl < time.Millisecond || ttl > MaxHoldTTL {
		return 0, 0, fmt.Errorf("ratelimit: hold ttl %v must be between 1ms and %v", ttl, MaxHoldTTL)
	}
	return ttl.Microseconds(), ttl, nil
}

// validateHold checks a Reserve's items: valid, of the bucket family, with
// a span that holds keep exact.
func validateHold(items []Item) error {
	for i := range items {
		it := &items[i]
		if err := validateItem(it); err != nil {
			return wrapf(err, "item %d", i)
		}
		switch it.Policy.Algorithm {
		case TokenBucket, GCRA, LeakyBucket:
		default:
			return wrapf(fmt.Errorf("%w: %s keeps no holds (only token_bucket, gcra and leaky_bucket do)", ErrHoldUnsupported, it.Policy.Algorithm), "item %d", i)
		}
		if p := it.Policy; p.effectiveBurst() > maxHoldSpan/p.emissionInterval() {
			return wrapf(fmt.Errorf("%w: burst %d × interval %dµs exceeds 2^51 µs, the bound for holds", ErrInvalidPolicy, p.effectiveBurst(), p.emissionInterval()), "item %d", i)
		}
	}
	return nil
}

// holdMember is the name of item i's hold in a store: the hold id and the
// item's index, so two items of one batch on one key stay apart.
func holdMember(id string, i int) string { return id + "/" + strconv.Itoa(i) }

// ---------------------------------------------------------------------------
// The arithmetic of holds (both stores; the scripts follow it line by line).
// ---------------------------------------------------------------------------

// heldNow is now after the clamp for time going backwards: TAT − τ, or
// TAT − 2τ for a marked key.
func heldNow(tat, now int64, p *limits, marked bool) int64 {
	if now < 0 {
		now = 0
	}
	slack := p.tau
	if marked {
		slack = 2 * p.tau // τ ≤ 2^52: no overflow
	}
	if lo := tat - slack; now < lo {
		now = lo
	}
	return now
}

// heldDecide is bucketDecide for a key that may be marked: identical when
// it is not; when it is, the clamp is TAT − 2τ and wait may exceed τ (a
// debt), which only Remaining (floored at 0) and the retry reflect. It
// returns the TAT to write (tat when nothing is) and t, now after the
// clamp.
func heldDecide(tat, now int64, p *limits, n int64, marked bool) (o outcome, newTAT, t int64) {
	t = heldNow(tat, now, p, marked)
	wait := max(tat, t) - t // in [0, 2τ]
	o = waitOutcome(wait, p, n)
	if !o.allowed || n == 0 {
		return o, tat, t
	}
	return o, satAdd(t, o.reset), t
}

// waitOutcome is the decision of cost n on a bucket wait µs from full
// (wait = max(TAT, now') − now', in [0, 2τ]): how both stores turn a
// bucket's state, or a script's reply, into a decision. For wait ≤ τ it
// is bucketDecide's.
func waitOutcome(wait int64, p *limits, n int64) outcome {
	T, tau := p.T, p.tau
	room := max(tau-wait, 0)
	if n > p.B {
		return outcome{exceeds: true, remaining: room / T, reset: wait}
	}
	need := wait + n*T       // ≤ 3τ
	if n > 0 && need > tau { // a peek is allowed even in debt
		return outcome{remaining: room / T, reset: wait, retry: need - tau}
	}
	return outcome{allowed: true, remaining: max(tau-need, 0) / T, reset: need, delay: wait}
}

// heldRefund gives units back: TAT moves back units·T, but never past t
// (a full bucket stays as it is).
func heldRefund(tat, t, units, T int64) int64 {
	if tat <= t {
		return tat
	}
	return max(tat-satMul(units, T), t)
}

// heldCharge charges units after the fact: from max(TAT, t), up to one
// Burst of debt (TAT ≤ t + 2τ).
func heldCharge(tat, t, units int64, p *limits) int64 {
	return min(satAdd(max(tat, t), satMul(units, p.T)), satAdd(t, 2*p.tau))
}

// heldSettle applies a settle of actual against estimate.
func heldSettle(tat, t, estimate, actual int64, p *limits) int64 {
	switch {
	case actual < estimate:
		return heldRefund(tat, t, estimate-actual, p.T)
	case actual > estimate:
		return heldCharge(tat, t, actual-estimate, p)
	}
	return tat
}
