package ratelimit

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/lua"
)

// DefaultCoalescing is the number of script calls a RedisStore has in
// flight before it coalesces further decisions (see RedisSettings.Coalescing).
const DefaultCoalescing = 1

// Coalesced calls stay bounded: a batch of more than maxCoalesceItems
// items always runs alone, and one coalesced call carries at most
// maxCoalesceItems items (more wait for the next call).
const maxCoalesceItems = 256

// coalescer queues batches while max calls are in flight.
type coalescer struct {
	max int

	mu       sync.Mutex
	inflight int
	queue    []*waiter
	queued   int  // items in queue
	crowded  bool // a call queued since a yield last found nobody to join it

	exp atomic.Pointer[expiry] // the latest shared expiry
}

// expiry is a channel closed at the end of one millisecond, by one timer:
// the batches queued with a deadline (DecideBy) in that millisecond all
// wait on it, so that no timer is made per batch.
type expiry struct {
	at int64 // Unix ns, a multiple of expiryGrain
	ch chan struct{}
}

// expiryGrain is the granularity of the shared deadlines: a deadline is
// rounded up to the next multiple of it.
const expiryGrain = int64(time.Millisecond)

// expiry returns the channel closed once deadline (rounded up to the next
// millisecond) has passed. Deadlines arrive almost in order (one budget
// after their calls), so the latest expiry is nearly always the one; two
// callers that make a new one at once may each keep their own (a second
// timer, never a wrong bound).
func (c *coalescer) expiry(deadline time.Time) <-chan struct{} {
	at := deadline.UnixNano()
	at += (expiryGrain - at%expiryGrain) % expiryGrain
	e := c.exp.Load()
	if e != nil && e.at == at {
		return e.ch
	}
	n := &expiry{at: at, ch: make(chan struct{})}
	time.AfterFunc(time.Until(time.Unix(0, at)), func() { close(n.ch) })
	c.exp.CompareAndSwap(e, n)
	return n.ch
}

// waiter is one queued batch: a copy of the caller's items (the caller
// may return before the call does), their keys, and where the result goes.
type waiter struct {
	ctx      context.Context
	deadline time.Time // DecideBy's, besides ctx's (zero: none)
	items    []Item
	keys     []string
	slot     int    // bySlot: the batch's slot
	tag      string // byTag: the batch's hash tag
	buckets  bool   // every item is of the bucket family
	fixed    bool   // every item is a fixed window
	hold     *Hold  // a reservation (Reserve): keys are its items' keys
	ttl      int64  // the reservation's hold ttl in µs
	res      []spillway.Decision
	allowed  bool
	err      error
	done     chan struct{} // receives once the result is in
}

var waiterPool = sync.Pool{New: func() any { return &waiter{done: make(chan struct{}, 1)} }}

// decide decides a valid, non-empty batch within deadline (zero: ctx's
// alone), coalescing it with others when max calls are in flight.
func (c *coalescer) decide(ctx context.Context, deadline time.Time, s *RedisStore, items []Item, out []spillway.Decision) (bool, error) {
	if len(items) > maxCoalesceItems {
		return s.decideBy(ctx, deadline, items, out)
	}
	c.mu.Lock()
	if c.inflight < c.max && len(c.queue) == 0 {
		c.inflight++
		crowded := c.crowded
		c.mu.Unlock()
		if crowded {
			// The place is this call's. Under load other calls are ready
			// to run: let them queue behind it first, and send them all
			// in one coalesced call rather than this one alone and then
			// the others (each script call costs far more CPU than an
			// item in one). A lone caller, who never queues, never
			// yields: for it the yield is pure cost (the peers benchmark
			// with -goroutines 1 shows it).
			runtime.Gosched()
			c.mu.Lock()
			joined := len(c.queue) > 0
			c.crowded = joined
			c.mu.Unlock()
			if joined {
				if allowed, err, ok := c.lead(ctx, deadline, s, items, out); ok {
					return allowed, err
				}
			}
		}
		allowed, err := s.decideBy(ctx, deadline, items, out)
		c.release(s)
		return allowed, err
	}
	c.mu.Unlock()

	w := waiterPool.Get().(*waiter)
	if !w.prepare(s, items) {
		waiterPool.Put(w)
		return s.decideBy(ctx, deadline, items, out) // several slots: not coalesced
	}
	w.ctx, w.deadline = ctx, deadline
	var expired <-chan struct{} // nil: no deadline besides ctx's
	c.mu.Lock()
	if c.inflight < c.max && len(c.queue) == 0 {
		// the calls in flight returned meanwhile
		c.inflight++
		c.mu.Unlock()
		w.ctx = nil
		waiterPool.Put(w)
		allowed, err := s.decideBy(ctx, deadline, items, out)
		c.release(s)
		return allowed, err
	}
	c.queue = append(c.queue, w)
	c.queued += len(items)
	c.crowded = true
	c.mu.Unlock()
	if !deadline.IsZero() {
		expired = c.expiry(deadline)
	}
	return c.await(ctx, w, expired, out)
}

// lead queues a batch that holds a place (calls queued behind it while
// it yielded) at the head of the queue and hands the queue to a flusher
// with its place, as release does; ok is false, and nothing done, when the
// batch cannot be coalesced (several slots): it then goes alone.
func (c *coalescer) lead(ctx context.Context, deadline time.Time, s *RedisStore, items []Item, out []spillway.Decision) (allowed bool, err error, ok bool) {
	w := waiterPool.Get().(*waiter)
	if !w.prepare(s, items) {
		waiterPool.Put(w)
		return false, nil, false
	}
	w.ctx, w.deadline = ctx, deadline
	c.mu.Lock()
	c.queue = append(c.queue, nil)
	copy(c.queue[1:], c.queue)
	c.queue[0] = w
	c.queued += len(items)
	batch := c.take()
	c.mu.Unlock()
	go c.flushLoop(s, batch)
	var expired <-chan struct{}
	if !deadline.IsZero() {
		expired = c.expiry(deadline)
	}
	allowed, err = c.await(ctx, w, expired, out)
	return allowed, err, true
}

// await waits for the result of w, queued, and copies its decisions to
// out (a reservation's go to its Hold). When ctx ends or expired is
// closed first, w leaves the queue if it is still there (never sent).
func (c *coalescer) await(ctx context.Context, w *waiter, expired <-chan struct{}, out []spillway.Decision) (bool, error) {
	var cause error
	select {
	case <-w.done:
		allowed, err := w.allowed, w.err
		copy(out, w.res)
		w.ctx, w.err, w.hold = nil, nil, nil
		waiterPool.Put(w)
		return allowed, err
	case <-ctx.Done():
		cause = ctx.Err()
	case <-expired:
		cause = context.DeadlineExceeded
	}
	c.mu.Lock()
	for i, q := range c.queue {
		if q == w {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			c.queued -= len(w.items)
			c.mu.Unlock()
			w.ctx, w.hold = nil, nil
			waiterPool.Put(w)
			return false, fmt.Errorf("ratelimit: redis: not sent: %w", cause)
		}
	}
	c.mu.Unlock()
	// Sent: the call goes on for the others and owns w (not pooled again).
	return false, fmt.Errorf("ratelimit: redis: coalesced call: %w", cause)
}

// reserve is decide for a reservation: h (its keys and members made) is
// decided and held for ttlUS µs, alone when fewer than max calls are in
// flight, else in the next coalesced call (one hold script call per slot
// for every reservation queued meanwhile, in the pipeline of the
// decisions').
func (c *coalescer) reserve(ctx context.Context, s *RedisStore, h *Hold, ttlUS int64) (bool, error) {
	c.mu.Lock()
	if c.inflight < c.max && len(c.queue) == 0 {
		c.inflight++
		c.mu.Unlock()
		allowed, err := s.reserveDirect(ctx, h, ttlUS)
		c.release(s)
		return allowed, err
	}
	c.mu.Unlock()
	w := waiterPool.Get().(*waiter)
	if !w.prepareHold(s, h, ttlUS) {
		waiterPool.Put(w)
		return s.reserveDirect(ctx, h, ttlUS) // several slots: not coalesced
	}
	w.ctx = ctx
	c.mu.Lock()
	if c.inflight < c.max && len(c.queue) == 0 {
		c.inflight++
		c.mu.Unlock()
		w.ctx, w.hold = nil, nil
		waiterPool.Put(w)
		allowed, err := s.reserveDirect(ctx, h, ttlUS)
		c.release(s)
		return allowed, err
	}
	c.queue = append(c.queue, w)
	c.queued += len(w.items)
	c.crowded = true
	c.mu.Unlock()
	return c.await(ctx, w, nil, nil)
}

// prepareHold is prepare for a reservation: its items (copied), its key
// pairs, and whether they share one slot (hash tag).
func (w *waiter) prepareHold(s *RedisStore, h *Hold, ttlUS int64) bool {
	w.hold, w.ttl = h, ttlUS
	w.items = append(w.items[:0], h.items...)
	w.keys = append(w.keys[:0], h.rkeys...)
	w.buckets, w.fixed = false, false
	w.res = w.res[:0]
	return w.sameShard(s)
}

// sameShard reports whether w's keys share one slot (one hash tag on a
// Ring), recording it.
func (w *waiter) sameShard(s *RedisStore) bool {
	switch s.sharded {
	case bySlot:
		w.slot = slot(w.keys[0])
		for _, k := range w.keys[1:] {
			if slot(k) != w.slot {
				return false
			}
		}
	case byTag:
		w.tag = keys.Tag(w.keys[0])
		for _, k := range w.keys[1:] {
			if keys.Tag(k) != w.tag {
				return false
			}
		}
	}
	return true
}

// direct decides w with calls of its own.
func (w *waiter) direct(ctx context.Context, s *RedisStore, by sharding) (bool, error) {
	if w.hold != nil {
		return s.reserveDirect(ctx, w.hold, w.ttl)
	}
	if by != s.sharded {
		return s.decideGroups(ctx, w.items, w.res, by)
	}
	return s.decide(ctx, w.items, w.res)
}

// prepare copies items into w with their keys and reports whether they
// share one slot (one hash tag on a Ring), as a coalesced call needs.
func (w *waiter) prepare(s *RedisStore, items []Item) bool {
	w.items = append(w.items[:0], items...)
	w.keys = w.keys[:0]
	w.buckets = bucketsOnly(items)
	w.fixed = !w.buckets && fixedOnly(items)
	for i := range items {
		w.keys = append(w.keys, redisKey(s.prefix, &items[i]))
	}
	if !w.sameShard(s) {
		return false
	}
	if cap(w.res) < len(items) {
		w.res = make([]spillway.Decision, len(items))
	}
	w.res = w.res[:len(items)]
	return true
}

// release ends a call: it hands what was queued meanwhile to a flusher,
// or frees the call's place.
func (c *coalescer) release(s *RedisStore) {
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.inflight--
		c.mu.Unlock()
		return
	}
	batch := c.take()
	c.mu.Unlock()
	go c.flushLoop(s, batch)
}

// take removes the first waiters of the queue, up to maxCoalesceItems
// items (at least one waiter). c.mu is held.
func (c *coalescer) take() []*waiter {
	n, items := 0, 0
	for n < len(c.queue) && (n == 0 || items+len(c.queue[n].items) <= maxCoalesceItems) {
		items += len(c.queue[n].items)
		n++
	}
	batch := make([]*waiter, n)
	copy(batch, c.queue)
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	c.queued -= items
	return batch
}

// flushLoop sends batch, then whatever was queued meanwhile, until the
// queue is empty; it holds one of the max places all along.
func (c *coalescer) flushLoop(s *RedisStore, batch []*waiter) {
	for {
		s.flush(batch)
		c.mu.Lock()
		if len(c.queue) == 0 {
			// the calls just answered, and others ready to run, may
			// queue again at once: keep the place through one yield
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		if len(c.queue) == 0 {
			c.inflight--
			c.mu.Unlock()
			return
		}
		batch = c.take()
		c.mu.Unlock()
	}
}

// callContext is the context of a coalesced call: it carries the values of
// the first batch's context (tracing), is canceled by none of them, and
// ends at the latest of their deadlines (a batch's is the earlier of its
// context's and its DecideBy deadline) when every batch has one.
func callContext(batch []*waiter) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var last time.Time
	for _, w := range batch {
		d, ok := w.ctx.Deadline()
		if !w.deadline.IsZero() && (!ok || w.deadline.Before(d)) {
			d, ok = w.deadline, true
		}
		if !ok {
			return ctx, func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(ctx, last)
}

// coalescedCall is one script call of a coalesced batch: the waiters of
// one slot group, in queue order, with the buckets script when every item
// is of the bucket family, the fixed-window script when every item is a
// fixed window, else with the batch script.
type coalescedCall struct {
	ws      []*waiter
	hold    bool        // reservations: the hold script
	rides   *settleCall // settles carried by the hold script call
	buckets bool
	fixed   bool
	keys    []string
	args    []any
	cmd     *redis.Cmd
}

// flush decides the queued batches with one script call per slot group,
// all in one pipeline, and hands every waiter its result. Within a call
// the batches are decided in queue order; calls of different slots share
// no key, so the whole is decided exactly as the batches one after the
// other, in queue order.
func (s *RedisStore) flush(batch []*waiter) {
	ctx, cancel := callContext(batch)
	defer cancel()
	if len(batch) == 1 {
		w := batch[0]
		w.allowed, w.err = w.direct(ctx, s, s.sharded)
		w.done <- struct{}{}
		return
	}
	calls := s.coalescedCalls(batch)
	// the settles queued meanwhile ride in the same pipeline
	// (redis_settle.go): no round trip of their own
	settles := s.sq.takeForCall(s)
	if s.sq.nflight.Load() != 0 {
		var all []string
		for _, c := range calls {
			all = append(all, c.keys...)
		}
		s.awaitFlights(ctx, all, settles)
	}
	var scalls, alone []*settleCall
	if len(settles) > 0 {
		scalls = s.settleCalls(settles)
		// a slot's settles ride on its hold script call, if there is one
		// (ratelimit_hold.lua runs them first); the others are calls of
		// their own in the pipeline
		for _, sc := range scalls {
			if c := holdCallOf(s, calls, sc); c != nil {
				c.keys, c.args = sc.ride(c.keys, c.args)
				c.rides = sc
			} else {
				alone = append(alone, sc)
			}
		}
	}
	if len(calls) == 1 && len(alone) == 0 {
		c := calls[0]
		c.cmd = c.script().Run(ctx, s.client, c.keys, c.args...)
	} else {
		pipe := s.client.Pipeline()
		for _, c := range calls {
			c.cmd = c.script().EvalSha(ctx, pipe, c.keys, c.args...)
		}
		for _, c := range alone {
			c.cmd = lua.Script("ratelimit_settle").EvalSha(ctx, pipe, c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx)
		for _, c := range calls {
			if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				c.cmd = c.script().Run(ctx, s.client, c.keys, c.args...)
			}
		}
		for _, c := range alone {
			if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				c.cmd = lua.Script("ratelimit_settle").Run(ctx, s.client, c.keys, c.args...)
			}
		}
	}
	for _, c := range calls {
		if c.rides != nil { // the hold's reply, without the settles'
			res, err := c.cmd.Result()
			res = c.rides.split(ctx, res, err)
			if err == nil {
				c.cmd.SetVal(res)
			}
		}
	}
	if len(settles) > 0 {
		s.deliverSettles(ctx, settles, scalls)
	}
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && strings.Contains(err.Error(), "CROSSSLOT") {
			// A Cluster in disguise refused the call before running it:
			// each batch decides alone, grouped by slot.
			var wg sync.WaitGroup
			for _, w := range c.ws {
				wg.Go(func() {
					w.allowed, w.err = w.direct(ctx, s, bySlot)
					w.done <- struct{}{}
				})
			}
			wg.Wait()
			continue
		}
		c.deliver(s)
	}
}

// coalescedCalls groups batch by slot (tag), keeping the order of the
// queue within each call, and builds every call's KEYS and ARGV.
func (s *RedisStore) coalescedCalls(batch []*waiter) []*coalescedCall {
	var calls []*coalescedCall
	for _, w := range batch {
		var c *coalescedCall
		for _, d := range calls {
			h := d.ws[0]
			if d.hold != (w.hold != nil) {
				continue
			}
			if s.sameGroup(h.slot, h.tag, w.slot, w.tag) {
				c = d
				break
			}
		}
		if c == nil {
			c = &coalescedCall{buckets: w.hold == nil, fixed: w.hold == nil, hold: w.hold != nil}
			calls = append(calls, c)
		}
		c.ws = append(c.ws, w)
		c.buckets = c.buckets && w.buckets
		c.fixed = c.fixed && w.fixed
	}
	for _, c := range calls {
		n := 0
		for _, w := range c.ws {
			n += len(w.items)
		}
		c.keys = make([]string, 0, n)
		for _, w := range c.ws {
			c.keys = append(c.keys, w.keys...)
		}
		if c.hold {
			c.args = holdArgs(s.nowArg(), c.ws)
			continue
		}
		if c.buckets {
			var b bucketsArgs
			for _, w := range c.ws {
				b.add(w.items)
			}
			c.args = b.argv(s.nowArg(), false)
			continue
		}
		if c.fixed {
			var b bucketsArgs
			for _, w := range c.ws {
				b.addFixed(w.items)
			}
			c.args = b.argv(s.nowArg(), false)
			continue
		}
		c.args = make([]any, 0, 2+len(c.ws)+batchFields*n)
		c.args = append(c.args, s.nowArg())
		if len(c.ws) > 1 {
			c.args = append(c.args, len(c.ws))
			for _, w := range c.ws {
				c.args = append(c.args, len(w.items))
			}
		}
		for _, w := range c.ws {
			c.args = s.batchArgs(c.args, w.items, nil)
		}
	}
	return calls
}

// sameGroup reports whether two calls' keys, in slot a (hash tag ta) and
// slot b (tb), go to one script call: always on one server, else when
// they share the slot (Cluster) or the hash tag (Ring).
func (s *RedisStore) sameGroup(a int, ta string, b int, tb string) bool {
	switch s.sharded {
	case bySlot:
		return a == b
	case byTag:
		return ta == tb
	}
	return true
}

// holdCallOf returns the hold script call of calls in sc's slot (hash
// tag), or nil.
func holdCallOf(s *RedisStore, calls []*coalescedCall, sc *settleCall) *coalescedCall {
	for _, c := range calls {
		if !c.hold || c.rides != nil {
			continue
		}
		if w := c.ws[0]; s.sameGroup(w.slot, w.tag, sc.shard, sc.tag) {
			return c
		}
	}
	return nil
}

func (c *coalescedCall) script() *redis.Script {
	if c.hold {
		return lua.Script("ratelimit_hold")
	}
	if c.buckets {
		return lua.Script("ratelimit_buckets")
	}
	if c.fixed {
		return lua.Script("ratelimit_fixed")
	}
	return lua.Script("ratelimit_batch")
}

// deliver decodes the call's reply into each waiter's result and wakes it.
func (c *coalescedCall) deliver(s *RedisStore) {
	defer func() {
		for _, w := range c.ws {
			w.done <- struct{}{}
		}
	}()
	fail := func(err error) {
		for _, w := range c.ws {
			w.allowed, w.err = false, err
		}
	}
	res, err := c.cmd.Result()
	if err == nil && c.hold {
		err = deliverHolds(c.ws, res)
		if err != nil {
			fail(err)
		}
		return
	}
	if err != nil {
		name := "batch"
		switch {
		case c.hold:
			name = "hold"
		case c.buckets:
			name = "buckets"
		case c.fixed:
			name = "fixed window"
		}
		fail(fmt.Errorf("ratelimit: redis: %s script: %w", name, err))
		return
	}
	n := len(c.keys)
	if c.buckets {
		r, err := bucketsReply(res, n, false)
		if err != nil {
			fail(err)
			return
		}
		at := 1
		for _, w := range c.ws {
			if w.allowed, err = bucketsDecisions(w.items, r[at:at+len(w.items)], at, w.res); err != nil {
				fail(err) // a reply out of range fails the whole call
				return
			}
			at += len(w.items)
		}
		return
	}
	if c.fixed {
		r, err := fixedReply(res, n)
		if err != nil {
			fail(err)
			return
		}
		at := 1
		for _, w := range c.ws {
			w.allowed, w.err = fixedDecisions(w.items, r[0], r[at:at+len(w.items)], w.res), nil
			at += len(w.items)
		}
		return
	}
	v, err := batchReply(res, n)
	if err != nil {
		fail(err)
		return
	}
	at := 2
	for _, w := range c.ws {
		w.allowed, w.err = s.batchDecisions(w.items, v[at:at+batchReplyFields*len(w.items)], w.res), nil
		at += batchReplyFields * len(w.items)
	}
}
