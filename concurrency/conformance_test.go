package concurrency

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
)

func newFakeClock() *testclock.Clock {
	return testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

type storeFactory func(t *testing.T, clk *testclock.Clock) Store

func memoryFactory(t *testing.T, clock *testclock.Clock) Store {
	return NewMemoryStore(MemorySettings{Clock: clock.Now})
}

func redisFactory(t *testing.T, clock *testclock.Clock) Store {
	srv := redistest.Start(t)
	s, err := NewRedisStore(srv.Client(t), RedisSettings{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConformance runs one suite against both stores: the memory store is
// the oracle for the script.
func TestConformance(t *testing.T) {
	for _, f := range []struct {
		name string
		new  storeFactory
	}{{"memory", memoryFactory}, {"redis", redisFactory}} {
		t.Run(f.name, func(t *testing.T) { runConformance(t, f.new) })
	}
}

type step struct {
	advance  time.Duration // before the call
	release  string        // release this id instead of acquiring
	id       string
	cost     int64  // default 1; of the release too
	key      string // default "k"
	allowed  bool
	inFlight int64
	wait     time.Duration
}

func runSteps(t *testing.T, s Store, clock *testclock.Clock, limit int64, ttl time.Duration, steps []step) {
	t.Helper()
	ctx := context.Background()
	for i, st := range steps {
		clock.Advance(st.advance)
		key := st.key
		if key == "" {
			key = "k"
		}
		cost := st.cost
		if cost == 0 {
			cost = 1
		}
		if st.release != "" {
			if err := s.release(ctx, "scope", key, st.release, cost); err != nil {
				t.Fatalf("step %d: release %s: %v", i, st.release, err)
			}
			continue
		}
		res, err := s.acquire(ctx, "scope", key, st.id, cost, limit, ttl)
		if err != nil {
			t.Fatalf("step %d: acquire %s cost %d: %v", i, st.id, cost, err)
		}
		want := result{Allowed: st.allowed, InFlight: st.inFlight, Wait: st.wait}
		if res != want {
			t.Fatalf("step %d (%s cost %d): got %+v, want %+v", i, st.id, cost, res, want)
		}
	}
}

func runConformance(t *testing.T, newStore storeFactory) {
	const ttl = 10 * time.Second
	t.Run("LimitThenDeny", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 3, ttl, []step{
			{id: "a", allowed: true, inFlight: 1},
			{advance: time.Second, id: "b", allowed: true, inFlight: 2},
			{id: "c", allowed: true, inFlight: 3},
			// The oldest entry, a, is reaped 10 s after it started: 8 s from now.
			{advance: time.Second, id: "d", allowed: false, inFlight: 3, wait: 8 * time.Second},
			{release: "b"},
			{id: "d", allowed: true, inFlight: 3},
			{id: "e", allowed: false, inFlight: 3, wait: 8 * time.Second},
		})
	})
	t.Run("ReleaseIsIdempotent", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 2, ttl, []step{
			{id: "a", allowed: true, inFlight: 1},
			{id: "b", allowed: true, inFlight: 2},
			{release: "a"},
			{release: "a"},       // twice: nothing more
			{release: "unknown"}, // never acquired: nothing
			{id: "c", allowed: true, inFlight: 2},
			{id: "d", allowed: false, inFlight: 2, wait: ttl},
		})
	})
	t.Run("LeakReapedAfterTTL", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 2, ttl, []step{
			{id: "leak1", allowed: true, inFlight: 1},
			{id: "leak2", allowed: true, inFlight: 2},
			{advance: ttl - time.Millisecond, id: "x", allowed: false, inFlight: 2, wait: time.Millisecond},
			// Exactly ttl after the start the entries are reaped.
			{advance: time.Millisecond, id: "x", allowed: true, inFlight: 1},
			{id: "y", allowed: true, inFlight: 2},
		})
	})
	t.Run("WaitRoundsUpToMillisecond", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 1, ttl, []step{
			{id: "a", allowed: true, inFlight: 1},
			{advance: ttl - 1500*time.Microsecond, id: "b", allowed: false, inFlight: 1, wait: 2 * time.Millisecond},
			{advance: 1400 * time.Microsecond, id: "b", allowed: false, inFlight: 1, wait: time.Millisecond},
		})
	})
	t.Run("DuplicateIDCountsOnce", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 2, ttl, []step{
			{id: "a", allowed: true, inFlight: 1},
			{id: "a", allowed: true, inFlight: 1},
			{id: "b", allowed: true, inFlight: 2},
		})
	})
	t.Run("KeysAndScopesAreSeparate", func(t *testing.T) {
		clock := newFakeClock()
		s := newStore(t, clock)
		runSteps(t, s, clock, 1, ttl, []step{
			{id: "a", key: "k1", allowed: true, inFlight: 1},
			{id: "b", key: "k2", allowed: true, inFlight: 1},
			{id: "c", key: "k1", allowed: false, inFlight: 1, wait: ttl},
			// A key that looks like another's hash tag stays separate.
			{id: "d", key: "{k1}", allowed: true, inFlight: 1},
		})
		res, err := s.acquire(context.Background(), "other", "k1", "e", 1, 1, ttl)
		if err != nil || !res.Allowed {
			t.Fatalf("other scope: %+v, %v; want allowed", res, err)
		}
	})
	t.Run("ClockGoingBackwards", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 1, ttl, []step{
			{id: "a", allowed: true, inFlight: 1},
			// Back 2 s: the entry looks 2 s in the future; it is not
			// reaped early and is reaped ttl after its own start.
			{advance: -2 * time.Second, id: "b", allowed: false, inFlight: 1, wait: ttl + 2*time.Second},
			{advance: ttl + 2*time.Second - time.Millisecond, id: "b", allowed: false, inFlight: 1, wait: time.Millisecond},
			{advance: time.Millisecond, id: "b", allowed: true, inFlight: 1},
		})
	})
	t.Run("CostsHoldUnits", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 10, ttl, []step{
			{id: "a", cost: 3, allowed: true, inFlight: 3},
			{advance: time.Second, id: "b", cost: 3, allowed: true, inFlight: 6},
			{advance: time.Second, id: "c", cost: 3, allowed: true, inFlight: 9},
			// 9 + 2 > 10: one unit must go, the oldest, a's: 10 s after
			// a started, 7 s from now.
			{advance: time.Second, id: "d", cost: 2, allowed: false, inFlight: 9, wait: 7 * time.Second},
			{id: "e", cost: 1, allowed: true, inFlight: 10},
			// Full: the wait is until the request holding the
			// (in flight + cost − L)-th oldest unit is reaped.
			{id: "d", cost: 2, allowed: false, inFlight: 10, wait: 7 * time.Second}, // unit 2: a
			{id: "d", cost: 3, allowed: false, inFlight: 10, wait: 7 * time.Second}, // unit 3: a
			{id: "d", cost: 4, allowed: false, inFlight: 10, wait: 8 * time.Second}, // unit 4: b
			{id: "d", cost: 9, allowed: false, inFlight: 10, wait: 9 * time.Second}, // unit 9: c
			{id: "d", cost: 10, allowed: false, inFlight: 10, wait: ttl},            // unit 10: e
			// Releasing b frees exactly its 3 units.
			{release: "b", cost: 3},
			{id: "f", cost: 4, allowed: false, inFlight: 7, wait: 7 * time.Second},
			{id: "f", cost: 3, allowed: true, inFlight: 10},
			{id: "g", cost: 1, allowed: false, inFlight: 10, wait: 7 * time.Second},
			{release: "a", cost: 3},
			{release: "a", cost: 3}, // twice: nothing more
			{id: "g", cost: 1, allowed: true, inFlight: 8},
			{id: "h", cost: 2, allowed: true, inFlight: 10},
		})
	})
	t.Run("CrashedCostReapedAfterTTL", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 5, ttl, []step{
			{id: "crashed", cost: 3, allowed: true, inFlight: 3}, // never released
			{advance: time.Second, id: "b", cost: 2, allowed: true, inFlight: 5},
			{advance: ttl - time.Second - time.Millisecond, id: "c", cost: 3, allowed: false, inFlight: 5, wait: time.Millisecond},
			// ttl after its start all 3 units of the crashed request go
			// at once.
			{advance: time.Millisecond, id: "c", cost: 3, allowed: true, inFlight: 5},
			{id: "d", cost: 1, allowed: false, inFlight: 5, wait: time.Second}, // unit 1: b
		})
	})
	t.Run("DuplicateIDWithCostCountsOnce", func(t *testing.T) {
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 5, ttl, []step{
			{id: "a", cost: 2, allowed: true, inFlight: 2},
			{id: "a", cost: 2, allowed: true, inFlight: 2},
			{id: "a", cost: 3, allowed: true, inFlight: 2},
			{id: "b", cost: 3, allowed: true, inFlight: 5},
		})
	})
	t.Run("LargeCost", func(t *testing.T) {
		// More members than the script adds in one ZADD (1000).
		clock := newFakeClock()
		runSteps(t, newStore(t, clock), clock, 2500, ttl, []step{
			{id: "big", cost: 2499, allowed: true, inFlight: 2499},
			{id: "x", cost: 2, allowed: false, inFlight: 2499, wait: ttl},
			{id: "x", cost: 1, allowed: true, inFlight: 2500},
			{release: "big", cost: 2499},
			{id: "y", cost: 2499, allowed: true, inFlight: 2500},
			{release: "y", cost: 2499},
			{release: "x"},
			{id: "z", cost: 2500, allowed: true, inFlight: 2500},
		})
	})
	t.Run("BadInput", func(t *testing.T) {
		clock := newFakeClock()
		s := newStore(t, clock)
		ctx := context.Background()
		// want is what the error must name.
		for _, c := range []struct {
			cost, limit int64
			ttl         time.Duration
			id          string
			want        string
		}{
			{1, 0, ttl, "a", "limit 0"},
			{1, -1, ttl, "a", "limit -1"},
			{1, 1, 0, "a", "ttl 0s"},
			{1, 1, -time.Second, "a", "ttl -1s"},
			{1, 1, ttl, "", "id is empty"},
			{1, 1, ttl, "a#1", "contains '#'"},
			{0, 1, ttl, "a", "cost 0"},
			{-1, 1, ttl, "a", "cost -1"},
			{3, 2, ttl, "a", "cost 3"},
		} {
			if _, err := s.acquire(ctx, "scope", "k", c.id, c.cost, c.limit, c.ttl); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Acquire(cost=%d, limit=%d, ttl=%v, id=%q): err = %v, want one naming %q", c.cost, c.limit, c.ttl, c.id, err, c.want)
			}
		}
		// An id with '#' could name another request's unit.
		if res, err := s.acquire(ctx, "scope", "k", "a", 3, 3, ttl); err != nil || !res.Allowed {
			t.Fatalf("a: %+v %v", res, err)
		}
		for _, c := range []struct {
			id   string
			cost int64
			want string
		}{{"a#1", 1, "contains '#'"}, {"", 1, "id is empty"}, {"a", 0, "cost 0"}} {
			if err := s.release(ctx, "scope", "k", c.id, c.cost); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Release(id=%q, cost=%d): err = %v, want one naming %q", c.id, c.cost, err, c.want)
			}
		}
		if res, err := s.acquire(ctx, "scope", "k", "b", 1, 3, ttl); err != nil || res.Allowed || res.InFlight != 3 {
			t.Fatalf("after refused releases: %+v %v; want a's 3 units still held", res, err)
		}
	})
}
