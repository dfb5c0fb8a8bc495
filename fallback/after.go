package fallback

import (
	"sync"
	"sync/atomic"
)

// afterQueue holds the post-admission calls (a Limiter's releases) made
// while the health was not closed, to run once it closes: none of them
// waits on a Redis the health has given up on, and none is lost while
// there is room. Bounded by max entries (each a closure of the inner
// limiter's done: about 100–200 bytes with its key and id).
type afterQueue struct {
	max int

	mu       sync.Mutex
	fns      []func()
	draining bool
	dropped  atomic.Int64
}

// add queues f and reports true, or reports false (f is dropped, left to
// its TTL) when the queue is full or disabled.
func (q *afterQueue) add(f func()) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.fns) >= q.max {
		q.dropped.Add(1)
		return false
	}
	q.fns = append(q.fns, f)
	return true
}

func (q *afterQueue) stats() (queued int, dropped int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.fns), q.dropped.Load()
}

// drain runs the queued calls on a goroutine of its own, in order, while
// h stays closed; what is left when it opens again waits for the next
// close. It never blocks (it is called under the breaker's lock).
func (q *afterQueue) drain(h *Health) {
	q.mu.Lock()
	if q.draining || len(q.fns) == 0 {
		q.mu.Unlock()
		return
	}
	q.draining = true
	q.mu.Unlock()
	go func() {
		for {
			q.mu.Lock()
			if len(q.fns) == 0 || !h.closed.Load() {
				q.draining = false
				q.mu.Unlock()
				return
			}
			f := q.fns[0]
			q.fns[0] = nil
			q.fns = q.fns[1:]
			if len(q.fns) == 0 {
				q.fns = nil // let the backing array go
			}
			q.mu.Unlock()
			f()
		}
	}()
}
