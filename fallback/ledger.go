package fallback

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
)

// ledger remembers, per key, the units this server admitted locally, in
// two fixed windows of one Period each (the current and the previous), so
// that reconcile can carry back "what was consumed in the last Period"
// without keeping a log. It is bounded: past its size, new keys are not
// recorded (and counted in skipped).
type ledger struct {
	seed    maphash.Seed
	shards  [16]ledgerShard // sharded so that an outage's local decisions do not serialize on one lock
	limit   int             // per shard
	size    atomic.Int64
	skipped atomic.Int64
}

type ledgerShard struct {
	mu sync.Mutex
	m  map[itemKey]*usage
}

type usage struct {
	start      int64 // µs, start of the current window
	cur, prev  int64 // units admitted in the current and the previous window
	periodUS   int64
	capacity   int64
	lastRecord int64
}

// charge is one key's carry, taken out of the ledger for a reconcile pass.
type charge struct {
	k     itemKey
	carry int64
}

func newLedger(limit int) *ledger {
	l := &ledger{seed: maphash.MakeSeed(), limit: max(limit/16, 1)}
	for i := range l.shards {
		l.shards[i].m = make(map[itemKey]*usage)
	}
	return l
}

func (l *ledger) shard(k *itemKey) *ledgerShard {
	return &l.shards[k.hash(l.seed)%uint64(len(l.shards))]
}

func (u *usage) roll(now int64) {
	if now < u.start { // time went backwards: no time passed
		return
	}
	k := (now - u.start) / u.periodUS
	switch {
	case k == 0:
		return
	case k == 1:
		u.prev, u.cur = u.cur, 0
	default:
		u.prev, u.cur = 0, 0
	}
	u.start += k * u.periodUS
}

// carry is the sliding-window estimate of the units admitted in the last
// Period before now, capped at the policy's capacity: cur + prev × (P − e)
// / P, with e the time since the current window began.
func (u *usage) carry(now int64) int64 {
	u.roll(now)
	e := max(now-u.start, 0)
	c := u.cur + mulDiv(u.prev, u.periodUS-e, u.periodUS)
	return min(c, u.capacity)
}

// mulDiv returns floor(a × b / c) for non-negative a, b and positive c
// without overflow (the result saturates).
func mulDiv(a, b, c int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return 1<<63 - 1
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(q)
}

func (l *ledger) pending() bool { return l.size.Load() > 0 }

// record adds n units of k admitted locally at now.
func (l *ledger) record(k itemKey, n, now int64) {
	if n <= 0 {
		return
	}
	sh := l.shard(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u, ok := sh.m[k]
	if !ok {
		if len(sh.m) >= l.limit {
			l.skipped.Add(1)
			return
		}
		u = &usage{start: now, periodUS: max(k.policy.Period.Microseconds(), 1), capacity: k.policy.Capacity()}
		sh.m[k] = u
		l.size.Add(1)
	}
	u.roll(now)
	u.cur += n
	u.lastRecord = now
}

// take empties the ledger and returns the keys with something to carry.
func (l *ledger) take(now int64) []charge {
	var out []charge
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		m := sh.m
		sh.m = make(map[itemKey]*usage)
		l.size.Add(-int64(len(m)))
		sh.mu.Unlock()
		for k, u := range m {
			if c := u.carry(now); c > 0 {
				out = append(out, charge{k: k, carry: c})
			}
		}
	}
	return out
}

// restore puts back charges a failed pass did not carry, as if admitted at
// now.
func (l *ledger) restore(cs []charge, now int64) {
	for _, c := range cs {
		l.record(c.k, c.carry, now)
	}
}
