package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/lua"
)

// settleResult is what a SettleAsync's then received.
type settleResult struct {
	res []SettleResult
	err error
}

func settleAsync(t *testing.T, h *Hold, actual ...int64) <-chan settleResult {
	t.Helper()
	ch := make(chan settleResult, 1)
	if err := h.settleAsync(actual, func(res []SettleResult, err error) { ch <- settleResult{res, err} }); err != nil {
		t.Fatalf("SettleAsync: %v", err)
	}
	return ch
}

// TestRedisSettleAsync: settles handed to the background path land on a
// redis-server and on the 3×3 Cluster (one hold over several slots
// included), with the results SettleEach would give; many concurrent
// ones ride on the coalesced calls of decisions; a second settle reports
// already settled; bad input is refused before anything is queued.
func TestRedisSettleAsync(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t)
	ctx := context.Background()
	p := Policy{Limit: 100, Period: time.Hour} // nothing refills within the test
	for _, tc := range []struct {
		name string
		c    redis.UniversalClient
	}{{"redis", srv.Client(t)}, {"cluster", cl.Client(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustRedisStore(tc.c, RedisSettings{Prefix: "async:"})
			defer func() {
				if err := s.Close(ctx); err != nil {
					t.Error(err)
				}
			}()
			items := []Item{{Scope: "a", Key: "k1", Policy: p, Cost: 30}, {Scope: "a", Key: "k2", Policy: p, Cost: 20}, {Scope: "b", Key: "k1", Policy: p, Cost: 10}}
			h, err := s.Reserve(ctx, items, time.Minute)
			if err != nil || !h.allowed {
				t.Fatal(h, err)
			}
			if err := h.settleAsync([]int64{1}, nil); err == nil {
				t.Fatal("SettleAsync of 1 cost for 3 items: no error")
			}
			if err := h.settleAsync([]int64{1, -1, 1}, nil); !errors.Is(err, ErrInvalidCost) {
				t.Fatalf("SettleAsync of a negative cost: %v", err)
			}
			r := <-settleAsync(t, h, 5, 20, 40)
			if r.err != nil || fmt.Sprint(r.res) != "[applied applied applied]" {
				t.Fatalf("async settle: %v %v", r.res, r.err)
			}
			if res, err := h.settleEach(ctx, []int64{0, 0, 0}); err != nil || fmt.Sprint(res) != "[already_settled already_settled already_settled]" {
				t.Fatalf("settle after the async one: %v %v", res, err)
			}
			if r := <-settleAsync(t, h, 0, 0, 0); r.err != nil || fmt.Sprint(r.res) != "[already_settled already_settled already_settled]" {
				t.Fatalf("second async settle: %v %v", r.res, r.err)
			}
			out := make([]spillway.Decision, 3)
			for i := range items {
				items[i].Cost = 0
			}
			if _, err := s.Decide(ctx, items, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Remaining != 95 || out[1].Remaining != 80 || out[2].Remaining != 60 {
				t.Fatalf("after settling 5, 20, 40: remaining %d %d %d, want 95 80 60", out[0].Remaining, out[1].Remaining, out[2].Remaining)
			}

			// 64 goroutines, each a reservation, a decision and an async
			// settle on its own key, while others decide: the settles ride
			// on the coalesced calls or the background flush; all land.
			var wg sync.WaitGroup
			var bad atomic.Int64
			for g := range 64 {
				wg.Go(func() {
					key := fmt.Sprint("g", g)
					for range 20 {
						h, err := s.Reserve(ctx, []Item{{Scope: "c", Key: key, Policy: p, Cost: 3}}, time.Minute)
						if err != nil || !h.allowed {
							bad.Add(1)
							return
						}
						if _, err := s.Decide(ctx, []Item{{Scope: "d", Key: key, Policy: p, Cost: 1}}, make([]spillway.Decision, 1)); err != nil {
							bad.Add(1)
						}
						if err := h.settleAsync([]int64{1}, func(res []SettleResult, err error) {
							if err != nil || res[0] != SettleApplied {
								bad.Add(1)
							}
						}); err != nil {
							bad.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if err := s.flushSettles(ctx); err != nil {
				t.Fatal(err)
			}
			if bad.Load() != 0 {
				t.Fatalf("%d failures", bad.Load())
			}
			for g := range 64 {
				out := make([]spillway.Decision, 1)
				if _, err := s.Decide(ctx, []Item{{Scope: "c", Key: fmt.Sprint("g", g), Policy: p}}, out); err != nil || out[0].Remaining != 80 {
					t.Fatalf("g%d: %+v %v, want 80 left (20 settles of 1)", g, out[0], err)
				}
			}
		})
	}
}

// TestRedisSettleGate: while the store's gate is closed nothing is sent:
// a synchronous settle returns errNotSent at once, async settles wait in
// the queue, and land once the gate opens; past the queue's bound they
// are refused with errNotSent; Close at a deadline drops what is left.
func TestRedisSettleGate(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := &countHook{}
	c.AddHook(hook)
	ctx := context.Background()
	p := Policy{Limit: 100, Period: time.Hour}
	s := mustRedisStore(c, RedisSettings{Prefix: "gate:", SettleQueue: 2})
	var open atomic.Bool
	s.setGate(open.Load)
	it := []Item{{Scope: "a", Key: "k", Policy: p, Cost: 10}}
	var hs []*Hold
	for range 4 {
		h, err := s.Reserve(ctx, it, time.Minute) // the gate is for calls after admission only
		if err != nil || !h.allowed {
			t.Fatal(h, err)
		}
		hs = append(hs, h)
	}
	before := hook.n.Load()
	if _, err := hs[0].Settle(ctx, 0); !errors.Is(err, errNotSent) {
		t.Fatalf("synchronous settle with the gate closed: %v, want errNotSent", err)
	}
	a1, a2 := settleAsync(t, hs[1], 0), settleAsync(t, hs[2], 0)
	if r := <-settleAsync(t, hs[3], 0); !errors.Is(r.err, errNotSent) {
		t.Fatalf("third settle on a queue of 2: %v, want errNotSent", r.err)
	}
	time.Sleep(3 * settleRetry)
	if n := hook.n.Load() - before; n != 0 {
		t.Fatalf("%d commands sent with the gate closed", n)
	}
	select {
	case r := <-a1:
		t.Fatalf("settle answered with the gate closed: %v", r)
	default:
	}
	open.Store(true)
	for _, ch := range []<-chan settleResult{a1, a2} {
		if r := <-ch; r.err != nil || r.res[0] != SettleApplied {
			t.Fatalf("after the gate opened: %v", r)
		}
	}
	out := make([]spillway.Decision, 1)
	it[0].Cost = 0
	if _, err := s.Decide(ctx, it, out); err != nil || out[0].Remaining != 80 {
		t.Fatalf("%+v %v, want 80 left (two holds of 10 still held)", out[0], err)
	}

	// Close at a deadline while the gate is closed: the queued settle is
	// dropped with errNotSent, and later ones are refused.
	open.Store(false)
	it[0].Cost = 10
	h, err := s.Reserve(ctx, it, time.Minute)
	if err != nil || !h.allowed {
		t.Fatal(h, err)
	}
	ch := settleAsync(t, h, 0)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := s.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with the gate closed: %v", err)
	}
	if r := <-ch; !errors.Is(r.err, errNotSent) {
		t.Fatalf("settle left at Close: %v", r)
	}
	if r := <-settleAsync(t, hs[0], 0); !errors.Is(r.err, errNotSent) {
		t.Fatalf("settle after Close: %v", r)
	}
}

// TestRedisSettleRidesOnNextCall: on a single server the settles queued
// go first in the pipeline of the store's next call, so a process's next
// decision or reservation sees them, the very first settle included.
func TestRedisSettleRidesOnNextCall(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hook := &countHook{}
	c.AddHook(hook)
	s := mustRedisStore(c)
	ctx := context.Background()
	p := Policy{Limit: 100, Period: time.Hour}
	it := []Item{{Scope: "a", Key: "k", Policy: p, Cost: 50}}
	h, err := s.Reserve(ctx, it, time.Minute)
	if err != nil || !h.allowed {
		t.Fatal(h, err)
	}
	answered := make(chan settleResult, 1)
	if err := h.settleAsync([]int64{10}, func(res []SettleResult, err error) { answered <- settleResult{res, err} }); err != nil {
		t.Fatal(err)
	}
	before := hook.n.Load()
	h2, err := s.Reserve(ctx, it, time.Minute) // carries the settle: 100 − 10 − 50
	if err != nil || !h2.allowed || h2.Decision().Remaining != 40 {
		t.Fatalf("reserve after the settle: %+v %v, want 40 left", h2.Decision(), err)
	}
	if r := <-answered; r.err != nil || r.res[0] != SettleApplied {
		t.Fatalf("settle: %v", r)
	}
	if n := hook.n.Load() - before; n != 1 {
		t.Fatalf("%d round trips for the reservation and the settle it carried, want 1 (one script call)", n)
	}
	out := make([]spillway.Decision, 1)
	if _, err := s.Decide(ctx, []Item{{Scope: "a", Key: "other", Policy: p, Cost: 1}}, out); err != nil { // loads the script
		t.Fatal(err)
	}
	// a decision carries the settles in its pipeline (the settle script
	// loaded once, first)
	it[0].Cost = 1
	// 40 left: a reservation of 1 (39), the settle of the one before it
	// gives 10 back (50 → 40), then 1 back (1 → 0); a decision of 1
	for i, c := range []struct{ actual, want int64 }{{40, 48}, {0, 47}} {
		want := c.want
		h3, err := s.Reserve(ctx, it, time.Minute)
		if err != nil || !h3.allowed {
			t.Fatal(h3, err)
		}
		if err := h2.settleAsync([]int64{c.actual}, nil); err != nil {
			t.Fatal(err)
		}
		h2 = h3
		before := hook.n.Load()
		if _, err := s.Decide(ctx, it, out); err != nil || out[0].Remaining != want {
			t.Fatalf("decision after settle %d: %+v %v, want %d left", i+2, out[0], err, want)
		}
		if n := hook.n.Load() - before; i == 1 && n != 1 {
			t.Fatalf("%d round trips for the decision and the settle it carried, want 1", n)
		}
	}
}

// TestRedisSettleInFlightOrdersNextCall: a settle already taken from the
// queue and on its way (here held back by the test, as a slow connection
// would) is waited for by the process's next call on one of its keys, a
// decision or a reservation, so that the call sees it although it would
// reach Redis first; a call on another key does not wait.
func TestRedisSettleInFlightOrdersNextCall(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	p := Policy{Limit: 100, Period: time.Hour}
	for _, next := range []string{"decide", "reserve"} {
		t.Run(next, func(t *testing.T) {
			s := mustRedisStore(srv.Client(t), RedisSettings{Prefix: next + ":"})
			q := s.sq
			q.running.Store(true) // no background goroutine: the test is the sender
			it := []Item{{Scope: "a", Key: "k", Policy: p, Cost: 50}}
			h, err := s.Reserve(ctx, it, time.Minute)
			if err != nil || !h.allowed || h.Decision().Remaining != 50 {
				t.Fatal(h, err)
			}
			answered := settleAsync(t, h, 10)
			q.mu.Lock()
			batch := q.take(settleFlushItems)
			q.mu.Unlock()
			if len(batch) != 1 || q.nflight.Load() != 1 {
				t.Fatalf("took %d settles, %d flights", len(batch), q.nflight.Load())
			}

			// another key does not wait for the flight
			out := make([]spillway.Decision, 1)
			if _, err := s.Decide(ctx, []Item{{Scope: "a", Key: "other", Policy: p, Cost: 1}}, out); err != nil || out[0].Remaining != 99 {
				t.Fatalf("decision on another key: %+v %v", out[0], err)
			}

			got := make(chan int64, 1)
			go func() {
				it := []Item{{Scope: "a", Key: "k", Policy: p, Cost: 1}}
				if next == "decide" {
					out := make([]spillway.Decision, 1)
					if _, err := s.Decide(ctx, it, out); err != nil {
						t.Error(err)
					}
					got <- out[0].Remaining
					return
				}
				h, err := s.Reserve(ctx, it, time.Minute)
				if err != nil {
					t.Error(err)
					got <- -1
					return
				}
				got <- h.Decision().Remaining
			}()
			time.Sleep(50 * time.Millisecond)
			select {
			case r := <-got:
				t.Fatalf("the call on the settle's key went on with the settle on its way: %d left", r)
			default:
			}
			calls := s.settleCalls(batch)
			calls[0].cmd = lua.Script("ratelimit_settle").Run(ctx, s.client, calls[0].keys, calls[0].args...)
			if failed := s.deliverSettles(ctx, batch, calls); failed {
				t.Fatal("settle failed")
			}
			if r := <-answered; r.err != nil || r.res[0] != SettleApplied {
				t.Fatalf("settle: %v", r)
			}
			// 100 − 10 settled − 1
			if r := <-got; r != 89 {
				t.Fatalf("%s after the settle landed: %d left, want 89", next, r)
			}
			if q.nflight.Load() != 0 {
				t.Fatalf("%d flights after landing", q.nflight.Load())
			}
		})
	}
}
