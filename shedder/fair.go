package shedder

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/spillway-go/spillway"
)

// tenant is one active tenant of one priority in a Queue with Tenant:
// the cost it has in flight and waiting.
type tenant struct {
	name              string
	p                 spillway.Priority
	inflight, waiting int64
	weight            float64
	idleAt            time.Time // when it last had nothing in flight or waiting
	served            float64   // cost admitted ÷ weight, decaying by e every servedDecay
	servedAt          time.Time // when served was last brought up to date
}

// servedDecay is how fast a tenant's record of the service it got fades:
// a slot that frees goes to the waiter whose tenant got the least service
// (for its weight) over about the last servedDecay, not merely the least
// in flight now, so that a tenant that always has a request waiting does
// not get more than one that sends as often as its share allows, and a
// tenant that missed its turns (it had nothing waiting when slots freed)
// makes them up over the next seconds.
const servedDecay = 5 * time.Second

// A tenant forgotten when idle leaves its record of service behind
// (Queue.memory) until the record decays below minServed (about 15 s
// after its last request at servedDecay 5 s), for at most maxRemembered
// tenants per priority: a tenant that comes back within that time is
// ordered by the service it got, not as a newcomer that got none (which
// put a tenant between two requests ahead of one that always waits).
// Beyond maxRemembered, a tenant that comes back starts afresh.
const (
	minServed     = 0.05
	maxRemembered = 4096
)

// servedRecord is an idle tenant's record of service: served at at.
type servedRecord struct {
	served float64
	at     time.Time
}

// servedNow returns t's decayed service at now.
func (t *tenant) servedNow(now time.Time) float64 { return decayed(t.served, t.servedAt, now) }

// decayed returns service served recorded at at, faded to now.
func decayed(served float64, at, now time.Time) float64 {
	if served == 0 {
		return 0
	}
	return served * math.Exp(-now.Sub(at).Seconds()/servedDecay.Seconds())
}

// serve records c more of service for t at now.
func (t *tenant) serve(c int64, now time.Time) {
	t.served = t.servedNow(now) + float64(c)/t.weight
	t.servedAt = now
}

// shareEntry is one tenant's demand in a max-min computation.
type shareEntry struct {
	demand float64
	weight float64
	mine   bool // the tenant asking
}

// tenantFor returns the state of tenant name at priority p, made when it
// becomes active; nil without Tenant. Called with q.mu held.
func (q *Queue) tenantFor(p spillway.Priority, name string) *tenant {
	if q.o.tenantDim == "" {
		return nil
	}
	m := q.tenants[p]
	if m == nil {
		m = map[string]*tenant{}
		q.tenants[p] = m
	}
	t := m[name]
	if t == nil {
		t = &tenant{name: name, p: p, weight: q.weightOf(name)}
		if r, ok := q.memory[p][name]; ok {
			t.served, t.servedAt = r.served, r.at
			delete(q.memory[p], name)
		}
		m[name] = t
	}
	return t
}

func (q *Queue) weightOf(name string) float64 {
	if w, ok := q.o.weights[name]; ok {
		return w
	}
	return 1
}

// dropIdle notes when t has nothing in flight or waiting left; it stays
// active for one mean hold time more (a tenant between two requests is
// still a tenant: without it, a tenant that sends most takes every slot
// that frees while the others are between requests), then it is
// forgotten: the state kept is bounded by the tenants that had work in
// the last mean hold time. Called with q.mu held.
func (q *Queue) dropIdle(t *tenant) {
	if t.inflight <= 0 && t.waiting <= 0 {
		t.idleAt = q.o.now()
		if q.hold <= 0 {
			q.forget(t)
		}
	}
}

func (q *Queue) forget(t *tenant) {
	if m := q.tenants[t.p]; m[t.name] == t {
		delete(m, t.name)
		q.remember(t)
	}
}

// remember keeps idle tenant t's record of service (see minServed).
// Called with q.mu held.
func (q *Queue) remember(t *tenant) {
	now := q.o.now()
	served := t.servedNow(now)
	if served < minServed {
		return
	}
	mem := q.memory[t.p]
	if mem == nil {
		mem = map[string]servedRecord{}
		q.memory[t.p] = mem
	}
	if len(mem) >= maxRemembered && now.After(q.pruned[t.p]) {
		// Full: drop the records that have faded, at most once per
		// servedDecay (each scan is maxRemembered entries).
		q.pruned[t.p] = now.Add(servedDecay)
		for name, r := range mem {
			if decayed(r.served, r.at, now) < minServed {
				delete(mem, name)
			}
		}
	}
	if len(mem) < maxRemembered {
		mem[t.name] = servedRecord{served: served, at: now}
	}
}

// unwait takes a waiter that leaves the queue without a slot off its
// tenant. Called with q.mu held.
func (q *Queue) unwait(w *waiter) {
	if w.t != nil {
		w.t.waiting -= w.cost
		q.dropIdle(w.t)
	}
}

// fairShare is the max-min fair share of capacity of tenant name at
// priority p, with c more of its demand: the capacity left to p (the
// slots less what higher priorities hold) is split between the active
// tenants of p in proportion to their weights, a tenant that wants less
// than its part (in flight and waiting) keeps what it wants, and the rest
// is split again between the others (water-filling). Called with q.mu
// held.
func (q *Queue) fairShare(p spillway.Priority, name string, c int64) float64 {
	capacity := q.slots
	for i := int(p) + 1; i < spillway.NumPriorities; i++ {
		capacity -= q.usedBy[i]
	}
	left := float64(max(0, capacity))
	es := q.scratch[:0]
	found := false
	var wsum float64
	now := q.o.now()
	for _, t := range q.tenants[p] {
		mine := t.name == name
		d := float64(t.inflight + t.waiting)
		if d == 0 && !mine {
			if now.Sub(t.idleAt) > q.hold {
				q.forget(t)
				continue
			}
			d = 1 // between two requests: it wants one
		}
		if mine {
			d += float64(c)
			found = true
		}
		es = append(es, shareEntry{demand: d, weight: t.weight, mine: mine})
		wsum += t.weight
	}
	if !found {
		es = append(es, shareEntry{demand: float64(c), weight: q.weightOf(name), mine: true})
		wsum += q.weightOf(name)
	}
	slices.SortFunc(es, func(a, b shareEntry) int { return cmp.Compare(a.demand/a.weight, b.demand/b.weight) })
	q.scratch = es[:0]
	for _, e := range es {
		level := left / wsum
		if e.demand/e.weight > level {
			// Every tenant from here on, this one among them, wants
			// more than its part at this level: each gets its part.
			return q.weightOf(name) * level
		}
		if e.mine {
			return e.demand
		}
		left -= e.demand
		wsum -= e.weight
	}
	return 0
}

// overShare decides, for a request of tenant name, whether its tenant
// already holds its fair share: its cost in flight and waiting, with this
// request, above its max-min share of p's capacity, rounded up (a tenant
// holding nothing may always ask). Such a request is denied at
// once with spillway.ReasonConcurrency (429: this tenant is over its
// share, not the server out of room for everybody), Limit its share
// rounded up, and a RetryAfter of its own: the time its backlog takes to
// drain at its share (mean hold × backlog ÷ share) — unless it is the one
// request more that a tenant behind the mean may have: then over is
// false and d is the refusal it gets if it finds no slot in time. d is
// the zero Decision for a request within the share. Called with q.mu
// held.
func (q *Queue) overShare(p spillway.Priority, name string, c int64) (spillway.Decision, bool) {
	share := q.fairShare(p, name, c)
	var held int64
	if t := q.tenants[p][name]; t != nil {
		held = t.inflight + t.waiting
	}
	allowed := int64(math.Ceil(share - 1e-9))
	if held == 0 || held+c <= allowed {
		return spillway.Decision{}, false
	}
	retry := q.o.retryAfter
	if q.hold > 0 {
		retry = time.Duration(float64(q.hold) * float64(held+c) / math.Max(share, float64(c)))
		retry = min(max(retry, time.Millisecond), time.Minute)
	}
	d := spillway.Decision{
		Reason:     spillway.ReasonConcurrency,
		Limiter:    q.o.name,
		Limit:      max(allowed, 1),
		Remaining:  0,
		RetryAfter: retry,
	}
	// A tenant that got less than the mean service lately may have one
	// request more waiting, so that it does not miss the next freed slot
	// while its clients wait out a refusal; if that request finds no
	// slot in time, it gets this refusal (429), not the queue's 503.
	return d, held+c > allowed+1 || !q.behind(p, name)
}

// fairest returns the index, in the waiters of priority p, of the one a
// freed slot goes to: of the tenant that got the least service for its
// weight lately (servedDecay), the oldest (the newest under adaptive
// LIFO). Called with q.mu held.
func (q *Queue) fairest(p spillway.Priority, lifo bool, now time.Time) int {
	best, bestLoad := -1, 0.0
	for i, w := range q.waiting[p] {
		load := w.t.servedNow(now)
		if best < 0 || load < bestLoad || (lifo && load == bestLoad) {
			best, bestLoad = i, load
		}
	}
	return best
}

// behind reports whether tenant name of p got less service for its weight
// lately (servedDecay) than the mean of p's active tenants. Called with
// q.mu held.
func (q *Queue) behind(p spillway.Priority, name string) bool {
	t := q.tenants[p][name]
	if t == nil || len(q.tenants[p]) < 2 {
		return false
	}
	now := q.o.now()
	var sum float64
	for _, u := range q.tenants[p] {
		sum += u.servedNow(now)
	}
	return t.servedNow(now) < sum/float64(len(q.tenants[p]))
}
