package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"sync/atomic"
	"time"
)

// fakeDB is an in-process database for the demo: like PostgreSQL it
// refuses connections beyond max_connections, and every statement takes a
// service time. It counts what the guard is meant to protect.
type fakeDB struct {
	maxConns int64
	service  time.Duration

	open, peak, refused, statements atomic.Int64
}

// Connect implements driver.Connector.
func (db *fakeDB) Connect(ctx context.Context) (driver.Conn, error) {
	n := db.open.Add(1)
	if n > db.maxConns {
		db.open.Add(-1)
		db.refused.Add(1)
		return nil, errors.New("fakedb: sorry, too many clients already")
	}
	for {
		p := db.peak.Load()
		if n <= p || db.peak.CompareAndSwap(p, n) {
			break
		}
	}
	return &fakeConn{db: db}, nil
}

// Driver implements driver.Connector.
func (db *fakeDB) Driver() driver.Driver { return fakeDriver{db} }

type fakeDriver struct{ db *fakeDB }

func (d fakeDriver) Open(string) (driver.Conn, error) { return d.db.Connect(context.Background()) }

type fakeConn struct {
	db     *fakeDB
	closed bool
}

func (c *fakeConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("fakedb: prepared statements are not supported")
}

func (c *fakeConn) Close() error {
	if !c.closed {
		c.closed = true
		c.db.open.Add(-1)
	}
	return nil
}

func (c *fakeConn) Begin() (driver.Tx, error) { return c, nil }
func (c *fakeConn) Commit() error             { return nil }
func (c *fakeConn) Rollback() error           { return nil }

func (c *fakeConn) ExecContext(ctx context.Context, _ string, _ []driver.NamedValue) (driver.Result, error) {
	if err := c.work(ctx); err != nil {
		return nil, err
	}
	return driver.RowsAffected(1), nil
}

func (c *fakeConn) QueryContext(ctx context.Context, _ string, _ []driver.NamedValue) (driver.Rows, error) {
	if err := c.work(ctx); err != nil {
		return nil, err
	}
	return &rows{}, nil
}

func (c *fakeConn) work(ctx context.Context) error {
	c.db.statements.Add(1)
	t := time.NewTimer(c.db.service)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type rows struct{ done bool }

func (r *rows) Columns() []string { return []string{"n"} }
func (r *rows) Close() error      { return nil }
func (r *rows) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = int64(1)
	return nil
}
