package shedder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/budget"
)

// Queue is a server's own pool of slots (its database connections, its
// workers) with a short wait in priority order in front of it: at most
// slots units of cost are in flight; a request that finds no free slot
// waits up to the maximum wait (default 100ms) for one, and a slot that
// comes free goes to the waiter of the highest priority (the longest
// waiting among equals), never to whoever asks next.
//
// It does what a Worker's hard cap cannot on a saturated pool. A cap
// rejects at once, so every slot that comes free stays idle until the
// next request arrives, and Critical work only gets a slot that the
// reserve kept idle for it; both cost throughput. The Queue hands each
// freed slot straight to a waiter, and Critical work waits only for the
// next slot to come free, however much lower-priority work is offered.
//
// The queue holds at most depth waiters (default slots). When it is full,
// an arriving request displaces the newest waiter of the lowest priority
// below its own, which is denied at once; if there is none, the arrival is
// denied at once. A waiter whose wait runs out or whose context ends is
// denied. Denials have Reason spillway.ReasonShed and the Queue's
// RetryAfter; a request that costs more than slots is denied with
// spillway.ReasonCostExceedsLimit, a malformed one with
// spillway.ReasonInvalid. Allowed decisions carry Limit 0, so a chain's
// headers keep reporting the client's own quota.
//
// The wait does not spend the request's admission budget
// (it is paused): a Redis-backed block after the Queue in a chain
// keeps the budget the blocks before the Queue left it.
//
// A slot is not taken from a waiter: a request is admitted without waiting
// only when its cost fits and nobody of its priority or higher waits. The
// head of the queue is never overtaken by smaller requests behind it, so
// a large request is not starved.
//
// It is configured by QueueSettings; the order of the queue takes the
// place of a reserve. A Queue is safe for concurrent use; Admit never
// returns an error.
type Queue struct {
	slots int64
	o     options
	waits [spillway.NumPriorities]time.Duration // the maximum wait per priority

	mu      sync.Mutex
	used    int64
	waiting [spillway.NumPriorities][]*waiter // FIFO per priority
	nwait   int
	hold    time.Duration // how long admitted work holds its slots, on average (EWMA)
	busy    time.Time     // the queue last went from no waiter to one
	usedBy  [spillway.NumPriorities]int64

	// Tenant: the active tenants (work in flight or waiting) of each
	// priority; an entry is removed when its tenant has neither.
	tenants [spillway.NumPriorities]map[string]*tenant
	// Tenant: the records of service of tenants forgotten when idle
	// (remember), and when each priority's were last pruned.
	memory  [spillway.NumPriorities]map[string]servedRecord
	pruned  [spillway.NumPriorities]time.Time
	scratch []shareEntry

	admitted, waited, timedOut, displaced, rejected, late, expired, overShared atomic.Int64
}

type waiter struct {
	cost     int64
	t        *tenant       // Tenant: its tenant; nil without
	enq      time.Time     // when it joined the queue
	deadline time.Time     // its context's deadline; zero: none
	ready    chan struct{} // closed when granted or denied
	// Written under Queue.mu before ready is closed.
	granted bool
	expired bool // denied at the grant: its deadline had passed
}

// QueueStats are a Queue's counters since it was made.
type QueueStats struct {
	Admitted  int64 // admissions, with or without a wait
	Waited    int64 // admissions that waited for a slot
	TimedOut  int64 // waiters denied when their wait or context ran out
	Displaced int64 // waiters denied to make room for a higher priority
	Rejected  int64 // arrivals denied at once (queue full, or no wait)
	// Late are arrivals denied at once because their expected wait and
	// work were longer than the time their deadline left them (or it had
	// passed).
	Late int64
	// Expired are waiters dropped before any work because their
	// deadline passed while they waited (their context's deadline, or a
	// slot granted after it).
	Expired int64
	// OverShare are arrivals denied at once because their tenant held
	// its fair share of its priority (Tenant).
	OverShare int64
	InFlight  int64 // cost admitted and not yet done
	Waiting   int   // waiters now
	Slots     int64 // slots now
}

// NewQueue returns a Queue of slots units of cost. It fails when slots is
// not positive or a setting is out of range.
func NewQueue(slots int64, s QueueSettings) (*Queue, error) {
	if slots <= 0 {
		return nil, fmt.Errorf("shedder: queue slots %d must be positive", slots)
	}
	return newQueue(slots, queueOptions(s, "queue", int(min(slots, 1<<20))))
}

// newQueue validates the options of a Queue (or a Pool's) and returns it.
func newQueue(slots int64, o options) (*Queue, error) {
	if err := o.validateCommon(); err != nil {
		return nil, err
	}
	if o.maxWait < 0 {
		return nil, fmt.Errorf("shedder: max wait %v is negative", o.maxWait)
	}
	if o.badQueue != "" {
		return nil, fmt.Errorf("shedder: %s", o.badQueue)
	}
	if o.badWait {
		return nil, fmt.Errorf("shedder: priority wait of a priority outside [%v, %v]", spillway.Sheddable, spillway.CriticalPlus)
	}
	q := &Queue{slots: slots, o: o}
	for p := range q.waits {
		q.waits[p] = o.maxWait
		if o.waitSet[p] {
			q.waits[p] = o.waits[p]
		}
		if q.waits[p] < 0 {
			return nil, fmt.Errorf("shedder: priority wait of %v is %v, negative", spillway.Priority(p), q.waits[p])
		}
	}
	if o.depth < 0 {
		return nil, fmt.Errorf("shedder: queue depth %d is negative", o.depth)
	}
	return q, nil
}

// Admit decides r, waiting up to the maximum wait for a slot. When
// allowed, done gives r's slots back (to the first waiter).
func (q *Queue) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: q.o.name}, spillway.Noop, nil
	}
	c, p := r.EffectiveCost(), r.Priority
	var tname string
	if q.o.tenantDim != "" {
		tname, _ = r.Get(q.o.tenantDim) // without it: the tenant ""
	}
	if ctx.Err() != nil {
		// The client already left (its deadline passed, or it went
		// away): no work for it, not even a slot.
		q.mu.Lock()
		d := q.deny()
		q.mu.Unlock()
		q.late.Add(1)
		return d, spillway.Noop, nil
	}
	q.mu.Lock()
	if c > q.slots {
		slots := q.slots
		q.mu.Unlock()
		return spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: q.o.name, Limit: slots}, spillway.Noop, nil
	}
	var overDeny spillway.Decision // the tenant's refusal, if it is past its share
	if q.o.tenantDim != "" {
		d, over := q.overShare(p, tname, c)
		if over {
			q.mu.Unlock()
			q.overShared.Add(1)
			return d, spillway.Noop, nil
		}
		overDeny = d
	}
	if c <= q.slots-q.used && !q.waitingFrom(p) { // never wraps, where used + c could
		q.used += c
		q.usedBy[p] += c
		t := q.tenantFor(p, tname)
		if t != nil {
			t.inflight += c
			t.serve(c, q.o.now())
		}
		q.mu.Unlock()
		return q.allow(c, p, t)
	}
	var (
		now      = q.o.now()
		deadline time.Time
		wait     = q.waits[p]
	)
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl
		if left := dl.Sub(now); left <= 0 || q.expectedWait(p, c)+q.hold > left {
			// Its wait and its work (the mean hold) would end after its
			// client gave up: refuse it now, while it can still go
			// elsewhere.
			d := q.deny()
			q.mu.Unlock()
			q.late.Add(1)
			return d, spillway.Noop, nil
		}
	}
	if q.o.sojournTarget > 0 {
		// CoDel-style: while the queue has not been empty for an
		// interval, a wait is bounded by the target; else by the
		// interval.
		if q.nwait > 0 && now.Sub(q.busy) >= q.o.sojournInterval {
			wait = min(wait, q.o.sojournTarget)
		} else {
			wait = min(wait, q.o.sojournInterval)
		}
	}
	if wait <= 0 || !q.makeRoom(p) {
		d := overDeny // the tenant's extra request: its 429
		if d.Reason == spillway.ReasonNone {
			d = q.deny()
			q.rejected.Add(1)
		} else {
			q.overShared.Add(1)
		}
		q.mu.Unlock()
		return d, spillway.Noop, nil
	}
	w := &waiter{cost: c, enq: now, deadline: deadline, ready: make(chan struct{}), t: q.tenantFor(p, tname)}
	if w.t != nil {
		w.t.waiting += c
	}
	if q.nwait == 0 {
		q.busy = now
	}
	q.waiting[p] = append(q.waiting[p], w)
	q.nwait++
	q.mu.Unlock()

	// The wait is local work, not a wait on a shared store: it does not
	// spend the request's admission budget (budget.Pause).
	resume := budget.Pause(ctx)
	t := time.NewTimer(wait)
	select {
	case <-w.ready:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	resume()
	q.mu.Lock()
	granted := w.granted
	var d spillway.Decision
	if !granted && q.remove(p, w) {
		// Still queued: its wait or its context ran out.
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			q.expired.Add(1)
		case ctx.Err() == nil && overDeny.Reason != spillway.ReasonNone:
			q.overShared.Add(1)
			d = overDeny
		default:
			q.timedOut.Add(1)
		}
	}
	if !granted && d.Reason == spillway.ReasonNone {
		d = q.deny()
	}
	q.mu.Unlock()
	if !granted {
		return d, spillway.Noop, nil
	}
	if ctx.Err() != nil {
		// Granted as its deadline passed (or its client left): the slot
		// goes back before any work.
		q.release(c, p, w.t, 0, -1)
		q.mu.Lock()
		d = q.deny()
		q.mu.Unlock()
		q.expired.Add(1)
		return d, spillway.Noop, nil
	}
	q.waited.Add(1)
	return q.allow(c, p, w.t)
}

// expectedWait is how long a request of priority p and cost c that joins
// the queue now would wait for its slots: the cost ahead of it (waiters
// of its priority and higher), less the free slots, served at slots per
// mean hold time; 0 before any work ended. Called with q.mu held.
func (q *Queue) expectedWait(p spillway.Priority, c int64) time.Duration {
	if q.hold <= 0 {
		return 0
	}
	ahead := c - (q.slots - q.used)
	for i := int(p); i < spillway.NumPriorities; i++ {
		for _, w := range q.waiting[i] {
			ahead += w.cost
		}
	}
	if ahead <= 0 {
		return 0
	}
	return time.Duration(float64(q.hold) * float64(ahead) / float64(q.slots))
}

func (q *Queue) allow(c int64, p spillway.Priority, t *tenant) (spillway.Decision, spillway.Done, error) {
	q.admitted.Add(1)
	start := q.o.now()
	return spillway.Decision{Allowed: true, Limiter: q.o.name}, block.Once(func(spillway.Outcome) {
		q.release(c, p, t, 0, q.o.now().Sub(start))
	}), nil
}

// deny is called with q.mu held.
func (q *Queue) deny() spillway.Decision {
	return spillway.Decision{
		Reason:     spillway.ReasonShed,
		Limiter:    q.o.name,
		Limit:      q.slots,
		Remaining:  max(0, q.slots-q.used),
		RetryAfter: q.o.retryAfter,
	}
}

// waitingFrom reports whether anyone of priority p or higher waits. Called
// with q.mu held.
func (q *Queue) waitingFrom(p spillway.Priority) bool {
	for i := int(p); i < spillway.NumPriorities; i++ {
		if len(q.waiting[i]) > 0 {
			return true
		}
	}
	return false
}

// makeRoom reports whether a waiter of priority p can join the queue,
// displacing the newest waiter of the lowest priority below p when the
// queue is full. Called with q.mu held.
func (q *Queue) makeRoom(p spillway.Priority) bool {
	if q.nwait < q.o.depth {
		return true
	}
	for i := 0; i < int(p); i++ {
		if n := len(q.waiting[i]); n > 0 {
			w := q.waiting[i][n-1]
			q.waiting[i] = q.waiting[i][:n-1]
			q.nwait--
			q.unwait(w)
			q.displaced.Add(1)
			close(w.ready) // not granted: it is denied
			return true
		}
	}
	return false
}

// remove takes w out of the queue of priority p if it is still there.
// Called with q.mu held.
func (q *Queue) remove(p spillway.Priority, w *waiter) bool {
	i := slices.Index(q.waiting[p], w)
	if i < 0 {
		return false
	}
	q.waiting[p] = slices.Delete(q.waiting[p], i, i+1)
	q.nwait--
	q.unwait(w)
	return true
}

// setSlots changes the number of slots, for a pool whose size is learned
// at run time (from latency, or from the share of a fleet-wide limit this
// server sees). More slots go to the waiters at once; with fewer, work in
// flight finishes and nothing new is admitted until it is under the new
// count. n must be positive.
func (q *Queue) setSlots(n int64) error {
	if n <= 0 {
		return fmt.Errorf("shedder: queue slots %d must be positive", n)
	}
	q.release(0, 0, nil, n, -1)
	return nil
}

// meanHold returns how long admitted work holds its slots, on average over
// about the last 16 pieces (0 before any ended): the estimate behind a
// request's expected wait.
func (q *Queue) meanHold() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.hold
}

// holdWeight is the weight of one piece of work in the mean hold time
// (an EWMA over about the last 16).
const holdWeight = 1.0 / 16

// release gives c slots back (held for held, when not negative: it
// updates the mean hold time) and hands free slots to the waiters in
// order: highest priority first, the longest waiting first among equals
// (the newest under a standing queue with LIFO), stopping at the
// first that does not fit. A waiter whose deadline passed or comes within
// the mean hold time (its work would end after it), or whose
// sojourn passed the target of SojournTarget under a standing queue, is
// denied instead, before any work.
func (q *Queue) release(c int64, p spillway.Priority, t *tenant, slots int64, held time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.used -= c
	q.usedBy[p] -= c
	if t != nil {
		t.inflight -= c
		q.dropIdle(t)
	}
	if slots > 0 {
		q.slots = slots
	}
	if held >= 0 && c > 0 {
		if q.hold == 0 {
			q.hold = held
		} else {
			q.hold += time.Duration(holdWeight * float64(held-q.hold))
		}
	}
	if q.nwait == 0 {
		return
	}
	now := q.o.now()
	standing := now.Sub(q.busy)
	for p := spillway.NumPriorities - 1; p >= 0; p-- {
		for len(q.waiting[p]) > 0 {
			lifo := q.o.lifoAfter > 0 && now.Sub(q.waiting[p][0].enq) >= q.o.lifoAfter
			i := 0
			switch {
			case q.o.tenantDim != "":
				i = q.fairest(spillway.Priority(p), lifo, now)
			case lifo:
				i = len(q.waiting[p]) - 1 // adaptive LIFO: the newest first
			}
			w := q.waiting[p][i]
			switch {
			case !w.deadline.IsZero() && w.deadline.Sub(now) <= q.hold:
				// Its deadline passed, or comes before its work would
				// end (the mean hold): no work for it.
				w.expired = true
			case q.o.sojournTarget > 0 && standing >= q.o.sojournInterval && now.Sub(w.enq) > q.o.sojournTarget:
				w.expired = true
			case w.cost > q.slots-q.used:
				return
			default:
				q.used += w.cost
				q.usedBy[p] += w.cost
				w.granted = true
			}
			q.waiting[p] = slices.Delete(q.waiting[p], i, i+1)
			q.nwait--
			if w.t != nil {
				w.t.waiting -= w.cost
				if w.granted {
					w.t.inflight += w.cost
					w.t.serve(w.cost, now)
				} else {
					q.dropIdle(w.t)
				}
			}
			if w.expired {
				q.expired.Add(1)
			}
			close(w.ready)
			if q.nwait == 0 {
				return
			}
		}
	}
}

// Stats returns the Queue's counters.
func (q *Queue) Stats() QueueStats {
	q.mu.Lock()
	inflight, nwait, slots := q.used, q.nwait, q.slots
	q.mu.Unlock()
	return QueueStats{
		Admitted:  q.admitted.Load(),
		Waited:    q.waited.Load(),
		TimedOut:  q.timedOut.Load(),
		Displaced: q.displaced.Load(),
		Rejected:  q.rejected.Load(),
		Late:      q.late.Load(),
		Expired:   q.expired.Load(),
		OverShare: q.overShared.Load(),
		InFlight:  inflight,
		Waiting:   nwait,
		Slots:     slots,
	}
}

var _ spillway.Limiter = (*Queue)(nil)
