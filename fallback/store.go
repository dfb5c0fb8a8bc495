package fallback

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/budget"
	"github.com/spillway-go/spillway/internal/fallbackview"
	"github.com/spillway-go/spillway/internal/share"
	"github.com/spillway-go/spillway/ratelimit"
)

// Store is a ratelimit.Store that puts a time budget, a circuit breaker, a
// local share, fail-open/fail-closed per item, a cache of denials and
// reconcile in front of another store (a ratelimit.RedisStore, typically).
// While the store cannot answer, a batch with a fail-closed item
// (ratelimit.Item.Fail, which tiers sets from each rule's `fail:` and
// ratelimit.Settings.FailMode per limiter; or Settings.Fail for every item) is
// denied, its fail-closed items with spillway.ReasonFailClosed; other
// batches are decided by the local share.
// Its Decide never returns the inner store's errors: a failed or refused
// call is decided locally, marked Degraded. Errors are returned only for
// invalid items, when the caller's context is canceled, and when its
// deadline passes before the decision: as the call comes (refused at once,
// decided neither by the inner store nor locally) or while the inner store
// has it (not decided locally: the caller has stopped waiting). Only the
// Store's own budget, or the chain's, ending first makes a local decision.
// A call whose budget ran out in this process (a queue, the pool, the CPU)
// before Redis could answer is overload: it is refused, undecided, with
// an error that matches spillway.ErrBudgetSpent (in a chain, the block's
// fail mode answers it), and never counted against the inner store (see
// NewHealth).
//
// Reconcile: while decisions are local, the Store records per key the
// units it admitted locally. On the first successful call to the inner
// store afterwards it starts a reconcile pass in the background
// (Settings.OnReconcile is told how it went): for every recorded key it carries back the local
// consumption of the last Period before now (a sliding-window estimate over
// two fixed windows), capped at the policy's capacity, by charging it to
// the inner store with its ordinary Decide, as much as the key has room
// for (a peek first, then a charge of min(carry, remaining)). So a fleet
// that admitted its local shares during an outage finds the keys as drained
// as those admissions made them — an outage is no free refill — while
// consumption older than a Period, which the store would have refilled by
// now anyway, is not carried. Decisions the inner store makes for a key
// before its charge lands (the pass takes a round trip per key) do not see
// it yet.
//
// A Store is safe for concurrent use.
type Store struct {
	inner   ratelimit.Store
	bounded boundedStore // inner, when it takes a deadline apart from the context
	local   ratelimit.Store
	set     Settings
	br      *Health
	ppm     uint64       // a fixed Settings.Share; 0: the health's share, read per local decision
	share   *share.State // the share of the store's client (or the health's), when ppm is 0
	cache   *denyCache   // nil when disabled
	ledger  *ledger      // nil when disabled

	// direct: the inner store's calls end at their context's deadline (a
	// RedisStore whose client NewHealth or NewStore made honour deadlines,
	// a MemoryStore); otherwise each call runs detached (Health.detach).
	direct bool

	reconciling atomic.Bool
	retryAt     atomic.Int64 // Unix ns before which no reconcile pass starts by itself (keys left pending)
	stats       storeStats
}

// boundedStore is a store that bounds one Decide by a deadline given apart
// from the context (ratelimit.RedisStore.DecideBy): no timer per call.
type boundedStore interface {
	ratelimit.Store
	DecideBy(ctx context.Context, deadline time.Time, items []ratelimit.Item, out []spillway.Decision) (bool, error)
}

var _ ratelimit.Store = (*Store)(nil)

type storeStats struct {
	calls, degraded, overloaded, refused, cacheHits, reconciled atomic.Int64
}

// counts is what a Store did since it was created.
type counts struct {
	Calls      int64 // Decide calls the inner store answered
	Degraded   int64 // Decide calls answered locally (breaker open, call failed, or time spent in this process)
	Overloaded int64 // calls whose time was spent in this process (a spent budget, a queue, the pool, the CPU), not by Redis: Refused, and the Degraded ones whose budget the blocks before spent
	Refused    int64 // Decide calls refused, undecided, because their budget ran out in this process (errOverloaded)
	CacheHits  int64 // Decide calls answered from the cache of denials
	Reconciled int64 // units carried back to the inner store by reconcile
	Skipped    int64 // local admissions not recorded for reconcile because the ledger was full
}

// NewStore wraps inner. It returns an error naming the field when s is
// invalid or inner is nil.
//
// When inner is a RedisStore, NewStore makes its go-redis client honour
// context deadlines (as NewHealth does) and, given no Health, probes it
// with a PING; calls to another inner store (other than a MemoryStore,
// which never waits) run detached, so that the budget holds whatever the store does
// (see MaxAbandoned). A RedisStore's settles sent off the request path
// are gated by the health: nothing is sent while it is not closed.
func NewStore(inner ratelimit.Store, s Settings) (*Store, error) {
	if inner == nil {
		return nil, errors.New("fallback: inner store is nil")
	}
	client := clientOf(inner)
	if s.Health == nil && client != nil && s.Failures == 0 && s.OpenTimeout == 0 && s.Probes == 0 && s.OnStateChange == nil {
		s.Health = healthOf(client) // the client's shared health, when it has one
	}
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	st := &Store{inner: inner, set: s, br: s.health(client)}
	if s.Share != 0 {
		st.ppm = sharePPM(s.Share)
	} else {
		st.share = st.br.share
	}
	st.direct = st.br.direct
	st.br.noteBudget(s.Budget)
	if client != nil {
		st.direct = honourDeadlines(client)
	}
	if _, mem := inner.(*ratelimit.MemoryStore); mem {
		st.direct = true // never waits
	}
	st.bounded, _ = inner.(boundedStore)
	// The store's calls after admission (a RedisStore's settles sent in
	// the background) go out only while the health is closed.
	rateHooks.SetGate(inner, st.br.closed.Load)
	st.local = s.Local
	if st.local == nil {
		st.local = ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: s.Clock, MaxKeys: 1 << 16})
	}
	if s.DenyCacheSize > 0 {
		st.cache = newDenyCache(s.DenyCacheSize)
	}
	if s.LedgerSize > 0 {
		st.ledger = newLedger(s.LedgerSize)
	}
	return st, nil
}

// sharePPM is the local share in parts per million: Settings.Share when
// set, else the share of the fleet the health last saw (see Settings.Share).
func (s *Store) sharePPM() uint64 {
	if s.ppm != 0 {
		return s.ppm
	}
	return sharePPM(s.share.Share())
}

func (s *Store) counts() counts {
	st := counts{
		Calls:      s.stats.calls.Load(),
		Degraded:   s.stats.degraded.Load(),
		Overloaded: s.stats.overloaded.Load(),
		Refused:    s.stats.refused.Load(),
		CacheHits:  s.stats.cacheHits.Load(),
		Reconciled: s.stats.reconciled.Load(),
	}
	if s.ledger != nil {
		st.Skipped = s.ledger.skipped.Load()
	}
	return st
}

// clientOf returns the go-redis client a store sends its commands
// through (a ratelimit.RedisStore's), or nil.
func clientOf(inner ratelimit.Store) redis.UniversalClient { return rateHooks.Client(inner) }

func (s *Store) now() int64 { return s.set.Clock().UnixMicro() }

// smallBatch is the batch size decided without allocating.
const smallBatch = 8

// itemPool holds the scaled copies of small batches: a slice passed to the
// local store's interface method would escape to the heap.
var itemPool = sync.Pool{New: func() any { return new([smallBatch]ratelimit.Item) }}

// Decide implements ratelimit.Store: it decides items on the wrapped store
// within the budget, and locally (marked Degraded) when the breaker is
// open, the call fails or the budget is spent; fail-closed items are then
// denied with spillway.ReasonFailClosed. It returns an error only for
// invalid input or a ctx that ended; see Store for what it adds.
func (s *Store) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	if len(out) < len(items) {
		return false, fmt.Errorf("fallback: out has %d decisions for %d items", len(out), len(items))
	}
	for i := range items {
		if items[i].Cost < 0 {
			return false, fmt.Errorf("fallback: item %d: %w: cost %d is negative", i, ratelimit.ErrInvalidCost, items[i].Cost)
		}
		if err := items[i].Policy.Validate(); err != nil {
			return false, fmt.Errorf("fallback: item %d: %w", i, err)
		}
	}
	if len(items) == 0 {
		return true, nil
	}
	// one read of the clock for the checks, the budget and the guard
	now := time.Now()
	if err := callerGoneAt(ctx, now); err != nil {
		// The caller has stopped waiting: refused at once, neither
		// decided nor counted.
		return false, &canceledError{err: err}
	}
	if s.cache != nil && s.answerFromCache(items, out) {
		s.stats.cacheHits.Add(1)
		return false, nil
	}
	// The breaker inline rather than through Health.call: no closure to
	// allocate on the hot path, and no context when the breaker is open or
	// the request's budget is spent. A boundedStore (a RedisStore) takes
	// the budget's deadline as an argument: no context, and no timer, per
	// call.
	deadline, total, ok := budget.DeadlineAt(ctx, s.set.Budget, now)
	if !ok {
		return s.decideLocal(ctx, items, out, spillway.ErrBudgetSpent)
	}
	var allowed bool
	done, err := s.br.allow()
	if err == nil {
		sc := s.br.guardAt(ctx, now, deadline, total, s.set.Budget, s.bounded == nil || !s.direct)
		switch {
		case !s.direct:
			allowed, err = s.decideDetached(sc.ctx, deadline, items, out)
		case s.bounded != nil:
			allowed, err = s.bounded.DecideBy(sc.ctx, deadline, items, out)
		default:
			allowed, err = s.inner.Decide(sc.ctx, items, out)
		}
		sc.end()
		err = s.br.finish(ctx, done, err, sc)
	}
	if err == nil {
		s.stats.calls.Add(1)
		if s.cache != nil && !allowed {
			now := s.now()
			for i := range items {
				if !out[i].Allowed {
					s.cache.add(itemKey{items[i].Scope, items[i].Key, items[i].Policy}, items[i].Cost, now, out[i])
				}
			}
		}
		if s.ledger != nil && s.ledger.pending() && time.Now().UnixNano() >= s.retryAt.Load() && s.reconciling.CompareAndSwap(false, true) {
			go func() {
				defer s.reconciling.Store(false)
				_ = s.reconcile(context.Background())
			}()
		}
		return allowed, nil
	}
	if _, ok := err.(*canceledError); ok { // finish returns it unwrapped
		return false, err
	}
	if cerr := callerGone(ctx); cerr != nil {
		// The caller's own deadline passed during the call: it has stopped
		// waiting, and a local decision now would be late. Refused, like a
		// call that comes after its deadline (the call was counted above
		// for what Redis did).
		return false, &canceledError{err: cerr}
	}
	if errors.Is(err, errOverloaded) {
		// Refused, not approximated (see errOverloaded).
		s.stats.overloaded.Add(1)
		s.stats.refused.Add(1)
		return false, err
	}
	if s.br.shards != nil && len(items) > 1 && errors.Is(err, ErrOpen) {
		if allowed, ok, err := s.decideSplit(ctx, items, out, err); ok {
			return allowed, err
		}
	}
	return s.decideLocal(ctx, items, out, err)
}

// callerGone returns ctx's error, or context.DeadlineExceeded once its
// deadline has passed even if its timer has not fired yet (a socket
// deadline set to the same instant may end the call first).
func callerGone(ctx context.Context) error { return callerGoneAt(ctx, time.Now()) }

// callerGoneAt is callerGone at now.
func callerGoneAt(ctx context.Context, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !now.Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// decideSplit decides a batch over several Cluster nodes of which some
// are open: the items whose node answers on Redis, the others locally,
// still all or nothing. Which node answers is found by a peek of each item
// alone (an open node refuses at once). The failed part is decided first,
// locally; the healthy part is then charged on Redis only if it allowed
// (else only peeked, for its decisions). ok is false when the batch is not
// split that way (every node, or none, answers; a call fails): it is then
// decided locally as a whole.
func (s *Store) decideSplit(ctx context.Context, items []ratelimit.Item, out []spillway.Decision, cause error) (allowed, ok bool, err error) {
	var healthy, failed []int
	for i := range items {
		peek := [1]ratelimit.Item{items[i]}
		peek[0].Cost = 0
		var d [1]spillway.Decision
		err := s.br.bypass(ctx, s.set.Budget, func(ctx context.Context) error {
			_, err := s.inner.Decide(ctx, peek[:], d[:])
			return err
		})
		switch {
		case err == nil:
			healthy = append(healthy, i)
		case errors.Is(err, ErrOpen):
			failed = append(failed, i)
		default:
			return false, false, nil
		}
	}
	if len(healthy) == 0 || len(failed) == 0 {
		return false, false, nil
	}
	part := func(idx []int) ([]ratelimit.Item, []spillway.Decision) {
		its := make([]ratelimit.Item, len(idx))
		for j, i := range idx {
			its[j] = items[i]
		}
		return its, make([]spillway.Decision, len(idx))
	}
	fItems, fOut := part(failed)
	okLocal, err := s.decideLocal(ctx, fItems, fOut, cause)
	if err != nil {
		return false, true, err
	}
	hItems, hOut := part(healthy)
	if !okLocal {
		for j := range hItems {
			hItems[j].Cost = 0 // the batch is denied: only looked at
		}
	}
	var okRedis bool
	if err := s.br.bypass(ctx, s.set.Budget, func(ctx context.Context) error {
		var err error
		okRedis, err = s.inner.Decide(ctx, hItems, hOut)
		return err
	}); err != nil {
		// the healthy part failed meanwhile: locally too
		if okRedis, err = s.decideLocal(ctx, hItems, hOut, err); err != nil {
			return false, true, err
		}
	}
	for j, i := range failed {
		out[i] = fOut[j]
	}
	for j, i := range healthy {
		out[i] = hOut[j]
	}
	return okLocal && okRedis, true, nil
}

// decideDetached is inner.Decide run detached (Health.detach), on copies
// of items and out: the caller may return, and reuse them, before it ends.
func (s *Store) decideDetached(ctx context.Context, deadline time.Time, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	its := slices.Clone(items)
	res := make([]spillway.Decision, len(items))
	var allowed bool
	err := s.br.detach(ctx, deadline, func(ctx context.Context) error {
		var err error
		allowed, err = s.inner.Decide(ctx, its, res)
		return err
	}, nil)
	if err != nil {
		return false, err // allowed is the abandoned call's
	}
	copy(out, res)
	return allowed, nil
}

// answerFromCache reports whether a cached denial decides the batch; it
// then fills out. Items without a cached denial are reported allowed, with
// their Limit and nothing known about Remaining (0): nothing is charged.
func (s *Store) answerFromCache(items []ratelimit.Item, out []spillway.Decision) bool {
	if s.cache.len() == 0 {
		return false
	}
	now := s.now()
	hit := -1
	for i := range items {
		if d, ok := s.cache.lookup(itemKey{items[i].Scope, items[i].Key, items[i].Policy}, items[i].Cost, now); ok {
			out[i] = d
			hit = i
			break
		}
	}
	if hit < 0 {
		return false
	}
	for i := range items {
		if i == hit {
			continue
		}
		if d, ok := s.cache.lookup(itemKey{items[i].Scope, items[i].Key, items[i].Policy}, items[i].Cost, now); ok {
			out[i] = d
			continue
		}
		out[i] = spillway.Decision{Allowed: true, Limiter: items[i].Scope, Limit: items[i].Policy.Capacity()}
	}
	return true
}

// decideLocal decides items from the local share (fail-open items) or
// denies them (fail-closed items), all or nothing like any store.
func (s *Store) decideLocal(ctx context.Context, items []ratelimit.Item, out []spillway.Decision, cause error) (bool, error) {
	s.stats.degraded.Add(1)
	if errors.Is(cause, spillway.ErrBudgetSpent) {
		s.stats.overloaded.Add(1)
	}
	var scaled []ratelimit.Item
	if len(items) <= smallBatch {
		buf := itemPool.Get().(*[smallBatch]ratelimit.Item)
		defer func() {
			clear(buf[:]) // drop the strings
			itemPool.Put(buf)
		}()
		scaled = buf[:0]
	} else {
		scaled = make([]ratelimit.Item, 0, len(items))
	}
	closed := false
	ppm := s.sharePPM()
	for i := range items {
		it := items[i]
		it.Policy = scalePolicy(it.Policy, ppm)
		scaled = append(scaled, it)
		if s.failClosed(&it) {
			closed = true
		}
	}
	var allowed bool
	if closed {
		// Peek the fail-open items so their decisions say what they have
		// left; charge nothing since the batch is denied.
		for i := range scaled {
			scaled[i].Cost = 0
		}
		if _, err := s.local.Decide(ctx, scaled, out); err != nil {
			return false, fmt.Errorf("fallback: local store: %w", err)
		}
		for i := range items {
			if s.failClosed(&items[i]) {
				out[i] = spillway.Decision{
					Reason:     spillway.ReasonFailClosed,
					Limiter:    items[i].Scope,
					Limit:      items[i].Policy.Capacity(),
					RetryAfter: s.set.OpenTimeout,
				}
			}
		}
	} else {
		var err error
		allowed, err = s.local.Decide(ctx, scaled, out)
		if err != nil {
			return false, fmt.Errorf("fallback: local store: %w", err)
		}
		if allowed && s.ledger != nil {
			now := s.now()
			for i := range items {
				s.ledger.record(itemKey{items[i].Scope, items[i].Key, items[i].Policy}, items[i].Cost, now)
			}
		}
	}
	ev := DegradedEvent{Name: s.set.Name, Scope: items[0].Scope, Allowed: allowed, Cause: cause}
	for i := range items {
		d := &out[i]
		d.Degraded = true
		// A cost the full policy admits but the share cannot is not
		// "never": it can succeed once the store is back.
		if d.Reason == spillway.ReasonCostExceedsLimit && items[i].Cost <= items[i].Policy.Capacity() {
			d.Reason = spillway.ReasonRateLimited
			d.RetryAfter = s.set.OpenTimeout
		}
		if !d.Allowed && ev.Reason == spillway.ReasonNone {
			ev.Scope, ev.Reason = items[i].Scope, d.Reason
		}
	}
	if s.set.OnDegraded != nil {
		s.set.OnDegraded(ev)
	}
	return allowed, nil
}

// failClosed reports whether it must be denied while the store cannot
// answer: its own fail mode or the Store's says closed.
func (s *Store) failClosed(it *ratelimit.Item) bool {
	return it.Fail == spillway.FailClosed || s.set.Fail == spillway.FailClosed
}

// Reset implements ratelimit.Store: it forgets (scope, key) in the inner
// store (under the budget and the breaker), in the local share and in the
// cache of denials. The inner store's error is returned, wrapped.
func (s *Store) Reset(ctx context.Context, scope, key string, p ratelimit.Policy) error {
	_ = s.local.Reset(ctx, scope, key, scalePolicy(p, s.sharePPM()))
	if s.cache != nil {
		s.cache.remove(itemKey{scope, key, p})
	}
	err := s.br.call(ctx, s.set.Budget, s.direct, func(ctx context.Context) error { return s.inner.Reset(ctx, scope, key, p) }, nil)
	if err != nil {
		return fmt.Errorf("fallback: reset: %w", err)
	}
	return nil
}

// Flush sends now what the inner store queued to send in the background
// (the settles of holds, on a RedisStore); otherwise it does nothing.
// tiers.Limiter.Flush calls it at shutdown. It is not gated by the
// health: ctx bounds it.
func (s *Store) Flush(ctx context.Context) error { return rateHooks.Flush(ctx, s.inner) }

// reconcileBatch is the number of keys peeked in one call.
const reconcileBatch = 64

func (s *Store) reconcile(ctx context.Context) error {
	charges := s.ledger.take(s.now())
	ev := ReconcileEvent{Name: s.set.Name}
	var (
		left    []charge
		lastErr error
	)
	for done := 0; done < len(charges); {
		batch := charges[done:min(done+reconcileBatch, len(charges))]
		done += len(batch)
		n, err := s.carry(ctx, batch, &ev)
		if err == nil {
			continue
		}
		// Part of the batch failed (on a Cluster, one shard may still be
		// away): each key left alone, so that the others land now.
		for i := n; i < len(batch); i++ {
			if _, err := s.carry(ctx, batch[i:i+1], &ev); err != nil {
				left = append(left, batch[i])
				lastErr = err
			}
		}
	}
	if len(left) > 0 {
		s.ledger.restore(left, s.now())
		ev.Pending = len(left)
		// not again before a quarter of OpenTimeout: the store is still
		// failing for these keys
		s.retryAt.Store(time.Now().Add(s.set.OpenTimeout / 4).UnixNano())
	}
	ev.Err = lastErr
	s.stats.reconciled.Add(ev.Charged)
	if s.set.OnReconcile != nil && (len(charges) > 0 || lastErr != nil) {
		s.set.OnReconcile(ev)
	}
	if lastErr != nil {
		return fmt.Errorf("fallback: reconcile: %w", lastErr)
	}
	return nil
}

// carry charges batch's carries to the inner store: a peek of every key,
// then a charge of min(carry, remaining) per key (peeked again and retried
// when traffic took the room meanwhile, twice at most). It returns how
// many keys of batch were carried before an error.
func (s *Store) carry(ctx context.Context, batch []charge, ev *ReconcileEvent) (int, error) {
	var (
		items [reconcileBatch]ratelimit.Item
		out   [reconcileBatch]spillway.Decision
	)
	for i, c := range batch {
		items[i] = ratelimit.Item{Scope: c.k.scope, Key: c.k.key, Policy: c.k.policy}
	}
	n := len(batch)
	if err := s.br.bypass(ctx, s.set.Budget, func(ctx context.Context) error {
		_, err := s.inner.Decide(ctx, items[:n], out[:n])
		return err
	}); err != nil {
		return 0, err
	}
	for i, c := range batch {
		room := out[i].Remaining
		for try := 0; try < 3; try++ {
			cost := min(c.carry, room)
			if cost <= 0 {
				break
			}
			one := [1]ratelimit.Item{items[i]}
			one[0].Cost = cost
			var d [1]spillway.Decision
			var ok bool
			if err := s.br.bypass(ctx, s.set.Budget, func(ctx context.Context) error {
				var err error
				ok, err = s.inner.Decide(ctx, one[:], d[:])
				return err
			}); err != nil {
				return i, err
			}
			if ok {
				ev.Charged += cost
				break
			}
			room = d[0].Remaining // taken meanwhile: what is left now
		}
		ev.Keys++
	}
	return n, nil
}

func init() {
	fallbackview.HealthOf = func(client redis.UniversalClient) any {
		if h := healthOf(client); h != nil {
			return h
		}
		return nil
	}
	fallbackview.StoreHealth = func(store any) any { return store.(*Store).br }
	fallbackview.StoreDegraded = func(store any) (int64, int64) {
		c := store.(*Store).counts()
		return c.Degraded, c.Overloaded - c.Refused
	}
	fallbackview.StoreRefused = func(store any) int64 { return store.(*Store).counts().Refused }
}
