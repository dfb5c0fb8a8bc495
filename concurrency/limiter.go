package concurrency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/budget"
	"github.com/spillway-go/spillway/internal/cchook"
	"github.com/spillway-go/spillway/internal/share"
)

// Limiter admits at most Limit units of one key in flight at a time,
// across every process that shares its Store: a request of cost c holds c
// units. Create it with New.
type Limiter struct {
	store    Store
	limit    int64
	o        options
	idPrefix string
	seq      atomic.Uint64

	// Releases that failed (the store did not answer within the release
	// timeout), retried after the next Acquire the store answers.
	mu        sync.Mutex
	pending   []pendingRelease
	npending  atomic.Int64
	dropped   atomic.Int64
	retrying  atomic.Bool
	retryWait sync.WaitGroup

	releasing sync.WaitGroup // releases done handed to the background, not yet answered
	// The keys with a release in flight, and a channel each that closes
	// when the key's last one is answered (see waitRelease).
	relMu   sync.Mutex
	relKeys map[string]*keyReleases
	relN    atomic.Int64 // len(relKeys): while 0, Acquire takes no lock for it

	// On a RedisStore: this process's units in flight per key and the
	// client's local share, for the decisions made while Redis cannot
	// answer (see acquireRedis).
	held   *held
	shares *share.State
}

func init() {
	cchook.PendingReleases = func(l any) (int64, int64) { return l.(*Limiter).pendingReleases() }
}

// pendingRelease is a release to retry.
type pendingRelease struct {
	key, id string
	n       int64
	at      time.Time // when the request was admitted
}

// Settings configures a Limiter (New, NewInFlight). The zero value is
// the default.
type Settings struct {
	// Name names the limiter (New: "" is "concurrency"; NewInFlight: it
	// must be set). The name is the Decision.Limiter and the scope of the
	// keys: two limiters with different names keep separate sets for the
	// same key.
	Name string
	// FailMode is what the limiter does when its store cannot answer
	// (default spillway.FailOpen). On a RedisStore: FailOpen decides
	// locally at this server's share, FailClosed denies with
	// spillway.ReasonFailClosed (a 503), both marked Degraded. On another
	// store, the *spillway.StoreError that Acquire and PerKey return
	// carries it, and the adapters deny a request whose error asks for
	// spillway.FailClosed whatever their own default.
	FailMode spillway.FailMode
	// TTL is how long an entry may stay in flight before it is reaped as
	// a leak (0: 1 minute). Set it above the longest legitimate request:
	// a request that outlives the TTL loses its slot while it still runs.
	// A server that crashes mid-request blocks its slots for at most the
	// TTL. Redis keeps TTLs in whole milliseconds, so it is rounded up to
	// one.
	TTL time.Duration
	// RetryAfter is the RetryAfter of a denial (0: 1 s): a slot frees when
	// any request of the key finishes, which the limiter cannot foresee,
	// so the hint is a typical request duration. It is capped by the time
	// until the oldest entry is reaped, when that is sooner.
	RetryAfter time.Duration
	// ReleaseTimeout bounds the store call of a Done (0:
	// spillway.DefaultBudget, 50 ms). A Done does not wait for the store:
	// it hands the release to a goroutine of its own and returns, so a
	// response is not delayed by a slow or stopped store. An Acquire that
	// the store denies while a release of the same key is in flight waits
	// for that release (within ReleaseTimeout and the request's budget;
	// one such Acquire per release) and asks again, so a client that sends
	// its next request as soon as the last one answered finds its slot
	// free (WaitReleases waits for the releases handed off). The release
	// runs detached from the admission
	// context's cancellation (a cancelled request must still release its
	// slot) but keeps its values. A release that fails is not lost: see
	// MaxPendingReleases.
	ReleaseTimeout time.Duration
	// OnReleaseError, when set, is called when a Done fails to release its
	// entry (the store was unreachable, or the store's circuit breaker is
	// open); the release is then retried later (see MaxPendingReleases).
	OnReleaseError func(error)
	// MaxPendingReleases bounds the releases kept for a retry (0: 4096;
	// negative: none kept). A release that fails is kept and retried in
	// the background after the next Acquire the store answers, so a store
	// outage does not leave slots taken once the store is back; a release
	// older than the TTL is dropped instead (the store has reaped its
	// entry by then), and so is one that finds the list full: its entry
	// is reaped after the TTL.
	MaxPendingReleases int
}

type options struct {
	name           string
	ttl            time.Duration
	retryAfter     time.Duration
	releaseTimeout time.Duration
	onReleaseError func(error)
	maxPending     int
	fail           spillway.FailMode
}

// New returns a limiter that admits at most limit units per key in flight
// (limit requests of cost 1). It fails when store is nil, limit is below 1
// or a setting is out of range (a negative duration).
func New(store Store, limit int64, s Settings) (*Limiter, error) {
	o := options{name: s.Name, ttl: s.TTL, retryAfter: s.RetryAfter, releaseTimeout: s.ReleaseTimeout,
		onReleaseError: s.OnReleaseError, maxPending: s.MaxPendingReleases, fail: s.FailMode}
	if o.name == "" {
		o.name = "concurrency"
	}
	o.ttl = orDefault(o.ttl, time.Minute)
	o.retryAfter = orDefault(o.retryAfter, time.Second)
	o.releaseTimeout = orDefault(o.releaseTimeout, spillway.DefaultBudget)
	switch {
	case o.maxPending == 0:
		o.maxPending = 4096
	case o.maxPending < 0:
		o.maxPending = 0
	}
	switch {
	case store == nil:
		return nil, fmt.Errorf("concurrency: New: store is nil")
	case limit < 1:
		return nil, fmt.Errorf("concurrency: New: limit %d must be at least 1", limit)
	case isRedis(store) && limit > MaxRedisLimit:
		return nil, fmt.Errorf("concurrency: New: limit %d exceeds MaxRedisLimit %d of the Redis store (one member per unit in flight)", limit, MaxRedisLimit)
	case o.ttl <= 0:
		return nil, fmt.Errorf("concurrency: New: ttl %v must be positive", o.ttl)
	case o.retryAfter <= 0:
		return nil, fmt.Errorf("concurrency: New: retry after %v must be positive", o.retryAfter)
	case o.releaseTimeout <= 0:
		return nil, fmt.Errorf("concurrency: New: release timeout %v must be positive", o.releaseTimeout)
	case o.fail > spillway.FailClosed:
		return nil, fmt.Errorf("concurrency: New: unknown fail mode %d (want spillway.FailOpen or spillway.FailClosed)", uint8(o.fail))
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("concurrency: New: request id prefix: %w", err)
	}
	l := &Limiter{store: store, limit: limit, o: o, idPrefix: hex.EncodeToString(b[:]) + ":"}
	if rs, ok := store.(*RedisStore); ok {
		l.held, l.shares = newHeld(), share.Of(rs.client)
	}
	return l, nil
}

// orDefault is d, or def when d is 0.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func isRedis(s Store) bool { _, ok := s.(*RedisStore); return ok }

// Acquire admits a request of key that holds n units when the units in
// flight plus n are at most Limit. n = 0 means 1, as spillway.Request.Cost
// does; a negative n is an error.
//
// Allowed: Remaining is Limit minus the units in flight (this request's
// included); done frees the request's n units — call it once when the work
// ends; further calls do nothing. done does not wait for the store: the
// release runs on a goroutine of its own (see Settings.ReleaseTimeout).
// Denied: Reason is spillway.ReasonConcurrency (answer 429), Remaining is
// the units left (fewer than n; 0 for n = 1) and RetryAfter is the
// Settings.RetryAfter hint,
// or the time until enough of the oldest entries are reaped for n units to
// fit when sooner. An n above Limit can never be admitted: it is denied
// with spillway.ReasonCostExceedsLimit, Remaining 0 and no RetryAfter,
// without a store call. ResetAfter is always 0: when the key is back to
// empty depends on requests the limiter cannot foresee. On a RedisStore a
// store that cannot answer is decided locally (see the package doc and
// Settings.FailMode) and err != nil only for a negative n or a caller that
// canceled. On a MemoryStore, err != nil means only that the store failed:
// it is a *spillway.StoreError (errors.Is(err, spillway.ErrStoreUnavailable))
// with the Settings.FailMode mode, wrapping the store's error.
func (l *Limiter) Acquire(ctx context.Context, key string, n int64) (spillway.Decision, spillway.Done, error) {
	switch {
	case n < 0:
		return spillway.Decision{}, spillway.Noop, fmt.Errorf("concurrency: %s: cost %d is negative", l.o.name, n)
	case n == 0:
		n = 1
	case n > l.limit:
		return spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: l.o.name, Limit: l.limit}, spillway.Noop, nil
	}
	inFlight := l.releasesOf(key) // before the store call: one may land during it
	d, done, err := l.acquire(ctx, key, n)
	if err == nil && !d.Allowed && !d.Degraded && l.waitRelease(ctx, inFlight) {
		// The store answered, and a release of this key done handed off
		// was still in flight: once it lands, the units it frees may admit
		// this request (a client that sends its next request as soon as
		// the last one answered). A local decision does not wait: the
		// store it would wait on is not answering.
		return l.acquire(ctx, key, n)
	}
	return d, done, err
}

// acquire is one store decision of Acquire.
func (l *Limiter) acquire(ctx context.Context, key string, n int64) (spillway.Decision, spillway.Done, error) {
	if l.held != nil {
		return l.acquireRedis(ctx, key, n)
	}
	id := l.idPrefix + strconv.FormatUint(l.seq.Add(1), 36)
	res, err := l.store.acquire(ctx, l.o.name, key, id, n, l.limit, l.o.ttl)
	if err != nil {
		return spillway.Decision{}, spillway.Noop, &spillway.StoreError{Limiter: l.o.name, Fail: l.o.fail, Err: err}
	}
	if l.npending.Load() > 0 {
		l.retryPending()
	}
	d := l.decision(res)
	if !res.Allowed {
		return d, spillway.Noop, nil
	}
	if _, local := l.store.(*MemoryStore); local {
		// A memory release cannot block and ignores its context: none is
		// kept.
		return d, block.Once(func(spillway.Outcome) { _ = l.store.release(context.Background(), l.o.name, key, id, n) }), nil
	}
	at := time.Now()
	return d, block.Once(func(spillway.Outcome) { l.releaseAsync(ctx, key, id, n, at) }), nil
}

// keyReleases counts a key's releases in flight; done closes when the
// count is back to 0. waited says a denied Acquire already waits for
// them: one at a time, so a flood of denials for a hot key costs Redis at
// most one more call per release, not one per denial.
type keyReleases struct {
	n      int
	waited bool
	done   chan struct{}
}

// releaseAsync runs a done's release on a goroutine of its own, bounded by
// the release timeout, and returns at once: the release leaves the
// response path (a denied Acquire of the same key waits for it, see
// waitRelease). A release that fails is kept for a retry.
func (l *Limiter) releaseAsync(ctx context.Context, key, id string, n int64, at time.Time) {
	l.releasing.Add(1)
	l.relMu.Lock()
	if l.relKeys == nil {
		l.relKeys = make(map[string]*keyReleases)
	}
	kr := l.relKeys[key]
	if kr == nil {
		kr = &keyReleases{done: make(chan struct{})}
		l.relKeys[key] = kr
		l.relN.Add(1)
	}
	kr.n++
	l.relMu.Unlock()
	go func() {
		defer l.releasing.Done()
		if err := l.release(context.WithoutCancel(ctx), key, id, n); err != nil {
			l.keep(pendingRelease{key: key, id: id, n: n, at: at})
			if l.o.onReleaseError != nil {
				l.o.onReleaseError(err)
			}
		}
		l.relMu.Lock()
		if kr.n--; kr.n == 0 {
			delete(l.relKeys, key)
			l.relN.Add(-1)
			close(kr.done)
		}
		l.relMu.Unlock()
	}()
}

// releasesOf returns the releases of key in flight, nil if none.
func (l *Limiter) releasesOf(key string) *keyReleases {
	if l.relN.Load() == 0 {
		return nil
	}
	l.relMu.Lock()
	defer l.relMu.Unlock()
	return l.relKeys[key]
}

// waitRelease waits for the releases kr counts to be answered, at most
// the release timeout and within the request's budget, and reports
// whether they were (so a retry may find their units free). Only one
// caller waits on a kr; the others are told false at once.
func (l *Limiter) waitRelease(ctx context.Context, kr *keyReleases) bool {
	if kr == nil {
		return false
	}
	l.relMu.Lock()
	if kr.waited {
		l.relMu.Unlock()
		return false
	}
	kr.waited = true
	l.relMu.Unlock()
	deadline, ok := budget.Deadline(ctx, l.o.releaseTimeout)
	if !ok {
		return false
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-kr.done:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// decision is the decision of a store's answer.
func (l *Limiter) decision(res result) spillway.Decision {
	d := spillway.Decision{
		Allowed:   res.Allowed,
		Limiter:   l.o.name,
		Limit:     l.limit,
		Remaining: max(l.limit-res.InFlight, 0),
	}
	if !res.Allowed {
		d.Reason = spillway.ReasonConcurrency
		d.RetryAfter = l.o.retryAfter
		if res.Wait > 0 && res.Wait < d.RetryAfter {
			d.RetryAfter = res.Wait
		}
	}
	return d
}

func (l *Limiter) release(ctx context.Context, key, id string, n int64) error {
	rctx, cancel := context.WithTimeout(ctx, l.o.releaseTimeout)
	defer cancel()
	return l.store.release(rctx, l.o.name, key, id, n)
}

// keep adds a failed release to the retry list, unless it is full.
func (l *Limiter) keep(p pendingRelease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) >= l.o.maxPending {
		l.dropped.Add(1)
		return
	}
	l.pending = append(l.pending, p)
	l.npending.Store(int64(len(l.pending)))
}

// retryPending retries the failed releases in the background, one pass
// at a time; a pass stops at the first failure and keeps the rest.
func (l *Limiter) retryPending() {
	if !l.retrying.CompareAndSwap(false, true) {
		return
	}
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	l.npending.Store(0)
	l.mu.Unlock()
	l.retryWait.Add(1)
	go func() {
		defer l.retryWait.Done()
		defer l.retrying.Store(false)
		for i, p := range batch {
			if time.Since(p.at) >= l.o.ttl {
				l.dropped.Add(1) // reaped by the store by now
				continue
			}
			if err := l.release(context.Background(), p.key, p.id, p.n); err != nil {
				for _, q := range batch[i:] {
					l.keep(q)
				}
				return
			}
		}
	}()
}

// pendingReleases returns the releases waiting for a retry and those
// given up (older than the TTL, or the list was full).
func (l *Limiter) pendingReleases() (pending, dropped int64) {
	return l.npending.Load(), l.dropped.Load()
}

// WaitReleases waits until the releases whose done has run so far were
// answered by the store (or failed: see Settings.MaxPendingReleases), and for a
// background retry of pending releases to end. Call it before reading a
// key's state right after a request, and at shutdown.
func (l *Limiter) WaitReleases() { l.releasing.Wait(); l.retryWait.Wait() }

// PerKey adapts l to spillway.Limiter: the key is the value of the request
// dimension dim (spillway.DimUser, spillway.DimAPIKey, …). A request that
// lacks the dimension is not limited by it, as in every block (see
// spillway.DimIP): it is admitted holding nothing, with Limit 0 and the
// Limiter "<name>:absent". A malformed (or nil) request is denied with
// spillway.ReasonInvalid. A request holds r.EffectiveCost() units (Cost 0
// is 1); one that costs more than the limit is denied with
// spillway.ReasonCostExceedsLimit.
func PerKey(l *Limiter, dim string) spillway.Limiter {
	absent := l.o.name + ":absent"
	return block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		if r.Validate() != nil {
			return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: l.o.name}, spillway.Noop, nil
		}
		key, ok := r.Get(dim)
		if !ok {
			return spillway.Decision{Allowed: true, Limiter: absent}, spillway.Noop, nil
		}
		return l.Acquire(ctx, key, r.EffectiveCost())
	})
}
