package sim

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Backend is the simulated database every API server calls. It has a
// capacity (the concurrency at which it is fully used) and no admission
// control of its own beyond a connection cap, like most databases: past
// the capacity, requests contend for the same CPU and locks, so each query
// slows down more than in proportion to the queue — throughput falls as
// concurrency rises (thrashing). Clients time out and retry, so the work
// the database does for them is wasted: goodput collapses.
type Backend struct {
	capacity atomic.Int64  // concurrency the database serves at full speed now
	Service  time.Duration // mean service time of one query when not overloaded
	// Thrash is how much each query slows per unit of overload: service
	// time = Service · max(1, n/C) · (1 + Thrash·max(0, n−C)/C) for n
	// queries in flight (n/C alone would be fair sharing with constant
	// throughput; the second factor makes throughput fall).
	Thrash           float64
	MaxConns         int           // connections past which queries fail at once
	StatementTimeout time.Duration // queries running longer are cancelled (the work is lost)
	GaugeWindow      time.Duration // how often it publishes its utilization (Gauge)

	inflight atomic.Int64
	rec      *Recorder
	slow     atomic.Uint64 // math.Float64bits of the latency multiplier; 0: 1
	stuck    atomic.Bool   // every query hangs to the statement timeout

	// The utilization gauge (Gauge): integrals over the current window,
	// updated at every change of the queries in flight or the capacity.
	gmu       sync.Mutex
	gStart    time.Time // the current window began
	gLast     time.Time // integrated up to here
	gActive   float64   // ∫ n dt, in query-seconds
	gBusy     float64   // ∫ min(n, C) dt
	gIdle     float64   // ∫ max(0, C − n) dt
	published Gauge
}

// DefaultGaugeWindow is how often the database publishes its utilization
// by default (System.GaugeWindow): four times a second, as a CPU gauge
// read from the host's cgroup every 250 ms would (shedder.CgroupCPU reads
// at any rate). A managed database's load chart, once a second, is
// -gauge-window 1s; see docs/loadtest.md for both.
const DefaultGaugeWindow = 250 * time.Millisecond

// Gauge is what the database publishes about its last full window of
// GaugeWindow, as a host's CPU gauge or a managed database's load chart
// does: how many queries were running on average (Active, queries waiting
// for a worker included), and how many of its workers were busy and idle
// on average (the CPU's busy and idle shares times the cores it has now).
// Busy + Idle is its capacity, averaged over the window: a window late,
// and between the old and the new one for a window in which it changed.
type Gauge struct {
	From, To           time.Time // the window; zero before the first one ended
	Active, Busy, Idle float64
}

// integrate advances the gauge's integrals to now; call with gmu held.
func (b *Backend) integrate(now time.Time) {
	if b.gStart.IsZero() {
		b.gStart, b.gLast = now, now
		return
	}
	dt := now.Sub(b.gLast).Seconds()
	n, c := float64(b.inflight.Load()), float64(b.capacity.Load())
	b.gActive += n * dt
	b.gBusy += min(n, c) * dt
	b.gIdle += max(0, c-n) * dt
	b.gLast = now
	if w := now.Sub(b.gStart); w >= b.GaugeWindow {
		sec := w.Seconds()
		b.published = Gauge{From: b.gStart, To: now, Active: b.gActive / sec, Busy: b.gBusy / sec, Idle: b.gIdle / sec}
		b.gStart, b.gActive, b.gBusy, b.gIdle = now, 0, 0, 0
	}
}

// change applies delta to the queries in flight (and c, when positive, to
// the capacity) after integrating the gauge up to now; it returns the
// queries in flight after the change.
func (b *Backend) change(delta int64, c int64) int64 {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	b.integrate(time.Now())
	if c > 0 {
		b.capacity.Store(c)
	}
	return b.inflight.Add(delta)
}

// Gauge returns the database's last published utilization.
func (b *Backend) Gauge() Gauge {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	b.integrate(time.Now())
	return b.published
}

// Errors the backend returns; the API server answers 503 for both.
var (
	errTooManyConns     = errors.New("backend: too many connections")
	errStatementTimeout = errors.New("backend: statement timeout")
)

// SetCapacity changes the capacity (a lost replica, a noisy neighbour);
// queries already running keep their service time.
func (b *Backend) SetCapacity(c int) { b.change(0, int64(max(1, c))) }

// SetSlow multiplies every query's service time by f from now on (1: as
// usual): a slower replica, a missing index.
func (b *Backend) SetSlow(f float64) {
	if f <= 0 {
		f = 1
	}
	b.slow.Store(math.Float64bits(f))
}

// SetStuck makes every query that starts from now on hang until the
// statement timeout and fail (a lock held for ever, a hung replica).
func (b *Backend) SetStuck(on bool) { b.stuck.Store(on) }

type giveUpKey struct{}

// WithGiveUp returns ctx carrying the time the request's client gives up
// waiting for its answer: the database counts the time it spends on the
// request after it as wasted.
func WithGiveUp(ctx context.Context, at time.Time) context.Context {
	return context.WithValue(ctx, giveUpKey{}, at)
}

// Capacity returns the capacity now.
func (b *Backend) Capacity() int { return int(b.capacity.Load()) }

// Inflight returns the number of queries running now.
func (b *Backend) Inflight() int64 { return b.inflight.Load() }

// Query runs one query. The database does not notice that the client went
// away: a query runs to completion (or to the statement timeout) even when
// nobody waits for its answer any more.
func (b *Backend) Query(ctx context.Context) error {
	n := b.change(1, 0)
	defer b.change(-1, 0)
	start := time.Now()
	if b.rec.Debug.On() {
		defer func() {
			b.rec.Debug.Add("db:busy_us", time.Since(start).Microseconds())
		}()
	}
	b.rec.BackendStart(n)
	if b.MaxConns > 0 && n > int64(b.MaxConns) {
		b.rec.BackendDone(start, 0, false)
		return errTooManyConns
	}
	if giveUp, ok := ctx.Value(giveUpKey{}).(time.Time); ok {
		defer func() {
			end, from := time.Now(), start
			if giveUp.After(from) {
				from = giveUp
			}
			b.rec.BackendWork(start, end.Sub(start), end.Sub(from))
		}()
	} else {
		defer func() { b.rec.BackendWork(start, time.Since(start), 0) }()
	}
	if b.stuck.Load() {
		time.Sleep(b.StatementTimeout)
		b.rec.BackendDone(start, time.Since(start), false)
		return errStatementTimeout
	}
	c := float64(b.capacity.Load())
	over := max(0, float64(n)-c) / c
	slow := max(1, float64(n)/c) * (1 + b.Thrash*over)
	if f := b.slow.Load(); f != 0 {
		slow *= math.Float64frombits(f)
	}
	// Service times vary ±50% around the mean (uniform), so p99 is
	// meaningful even at low load.
	st := time.Duration(float64(b.Service) * (0.5 + rand.Float64()) * slow)
	if b.StatementTimeout > 0 && st > b.StatementTimeout {
		time.Sleep(b.StatementTimeout)
		b.rec.BackendDone(start, time.Since(start), false)
		return errStatementTimeout
	}
	time.Sleep(st)
	// The measured time, not st: on a busy machine sleeps overrun, and
	// the report should show what the clients waited.
	b.rec.BackendDone(start, time.Since(start), true)
	return nil
}
