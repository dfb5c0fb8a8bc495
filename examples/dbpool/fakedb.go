package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway/shedder"
)

// fakeDB is an in-process database for the demo: like PostgreSQL it
// refuses connections beyond max_connections, and it runs statements on a
// fixed number of workers (its CPUs, say): each takes a service time on a
// worker, and statements beyond the workers wait for one, so latency
// grows with the load past its capacity. Like a database's own statistics
// it publishes a utilization gauge: its busy and idle workers, and the
// statements running or waiting for one, averaged over the last full
// window. It counts what the guard is meant to protect.
type fakeDB struct {
	maxConns int64
	service  time.Duration
	workers  chan struct{} // a token per worker
	capacity atomic.Int64  // workers now

	open, peak, refused, statements atomic.Int64
	active, peakActive              atomic.Int64 // statements running or waiting for a worker

	gmu       sync.Mutex
	gStart    time.Time
	gLast     time.Time
	gBusy     float64 // busy worker-seconds in the current window
	gActive   float64 // statement-seconds, running or waiting, in it
	published shedder.Reading
}

// gaugeWindow is the window the gauge averages over.
const gaugeWindow = 250 * time.Millisecond

func newFakeDB(maxConns int64, workers int, service time.Duration) *fakeDB {
	db := &fakeDB{maxConns: maxConns, service: service, workers: make(chan struct{}, workers)}
	db.capacity.Store(int64(workers))
	for range workers {
		db.workers <- struct{}{}
	}
	return db
}

// loseWorkers takes n workers away for good (a replica lost, a noisy
// neighbour), each as soon as it is free.
func (db *fakeDB) loseWorkers(n int) {
	db.gmu.Lock()
	db.integrate(time.Now())
	db.capacity.Add(-int64(n))
	db.gmu.Unlock()
	go func() {
		for range n {
			<-db.workers
		}
	}()
}

// integrate advances the gauge to now with the statements in flight
// before a change; call with gmu held.
func (db *fakeDB) integrate(now time.Time) {
	if db.gStart.IsZero() {
		db.gStart, db.gLast = now, now
		return
	}
	c, n := db.capacity.Load(), db.active.Load()
	dt := now.Sub(db.gLast).Seconds()
	db.gBusy += float64(min(n, c)) * dt
	db.gActive += float64(n) * dt
	db.gLast = now
	if w := now.Sub(db.gStart); w >= gaugeWindow {
		sec := w.Seconds()
		b := db.gBusy / sec
		db.published = shedder.Reading{Since: db.gStart, At: now, Busy: b, Idle: max(0, float64(c)-b), Active: db.gActive / sec}
		db.gStart, db.gBusy, db.gActive = now, 0, 0
	}
}

// change moves the statements in flight by delta after integrating the
// gauge up to now.
func (db *fakeDB) change(delta int64) {
	db.gmu.Lock()
	db.integrate(time.Now())
	n := db.active.Add(delta)
	db.gmu.Unlock()
	for {
		p := db.peakActive.Load()
		if n <= p || db.peakActive.CompareAndSwap(p, n) {
			break
		}
	}
}

// Gauge returns the last published reading: a shedder.Gauge.
func (db *fakeDB) Gauge(context.Context) (shedder.Reading, error) {
	db.gmu.Lock()
	defer db.gmu.Unlock()
	db.integrate(time.Now())
	return db.published, nil
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

// work waits for a worker, then holds it for the service time.
func (c *fakeConn) work(ctx context.Context) error {
	db := c.db
	db.statements.Add(1)
	db.change(1)
	defer db.change(-1)
	select {
	case <-db.workers:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { db.workers <- struct{}{} }()
	t := time.NewTimer(db.service)
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
