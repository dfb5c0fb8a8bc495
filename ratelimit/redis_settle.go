package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/lua"
)

// Settles off the request path (Hold.settleAsync on a RedisStore).
//
// A settle decides nothing a client sees, so it need not make the request
// wait for a round trip. settleAsync puts it in the store's queue and
// returns; the store sends what is queued in one settle script call per
// Cluster slot (one in all on a single server), in one pipeline:
//
//   - first in the pipeline of the store's next call on a single server
//     (run: the process's next decision or reservation sees them), or
//     with the next coalesced call of decisions on a Cluster (a busy
//     store pays no round trip of its own for its settles), or
//   - from the store's background goroutine, two milliseconds after the
//     first settle queued (sooner once settleFlushItems items wait), so
//     that a quiet store still settles within about a round trip.
//
// On a single server a call that starts while a settle on one of its
// keys is on its way (a flight) waits for it (awaitFlights), so that the
// process's next call sees its earlier settles whichever connection gets
// to Redis first.
//
// The queue is bounded (RedisSettings.SettleQueue, in items): a settle that finds it
// full is not queued, and its hold is left to its TTL. A call that fails
// (a timeout, a refused connection, a breaker that refuses the command)
// puts its settles back at the head of the queue, while their holds live
// and the queue has room; the goroutine then waits settleRetry before it
// sends again. A retried settle is safe: the script settles each hold id
// at most once. Close flushes the queue within a deadline.

// DefaultSettleQueue is the number of settle items (one per item of a
// Hold) a RedisStore queues at most (see RedisSettings.SettleQueue).
const DefaultSettleQueue = 1 << 14

const (
	settleLinger      = 2 * time.Millisecond   // how long the first queued settle waits for company
	settleFlushItems  = 256                    // items per flush: a flush starts at once with as many
	settleCallTimeout = 250 * time.Millisecond // the deadline of one flush's call
	settleRetry       = 100 * time.Millisecond // the pause after a failed flush
)

// setGate installs gate, asked before each call after admission (a nil
// gate always calls; fallback.Store installs its breaker). While gate
// returns false, the store's background path sends no settle (they wait in the queue while their
// holds live, else are left to their TTL) and a synchronous Settle
// returns an error wrapping errNotSent at once. gate must be quick and
// safe for concurrent use.
func (s *RedisStore) setGate(gate func() bool) {
	if gate == nil {
		s.gate.Store(nil)
		return
	}
	s.gate.Store(&gate)
}

// open reports whether the gate lets the store call Redis.
func (s *RedisStore) open() bool {
	g := s.gate.Load()
	return g == nil || (*g)()
}

// asyncSettle is one Hold's settle in the queue.
type asyncSettle struct {
	h      *Hold
	actual []int64
	res    []SettleResult // what the calls so far answered (0: not yet)
	then   func([]SettleResult, error)
	next   *asyncSettle // in settleQueue.in
	flight *flight      // the call carrying it, once taken
}

// flight is one call's worth of settles on its way to Redis (taken by
// the goroutine or by a call they ride on). A process's later call on a
// single server that touches one of its keys waits for it (awaitFlights),
// so that it sees them even when it would reach Redis first on another
// connection: what a client was answered before it sent its next request
// is what that request is decided on.
type flight struct {
	keys []string      // the items' keys
	done chan struct{} // closed once answered or put back
}

// settleQueue is a RedisStore's queue of settles. settleAsync pushes onto
// a lock-free stack (in), so that a done never waits on a lock that a
// descheduled goroutine holds; the senders move it, in order, to q under
// mu.
type settleQueue struct {
	max int64 // items

	in      atomic.Pointer[asyncSettle] // pushed by SettleAsync, newest first
	items   atomic.Int64                // items queued, in in and q
	closed  atomic.Bool
	running atomic.Bool                   // the background goroutine runs
	exited  atomic.Pointer[chan struct{}] // closed when it returns
	wake    chan struct{}                 // cuts the goroutine's linger short (cap 1)
	arrive  chan struct{}                 // wakes the idle goroutine: the queue is no longer empty (cap 1)
	ticking atomic.Bool                   // the goroutine looks at the queue each linger: a push need not wake it
	pushes  atomic.Uint64                 // settles pushed so far

	mu      sync.Mutex // the senders' side
	q       []*asyncSettle
	flying  int       // settles taken and not yet answered or put back
	flights []*flight // taken and not yet landed
	nflight atomic.Int64
}

func newSettleQueue(max int) *settleQueue {
	if max <= 0 {
		max = DefaultSettleQueue
	}
	return &settleQueue{max: int64(max), wake: make(chan struct{}, 1), arrive: make(chan struct{}, 1)}
}

// collect moves what SettleAsync pushed to the end of q, oldest first.
// q.mu is held.
func (q *settleQueue) collect() {
	top := q.in.Swap(nil)
	if top == nil {
		return
	}
	n := len(q.q)
	for a := top; a != nil; {
		next := a.next
		a.next = nil
		q.q = append(q.q, a)
		a = next
	}
	slices.Reverse(q.q[n:])
}

// settleAsync implements holdSettler: it queues the settle.
func (s *RedisStore) settleAsync(h *Hold, actual []int64, then func([]SettleResult, error)) {
	res := make([]SettleResult, len(h.items))
	if h.fixedOnly(res) { // nothing held: nothing to send
		then(res, nil)
		return
	}
	q := s.sq
	if q.closed.Load() {
		then(nil, fmt.Errorf("ratelimit: redis: store closed: %w", errNotSent))
		return
	}
	n := int64(len(h.items))
	after := q.items.Add(n)
	if after > q.max {
		q.items.Add(-n)
		then(nil, fmt.Errorf("ratelimit: redis: %d settle items queued, the bound: %w", q.max, errNotSent))
		return
	}
	a := &asyncSettle{h: h, actual: actual, res: res, then: then} // res: the fixed items answered
	for {
		old := q.in.Load()
		a.next = old
		if q.in.CompareAndSwap(old, a) {
			q.pushes.Add(1)
			// a goroutine that ticks finds it within a linger: waking
			// one would cost done a system call
			if old == nil && !q.ticking.Load() {
				signal(q.arrive)
			}
			break
		}
	}
	if after >= settleFlushItems && after-n < settleFlushItems {
		signal(q.wake)
	}
	s.startSettleLoop()
}

// startSettleLoop starts the background goroutine unless it runs.
func (s *RedisStore) startSettleLoop() {
	q := s.sq
	if q.running.Load() || !q.running.CompareAndSwap(false, true) {
		return
	}
	ch := make(chan struct{})
	q.exited.Store(&ch)
	go s.settleLoop(ch)
}

// signal sends on ch (cap 1) unless a signal is already pending.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// take removes up to max items' worth of settles (at least one) from the
// head of the queue. q.mu is held.
func (q *settleQueue) take(max int) []*asyncSettle {
	q.collect()
	n, items := 0, 0
	for n < len(q.q) && (n == 0 || items+len(q.q[n].h.items) <= max) {
		items += len(q.q[n].h.items)
		n++
	}
	q.flying += n
	batch := make([]*asyncSettle, n)
	copy(batch, q.q)
	f := &flight{keys: make([]string, 0, items), done: make(chan struct{})}
	for _, a := range batch {
		a.flight = f
		for i := range a.h.items {
			f.keys = append(f.keys, a.h.rkeys[i])
		}
	}
	q.flights = append(q.flights, f)
	q.nflight.Add(1) // before items: a call that finds none queued finds the flight
	rest := copy(q.q, q.q[n:])
	clear(q.q[rest:])
	q.q = q.q[:rest]
	q.items.Add(-int64(items))
	return batch
}

// flightOf is the flight of a batch that take returned (read by its
// taker before the batch is put back: a later take sets another).
func flightOf(batch []*asyncSettle) *flight {
	if len(batch) == 0 {
		return nil
	}
	return batch[0].flight
}

// land ends flight f (its settles answered or put back): the calls
// waiting for it go on.
func (q *settleQueue) land(f *flight) {
	if f == nil {
		return
	}
	q.mu.Lock()
	if i := slices.Index(q.flights, f); i >= 0 {
		q.flights = slices.Delete(q.flights, i, i+1)
		q.nflight.Add(-1)
	}
	q.mu.Unlock()
	close(f.done)
}

// awaitFlights waits, on a single server, until no settle on its way to
// Redis in a flight other than own touches one of keys, or ctx ends. A
// call runs it after it took what it carries (takeForCall): a settle
// queued before it started is then either carried by it, or in a flight,
// or answered. Without a flight on its way it costs one atomic load.
func (s *RedisStore) awaitFlights(ctx context.Context, keys []string, own []*asyncSettle) {
	q := s.sq
	if s.sharded != oneServer || q.nflight.Load() == 0 {
		return
	}
	mine := flightOf(own)
	var wait []chan struct{}
	q.mu.Lock()
	for _, f := range q.flights {
		if f != mine && slices.ContainsFunc(f.keys, func(k string) bool { return slices.Contains(keys, k) }) {
			wait = append(wait, f.done)
		}
	}
	q.mu.Unlock()
	for _, ch := range wait {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// run runs script as Script.Run does; on a single server the settles
// queued so far go first, in the same pipeline (one round trip): a
// process's next call sees its earlier settles, and a quiet store sends
// them without a call of their own. On a Cluster (Ring) the call runs
// alone (the settles wait for the goroutine or a coalesced call).
func (s *RedisStore) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.sharded != oneServer {
		return script.Run(ctx, s.client, keys, args...)
	}
	settles := s.sq.takeForCall(s)
	s.awaitFlights(ctx, keys, settles)
	if len(settles) == 0 {
		return script.Run(ctx, s.client, keys, args...)
	}
	if !s.settleLoaded.Load() {
		// Loaded once, so that the settles run before the call on their
		// first trip too (a NOSCRIPT would send them again after it). A
		// server that lost its scripts since (a restart, SCRIPT FLUSH)
		// runs them after the call once.
		if err := lua.Script("ratelimit_settle").Load(ctx, s.client).Err(); err == nil {
			s.settleLoaded.Store(true)
		}
	}
	calls := s.settleCalls(settles)
	pipe := s.client.Pipeline()
	for _, c := range calls {
		c.cmd = lua.Script("ratelimit_settle").EvalSha(ctx, pipe, c.keys, c.args...)
	}
	cmd := script.EvalSha(ctx, pipe, keys, args...)
	_, _ = pipe.Exec(ctx)
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			c.cmd = lua.Script("ratelimit_settle").Run(ctx, s.client, c.keys, c.args...)
		}
	}
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = script.Run(ctx, s.client, keys, args...)
	}
	s.deliverSettles(ctx, settles, calls)
	return cmd
}

// settlesToRide takes the settles that a single server's hold script
// call carries (see run): none on a Cluster or a Ring, whose settles wait
// for the goroutine or a coalesced call.
func (s *RedisStore) settlesToRide() []*asyncSettle {
	if s.sharded != oneServer {
		return nil
	}
	return s.sq.takeForCall(s)
}

// takeForCall takes what a coalesced call of decisions can carry along:
// nothing when the queue is empty or the gate is closed.
func (q *settleQueue) takeForCall(s *RedisStore) []*asyncSettle {
	if q.in.Load() == nil && q.items.Load() == 0 {
		return nil // lock-free: the common case of a busy store without holds
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.collect()
	if len(q.q) == 0 || !s.open() {
		return nil
	}
	return q.take(settleFlushItems)
}

// requeue puts back, at the head, the settles of a failed call whose
// holds still live and for which there is room; the others end with err.
func (q *settleQueue) requeue(batch []*asyncSettle, err error) {
	now := time.Now()
	var back, dropped []*asyncSettle
	q.mu.Lock()
	q.flying -= len(batch)
	room := q.max - q.items.Load()
	for _, a := range batch {
		if n := int64(len(a.h.items)); !q.closed.Load() && now.Before(a.h.until) && n <= room {
			back = append(back, a)
			room -= n
			q.items.Add(n)
		} else {
			dropped = append(dropped, a)
		}
	}
	q.q = append(back, q.q...)
	q.mu.Unlock()
	for _, a := range dropped {
		a.then(nil, fmt.Errorf("%w: %w", errNotSent, err))
	}
}

// settleIdle is how long the background goroutine waits for a settle
// once the queue is empty before it returns (the next settle starts it
// again): a busy store does not start a goroutine per flush.
const settleIdle = 100 * time.Millisecond

// settleLoop is the background goroutine: it sends what is queued, a
// linger after the first settle arrives, until the queue has stayed empty
// for settleIdle.
func (s *RedisStore) settleLoop(exited chan struct{}) {
	q := s.sq
	defer close(exited)
	var idle *time.Timer
	// stop returns whether the goroutine may return: nothing is queued
	// (what a SettleAsync pushes after this check starts a goroutine of
	// its own, or this one again).
	stop := func() bool {
		q.running.Store(false)
		return q.in.Load() == nil || !q.running.CompareAndSwap(false, true)
	}
	// While settles keep coming (a busy store, whose calls mostly carry
	// them), the goroutine ticks: it looks at the queue every linger,
	// and SettleAsync does not wake it. settleIdle without a push ends
	// the ticking.
	var seen uint64
	var quiet time.Duration
	ticked := false // the last wait was a tick: what it found waited a linger already
	for {
		q.mu.Lock()
		q.collect()
		if len(q.q) == 0 {
			if q.closed.Load() {
				q.mu.Unlock()
				q.ticking.Store(false)
				if stop() {
					return
				}
				continue
			}
			q.mu.Unlock()
			if n := q.pushes.Load(); n != seen {
				seen, quiet = n, 0
			} else {
				quiet += settleLinger
			}
			if quiet < settleIdle {
				q.ticking.Store(true)
				t := time.NewTimer(settleLinger)
				select {
				case <-t.C:
				case <-q.wake:
					t.Stop()
				}
				ticked = true
				continue
			}
			// no push for settleIdle: wait to be woken; a push made
			// before ticking stopped is seen by this check
			q.ticking.Store(false)
			if q.in.Load() != nil {
				continue
			}
			if idle == nil {
				idle = time.NewTimer(settleIdle)
			} else {
				idle.Reset(settleIdle)
			}
			select {
			case <-q.arrive:
				idle.Stop()
			case <-q.wake: // Close
				idle.Stop()
			case <-idle.C:
				q.mu.Lock()
				q.collect()
				empty := len(q.q) == 0
				q.mu.Unlock()
				if empty && stop() {
					return
				}
			}
			ticked = false
			continue
		}
		hurry := ticked || q.closed.Load() || q.items.Load() >= settleFlushItems
		ticked = false
		q.mu.Unlock()
		if !hurry {
			t := time.NewTimer(settleLinger)
			select {
			case <-t.C:
			case <-q.wake:
				t.Stop()
			}
		}
		q.mu.Lock()
		q.collect()
		if len(q.q) == 0 { // a coalesced call took them meanwhile
			q.mu.Unlock()
			continue
		}
		batch := q.take(settleFlushItems)
		q.mu.Unlock()
		if !s.open() {
			f := flightOf(batch)
			q.requeue(batch, errGateClosed)
			q.land(f)
			time.Sleep(settleRetry)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), settleCallTimeout)
		calls := s.settleCalls(batch)
		if len(calls) == 1 {
			c := calls[0]
			c.cmd = lua.Script("ratelimit_settle").Run(ctx, s.client, c.keys, c.args...)
		} else {
			pipe := s.client.Pipeline()
			for _, c := range calls {
				c.cmd = lua.Script("ratelimit_settle").EvalSha(ctx, pipe, c.keys, c.args...)
			}
			_, _ = pipe.Exec(ctx)
			for _, c := range calls {
				if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
					c.cmd = lua.Script("ratelimit_settle").Run(ctx, s.client, c.keys, c.args...)
				}
			}
		}
		failed := s.deliverSettles(ctx, batch, calls)
		cancel()
		if failed {
			time.Sleep(settleRetry)
		}
	}
}

// errGateClosed is the cause of a settle not sent because the store's
// gate (setGate) refused the call.
var errGateClosed = errors.New("ratelimit: redis: the store's gate refused the call (breaker open)")

// settleCall is one settle script call of a flush: the items of one slot
// (one hash tag on a Ring), in queue order.
type settleCall struct {
	shard int    // slot
	tag   string // byTag
	refs  []settleRef
	keys  []string
	args  []any
	cmd   *redis.Cmd
}

// settleRef is item i of a queued settle.
type settleRef struct {
	a *asyncSettle
	i int
}

// settleCalls groups the unanswered items of batch by slot (tag).
func (s *RedisStore) settleCalls(batch []*asyncSettle) []*settleCall {
	var calls []*settleCall
	now := s.nowArg()
	for _, a := range batch {
		h := a.h
		for i := range h.items {
			if a.res[i] != 0 {
				continue // answered by an earlier call
			}
			k := h.rkeys[i]
			var c *settleCall
			sl, tag := 0, ""
			switch s.sharded {
			case bySlot:
				sl = slot(k)
			case byTag:
				tag = keys.Tag(k)
			}
			for _, d := range calls {
				if d.shard == sl && d.tag == tag {
					c = d
					break
				}
			}
			if c == nil {
				c = &settleCall{shard: sl, tag: tag, args: []any{now, 0}}
				calls = append(calls, c)
			}
			c.refs = append(c.refs, settleRef{a, i})
			c.keys = append(c.keys, k)
			c.args = h.settleArgs(c.args, i, false, a.actual[i], [3]int64{})
		}
	}
	return calls
}

// deliverSettles reads the replies of calls into the settles of batch and
// tells each settle whose items are all answered; the others go back to
// the queue (or end with the error). It reports whether a call failed.
func (s *RedisStore) deliverSettles(ctx context.Context, batch []*asyncSettle, calls []*settleCall) bool {
	f := flightOf(batch)
	defer s.sq.land(f)
	var firstErr error
	for _, c := range calls {
		err := c.cmd.Err()
		if err != nil && s.sharded == oneServer && strings.Contains(err.Error(), "CROSSSLOT") {
			// a Cluster in disguise: each item on its own (nothing ran)
			for _, r := range c.refs {
				h := r.a.h
				v, e := lua.Script("ratelimit_settle").Run(ctx, s.client, h.rkeys[r.i:r.i+1], h.settleArgs([]any{s.nowArg(), 0}, r.i, false, r.a.actual[r.i], [3]int64{})...).Result()
				if e == nil {
					e = r.a.answer(r.i, v)
				}
				if e != nil && firstErr == nil {
					firstErr = e
				}
			}
			continue
		}
		if err == nil {
			var v []int64
			if v, err = intSlice(c.cmd.Val(), len(c.refs)); err == nil {
				for j, r := range c.refs {
					var sr SettleResult
					if sr, err = settleResultOf(j, v[j]); err != nil {
						break
					}
					r.a.res[r.i] = sr
				}
			}
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("ratelimit: redis: settle script: %w", err)
		}
	}
	var failed []*asyncSettle
	for _, a := range batch {
		if a.answered() {
			a.then(a.res, nil)
		} else {
			failed = append(failed, a)
		}
	}
	q := s.sq
	q.mu.Lock()
	q.flying -= len(batch) - len(failed)
	q.mu.Unlock()
	if len(failed) > 0 {
		q.requeue(failed, firstErr)
	}
	return firstErr != nil
}

// answer records item i's reply v (one integer in a one-item array).
func (a *asyncSettle) answer(i int, v any) error {
	r, err := intSlice(v, 1)
	if err != nil {
		return fmt.Errorf("ratelimit: redis: settle script: %w", err)
	}
	sr, err := settleResultOf(0, r[0])
	if err != nil {
		return fmt.Errorf("ratelimit: redis: settle script: %w", err)
	}
	a.res[i] = sr
	return nil
}

func (a *asyncSettle) answered() bool {
	for _, r := range a.res {
		if r == 0 {
			return false
		}
	}
	return true
}

// flushSettles sends the settles queued so far (Hold.settleAsync) at once and
// waits until none is queued or on its way, or ctx ends (then it returns
// ctx.Err()). A settle its call could not send is put back while its hold
// lives, so it returns only once that settle was answered or dropped.
func (s *RedisStore) flushSettles(ctx context.Context) error {
	q := s.sq
	for {
		q.mu.Lock()
		q.collect()
		idle := len(q.q) == 0 && q.flying == 0
		q.mu.Unlock()
		if idle {
			return nil
		}
		signal(q.wake)
		t := time.NewTimer(100 * time.Microsecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close sends the settles still queued off the request path (by tiers'
// `cost: response` rules) and waits until they are answered or ctx ends;
// what is still queued then is left to its holds' TTL. After Close, such
// settles are no longer queued (left to their TTL); decisions,
// reservations and synchronous settles still work: Close does not close
// the client, which belongs to the caller. It returns ctx.Err() when ctx
// ended first.
func (s *RedisStore) Close(ctx context.Context) error {
	q := s.sq
	q.closed.Store(true)
	signal(q.wake)
	exited := q.exited.Load()
	if exited == nil {
		return nil // never started: nothing was queued
	}
	select {
	case <-*exited:
		if q.in.Load() == nil { // else a SettleAsync that raced Close started another
			return nil
		}
		s.startSettleLoop()
		if e := q.exited.Load(); e != exited {
			select {
			case <-*e:
				return nil
			case <-ctx.Done():
			}
		}
	case <-ctx.Done():
	}
	q.mu.Lock()
	q.collect()
	left := q.q
	q.q = nil
	for _, a := range left {
		q.items.Add(-int64(len(a.h.items)))
	}
	q.mu.Unlock()
	for _, a := range left {
		a.then(nil, fmt.Errorf("ratelimit: redis: store closed before the settle was sent: %w", errNotSent))
	}
	return ctx.Err()
}

// ride appends the settle call sc to a hold script call's keys and args
// (ratelimit_hold.lua runs the settles first), so that the settles pay
// no script call of their own.
func (sc *settleCall) ride(keys []string, args []any) ([]string, []any) {
	keys = append(keys[:len(keys):len(keys)], sc.keys...)
	return keys, append(args[:len(args):len(args)], sc.args[2:]...) // without the settle script's now and mode
}

// split separates the reply res (or error err) of a hold script call that
// carried sc: sc.cmd gets the settles' results (or err); the hold's own
// reply is returned.
func (sc *settleCall) split(ctx context.Context, res any, err error) any {
	sc.cmd = redis.NewCmd(ctx)
	if err != nil {
		sc.cmd.SetErr(err)
		return res
	}
	arr, ok := res.([]any)
	if !ok || len(arr) < len(sc.refs) {
		sc.cmd.SetErr(fmt.Errorf("unexpected reply of the hold script carrying %d settles: %v", len(sc.refs), res))
		return res
	}
	cut := len(arr) - len(sc.refs)
	sc.cmd.SetVal(arr[cut:])
	return arr[:cut]
}
