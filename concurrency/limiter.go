package concurrency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// Limiter admits at most Limit requests of one key in flight at a time,
// across every process that shares its Store. Create it with New.
type Limiter struct {
	store    Store
	limit    int64
	o        options
	idPrefix string
	seq      atomic.Uint64
}

// Option configures a Limiter.
type Option func(*options)

type options struct {
	name           string
	ttl            time.Duration
	retryAfter     time.Duration
	releaseTimeout time.Duration
	onReleaseError func(error)
}

// WithName names the limiter (default "concurrency"). The name is the
// Decision.Limiter and the scope of the keys: two limiters with different
// names keep separate sets for the same key.
func WithName(name string) Option { return func(o *options) { o.name = name } }

// WithTTL sets how long an entry may stay in flight before it is reaped as
// a leak (default 1 minute). Set it above the longest legitimate request:
// a request that outlives the TTL loses its slot while it still runs. A
// server that crashes mid-request blocks its slots for at most the TTL.
// Redis keeps TTLs in whole milliseconds, so it is rounded up to one.
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithRetryAfter sets the RetryAfter of a denial (default 1 s): a slot
// frees when any request of the key finishes, which the limiter cannot
// foresee, so the hint is a typical request duration. It is capped by the
// time until the oldest entry is reaped, when that is sooner.
func WithRetryAfter(d time.Duration) Option { return func(o *options) { o.retryAfter = d } }

// WithReleaseTimeout bounds the store call of a Done (default 1 s). Done
// runs detached from the admission context's cancellation (a cancelled
// request must still release its slot) but keeps its values.
func WithReleaseTimeout(d time.Duration) Option { return func(o *options) { o.releaseTimeout = d } }

// WithReleaseErrorHandler is called when a Done fails to release its
// entry (the store was unreachable); the entry is then reaped after the
// TTL. The default ignores the error.
func WithReleaseErrorHandler(f func(error)) Option { return func(o *options) { o.onReleaseError = f } }

// New returns a limiter that admits at most limit requests per key in
// flight. It fails when store is nil, limit is below 1 or an option is out
// of range.
func New(store Store, limit int64, opts ...Option) (*Limiter, error) {
	o := options{name: "concurrency", ttl: time.Minute, retryAfter: time.Second, releaseTimeout: time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case store == nil:
		return nil, fmt.Errorf("concurrency: New: store is nil")
	case limit < 1:
		return nil, fmt.Errorf("concurrency: New: limit %d must be at least 1", limit)
	case o.name == "":
		return nil, fmt.Errorf("concurrency: New: name is empty")
	case o.ttl <= 0:
		return nil, fmt.Errorf("concurrency: New: ttl %v must be positive", o.ttl)
	case o.retryAfter <= 0:
		return nil, fmt.Errorf("concurrency: New: retry after %v must be positive", o.retryAfter)
	case o.releaseTimeout <= 0:
		return nil, fmt.Errorf("concurrency: New: release timeout %v must be positive", o.releaseTimeout)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("concurrency: New: request id prefix: %w", err)
	}
	return &Limiter{store: store, limit: limit, o: o, idPrefix: hex.EncodeToString(b[:]) + ":"}, nil
}

// Limit returns the limit per key.
func (l *Limiter) Limit() int64 { return l.limit }

// Name returns the limiter's name.
func (l *Limiter) Name() string { return l.o.name }

// Acquire admits one request of key when fewer than Limit are in flight.
//
// Allowed: Remaining is Limit minus the requests in flight (this one
// included); done removes the entry — call it once when the work ends;
// further calls do nothing. Denied: Reason is spillway.ReasonConcurrency
// (answer 429), Remaining is 0 and RetryAfter is the WithRetryAfter hint,
// or the time until the oldest entry is reaped when sooner. ResetAfter is
// always 0: when the key is back to empty depends on requests the limiter
// cannot foresee. err != nil means only that the store failed; it wraps
// the store's error.
func (l *Limiter) Acquire(ctx context.Context, key string) (spillway.Decision, spillway.Done, error) {
	id := l.idPrefix + strconv.FormatUint(l.seq.Add(1), 36)
	res, err := l.store.Acquire(ctx, l.o.name, key, id, l.limit, l.o.ttl)
	if err != nil {
		return spillway.Decision{}, spillway.Noop, err
	}
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
		return d, spillway.Noop, nil
	}
	if _, local := l.store.(*MemoryStore); local {
		// A memory release cannot block: no timeout context needed.
		return d, spillway.Once(func(spillway.Outcome) { _ = l.store.Release(ctx, l.o.name, key, id) }), nil
	}
	return d, spillway.Once(func(spillway.Outcome) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.o.releaseTimeout)
		defer cancel()
		if err := l.store.Release(rctx, l.o.name, key, id); err != nil && l.o.onReleaseError != nil {
			l.o.onReleaseError(err)
		}
	}), nil
}

// PerKey adapts l to spillway.Limiter: the key is the value of the request
// dimension dim (spillway.DimUser, spillway.DimAPIKey, …). Requests that
// lack the dimension share the key "" — they are limited together, not
// let through unlimited. A malformed (or nil) request is denied with
// spillway.ReasonInvalid. The request's Cost is ignored: each request is
// one slot.
func PerKey(l *Limiter, dim string) spillway.Limiter {
	return spillway.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		if r == nil || r.Validate() != nil {
			return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: l.o.name}, spillway.Noop, nil
		}
		key, _ := r.Get(dim)
		return l.Acquire(ctx, key)
	})
}
