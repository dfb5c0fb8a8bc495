package globalceiling

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/redistest"
)

// countingDriver is a database/sql driver that counts connections and
// statements, so a test can see whether rejected work touched the pool.
type countingDriver struct {
	opens, execs, queries atomic.Int64
}

func (d *countingDriver) Open(string) (driver.Conn, error) {
	d.opens.Add(1)
	return &countingConn{d}, nil
}

type countingConn struct{ d *countingDriver }

func (c *countingConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (c *countingConn) Close() error                        { return nil }
func (c *countingConn) Begin() (driver.Tx, error)           { return c, nil }
func (c *countingConn) Commit() error                       { return nil }
func (c *countingConn) Rollback() error                     { return nil }
func (c *countingConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	c.d.execs.Add(1)
	return driver.RowsAffected(1), nil
}
func (c *countingConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	c.d.queries.Add(1)
	return &oneRow{}, nil
}

type oneRow struct{ done bool }

func (r *oneRow) Columns() []string { return []string{"n"} }
func (r *oneRow) Close() error      { return nil }
func (r *oneRow) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = int64(42)
	return nil
}

func openCounting(t *testing.T) (*sql.DB, *countingDriver) {
	d := &countingDriver{}
	db := sql.OpenDB(connector{d})
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	return db, d
}

type connector struct{ d *countingDriver }

func (c connector) Connect(context.Context) (driver.Conn, error) { return c.d.Open("") }
func (c connector) Driver() driver.Driver                        { return c.d }

func TestGuardRejectsBeforeTouchingThePool(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	ceil := servers(t, srv, 1, 3, time.Minute, Settings{Clock: clock.Now})[0]
	g, err := NewGuard(ceil)
	if err != nil {
		t.Fatal(err)
	}
	db, drv := openCounting(t)
	gdb := &DB{DB: db, Guard: g}
	ctx := context.Background()
	if _, err := gdb.ExecContext(ctx, "UPDATE t SET x = 1"); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := gdb.QueryRowScan(ctx, "SELECT n", nil, &n); err != nil || n != 42 {
		t.Fatalf("QueryRowScan: %d %v", n, err)
	}
	if err := gdb.Tx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT 1")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	opens, execs, queries := drv.opens.Load(), drv.execs.Load(), drv.queries.Load()

	// The ceiling (3 per window) is used up: every call is rejected
	// without a connection or a statement.
	calls := map[string]func() error{
		"exec":  func() error { _, err := gdb.ExecContext(ctx, "UPDATE"); return err },
		"query": func() error { _, err := gdb.QueryContext(ctx, "SELECT"); return err },
		"row":   func() error { return gdb.QueryRowScan(ctx, "SELECT", nil, &n) },
		"tx":    func() error { return gdb.Tx(ctx, nil, func(context.Context, *sql.Tx) error { return nil }) },
		"do": func() error {
			return g.Do(ctx, nil, func(context.Context) error { t.Error("fn ran after a rejection"); return nil })
		},
	}
	for name, call := range calls {
		err := call()
		var rej *RejectedError
		if !errors.Is(err, ErrCeilingReached) || !errors.As(err, &rej) {
			t.Fatalf("%s: err = %v, want a *RejectedError matching ErrCeilingReached", name, err)
		}
		if rej.Decision.RetryAfter != time.Minute || rej.Decision.Reason != spillway.ReasonCeiling {
			t.Fatalf("%s: decision %+v", name, rej.Decision)
		}
		if !strings.Contains(err.Error(), `"orders-db" denied (ceiling)`) {
			t.Fatalf("%s: message %q", name, err)
		}
	}
	if drv.opens.Load() != opens || drv.execs.Load() != execs || drv.queries.Load() != queries || db.Stats().InUse != 0 {
		t.Fatalf("rejected calls touched the pool: opens %d→%d execs %d→%d queries %d→%d in use %d",
			opens, drv.opens.Load(), execs, drv.execs.Load(), queries, drv.queries.Load(), db.Stats().InUse)
	}
	// The work's own error comes back unchanged.
	clock.Advance(time.Minute)
	boom := errors.New("boom")
	if err := g.Do(ctx, nil, func(context.Context) error { return boom }); err != boom {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
}

// The ceiling falls back by itself: with Redis gone, a guard around it
// decides at the client's share of the ceiling per window (0.2 of 15 = 3
// while no fleet shedder has counted), Degraded, naming the ceiling; a
// limiter of one's own that errs fails the guard closed.
func TestGuardOverACeilingThatFallsBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	clock := newFakeClock()
	ceil, err := New(rdb, "db", 15, time.Hour, Settings{Clock: clock.Now, Reserve: -1})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := NewGuard(ceil)
	ctx := context.Background()
	if d, _, err := g.Admit(ctx, critical()); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("healthy: %+v %v", d, err)
	}
	srv.Stop()
	for i := 0; i < 3; i++ {
		d, _, err := g.Admit(ctx, critical())
		if err != nil || !d.Allowed || !d.Degraded || d.Limiter != "db" || d.Limit != 3 {
			t.Fatalf("degraded %d: %+v %v", i, d, err)
		}
	}
	d, _, err := g.Admit(ctx, critical())
	if err != nil || d.Allowed || !d.Degraded || d.Reason != spillway.ReasonCeiling || d.RetryAfter <= 0 || d.RetryAfter > time.Hour {
		t.Fatalf("degraded, share used: %+v %v; want a ceiling denial until the window ends", d, err)
	}
	if err := g.Do(ctx, nil, func(context.Context) error { return nil }); !errors.Is(err, ErrCeilingReached) || !strings.Contains(err.Error(), `"db" denied (ceiling)`) {
		t.Fatalf("Do degraded and used up: %v", err)
	}
	// A limiter of one's own that errs fails the guard closed.
	boom := errors.New("backend down")
	strict, _ := NewGuard(block.LimiterFunc(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{}, spillway.Noop, boom
	}))
	err = strict.Do(ctx, nil, func(context.Context) error { t.Error("ran"); return nil })
	if !errors.Is(err, spillway.ErrStoreUnavailable) || errors.Is(err, ErrCeilingReached) || !errors.Is(err, boom) {
		t.Fatalf("erring limiter: err = %v, want spillway.ErrStoreUnavailable", err)
	}
	var se *spillway.StoreError
	if _, _, err = strict.Admit(ctx, critical()); !errors.As(err, &se) || se.Fail != spillway.FailClosed || block.FailModeOf(err, spillway.FailOpen) != spillway.FailClosed {
		t.Fatalf("erring limiter, Admit: err = %v; want a fail-closed spillway.StoreError", err)
	}
	// The next window gives the share again.
	clock.Advance(time.Hour)
	if d, _, _ := g.Admit(ctx, critical()); !d.Allowed || !d.Degraded {
		t.Fatalf("next window: %+v", d)
	}
}

func TestGuardValidation(t *testing.T) {
	if _, err := NewGuard(nil); err == nil {
		t.Error("NewGuard(nil): no error")
	}
	if outcomeOf(context.DeadlineExceeded) != spillway.Dropped || outcomeOf(nil) != spillway.Success || outcomeOf(io.EOF) != spillway.Ignored {
		t.Error("outcomeOf")
	}
}
