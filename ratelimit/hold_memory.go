package ratelimit

import (
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
type holdSet struct {
	marked bool       // the clamp is TAT − 2τ (see hold.go)
	live   []heldUnit // holds outstanding; exp = release time (µs)
	tomb   []heldUnit // settled holds, in settle order; exp = end of the tombstone
	tombs  map[string]int64
}

type heldUnit struct {
	member string // holdMember(id, i)
	est    int64
	exp    int64
}

// reap releases the holds whose expiry is ≤ now: each gives its estimate
// back (heldRefund). It reports whether any was released.
func (hs *holdSet) reap(tat *int64, t, now, T int64) bool {
	kept := hs.live[:0]
	reaped := false
	for _, h := range hs.live {
		if h.exp <= now {
			*tat = heldRefund(*tat, t, h.est, T)
			reaped = true
			continue
		}
		kept = append(kept, h)
	}
	clear(hs.live[len(kept):])
	hs.live = kept
	return reaped
}

// lastExp is the latest release time of a live hold (0: none).
func (hs *holdSet) lastExp() int64 {
	var last int64
	for _, h := range hs.live {
		last = max(last, h.exp)
	}
	return last
}

// trimTombs drops the tombstones that ended by now.
func (hs *holdSet) trimTombs(now int64) {
	i := 0
	for i < len(hs.tomb) && hs.tomb[i].exp <= now {
		if hs.tombs[hs.tomb[i].member] == hs.tomb[i].exp {
			delete(hs.tombs, hs.tomb[i].member)
		}
		i++
	}
	if i > 0 {
		n := copy(hs.tomb, hs.tomb[i:])
		clear(hs.tomb[n:])
		hs.tomb = hs.tomb[:n]
	}
}

// write stores tat in e after a write at t and sets the mark: live holds,
// or a debt (TAT − t > τ).
func (hs *holdSet) write(e *entry, tat, t int64, p *limits) {
	e.a = tat
	hs.marked = len(hs.live) > 0 || tat-t > p.tau
	e.full = max(tat, hs.lastExp())
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
	if t := heldNow(tat, now, p, hs.marked); hs.reap(&tat, t, now, p.T) {
		hs.write(e, tat, t, p)
	}
	var next, t int64
	*o, next, t = heldDecide(tat, now, p, n, hs.marked)
	if next != tat {
		sh.prepareWrite(e, k, now, u)
		hs.write(e, next, t, p)
	}
}

// Reserve implements Reserver. The batch is decided under the locks of
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
		if t := heldNow(tat, now, &lim, hs.marked); hs.reap(&tat, t, now, lim.T) {
			hs.write(e, tat, t, &lim)
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
		for i := range items {
			hs := ents[i].log.holds
			hs.live = append(hs.live, heldUnit{member: holdMember(h.id, i), est: items[i].Cost, exp: exp})
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
// replaced by its actual cost (heldSettle) and leaves a tombstone.
func (s *MemoryStore) settle(ctx context.Context, h *Hold, actual []int64, res []SettleResult) error {
	now := s.now()
	ttlUS := h.ttl.Microseconds()
	for i := range h.items {
		it := &h.items[i]
		res[i] = s.settleOne(it, holdMember(h.id, i), settleCost(it, actual[i]), now, ttlUS)
	}
	return nil
}

func (s *MemoryStore) settleOne(it *Item, member string, actual, now, ttlUS int64) SettleResult {
	k := s.prepare(it.Scope, it.Key, it.Policy.Algorithm)
	sh := &s.shards[k.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(&k)
	if e == nil || e.log == nil || e.log.holds == nil {
		return SettleExpired // the key was reset or forgotten with its holds
	}
	lim := it.Policy.limits()
	hs := e.log.holds
	tat := e.a
	t := heldNow(tat, now, &lim, hs.marked)
	if hs.reap(&tat, t, now, lim.T) {
		hs.write(e, tat, t, &lim)
	}
	hs.trimTombs(now)
	for j, u := range hs.live {
		if u.member != member {
			continue
		}
		hs.live = append(hs.live[:j], hs.live[j+1:]...)
		t = heldNow(tat, now, &lim, hs.marked)
		hs.write(e, heldSettle(tat, t, u.est, actual, &lim), t, &lim)
		if hs.tombs == nil {
			hs.tombs = make(map[string]int64)
		}
		exp := now + ttlUS
		hs.tomb = append(hs.tomb, heldUnit{member: member, exp: exp})
		hs.tombs[member] = exp
		return SettleApplied
	}
	if _, ok := hs.tombs[member]; ok {
		return SettleAlreadySettled
	}
	return SettleExpired
}
