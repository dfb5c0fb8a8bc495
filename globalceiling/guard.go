package globalceiling

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"time"

	"golang.org/x/time/rate"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/degrade"
)

// ErrCeilingReached is the sentinel of a rejection: errors.Is(err,
// ErrCeilingReached) is true for every *RejectedError.
var ErrCeilingReached = errors.New("globalceiling: ceiling reached")

// ErrUnavailable is matched by a Guard's error when the shared store
// failed and the guard has no local fallback (it fails closed). It is
// spillway.ErrStoreUnavailable: the error is a *spillway.StoreError whose
// Fail is spillway.FailClosed, so an adapter denies the request whatever
// its own default.
var ErrUnavailable = spillway.ErrStoreUnavailable

// RejectedError is returned by a Guard that did not run the work. It
// matches ErrCeilingReached with errors.Is and carries the decision.
type RejectedError struct {
	Decision spillway.Decision
}

// Error says which ceiling rejected and when to retry.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("globalceiling: ceiling %q reached (%s); retry after %v", e.Decision.Limiter, e.Decision.Reason, e.Decision.RetryAfter)
}

// Unwrap returns ErrCeilingReached.
func (e *RejectedError) Unwrap() error { return ErrCeilingReached }

// RetryAfter is when a retry can succeed.
func (e *RejectedError) RetryAfter() time.Duration { return e.Decision.RetryAfter }

// LocalLimiter is the degraded-mode limit of a Guard: it decides alone,
// in this process, while the shared store fails. NewLocalBucket returns
// one; a ratelimit memory-store limiter can be adapted to it.
type LocalLimiter interface {
	// Allow reports whether cost units may pass at now and, when not,
	// how long until they may (0 when they never can).
	Allow(now time.Time, cost int64) (ok bool, retryAfter time.Duration)
}

// NewLocalBucket returns a token bucket that admits limit units per period
// with a burst of limit: the usual degraded mode is this server's share of
// the ceiling, e.g. NewLocalBucket(ceiling.Limit()/5, ceiling.Window()) for
// a 20% share. It is safe for concurrent use.
func NewLocalBucket(limit int64, period time.Duration) (LocalLimiter, error) {
	if limit < 1 {
		return nil, fmt.Errorf("globalceiling: NewLocalBucket: limit %d must be at least 1", limit)
	}
	if period <= 0 {
		return nil, fmt.Errorf("globalceiling: NewLocalBucket: period %v must be positive", period)
	}
	burst := int(min(limit, math.MaxInt32))
	return &localBucket{l: rate.NewLimiter(rate.Limit(float64(limit)/period.Seconds()), burst)}, nil
}

type localBucket struct{ l *rate.Limiter }

func (b *localBucket) Allow(now time.Time, cost int64) (bool, time.Duration) {
	if cost > int64(b.l.Burst()) {
		return false, 0
	}
	r := b.l.ReserveN(now, int(cost))
	if !r.OK() {
		return false, 0
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// Guard puts a limiter — usually a Ceiling, possibly chained with a
// concurrency limit — in front of database work. It admits before the
// work asks the pool for a connection, so a rejected or waiting caller
// never holds a connection, and rejects at once with a *RejectedError
// rather than queueing. When the limiter's store fails, the guard decides
// with its local fallback (decisions marked Degraded), or fails closed
// with ErrUnavailable when it has none. It is safe for concurrent use.
type Guard struct {
	lim        spillway.Limiter
	name       string
	local      LocalLimiter
	clock      func() time.Time
	onDegraded func(error)
}

// GuardOption configures a Guard.
type GuardOption func(*Guard)

// WithFallback sets the local limiter used while the shared store fails
// (default none: the guard fails closed with ErrUnavailable).
func WithFallback(l LocalLimiter) GuardOption { return func(g *Guard) { g.local = l } }

// WithGuardClock sets the clock given to the fallback (default time.Now).
func WithGuardClock(now func() time.Time) GuardOption { return func(g *Guard) { g.clock = now } }

// WithDegradedHandler is called with the store error each time the guard
// decides with its fallback, for logging and metrics.
func WithDegradedHandler(f func(error)) GuardOption { return func(g *Guard) { g.onDegraded = f } }

// WithGuardName names the guard in degraded decisions (default "guard").
func WithGuardName(name string) GuardOption { return func(g *Guard) { g.name = name } }

// NewGuard returns a guard around lim.
func NewGuard(lim spillway.Limiter, opts ...GuardOption) (*Guard, error) {
	if lim == nil {
		return nil, fmt.Errorf("globalceiling: NewGuard: limiter is nil")
	}
	g := &Guard{lim: lim, name: "guard", clock: time.Now}
	for _, o := range opts {
		o(g)
	}
	if g.clock == nil {
		return nil, fmt.Errorf("globalceiling: NewGuard: clock is nil")
	}
	return g, nil
}

// Admit decides r as the guard does — the limiter, or the fallback while
// the store fails — following the spillway.Limiter contract: a denial is a
// decision, not an error; err != nil (wrapping ErrUnavailable) only when
// the store failed and there is no fallback. Use it when the work is not
// one function call; Do and DoRequest turn a denial into a *RejectedError.
func (g *Guard) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r == nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: g.name}, spillway.Noop, nil
	}
	inner := ctx
	var sc *degrade.Scope
	if g.local != nil {
		// A telemetry.Instrument inside counts the local decision that
		// replaces its error, degraded, not the error.
		sc = degrade.Fallback(ctx)
		inner = sc
	}
	d, done, err := g.lim.Admit(inner, r)
	if sc != nil {
		defer func() { sc.Resolve(d, nil) }()
	}
	if err != nil {
		if g.local == nil {
			// The guard fails closed: say so in the error, so that an
			// adapter denies rather than runs the work unguarded.
			se := &spillway.StoreError{Limiter: g.name, Err: err}
			var inner *spillway.StoreError
			if errors.As(err, &inner) {
				se.Limiter, se.Rules, se.Err = inner.Limiter, inner.Rules, inner.Err
			}
			se.Fail = spillway.FailClosed
			return spillway.Decision{}, spillway.Noop, se
		}
		if g.onDegraded != nil {
			g.onDegraded(err)
		}
		d, done = g.degrade(r.EffectiveCost()), spillway.Noop
	}
	if !d.Allowed {
		return d, spillway.Noop, nil
	}
	return d, done, nil
}

// degradedRetry is the RetryAfter of a degraded denial of a cost the
// local fallback can never take but the shared limit could: the store may
// be back by then.
const degradedRetry = time.Second

// degrade decides cost with the local fallback. A cost above the shared
// limit's own (when the limiter says it, as a Ceiling does) is denied as
// exceeding, as the store would; a cost above only the local share is
// refused for now, not forever.
func (g *Guard) degrade(cost int64) spillway.Decision {
	d := spillway.Decision{Limiter: g.name, Degraded: true}
	if l, ok := g.lim.(interface{ Limit() int64 }); ok && cost > l.Limit() {
		d.Reason = spillway.ReasonCostExceedsLimit
		return d
	}
	ok, retry := g.local.Allow(g.clock(), cost)
	d.Allowed = ok
	if !ok {
		d.Reason, d.RetryAfter = spillway.ReasonCeiling, retry
		if retry == 0 {
			d.RetryAfter = degradedRetry
		}
	}
	return d
}

// Do runs fn when the guard admits a Critical request of cost 1; see
// DoRequest.
func (g *Guard) Do(ctx context.Context, fn func(context.Context) error) error {
	return g.DoRequest(ctx, &spillway.Request{Priority: spillway.Critical, Cost: 1}, fn)
}

// DoRequest runs fn when the guard admits r, and returns fn's error. It
// returns a *RejectedError (errors.Is(err, ErrCeilingReached)) without
// calling fn when denied, and an error wrapping ErrUnavailable when the
// store failed and there is no fallback. The admission's Done gets Success
// when fn returns nil, Dropped when fn's error is a deadline or a bad
// connection, and Ignored otherwise.
func (g *Guard) DoRequest(ctx context.Context, r *spillway.Request, fn func(context.Context) error) error {
	d, done, err := g.Admit(ctx, r)
	if err != nil {
		return err
	}
	if !d.Allowed {
		return &RejectedError{Decision: d}
	}
	ferr := fn(ctx)
	done(outcomeOf(ferr))
	return ferr
}

func outcomeOf(err error) spillway.Outcome {
	switch {
	case err == nil:
		return spillway.Success
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, driver.ErrBadConn):
		return spillway.Dropped
	default:
		return spillway.Ignored
	}
}

// DB guards a *sql.DB: each call is admitted by the guard before it asks
// the pool for a connection. Use DB.DB directly for work the guard should
// not see (migrations, health checks).
type DB struct {
	DB    *sql.DB
	Guard *Guard
	// Request, when set, returns the request to admit for a call (its
	// priority and cost); the default is a Critical request of cost 1.
	Request func(ctx context.Context, query string) *spillway.Request
}

// WrapDB returns db guarded by g.
func WrapDB(db *sql.DB, g *Guard) *DB { return &DB{DB: db, Guard: g} }

func (d *DB) request(ctx context.Context, query string) *spillway.Request {
	if d.Request != nil {
		if r := d.Request(ctx, query); r != nil {
			return r
		}
	}
	return &spillway.Request{Priority: spillway.Critical, Cost: 1}
}

// ExecContext is sql.DB.ExecContext behind the guard.
func (d *DB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := d.Guard.DoRequest(ctx, d.request(ctx, query), func(ctx context.Context) error {
		var err error
		res, err = d.DB.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// QueryContext is sql.DB.QueryContext behind the guard. The admission ends
// when the query returns; the rows hold their connection until closed.
func (d *DB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	var rows *sql.Rows
	err := d.Guard.DoRequest(ctx, d.request(ctx, query), func(ctx context.Context) error {
		var err error
		rows, err = d.DB.QueryContext(ctx, query, args...)
		return err
	})
	return rows, err
}

// QueryRowScan runs a query expected to return one row behind the guard
// and scans it into dest (sql.Row cannot carry a rejection, so this
// replaces QueryRowContext).
func (d *DB) QueryRowScan(ctx context.Context, query string, args []any, dest ...any) error {
	return d.Guard.DoRequest(ctx, d.request(ctx, query), func(ctx context.Context) error {
		return d.DB.QueryRowContext(ctx, query, args...).Scan(dest...)
	})
}

// Tx runs fn in a transaction behind the guard: one admission for the
// whole transaction, taken before the connection. fn's error (or a failed
// commit) rolls back.
func (d *DB) Tx(ctx context.Context, opts *sql.TxOptions, fn func(context.Context, *sql.Tx) error) error {
	return d.Guard.DoRequest(ctx, d.request(ctx, ""), func(ctx context.Context) error {
		tx, err := d.DB.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

var _ spillway.Limiter = (*Guard)(nil)
var _ spillway.Limiter = (*Ceiling)(nil)
