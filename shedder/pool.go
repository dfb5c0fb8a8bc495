package shedder

import (
	"context"
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/learn"
)

// Pool is a server's pool of slots for work at a shared dependency (its
// database connections, say) whose size a concurrency.LatencyLimit learns from the latency
// and the outcome of the work it admits, capped by what the fleet shedder
// allows this server (NewPool's fleet), with a short wait in priority order in
// front of it: a Queue whose slots follow the learned limit. The Queue
// decides who gets a slot (the highest priority waiting, a short wait),
// the limit how many slots there are.
//
// Before each decision and after each piece of work ends, the Pool sets
// the Queue's slots to the learned limit, capped by the fleet's allowance
// for Critical work (with a fleet), at least 1. The cap is also given
// to the limit, so that it does not learn a limit the fleet
// would not let it use, and so are the start times of the work in flight
// and the last capacity reading (from a CapacityWatcher): a reading that began after the last cut and shows
// idle capacity raises the limit once by this server's share of the idle
// capacity, rounded up (the Fleet's measured share; all of it without a
// fleet), never past what the fleet allows this server (the limit at the
// reading plus the idle capacity, without a fleet), and not while
// the Fleet is degraded (its share is then a guess). A reading that
// measures the work waiting at the dependency (Reading.Active) is given to
// the limit too: with nothing waiting, slow work is the dependency's own
// slowness, and the limit moves its baseline instead of cutting.
//
// done reports how the work ended: Success and Dropped (a timeout, an
// error of the dependency) teach the limit, Ignored only frees the slot
// (use it for work that did not use the dependency, or ended for reasons
// of its own: a slow handler's time is not the dependency's latency).
// Put the Pool only in front of work that uses the dependency.
//
// Decisions are the Queue's, configured by QueueSettings (Name "pool"
// and Depth 64 by default; Clock times the RTTs too). A Pool is safe for
// concurrent use; Admit never returns an error.
type Pool struct {
	q     *Queue
	fleet *Fleet
	now   func() time.Time

	mu       sync.Mutex
	l        learn.Limit
	inFlight int
	starts   map[uint64]time.Time // start of each piece of work in flight
	seq      uint64

	reading atomic.Pointer[poolReading] // the last capacity reading (observe)
	// fleetBound: at the last resize the fleet's allowance, not the
	// learned limit, set the slots (with a fleet)
	fleetBound atomic.Bool
}

// poolReading is a capacity reading and, without a fleet, the most the
// limit may be raised to on it.
type poolReading struct {
	r  Reading
	to int64
}

// PoolStats are a Pool's counters and sizes (QueueStats.Slots: the
// slots now).
type PoolStats struct {
	QueueStats
	Limit     int   // the learned limit (before the cap)
	Allowance int64 // what the fleet allows this server (with a fleet), else 0
}

// NewPool returns a Pool whose slots lim learns, starting at its initial
// limit, capped by what fleet allows this server for Critical work; fleet
// may be nil (no cap). With a fleet, the Pool also takes this server's
// share of the fleet (the Fleet's measured share) of the idle capacity a
// reading reports. It fails when lim is nil or a setting is out of range.
func NewPool(lim *concurrency.LatencyLimit, fleet *Fleet, s QueueSettings) (*Pool, error) {
	if lim == nil {
		return nil, fmt.Errorf("shedder: pool learner is nil")
	}
	l := learn.Of(lim)
	o := queueOptions(s, "pool", 64)
	q, err := newQueue(int64(max(1, l.Limit())), o)
	if err != nil {
		return nil, err
	}
	return &Pool{q: q, fleet: fleet, now: o.now, l: l, starts: map[uint64]time.Time{}}, nil
}

// Admit decides r: it waits in the Queue up to its priority's maximum
// wait for one of the slots the learned limit sets.
func (p *Pool) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	p.resize()
	d, done, err := p.q.Admit(ctx, r)
	if err != nil || !d.Allowed {
		if err == nil && d.Reason == spillway.ReasonShed && p.fleetBound.Load() {
			// no slot for it, and the fleet's allowance is what bounds
			// the slots: the fleet hears of a Critical refusal and its
			// other servers make room (a limit learned from the
			// dependency's latency is not the fleet's to lift)
			p.fleet.noteRefused(r.Priority)
		}
		return d, done, err
	}
	start := p.now()
	p.mu.Lock()
	p.inFlight++
	used := p.inFlight
	p.seq++
	id := p.seq
	p.starts[id] = start
	p.mu.Unlock()
	return d, block.Once(func(o spillway.Outcome) {
		rtt := p.now().Sub(start)
		p.mu.Lock()
		used = max(used, p.inFlight)
		p.inFlight--
		delete(p.starts, id)
		if o == spillway.Success || o == spillway.Dropped {
			p.l.Learn(start, rtt, used, o)
		}
		p.mu.Unlock()
		p.resize()
		done(o)
	}), nil
}

// observe gives the Pool a capacity reading of the dependency (a
// CapacityWatcher calls it with every new reading).
func (p *Pool) observe(r Reading) {
	pr := &poolReading{r: r, to: math.MaxInt64}
	if p.fleet == nil && r.Idle >= 1 && !math.IsInf(r.Idle, 1) {
		p.mu.Lock()
		pr.to = int64(p.l.Limit()) + int64(math.Floor(min(r.Idle, 1<<40)+0.5))
		p.mu.Unlock()
	}
	p.reading.Store(pr)
}

// resize sets the Queue's slots to the learned limit, capped by the
// fleet's allowance.
func (p *Pool) resize() {
	allowance := int64(math.MaxInt64)
	if p.fleet != nil {
		allowance = max(1, p.fleet.allowance(spillway.Critical))
	}
	now := p.now()
	p.mu.Lock()
	if p.fleet != nil {
		p.l.SetCap(allowance)
	}
	if len(p.starts) > 0 {
		p.l.Overdue(now, maps.Values(p.starts))
	}
	if pr := p.reading.Load(); pr != nil {
		if pr.r.Active > 0 {
			p.l.Queued(max(0, pr.r.Active-pr.r.Busy), pr.r.Since)
		}
		switch {
		case p.fleet == nil:
			p.l.Raise(pr.r.Idle, 1, pr.to, pr.r.Since, now)
		default:
			if st := p.fleet.Stats(); !st.Degraded {
				p.l.Raise(pr.r.Idle, st.Share, allowance, pr.r.Since, now)
			}
		}
	}
	learned := int64(p.l.Limit())
	limit := min(learned, allowance)
	p.mu.Unlock()
	p.fleetBound.Store(p.fleet != nil && allowance <= learned)
	_ = p.q.setSlots(max(1, limit))
}

// Stats returns the Pool's counters and sizes.
func (p *Pool) Stats() PoolStats {
	s := PoolStats{QueueStats: p.q.Stats()}
	p.mu.Lock()
	s.Limit = p.l.Limit()
	p.mu.Unlock()
	if p.fleet != nil {
		s.Allowance = p.fleet.allowance(spillway.Critical)
	}
	return s
}

var _ spillway.Limiter = (*Pool)(nil)
