package globalceiling

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/spillway-go/spillway"
)

// ErrCeilingReached is the sentinel of a rejection: errors.Is(err,
// ErrCeilingReached) is true for every *RejectedError.
var ErrCeilingReached = errors.New("globalceiling: ceiling reached")

// RejectedError is returned by a Guard that did not run the work. It
// matches ErrCeilingReached with errors.Is and carries the decision
// (Decision.RetryAfter is when a retry can succeed).
type RejectedError struct {
	Decision spillway.Decision
}

// Error names the block that denied, why, and when to retry.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("globalceiling: %q denied (%s); retry after %v", e.Decision.Limiter, e.Decision.Reason, e.Decision.RetryAfter)
}

// Unwrap returns ErrCeilingReached.
func (e *RejectedError) Unwrap() error { return ErrCeilingReached }

// Guard puts a limiter — an InFlight cap, a Ceiling, or a chain of them —
// in front of database work. It admits before the work asks the pool for
// a connection, so a rejected or waiting caller never holds a connection,
// and rejects at once with a *RejectedError rather than queueing. The
// guard adds no fallback of its own: each block of the library decides
// locally by itself while Redis cannot answer (marked Degraded), so no
// block of the guarded chain is ever skipped. A limiter that returns an
// error (a block of your own whose backend failed) fails the guard
// closed: the error wraps spillway.ErrStoreUnavailable. It is safe for concurrent use.
type Guard struct {
	lim  spillway.Limiter
	name string
}

// NewGuard returns a guard around lim (a nil lim is an error). The guard
// runs lim as a chain of one: its admission spends what is left of the
// request's budget (spillway.Chain), or a budget of its own, so a guard
// inside a handler that httpx or grpcx admitted never waits on Redis
// longer than the request's one budget.
func NewGuard(lim spillway.Limiter) (*Guard, error) {
	if lim == nil {
		return nil, fmt.Errorf("globalceiling: NewGuard: limiter is nil")
	}
	// A chain of one: the guard's admission spends what is left of the
	// request's budget, or a budget of its own.
	g := &Guard{lim: spillway.Chain(lim), name: "guard"}
	return g, nil
}

// Admit decides r as the guard does, following the spillway.Limiter
// contract: a denial is a decision, not an error; err != nil (wrapping
// spillway.ErrStoreUnavailable) only when the limiter failed. Use it when the work is
// not one function call; Do turns a denial into a *RejectedError.
func (g *Guard) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r == nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: g.name}, spillway.Noop, nil
	}
	d, done, err := g.lim.Admit(ctx, r)
	if err != nil {
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
	if !d.Allowed {
		return d, spillway.Noop, nil
	}
	if done == nil {
		done = spillway.Noop
	}
	return d, done, nil
}

// Do runs fn when the guard admits r (nil: a Critical request of cost 1),
// and returns fn's error. It returns a *RejectedError (errors.Is(err,
// ErrCeilingReached)) without calling fn when denied, and an error
// wrapping spillway.ErrStoreUnavailable when the limiter failed. The admission's Done
// gets Success when fn returns nil, Dropped when fn's error is a deadline
// or a bad connection, and Ignored otherwise.
func (g *Guard) Do(ctx context.Context, r *spillway.Request, fn func(context.Context) error) error {
	if r == nil {
		r = &spillway.Request{Priority: spillway.Critical, Cost: 1}
	}
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
// the pool for a connection (&globalceiling.DB{DB: db, Guard: g}). Use
// DB.DB directly for work the guard should not see (migrations, health
// checks).
type DB struct {
	DB    *sql.DB
	Guard *Guard
	// Request, when set, returns the request to admit for a call (its
	// priority and cost); the default is a Critical request of cost 1.
	Request func(ctx context.Context, query string) *spillway.Request
}

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
	err := d.Guard.Do(ctx, d.request(ctx, query), func(ctx context.Context) error {
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
	err := d.Guard.Do(ctx, d.request(ctx, query), func(ctx context.Context) error {
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
	return d.Guard.Do(ctx, d.request(ctx, query), func(ctx context.Context) error {
		return d.DB.QueryRowContext(ctx, query, args...).Scan(dest...)
	})
}

// Tx runs fn in a transaction behind the guard: one admission for the
// whole transaction, taken before the connection. fn's error (or a failed
// commit) rolls back.
func (d *DB) Tx(ctx context.Context, opts *sql.TxOptions, fn func(context.Context, *sql.Tx) error) error {
	return d.Guard.Do(ctx, d.request(ctx, ""), func(ctx context.Context) error {
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
