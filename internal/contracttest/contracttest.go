// Package contracttest is the conformance suite of the spillway.Limiter
// contract. Every Admit implementation of the project runs it, from a
// contract_test.go in its package:
//
//   - a nil or malformed request (negative cost, unknown priority) is denied
//     with spillway.ReasonInvalid, with no error and nothing acquired;
//   - done is never nil, and calling it more than once releases once;
//   - an allowed decision has Reason none and no RetryAfter; a denial has a
//     Reason, and holds nothing afterwards: what was acquired on the way
//     is released;
//   - an error comes with the zero Decision and a done that does nothing,
//     and matches spillway.ErrStoreUnavailable (a *spillway.StoreError);
//   - under concurrent use, everything acquired is released.
package contracttest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// Instance is one fresh limiter under test and the hooks that observe and
// drive it. Only Limiter is required.
type Instance struct {
	Limiter spillway.Limiter

	// Held reports what the limiter holds now (units in flight), for
	// blocks that hold something until done; nil for blocks that hold
	// nothing (rate limits, ceilings).
	Held func() int64

	// Deny puts the limiter in a state where Admit of the Subject's
	// Request is denied (fills it, exhausts it); nil when it cannot be
	// driven there.
	Deny func(t *testing.T)

	// Break makes the limiter's backend fail from now on (stops its Redis,
	// say); nil for blocks without one.
	Break func(t *testing.T)
}

// Subject describes one implementation.
type Subject struct {
	// New returns a fresh instance; it is called once per check.
	New func(t *testing.T) Instance

	// Request returns a well-formed request that a fresh instance admits
	// (at least twice). Default: Request().
	Request func() *spillway.Request

	// Decides is set for blocks that decide on a backend failure instead
	// of returning an error (a fallback, a local share): after Break,
	// Admit returns a Degraded decision and no error.
	Decides bool
}

// Request returns the default request of the suite: Critical, cost 1, with
// the ip, user and api_key dimensions set.
func Request() *spillway.Request {
	r := &spillway.Request{Endpoint: "/contract", Method: "POST", Priority: spillway.Critical, Cost: 1}
	r.Set(spillway.DimIP, "192.0.2.7")
	r.Set(spillway.DimUser, "u-contract")
	r.Set(spillway.DimAPIKey, "k-contract")
	return r
}

// Run checks every clause of the contract against s, each in a subtest.
func Run(t *testing.T, s Subject) {
	t.Helper()
	if s.Request == nil {
		s.Request = Request
	}
	// The first instance serves the first check and says which hooks the
	// subject has: the checks that need a missing hook do not run.
	first := s.New(t)
	t.Run("invalid", func(t *testing.T) { invalid(t, s, first) })
	t.Run("done", func(t *testing.T) { doneOnce(t, s) })
	if first.Deny != nil {
		t.Run("denial", func(t *testing.T) { denial(t, s) })
	}
	if first.Break != nil {
		t.Run("error", func(t *testing.T) { backendError(t, s) })
	}
	t.Run("concurrent", func(t *testing.T) { concurrent(t, s) })
}

func held(in Instance) int64 {
	if in.Held == nil {
		return 0
	}
	return in.Held()
}

// settled returns what in holds once it equals want, or what it holds
// after a few seconds: a release may land after done returns (a release
// that must not block the caller on a slow backend), but it must land.
func settled(in Instance, want int64) int64 {
	h := held(in)
	for deadline := time.Now().Add(3 * time.Second); h != want && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		h = held(in)
	}
	return h
}

// malformed returns the malformed requests the suite sends, by name.
func malformed(s Subject) map[string]func() *spillway.Request {
	return map[string]func() *spillway.Request{
		"nil":               func() *spillway.Request { return nil },
		"negative cost":     func() *spillway.Request { r := s.Request(); r.Cost = -1; return r },
		"priority above":    func() *spillway.Request { r := s.Request(); r.Priority = spillway.CriticalPlus + 1; return r },
		"negative priority": func() *spillway.Request { r := s.Request(); r.Priority = -1; return r },
	}
}

func invalid(t *testing.T, s Subject, in Instance) {
	ctx := context.Background()
	h0 := held(in)
	for name, mk := range malformed(s) {
		d, done, err := in.Limiter.Admit(ctx, mk())
		if err != nil {
			t.Errorf("%s request: err = %v; want a ReasonInvalid denial, no error", name, err)
			continue
		}
		if d.Allowed || d.Reason != spillway.ReasonInvalid || d.RetryAfter != 0 {
			t.Errorf("%s request: %+v; want denied with ReasonInvalid and no RetryAfter", name, d)
		}
		if done == nil {
			t.Errorf("%s request: done is nil", name)
			continue
		}
		done(spillway.Ignored)
		done(spillway.Ignored)
		if h := settled(in, h0); h != h0 {
			t.Errorf("%s request: holds %d after its denial; want %d", name, h, h0)
		}
	}
	// The limiter still works.
	d, done, err := in.Limiter.Admit(ctx, s.Request())
	if err != nil || !d.Allowed || done == nil {
		t.Fatalf("a valid request after the invalid ones: %+v, %v; want allowed", d, err)
	}
	done(spillway.Success)
}

func doneOnce(t *testing.T, s Subject) {
	in := s.New(t)
	ctx := context.Background()
	h0 := held(in)
	da, doneA, err := in.Limiter.Admit(ctx, s.Request())
	if err != nil || !da.Allowed || doneA == nil {
		t.Fatalf("first Admit: %+v, done nil %v, %v; want allowed with a done", da, doneA == nil, err)
	}
	if da.Reason != spillway.ReasonNone || da.RetryAfter != 0 {
		t.Errorf("allowed decision %+v has a Reason or a RetryAfter", da)
	}
	h1 := held(in)
	db, doneB, err := in.Limiter.Admit(ctx, s.Request())
	if err != nil || !db.Allowed || doneB == nil {
		t.Fatalf("second Admit: %+v, %v; want allowed with a done", db, err)
	}
	h2 := held(in)
	if in.Held != nil && (h1 <= h0 || h2 <= h1) {
		t.Fatalf("held %d → %d → %d over two admissions; want it to grow", h0, h1, h2)
	}
	doneA(spillway.Success)
	doneA(spillway.Success)
	doneA(spillway.Dropped)
	if h := settled(in, h2-(h1-h0)); h != h2-(h1-h0) {
		t.Fatalf("after A's done three times: holds %d; want %d (only A's share released, once)", h, h2-(h1-h0))
	}
	doneB(spillway.Success)
	doneB(spillway.Ignored)
	if h := settled(in, h0); h != h0 {
		t.Fatalf("after both dones: holds %d; want %d", h, h0)
	}
}

func denial(t *testing.T, s Subject) {
	in := s.New(t)
	ctx := context.Background()
	in.Deny(t)
	h0 := held(in)
	d, done, err := in.Limiter.Admit(ctx, s.Request())
	if err != nil {
		t.Fatalf("Admit after Deny: %v; want a denial", err)
	}
	if d.Allowed || d.Reason == spillway.ReasonNone {
		t.Fatalf("Admit after Deny: %+v; want denied with a Reason", d)
	}
	if done == nil {
		t.Fatal("the done of a denial is nil")
	}
	if h := settled(in, h0); h != h0 {
		t.Fatalf("a denial holds %d; want %d (what was acquired on the way is released)", h, h0)
	}
	done(spillway.Ignored)
	done(spillway.Ignored)
	if h := settled(in, h0); h != h0 {
		t.Fatalf("after the denial's done: holds %d; want %d", h, h0)
	}
}

func backendError(t *testing.T, s Subject) {
	in := s.New(t)
	ctx := context.Background()
	// One admission held across the outage: its release must still be
	// safe to call (it may fail to reach the backend; it must not panic).
	_, before, err := in.Limiter.Admit(ctx, s.Request())
	if err != nil || before == nil {
		t.Fatalf("Admit before Break: %v", err)
	}
	in.Break(t)
	d, done, err := in.Limiter.Admit(ctx, s.Request())
	if done == nil {
		t.Fatal("done is nil with a broken backend")
	}
	if s.Decides {
		if err != nil || !d.Degraded {
			t.Fatalf("broken backend: %+v, %v; want a Degraded decision, no error", d, err)
		}
		done(spillway.Ignored)
		done(spillway.Ignored)
	} else {
		if err == nil {
			t.Fatalf("broken backend: %+v, no error; want an error", d)
		}
		if d != (spillway.Decision{}) {
			t.Fatalf("broken backend: decision %+v with error %v; want the zero Decision", d, err)
		}
		if !errors.Is(err, spillway.ErrStoreUnavailable) {
			t.Errorf("broken backend: error %v does not match spillway.ErrStoreUnavailable (return a *spillway.StoreError)", err)
		}
		done(spillway.Ignored)
		done(spillway.Ignored)
	}
	// A malformed request is denied as such, backend or not: blocks check
	// it before they touch the backend (or decide locally).
	for name, mk := range malformed(s) {
		d, done, err := in.Limiter.Admit(ctx, mk())
		if err != nil || d.Allowed || d.Reason != spillway.ReasonInvalid || done == nil {
			t.Errorf("%s request, backend broken: %+v, %v; want a ReasonInvalid denial", name, d, err)
		}
	}
	before(spillway.Ignored)
	before(spillway.Ignored)
}

func concurrent(t *testing.T, s Subject) {
	in := s.New(t)
	ctx := context.Background()
	h0 := held(in)
	const workers, rounds = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				_, done, err := in.Limiter.Admit(ctx, s.Request())
				if err != nil {
					errs <- err
					return
				}
				if done == nil {
					t.Error("done is nil")
					return
				}
				done(spillway.Success)
				done(spillway.Success)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Admit: %v", err)
	}
	if h := settled(in, h0); h != h0 {
		t.Fatalf("after %d concurrent admissions and their dones: holds %d; want %d", workers*rounds, h, h0)
	}
}

// Redis starts a redis-server for one instance and returns a client that
// fails fast once the server is gone (no retries, short dial timeout), and
// a Break hook that stops the server.
func Redis(t *testing.T) (*redis.Client, func(t *testing.T)) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c, func(*testing.T) { srv.Stop() }
}
