package ratelimit

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash/maphash"
	"math/bits"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
)

// MemoryStore keeps rate-limit state in process memory. It is the reference
// implementation of Store (the Redis scripts must decide exactly as it
// does) and the local fallback when Redis is unavailable.
//
// State is spread over lock shards (MemorySettings.Shards) chosen by a hash of the
// item's Key, so unrelated keys rarely contend and the items of one entity
// (its tiers) share a shard. Keys longer than keys.MaxPart bytes are kept as
// a 128-bit SHA-256 prefix, so memory per key is bounded whatever callers
// send.
//
// The number of keys is capped (MemorySettings.MaxKeys, split evenly over the shards).
// Inserting a key into a full shard first drops every state that is back to
// full among a sample of 32 entries of that shard (dropping such a state
// changes no decision); when the sample holds none, it drops the sampled
// state that will be full soonest, which forgets the least. Forgetting a
// state that is not full lets that key start over, so set the cap above
// the number of keys active within one period.
//
// A MemoryStore is safe for concurrent use. The zero value is not usable;
// call NewMemoryStore.
type MemoryStore struct {
	clock     func() time.Time // nil: the monotonic clock below
	startUS   int64            // wall time at construction, µs since the epoch
	start     time.Time        // carries the monotonic reading
	seedKey   maphash.Seed
	seedScope maphash.Seed
	mask      uint64
	shards    []shard
	ids       holdIDs
}

var _ Store = (*MemoryStore)(nil)

type shard struct {
	mu    sync.Mutex
	m     map[uint64]*entry
	count int
	limit int
	_     [32]byte // keep hot mutexes on separate cache lines
}

// layout is the physical shape of an algorithm's state. Algorithms that
// share a layout share state for the same (scope, key): TokenBucket, GCRA
// and LeakyBucket are one TAT.
type layout uint8

const (
	layoutBucket layout = iota
	layoutFixed
	layoutCounter
	layoutLog
	layoutBuckets
)

func layoutOf(a Algorithm) layout {
	switch a {
	case FixedWindow:
		return layoutFixed
	case SlidingWindowCounter:
		return layoutCounter
	case SlidingWindowLog:
		return layoutLog
	case SlidingWindowBuckets:
		return layoutBuckets
	}
	return layoutBucket
}

// entry is one key's state. The fields a, b, c hold the fixed-size states:
// bucket a = TAT; fixed window (a, b) = (window, count); sliding window
// counter (a, b, c) = (window, prev, cur); bucketed window a = the newest
// sub-window, its counts in log.ts. The sliding window log lives apart
// (log), so the common entry stays at 96 bytes.
type entry struct {
	next    *entry // chain of entries whose hashes collide
	hash    uint64
	scope   string
	key     string // the key when ≤ keys.MaxPart bytes; else (long) its 16-byte SHA-256 prefix
	layout  layout
	long    bool
	busy    bool  // touched by the batch in progress: not evictable
	full    int64 // µs when the state is back to full (evictable for free)
	a, b, c int64
	log     *windowLog
}

// windowLog is an entry's side state: the SlidingWindowLog's timestamps
// ts[start:], ascending; SlidingWindowBuckets' Buckets+1 counts in ts,
// newest first; or, for the bucket family, its holds (hold.go), which
// keeps the common entry at 96 bytes.
type windowLog struct {
	ts    []int64
	start int
	holds *holdSet
}

// lookup is an item's prepared key.
type lookup struct {
	scope  string
	key    string
	digest [16]byte // SHA-256 prefix of a long key
	long   bool     // the key is longer than keys.MaxPart: digest stands for it
	layout layout
	hash   uint64
	shard  uint64
}

// NewMemoryStore returns a memory store configured by set (the zero
// MemorySettings: the defaults).
func NewMemoryStore(set MemorySettings) *MemoryStore {
	o := struct {
		clock           func() time.Time
		maxKeys, shards int
	}{set.Clock, set.MaxKeys, set.Shards}
	if o.maxKeys <= 0 {
		o.maxKeys = 1 << 20
	}
	if o.shards <= 0 {
		o.shards = 64
	}
	n := 1
	for n < o.shards && n < 1<<16 {
		n <<= 1
	}
	for n > o.maxKeys {
		n >>= 1
	}
	start := time.Now()
	s := &MemoryStore{
		clock:     o.clock,
		start:     start,
		startUS:   start.UnixMicro(),
		seedKey:   maphash.MakeSeed(),
		seedScope: maphash.MakeSeed(),
		mask:      uint64(n - 1),
		shards:    make([]shard, n),
		ids:       newHoldIDs(),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[uint64]*entry)
		s.shards[i].limit = o.maxKeys / n
		if i < o.maxKeys%n {
			s.shards[i].limit++
		}
	}
	return s
}

// now returns the time in µs since the epoch. Without MemorySettings.Clock it is the
// wall time at construction plus the monotonic time elapsed since: it never
// goes backwards (NTP steps do not move it) and reading it costs a third of
// time.Now on the machines measured (docs/ratelimit.md).
func (s *MemoryStore) now() int64 {
	if s.clock == nil {
		return s.startUS + time.Since(s.start).Microseconds()
	}
	return s.clock().UnixMicro()
}

func (s *MemoryStore) prepare(scope, key string, a Algorithm) lookup {
	var k lookup
	s.prepareH(&k, scope, s.scopeHash(scope), key, a)
	return k
}

// scopeHash is the hash of a scope under this store's seed; a Limiter
// computes it once.
func (s *MemoryStore) scopeHash(scope string) uint64 {
	return bits.RotateLeft64(maphash.String(s.seedScope, scope), 17)
}

func (s *MemoryStore) prepareH(k *lookup, scope string, scopeHash uint64, key string, a Algorithm) {
	k.scope, k.layout = scope, layoutOf(a)
	var hk uint64
	if len(key) > keys.MaxPart {
		sum := sha256.Sum256([]byte(key))
		copy(k.digest[:], sum[:16])
		k.long = true
		hk = maphash.Bytes(s.seedKey, k.digest[:])
	} else {
		k.key = key
		hk = maphash.String(s.seedKey, key)
	}
	k.shard = (hk >> 32) & s.mask
	k.hash = hk ^ scopeHash ^ uint64(k.layout)*0x9e3779b97f4a7c15
}

func (sh *shard) find(k *lookup) *entry {
	for e := sh.m[k.hash]; e != nil; e = e.next {
		if e.layout != k.layout || e.long != k.long || !sameString(e.scope, k.scope) {
			continue
		}
		if k.long && e.key == string(k.digest[:]) || !k.long && e.key == k.key {
			return e
		}
	}
	return nil
}

// sameString is a == b, short-cut when both share their bytes (a scope is
// usually the same string every time: the Limiter's).
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

func (sh *shard) insert(k *lookup, now int64) *entry {
	if sh.count >= sh.limit {
		sh.evict(now)
	}
	e := &entry{
		next:   sh.m[k.hash],
		hash:   k.hash,
		scope:  k.scope,              // not cloned: scopes are few and long-lived (a Limiter's, a rule's)
		key:    strings.Clone(k.key), // the caller's string may pin a larger buffer
		layout: k.layout,
		long:   k.long,
	}
	if k.long {
		e.key = string(k.digest[:])
	}
	sh.m[k.hash] = e
	sh.count++
	return e
}

func (sh *shard) remove(e *entry) {
	head := sh.m[e.hash]
	if head == e {
		if e.next == nil {
			delete(sh.m, e.hash)
		} else {
			sh.m[e.hash] = e.next
		}
		sh.count--
		return
	}
	for p := head; p != nil; p = p.next {
		if p.next == e {
			p.next = e.next
			sh.count--
			return
		}
	}
}

// evictSample is how many entries one eviction looks at.
const evictSample = 32

// evict makes room for one entry: it drops the full states among a sample
// and, when there is none, the sampled state that will be full soonest.
// Entries busy in the current batch are never dropped (the shard may then
// exceed its limit by the size of the batch).
func (sh *shard) evict(now int64) {
	var victim *entry
	seen, freed := 0, 0
	for _, head := range sh.m {
		for e := head; e != nil; {
			next := e.next
			if !e.busy {
				if e.full <= now {
					sh.remove(e)
					freed++
				} else if victim == nil || e.full < victim.full {
					victim = e
				}
			}
			seen++
			e = next
		}
		if seen >= evictSample {
			break
		}
	}
	if freed == 0 && victim != nil {
		sh.remove(victim)
	}
}

// undo is what rolls one item of a denied batch back.
type undo struct {
	e        *entry
	created  bool
	marked   bool // a bucket's holds.marked
	a, b, c  int64
	full     int64
	appended int
	counts   []int64 // a bucketed window's counts before the write
	recount  bool    // counts holds them
}

// apply decides one item against e (nil: no state) and, when allowed with
// a cost, writes the new state, creating the entry if needed. u, when not
// nil, records how to roll the write back.
func (sh *shard) apply(o *outcome, e *entry, k *lookup, p *limits, n, now int64, u *undo) {
	switch k.layout {
	case layoutBucket:
		if e != nil && e.log != nil && e.log.holds != nil {
			sh.applyHeld(o, e, k, p, n, now, u)
			return
		}
		var tat int64
		if e != nil {
			tat = e.a
		}
		var next int64
		*o, next = bucketDecide(tat, now, *p, n)
		if next != tat {
			e = sh.prepareWrite(e, k, now, u)
			e.a = next
			e.full = next
		}
	case layoutFixed:
		var st fixedState
		if e != nil {
			st = fixedState{e.a, e.b}
		}
		var next fixedState
		*o, next = fixedDecide(st, now, *p, n)
		if next != st {
			e = sh.prepareWrite(e, k, now, u)
			e.a, e.b = next.window, next.count
			e.full = satAdd(max(now, 0), o.reset)
		}
	case layoutCounter:
		var st counterState
		if e != nil {
			st = counterState{e.a, e.b, e.c}
		}
		var next counterState
		*o, next = counterDecide(st, now, *p, n)
		if next != st {
			e = sh.prepareWrite(e, k, now, u)
			e.a, e.b, e.c = next.window, next.prev, next.cur
			e.full = satAdd(max(now, 0), o.reset)
		}
	case layoutBuckets:
		var h int64
		var c []int64
		if e != nil && e.log != nil {
			h, c = e.a, e.log.ts
		}
		var head int64
		*o, head = bucketsDecide(h, c, now, *p, n)
		if o.allowed && n > 0 {
			e = sh.prepareWrite(e, k, now, u)
			if e.log == nil {
				e.log = &windowLog{}
			}
			l := e.log
			if u != nil && !u.recount {
				u.counts, u.recount = l.ts, true
			}
			if int64(len(l.ts)) != p.N+1 {
				l.ts = make([]int64, p.N+1) // none, or written under another N: no state
			} else {
				if u != nil { // a batch may roll back: write a copy
					l.ts = append([]int64(nil), l.ts...)
				}
				shiftBuckets(l.ts, head-e.a)
			}
			l.ts[0] += n
			e.a = head
			e.full = satAdd(max(now, 0), o.reset)
		}
	case layoutLog:
		var ts []int64
		if e != nil && e.log != nil {
			ts = e.log.ts[e.log.start:]
		}
		var trim int
		var at int64
		*o, trim, at = logDecide(ts, now, *p, n)
		if trim > 0 { // expired entries: dropping them changes no decision
			l := e.log
			l.start += trim
			if l.start == len(l.ts) {
				l.ts, l.start = l.ts[:0], 0
			}
		}
		if o.allowed && n > 0 {
			e = sh.prepareWrite(e, k, now, u)
			if e.log == nil {
				e.log = &windowLog{}
			}
			e.log.append(at, n, p.L)
			if u != nil {
				u.appended += int(n)
			}
			e.full = satAdd(at, p.P)
		}
	}
}

// prepareWrite returns the entry to write, creating it when e is nil, and
// records the state before the write in u.
func (sh *shard) prepareWrite(e *entry, k *lookup, now int64, u *undo) *entry {
	created := false
	if e == nil {
		e = sh.insert(k, now)
		created = true
	}
	if u != nil {
		if u.e == nil {
			*u = undo{e: e, created: created, a: e.a, b: e.b, c: e.c, full: e.full}
			if e.log != nil && e.log.holds != nil {
				u.marked = e.log.holds.marked
			}
		}
		e.busy = true
	}
	return e
}

// appendLog appends n copies of at, reusing the space of trimmed entries
// so that a steady log allocates nothing.
func (l *windowLog) append(at, n, limit int64) {
	if l.start > 0 && len(l.ts)+int(n) > cap(l.ts) {
		live := copy(l.ts, l.ts[l.start:])
		l.ts, l.start = l.ts[:live], 0
	}
	if len(l.ts)+int(n) > cap(l.ts) {
		c := max(2*cap(l.ts), len(l.ts)+int(n), 4)
		c = min(c, max(int(limit), len(l.ts)+int(n)))
		grown := make([]int64, len(l.ts), c)
		copy(grown, l.ts)
		l.ts = grown
	}
	for i := int64(0); i < n; i++ {
		l.ts = append(l.ts, at)
	}
}

// decideOne is the single-item fast path (no validation: the Limiter
// validated its policy and cost).
func (s *MemoryStore) decideOne(d *spillway.Decision, scope string, scopeHash uint64, key string, a Algorithm, p *limits, n int64) {
	now := s.now()
	var k lookup
	s.prepareH(&k, scope, scopeHash, key, a)
	sh := &s.shards[k.shard]
	sh.mu.Lock()
	var o outcome
	sh.apply(&o, sh.find(&k), &k, p, n, now, nil)
	sh.mu.Unlock()
	o.decisionInto(d, scope, p.capacity)
}

// batchStack is the batch size decided without allocating.
const batchStack = 8

// Decide implements Store. Items are decided in order and an item sees the
// charges of the earlier items of the same batch (this only matters when
// two items name the same scope, key and layout); if any item is denied,
// every write of the batch is rolled back. The shards of a batch are
// locked in ascending order, so concurrent batches cannot deadlock. The
// context is not consulted: the memory store never blocks on I/O.
func (s *MemoryStore) Decide(ctx context.Context, items []Item, out []spillway.Decision) (bool, error) {
	if err := validateBatch(items, out); err != nil {
		return false, err
	}
	switch len(items) {
	case 0:
		return true, nil
	case 1:
		it := &items[0]
		lim := it.Policy.limits()
		s.decideOne(&out[0], it.Scope, s.scopeHash(it.Scope), it.Key, it.Policy.Algorithm, &lim, it.Cost)
		return out[0].Allowed, nil
	}

	var (
		lkStack [batchStack]lookup
		unStack [batchStack]undo
		shStack [batchStack]uint64
		lks     = lkStack[:0]
		undos   = unStack[:0]
		locked  = shStack[:0]
	)
	if len(items) > batchStack {
		lks = make([]lookup, 0, len(items))
		undos = make([]undo, 0, len(items))
		locked = make([]uint64, 0, len(items))
	}
	for i := range items {
		k := s.prepare(items[i].Scope, items[i].Key, items[i].Policy.Algorithm)
		lks = append(lks, k)
		undos = append(undos, undo{})
		locked = insertSorted(locked, k.shard)
	}
	now := s.now()
	for _, i := range locked {
		s.shards[i].mu.Lock()
	}
	allowed := true
	for i := range items {
		it := &items[i]
		sh := &s.shards[lks[i].shard]
		lim := it.Policy.limits()
		var o outcome
		sh.apply(&o, sh.find(&lks[i]), &lks[i], &lim, it.Cost, now, &undos[i])
		out[i] = o.decisionCap(it.Scope, lim.capacity)
		allowed = allowed && o.allowed
	}
	for i := len(undos) - 1; i >= 0; i-- {
		u := &undos[i]
		if u.e == nil {
			continue
		}
		u.e.busy = false
		if allowed {
			continue
		}
		if u.created {
			s.shards[lks[i].shard].remove(u.e)
			continue
		}
		u.e.a, u.e.b, u.e.c, u.e.full = u.a, u.b, u.c, u.full
		if u.e.log != nil && u.e.log.holds != nil {
			u.e.log.holds.marked = u.marked
		}
		if u.appended > 0 {
			l := u.e.log
			l.ts = l.ts[:len(l.ts)-u.appended]
		}
		if u.recount {
			u.e.log.ts = u.counts
		}
	}
	for j := len(locked) - 1; j >= 0; j-- {
		s.shards[locked[j]].mu.Unlock()
	}
	return allowed, nil
}

// insertSorted inserts v into the ascending set xs (no duplicates).
func insertSorted(xs []uint64, v uint64) []uint64 {
	i := 0
	for i < len(xs) && xs[i] < v {
		i++
	}
	if i < len(xs) && xs[i] == v {
		return xs
	}
	xs = append(xs, 0)
	copy(xs[i+1:], xs[i:])
	xs[i] = v
	return xs
}

// validateBatch checks what every Store's Decide needs of its arguments:
// out has room for a decision per item and every item is valid.
func validateBatch(items []Item, out []spillway.Decision) error {
	if len(out) < len(items) {
		return fmt.Errorf("ratelimit: out has %d decisions for %d items", len(out), len(items))
	}
	for i := range items {
		if err := validateItem(&items[i]); err != nil {
			return wrapf(err, "item %d", i)
		}
	}
	return nil
}

func validateItem(it *Item) error {
	if it.Cost < 0 {
		return fmt.Errorf("%w: cost %d is negative", ErrInvalidCost, it.Cost)
	}
	return it.Policy.Validate()
}

// Reset implements Store: it forgets the state of (scope, key) under the
// layout of p (TokenBucket, GCRA and LeakyBucket share one).
func (s *MemoryStore) Reset(ctx context.Context, scope, key string, p Policy) error {
	k := s.prepare(scope, key, p.Algorithm)
	sh := &s.shards[k.shard]
	sh.mu.Lock()
	if e := sh.find(&k); e != nil {
		sh.remove(e)
	}
	sh.mu.Unlock()
	return nil
}

// keyCount returns the number of keys the store holds.
func (s *MemoryStore) keyCount() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.count
		sh.mu.Unlock()
	}
	return n
}
