package concurrency

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock = testclock.Clock

func newFakeClock() *fakeClock { return testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) }

type storeFactory func(t *testing.T, clock *fakeClock) Store

func memoryFactory(t *testing.T, clock *fakeClock) Store {
	return NewMemoryStore(WithClock(clock.Now))
}

func redisFactory(t *testing.T, clock *fakeClock) Store {
	srv := redistest.Start(t)
	s, err := NewRedisStore(srv.Client(t), WithClock(clock.Now))
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
	key      string // default "k"
	allowed  bool
	inFlight int64
	wait     time.Duration
}

func runSteps(t *testing.T, s Store, clock *fakeClock, limit int64, ttl time.Duration, steps []step) {
	t.Helper()
	ctx := context.Background()
	for i, st := range steps {
		clock.Advance(st.advance)
		key := st.key
		if key == "" {
			key = "k"
		}
		if st.release != "" {
			if err := s.Release(ctx, "scope", key, st.release); err != nil {
				t.Fatalf("step %d: release %s: %v", i, st.release, err)
			}
			continue
		}
		res, err := s.Acquire(ctx, "scope", key, st.id, limit, ttl)
		if err != nil {
			t.Fatalf("step %d: acquire %s: %v", i, st.id, err)
		}
		want := Result{Allowed: st.allowed, InFlight: st.inFlight, Wait: st.wait}
		if res != want {
			t.Fatalf("step %d (%s): got %+v, want %+v", i, st.id, res, want)
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
		res, err := s.Acquire(context.Background(), "other", "k1", "e", 1, ttl)
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
	t.Run("BadInput", func(t *testing.T) {
		clock := newFakeClock()
		s := newStore(t, clock)
		ctx := context.Background()
		for _, c := range []struct {
			limit int64
			ttl   time.Duration
			id    string
		}{{0, ttl, "a"}, {-1, ttl, "a"}, {1, 0, "a"}, {1, -time.Second, "a"}, {1, ttl, ""}} {
			if _, err := s.Acquire(ctx, "scope", "k", c.id, c.limit, c.ttl); err == nil {
				t.Errorf("Acquire(limit=%d, ttl=%v, id=%q): no error", c.limit, c.ttl, c.id)
			}
		}
	})
}
