package clientside

import (
	"fmt"
	"sync"
	"time"
)

// Throttle is Google SRE's client-side adaptive throttling. Over a sliding
// window it counts requests (every call of Allow, including the ones it
// rejects) and accepts (calls of Accepted, made when the backend did the
// work rather than reject it for overload) and rejects a new request
// locally with probability
//
//	max(0, (requests − K·accepts) / (requests + 1))
//
// While the backend accepts everything the probability is 0; once it
// rejects more than a 1−1/K share of what it is sent, the client rejects the
// excess itself, without spending the backend's resources, and still sends
// enough to notice recovery.
//
// A Throttle is safe for concurrent use.
type Throttle struct {
	k     float64
	width int64 // bucket width, ns
	now   func() time.Time
	rand  func() float64
	mu    sync.Mutex
	ring  []bucket
	cur   int64 // the newest bucket index seen; the window ends there
	req   int64 // sums over the buckets in the window
	acc   int64
	// scratch absorbs counts at times older than the window.
	scratch bucket
}

type bucket struct {
	idx      int64 // absolute bucket number: UnixNano / width
	requests int64
	accepts  int64
}

// NewThrottle returns a Throttle configured by s (ThrottleSettings{} for
// the defaults); an invalid setting is an error naming it.
func NewThrottle(s ThrottleSettings) (*Throttle, error) {
	c := throttleConfig(s)
	if err := c.validate(); err != nil {
		return nil, err
	}
	if !(c.k >= 1) || bad(c.k) {
		return nil, fmt.Errorf("clientside: K %v must be a number >= 1", c.k)
	}
	if c.buckets < 1 {
		return nil, fmt.Errorf("clientside: window buckets %d must be positive", c.buckets)
	}
	if c.window < time.Duration(c.buckets) {
		return nil, fmt.Errorf("clientside: window %v must be at least %d ns (one per bucket)", c.window, c.buckets)
	}
	t := &Throttle{k: c.k, width: int64(c.window) / int64(c.buckets), now: c.now, rand: c.rand, ring: make([]bucket, c.buckets)}
	for i := range t.ring {
		t.ring[i].idx = -1
	}
	return t, nil
}

// Allow counts a request at the time of the Throttle's Clock and reports
// whether to send it; false means reject it locally (and do not call
// Accepted).
func (t *Throttle) Allow() bool { return t.allowAt(t.now()) }

func (t *Throttle) allowAt(now time.Time) bool {
	t.mu.Lock()
	p := t.probability(now)
	t.add(now, 1, 0)
	t.mu.Unlock()
	return p <= 0 || t.rand() >= p
}

// Accepted records, at the time of the Throttle's Clock, that the backend
// accepted a request sent after Allow: it did the work, whatever the
// result, rather than reject it as overloaded or throttled.
func (t *Throttle) Accepted() { t.acceptedAt(t.now()) }

func (t *Throttle) acceptedAt(now time.Time) {
	t.mu.Lock()
	t.add(now, 0, 1)
	t.mu.Unlock()
}

// Probability returns the probability that a request now (the Throttle's
// Clock) is rejected locally.
func (t *Throttle) Probability() float64 { return t.probabilityAt(t.now()) }

func (t *Throttle) probabilityAt(now time.Time) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.probability(now)
}

// countsAt returns the requests and accepts counted in the window that ends
// at now.
func (t *Throttle) countsAt(now time.Time) (requests, accepts int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counts(now)
}

func (t *Throttle) probability(now time.Time) float64 {
	req, acc := t.counts(now)
	p := (float64(req) - t.k*float64(acc)) / float64(req+1)
	if p < 0 {
		return 0
	}
	return p
}

// counts returns the sums over the window that ends at now.
func (t *Throttle) counts(now time.Time) (req, acc int64) {
	idx := now.UnixNano() / t.width
	if idx >= t.cur {
		t.advance(idx)
		return t.req, t.acc
	}
	// A clock that went backwards: sum the buckets still in that window
	// without moving the ring.
	lo := idx - int64(len(t.ring)) + 1
	for i := range t.ring {
		b := &t.ring[i]
		if b.idx >= lo && b.idx <= idx {
			req += b.requests
			acc += b.accepts
		}
	}
	return req, acc
}

// advance moves the window to end at bucket idx >= t.cur, dropping the
// buckets that leave it from the sums: amortized O(1) per call.
func (t *Throttle) advance(idx int64) {
	n := int64(len(t.ring))
	if idx-t.cur >= n {
		for i := range t.ring {
			t.ring[i] = bucket{idx: -1}
		}
		t.req, t.acc = 0, 0
		t.cur = idx
		return
	}
	for i := t.cur + 1; i <= idx; i++ {
		b := &t.ring[((i%n)+n)%n]
		if b.idx >= 0 {
			t.req -= b.requests
			t.acc -= b.accepts
		}
		*b = bucket{idx: -1}
	}
	t.cur = idx
}

func (t *Throttle) add(now time.Time, req, acc int64) {
	b := t.current(now)
	if b == &t.scratch {
		return
	}
	b.requests += req
	b.accepts += acc
	t.req += req
	t.acc += acc
}

// current returns the bucket of now, for counting. Counts at a time before
// the window's end go to that time's bucket if it is still in the ring and
// are otherwise dropped (into a scratch bucket).
func (t *Throttle) current(now time.Time) *bucket {
	idx := now.UnixNano() / t.width
	n := int64(len(t.ring))
	if idx >= t.cur {
		t.advance(idx)
	} else if idx <= t.cur-n {
		return &t.scratch
	}
	b := &t.ring[((idx%n)+n)%n]
	if b.idx != idx {
		*b = bucket{idx: idx}
	}
	return b
}
