package spillway_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/contracttest"
)

// holder is a conforming block that holds one unit per admission until
// done, up to a capacity; it fails while broken.
type holder struct {
	capacity int64
	held     atomic.Int64
	broken   atomic.Bool
}

func (h *holder) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: "holder"}, spillway.Noop, nil
	}
	if h.broken.Load() {
		return spillway.Decision{}, spillway.Noop, &spillway.StoreError{Limiter: "holder", Err: errors.New("backend down")}
	}
	if n := h.held.Add(1); n > h.capacity {
		h.held.Add(-1)
		return spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "holder", Limit: h.capacity, RetryAfter: time.Second}, spillway.Noop, nil
	}
	return spillway.Decision{Allowed: true, Limiter: "holder", Limit: h.capacity, Remaining: h.capacity - h.held.Load()},
		block.Once(func(spillway.Outcome) { h.held.Add(-1) }), nil
}

// quota is a conforming rate-like block: n admissions, then denials.
type quota struct {
	mu   sync.Mutex
	left int
}

func (q *quota) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: "quota"}, spillway.Noop, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.left <= 0 {
		return spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "quota", Limit: 1, RetryAfter: time.Minute}, spillway.Noop, nil
	}
	q.left--
	return spillway.Decision{Allowed: true, Limiter: "quota", Limit: 1 << 20, Remaining: int64(q.left)}, spillway.Noop, nil
}

// The Chain conforms: a holding block in front of a denying one is
// released when the later one denies; a failing block's error comes with
// the zero Decision; the chain's done releases every block once.
func TestChainContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
		h := &holder{capacity: 1000}
		q := &quota{left: 1 << 20}
		last := &holder{capacity: 1000}
		c := spillway.Chain(h, q, last)
		return contracttest.Instance{
			Limiter: c,
			Held:    func() int64 { return h.held.Load() + last.held.Load() },
			Deny: func(*testing.T) {
				q.mu.Lock()
				q.left = 0
				q.mu.Unlock()
			},
			Break: func(*testing.T) { last.broken.Store(true) },
		}
	}})
}

// LimiterFunc passes everything through: a conforming function conforms.
func TestLimiterFuncContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
		h := &holder{capacity: 2}
		return contracttest.Instance{
			Limiter: block.LimiterFunc(h.Admit),
			Held:    h.held.Load,
			Deny: func(t *testing.T) {
				for i := 0; i < 2; i++ {
					if _, _, err := h.Admit(context.Background(), contracttest.Request()); err != nil {
						t.Fatal(err)
					}
				}
			},
			Break: func(*testing.T) { h.broken.Store(true) },
		}
	}})
}
