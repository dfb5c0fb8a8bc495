package concurrency

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/budget"
	"github.com/spillway-go/spillway/internal/share"
)

// held counts, per key, the units this process holds in flight or may
// hold (a Redis call under way), and among them those admitted locally.
// A local decision admits only while everything this process holds for
// the key stays within its share of the limit, so that a slot Redis
// granted, or may be granting now, still counts while Redis is away; and
// a slot Redis grants is kept only while Redis's count plus this
// process's local admissions stay within the limit, so that local
// admissions made while Redis was slow still count once it answers. On a
// lone server the key never has more than the limit in flight, however
// the decisions mix.
type held struct {
	seed   maphash.Seed
	shards [16]heldShard
}

type heldShard struct {
	mu sync.Mutex
	m  map[string]*heldCount
}

type heldCount struct{ all, local int64 }

func newHeld() *held {
	h := &held{seed: maphash.MakeSeed()}
	for i := range h.shards {
		h.shards[i].m = make(map[string]*heldCount)
	}
	return h
}

func (h *held) shard(key string) *heldShard {
	return &h.shards[maphash.String(h.seed, key)&15]
}

// add adds n units held (local: admitted locally) to key.
func (h *held) add(key string, n int64) {
	sh := h.shard(key)
	sh.mu.Lock()
	c := sh.m[key]
	if c == nil {
		c = &heldCount{}
		sh.m[key] = c
	}
	c.all += n
	sh.mu.Unlock()
}

// tryLocal admits n units of key locally when everything held stays
// within limit; it returns the units held after (or before, when refused)
// and whether it admitted.
func (h *held) tryLocal(key string, n, limit int64) (int64, bool) {
	sh := h.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.m[key]
	if c == nil {
		c = &heldCount{}
		sh.m[key] = c
	}
	if c.all+n > limit {
		v := c.all
		if v == 0 {
			delete(sh.m, key)
		}
		return v, false
	}
	c.all += n
	c.local += n
	return c.all, true
}

// localOf returns the units of key admitted locally.
func (h *held) localOf(key string) int64 {
	sh := h.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c := sh.m[key]; c != nil {
		return c.local
	}
	return 0
}

// sub gives back n units of key (local: admitted locally).
func (h *held) sub(key string, n int64, local bool) {
	sh := h.shard(key)
	sh.mu.Lock()
	if c := sh.m[key]; c != nil {
		c.all -= n
		if local {
			c.local -= n
		}
		if c.all <= 0 {
			delete(sh.m, key)
		}
	}
	sh.mu.Unlock()
}

// acquireRedis is Acquire on a RedisStore: the call is bounded by the
// request's budget (budget.Deadline; spillway.DefaultBudget when
// the context carries none) and, when Redis cannot answer in time (a
// failure, the budget spent, the client's health open), the request is
// decided locally at the client's share (see decideLocal).
func (l *Limiter) acquireRedis(ctx context.Context, key string, n int64) (spillway.Decision, spillway.Done, error) {
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return spillway.Decision{}, spillway.Noop, &spillway.StoreError{Limiter: l.o.name, Fail: l.o.fail, Err: err}
	}
	own := spillway.DefaultBudget
	if _, ok := budget.End(ctx); ok {
		own = 0 // the request's budget bounds it
	}
	deadline, ok := budget.Deadline(ctx, own)
	if !ok {
		return l.decideLocal(key, n)
	}
	id := l.idPrefix + strconv.FormatUint(l.seq.Add(1), 36)
	cctx, cancel := context.WithDeadline(ctx, deadline)
	at := time.Now()
	l.held.add(key, n) // may be held: a local decision meanwhile counts it
	res, err := l.store.acquire(cctx, l.o.name, key, id, n, l.limit, l.o.ttl)
	cancel()
	if err != nil {
		l.held.sub(key, n, false)
		if errors.Is(ctx.Err(), context.Canceled) {
			return spillway.Decision{}, spillway.Noop, &spillway.StoreError{Limiter: l.o.name, Fail: l.o.fail, Err: err}
		}
		if timedOut(err) {
			// The script may have run after the deadline: give its
			// entry back once Redis answers again (or leave it to the
			// TTL). A call refused before it left (an open health, a
			// refused connection) took nothing.
			l.keep(pendingRelease{key: key, id: id, n: n, at: at})
		}
		return l.decideLocal(key, n)
	}
	if l.npending.Load() > 0 {
		l.retryPending()
	}
	if res.Allowed {
		if loc := l.held.localOf(key); loc > 0 && res.InFlight+loc > l.limit {
			// Requests this process admitted locally while Redis was
			// slow are still running: Redis does not know them.
			res.Allowed, res.InFlight, res.Wait = false, res.InFlight+loc, 0
			l.keep(pendingRelease{key: key, id: id, n: n, at: at})
			l.retryPending()
		}
	}
	d := l.decision(res)
	if !res.Allowed {
		l.held.sub(key, n, false)
		return d, spillway.Noop, nil
	}
	return d, block.Once(func(spillway.Outcome) {
		l.held.sub(key, n, false)
		l.releaseAsync(ctx, key, id, n, at)
	}), nil
}

// timedOut reports whether err is a deadline or a network timeout: a call
// that may have reached Redis.
func timedOut(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &te) && te.Timeout())
}

// decideLocal decides a request while Redis cannot answer: with
// spillway.FailClosed it is denied (spillway.ReasonFailClosed); otherwise
// it is admitted while this process's units in flight for the key (those
// Redis admitted, and those of calls to Redis under way, included) stay
// within its share of the limit —
// share.Scale(limit, the client's share), at least 1: the whole limit on
// a lone server. Decisions are Degraded and carry the local limit.
func (l *Limiter) decideLocal(key string, n int64) (spillway.Decision, spillway.Done, error) {
	if l.o.fail == spillway.FailClosed {
		return spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: l.o.name, RetryAfter: l.o.retryAfter, Degraded: true}, spillway.Noop, nil
	}
	limit := share.Scale(l.limit, l.shares.Share())
	total, ok := l.held.tryLocal(key, n, limit)
	d := spillway.Decision{Allowed: ok, Limiter: l.o.name, Limit: limit, Remaining: max(limit-total, 0), Degraded: true}
	if !ok {
		d.Reason, d.RetryAfter = spillway.ReasonConcurrency, l.o.retryAfter
		return d, spillway.Noop, nil
	}
	return d, block.Once(func(spillway.Outcome) { l.held.sub(key, n, true) }), nil
}

// NewInFlight returns a fleet-wide cap named s.Name (which must be set):
// at most limit units in flight at once (limit requests of cost 1) across
// every server that
// shares the Redis behind client — "at most 20 database calls in flight".
// Each admission holds its units until its done is called; the entries of
// a server that crashed expire after s.TTL (default 1 minute), so a
// crash never leaks the cap. Like every Redis block it falls back by
// itself: while Redis cannot answer (a failure, the request's budget
// spent, the client's health open) this server admits only while
// everything it holds stays within its share of limit (its share of the
// fleet it last saw alive: the whole limit on a lone server; see
// fallback.HealthSettings.Share), and a slot Redis grants is kept only
// while Redis's count plus this server's local admissions stay within
// limit. So on one server the cap holds under bursts and a slow Redis;
// across a fleet that lost Redis it holds to the sum of the shares.
//
// Every request counts, whatever its dimensions. A denial has Reason
// spillway.ReasonCeiling (a shared resource is full: 503) and names the
// cap.
func NewInFlight(client redis.UniversalClient, limit int64, s Settings) (spillway.Limiter, error) {
	if s.Name == "" {
		return nil, fmt.Errorf("concurrency: NewInFlight: name is empty")
	}
	store, err := NewRedisStore(client, RedisSettings{})
	if err != nil {
		return nil, fmt.Errorf("concurrency: NewInFlight: %w", err)
	}
	l, err := New(store, limit, s)
	if err != nil {
		return nil, err
	}
	return inFlight{l}, nil
}

type inFlight struct{ l *Limiter }

func (f inFlight) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: f.l.o.name}, spillway.Noop, nil
	}
	d, done, err := f.l.Acquire(ctx, "", r.EffectiveCost())
	if d.Reason == spillway.ReasonConcurrency {
		d.Reason = spillway.ReasonCeiling
	}
	return d, done, err
}
