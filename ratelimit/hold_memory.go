package ratelimit

import (
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// holdIDs makes hold ids unique per store: a random base and a counter.
type holdIDs struct {
	base string
	seq  *atomic.Uint64
}

func newHoldIDs() holdIDs {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return holdIDs{base: "h" + base64.RawURLEncoding.EncodeToString(b[:]) + ".", seq: new(atomic.Uint64)}
}

func (h holdIDs) next() string { return h.base + strconv.FormatUint(h.seq.Add(1), 36) }

// holdSet is the hold side of a bucket-family entry of the memory store.
// Holds sit in a map (found by member) and in a heap by end time, so a
// touch releases what expired in O(log n) per item. Heap entries whose
// hold was settled meanwhile are skipped when they surface. A settled
// hold leaves nothing behind (see settleOne).
type holdSet struct {
	marked  bool                // the clamp is TAT − 2τ (see hold.go)
	live    map[string]heldUnit // holds outstanding, by member
	liveQ   unitHeap            // the same by release time (µs), lazily cleaned
	lastExp int64               // ≥ every live hold's release time
}

type heldUnit struct {
	member string // holdMember(id, i)
	est    int64
	exp    int64
}

// unitHeap is a min-heap of units by exp.
type unitHeap []heldUnit

func (h unitHeap) Len() int           { return len(h) }
func (h unitHeap) Less(i, j int) bool { return h[i].exp < h[j].exp }
func (h unitHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *unitHeap) Push(x any)        { *h = append(*h, x.(heldUnit)) }
func (h *unitHeap) Pop() any {
	old := *h
	u := old[len(old)-1]
	old[len(old)-1] = heldUnit{}
	*h = old[:len(old)-1]
	return u
}

// add records a live hold.
func (hs *holdSet) add(u heldUnit) {
	if hs.live == nil {
		hs.live = make(map[string]heldUnit)
	}
	hs.live[u.member] = u
	heap.Push(&hs.liveQ, u)
	hs.lastExp = max(hs.lastExp, u.exp)
}

// reap releases the holds whose expiry is ≤ now: each gives its estimate
// back (heldRefund). It reports whether any was released.
func (hs *holdSet) reap(tat *int64, t, now, T int64) bool {
	reaped := false
	for len(hs.liveQ) > 0 && hs.liveQ[0].exp <= now {
		u := heap.Pop(&hs.liveQ).(heldUnit)
		if cur, ok := hs.live[u.member]; ok && cur.exp == u.exp {
			delete(hs.live, u.member)
			*tat = heldRefund(*tat, t, u.est, T)
			reaped = true
		}
	}
	return reaped
}

// touch is what every script does first on a marked key, and a settle on
// any key: release the holds that expired. It reports whether a hold was
// released.
func (hs *holdSet) touch(tat *int64, t, now, T int64) bool {
	return hs.reap(tat, t, now, T)
}

// write stores tat in e after a write at t and sets the mark: live holds,
// or a debt (TAT − t > τ).
func (hs *holdSet) write(e *entry, tat, t int64, p *limits) {
	e.a = tat
	hs.marked = len(hs.live) > 0 || tat-t > p.tau
	e.full = tat
	if len(hs.live) > 0 {
		e.full = max(tat, hs.lastExp)
	}
}

// heldSide returns e's hold side, creating it.
func heldSide(e *entry) *holdSet {
	if e.log == nil {
		e.log = &windowLog{}
	}
	if e.log.holds == nil {
		e.log.holds = &holdSet{}
	}
	return e.log.holds
}

// applyHeld is apply for a bucket entry with a hold side: it releases the
// expired holds (kept whatever the decision), then decides as heldDecide
// and writes like apply.
func (sh *shard) applyHeld(o *outcome, e *entry, k *lookup, p *limits, n, now int64, u *undo) {
	hs := e.log.holds
	tat := e.a
	if hs.marked {
		if t := heldNow(tat, now, p, true); hs.touch(&tat, t, now, p.T) {
			hs.write(e, tat, t, p)
		}
	}
	var next, t int64
	*o, next, t = heldDecide(tat, now, p, n, hs.marked)
	if next != tat {
		sh.prepareWrite(e, k, now, u)
		hs.write(e, next, t, p)
	}
}

// Reserve decides items all or nothing and holds their estimates (see
// Limiter.Reserve). The batch is decided under the locks of
// its shards as Decide does; the holds are recorded only when every item
// had room. The context is not consulted.
func (s *MemoryStore) Reserve(ctx context.Context, items []Item, ttl time.Duration) (*Hold, error) {
	ttlUS, ttl, err := holdTTLOf(ttl)
	if err != nil {
		return nil, err
	}
	if err := validateHold(items); err != nil {
		return nil, err
	}
	h := &Hold{store: s, ttl: ttl, items: append([]Item(nil), items...), dec: make([]spillway.Decision, len(items))}
	if len(items) == 0 {
		h.allowed = true
		h.id = s.ids.next()
		return h, nil
	}
	lks := make([]lookup, len(items))
	var locked []uint64
	for i := range items {
		lks[i] = s.prepare(items[i].Scope, items[i].Key, items[i].Policy.Algorithm)
		locked = insertSorted(locked, lks[i].shard)
	}
	now := s.now()
	for _, i := range locked {
		s.shards[i].mu.Lock()
	}
	type saved struct {
		e       *entry
		created bool
		marked  bool
		a, full int64
	}
	undos := make([]saved, len(items))
	ents := make([]*entry, len(items))
	allowed := true
	for i := range items {
		it := &items[i]
		sh := &s.shards[lks[i].shard]
		lim := it.Policy.limits()
		e := sh.find(&lks[i])
		created := false
		if e == nil {
			e = sh.insert(&lks[i], now)
			created = true
		}
		e.busy = true
		ents[i] = e
		hs := heldSide(e)
		tat := e.a
		if hs.marked {
			if t := heldNow(tat, now, &lim, true); hs.touch(&tat, t, now, lim.T) {
				hs.write(e, tat, t, &lim)
			}
		}
		undos[i] = saved{e: e, created: created, marked: hs.marked, a: e.a, full: e.full}
		o, next, t := heldDecide(tat, now, &lim, it.Cost, hs.marked)
		h.dec[i] = o.decisionCap(it.Scope, lim.capacity)
		if !o.allowed {
			allowed = false
			continue
		}
		if next != tat {
			hs.write(e, next, t, &lim)
		}
	}
	if allowed {
		h.allowed = true
		h.id = s.ids.next()
		exp := now + ttlUS
		h.exps = make([]int64, len(items))
		for i := range items {
			h.exps[i] = exp
			if items[i].Fixed {
				continue // charged, not held
			}
			hs := ents[i].log.holds
			hs.add(heldUnit{member: holdMember(h.id, i), est: items[i].Cost, exp: exp})
			hs.marked = true
			ents[i].full = max(ents[i].full, exp)
		}
	} else {
		for i := len(undos) - 1; i >= 0; i-- {
			u := &undos[i]
			if u.e == nil {
				continue
			}
			if u.created {
				s.shards[lks[i].shard].remove(u.e)
				continue
			}
			u.e.a, u.e.full = u.a, u.full
			u.e.log.holds.marked = u.marked
		}
	}
	for _, e := range ents {
		e.busy = false
	}
	for j := len(locked) - 1; j >= 0; j-- {
		s.shards[locked[j]].mu.Unlock()
	}
	return h, nil
}

// settle implements holdSettler: each item's hold, if still live, is
// replaced by its actual cost (heldSettle).
func (s *MemoryStore) settle(ctx context.Context, h *Hold, actual []int64, res []SettleResult) error {
	now := s.now()
	for i := range h.items {
		it := &h.items[i]
		if it.Fixed {
			res[i] = SettleApplied // charged at admission: nothing to settle
			continue
		}
		res[i] = s.settleOne(it, holdMember(h.id, i), settleCost(it, actual[i]), h.exps[i], now)
	}
	return nil
}

// settleAsync implements holdSettler: the memory store settles at once.
func (s *MemoryStore) settleAsync(h *Hold, actual []int64, then func([]SettleResult, error)) {
	res := make([]SettleResult, len(h.items))
	err := s.settle(context.Background(), h, actual, res)
	then(res, err)
}

// settleOne settles one item's hold, member, released at exp (µs). A hold
// that is not live was settled before, if its end has not come (a second
// settle, or the retry of one whose reply was lost; a Reset also forgets
// it), else released by its TTL: the Redis store keeps no more than the
// live holds either, and answers alike.
func (s *MemoryStore) settleOne(it *Item, member string, actual, exp, now int64) SettleResult {
	k := s.prepare(it.Scope, it.Key, it.Policy.Algorithm)
	sh := &s.shards[k.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	gone := SettleExpired
	if now < exp {
		gone = SettleAlreadySettled
	}
	e := sh.find(&k)
	if e == nil || e.log == nil || e.log.holds == nil {
		return gone // never held here, settled and forgotten, or reset
	}
	lim := it.Policy.limits()
	hs := e.log.holds
	tat := e.a
	t := heldNow(tat, now, &lim, hs.marked)
	if hs.touch(&tat, t, now, lim.T) {
		hs.write(e, tat, t, &lim)
	}
	if u, ok := hs.live[member]; ok {
		delete(hs.live, member)
		t = heldNow(tat, now, &lim, hs.marked)
		hs.write(e, heldSettle(tat, t, u.est, actual, &lim), t, &lim)
		return SettleApplied
	}
	return gone
}
