package fallback

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// itemKey identifies the state of one (scope, key) under one policy.
type itemKey struct {
	scope, key string
	policy     ratelimit.Policy
}

// hash spreads keys over the shards of the deny cache and the ledger. The
// policy is left out: one key rarely has several policies, and hashing the
// strings alone is cheaper.
func (k *itemKey) hash(seed maphash.Seed) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	h.WriteString(k.scope)
	h.WriteByte(0)
	h.WriteString(k.key)
	return h.Sum64()
}

// denyCache remembers denials the store gave, until their RetryAfter ends:
// a request of at least the denied cost cannot succeed before then, so it
// is answered without a round trip. It is sharded and bounded; when full it
// drops expired entries, then arbitrary ones.
type denyCache struct {
	seed   maphash.Seed
	shards [16]denyShard
	limit  int // per shard
	size   atomic.Int64
}

type denyShard struct {
	mu sync.Mutex
	m  map[itemKey]denial
}

type denial struct {
	until int64 // µs
	cost  int64
	d     spillway.Decision
	at    int64 // µs, when the store decided
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), limit: max(size/16, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[itemKey]denial)
	}
	return c
}

func (c *denyCache) shard(k *itemKey) *denyShard {
	return &c.shards[k.hash(c.seed)%uint64(len(c.shards))]
}

// lookup returns the cached denial for a request of cost n at now.
func (c *denyCache) lookup(k itemKey, n, now int64) (spillway.Decision, bool) {
	if c.size.Load() == 0 || n <= 0 {
		return spillway.Decision{}, false
	}
	sh := c.shard(&k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	if ok && now >= e.until {
		delete(sh.m, k)
		c.size.Add(-1)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || n < e.cost {
		return spillway.Decision{}, false
	}
	d := e.d
	d.RetryAfter = time.Duration(e.until-now) * time.Microsecond
	elapsed := time.Duration(now-e.at) * time.Microsecond
	d.ResetAfter = max(d.ResetAfter-elapsed, d.RetryAfter)
	return d, true
}

// add remembers a denial of cost n decided at now.
func (c *denyCache) add(k itemKey, n, now int64, d spillway.Decision) {
	if d.RetryAfter <= 0 || d.Reason != spillway.ReasonRateLimited || n <= 0 {
		return
	}
	until := now + d.RetryAfter.Microseconds()
	sh := c.shard(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old, ok := sh.m[k]; ok {
		// Keep the entry that says more: a smaller denied cost, or the
		// same cost for longer.
		if old.until > now && (old.cost < n || (old.cost == n && old.until >= until)) {
			return
		}
		sh.m[k] = denial{until: until, cost: n, d: d, at: now}
		return
	}
	if len(sh.m) >= c.limit {
		evicted := 0
		for ek, e := range sh.m {
			if e.until <= now {
				delete(sh.m, ek)
				evicted++
			}
			if evicted >= 8 {
				break
			}
		}
		if evicted == 0 {
			for ek := range sh.m { // map order is random enough
				delete(sh.m, ek)
				evicted++
				break
			}
		}
		c.size.Add(int64(-evicted))
	}
	sh.m[k] = denial{until: until, cost: n, d: d, at: now}
	c.size.Add(1)
}

// remove forgets k's denial.
func (c *denyCache) remove(k itemKey) {
	sh := c.shard(&k)
	sh.mu.Lock()
	if _, ok := sh.m[k]; ok {
		delete(sh.m, k)
		c.size.Add(-1)
	}
	sh.mu.Unlock()
}

// len returns the number of entries.
func (c *denyCache) len() int { return int(c.size.Load()) }
