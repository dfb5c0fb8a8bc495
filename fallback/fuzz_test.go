package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/ratelimit"
)

// faultyStore is a fault injector around a real memory store: it fails,
// or stalls until the call's deadline, on demand. It counts the calls made
// for a fuzz operation (their context carries opKey) apart from the
// Store's background reconcile.
type faultyStore struct {
	inner ratelimit.Store
	mode  atomic.Int32 // faultNone, faultError, faultStall
	calls atomic.Int64 // calls made for an operation
	ok    atomic.Int64 // of which answered
}

const (
	faultNone = iota
	faultError
	faultStall
	numFaults
)

type opKey struct{}

var errInjected = errors.New("injected store failure")

func (s *faultyStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	op := ctx.Value(opKey{}) != nil
	if op {
		s.calls.Add(1)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	switch s.mode.Load() {
	case faultError:
		return false, errInjected
	case faultStall:
		<-ctx.Done() // the Store's budget always sets a deadline
		return false, ctx.Err()
	}
	allowed, err := s.inner.Decide(ctx, items, out)
	if err == nil && op {
		s.ok.Add(1)
	}
	return allowed, err
}

func (s *faultyStore) Reset(ctx context.Context, scope, key string, p ratelimit.Policy) error {
	if s.mode.Load() != faultNone {
		return errInjected
	}
	return s.inner.Reset(ctx, scope, key, p)
}

// fuzzScopes are the rules of the fuzzed store, one policy each (one of
// every algorithm, over a minute); "login" fails closed.
var fuzzScopes = []struct {
	name string
	p    ratelimit.Policy
}{
	{"tb", ratelimit.Policy{Limit: 50, Period: time.Minute}},
	{"gcra", ratelimit.Policy{Algorithm: ratelimit.GCRA, Limit: 20, Period: time.Minute, Burst: 40}},
	{"leaky", ratelimit.Policy{Algorithm: ratelimit.LeakyBucket, Limit: 30, Period: time.Minute, Burst: 10}},
	{"fw", ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: 30, Period: time.Minute}},
	{"swc", ratelimit.Policy{Algorithm: ratelimit.SlidingWindowCounter, Limit: 25, Period: time.Minute}},
	{"swlog", ratelimit.Policy{Algorithm: ratelimit.SlidingWindowLog, Limit: 12, Period: time.Minute}},
	{"swb", ratelimit.Policy{Algorithm: ratelimit.SlidingWindowBuckets, Limit: 24, Period: time.Minute, Buckets: 6, Mode: ratelimit.Conservative}},
	{"login", ratelimit.Policy{Limit: 10, Period: time.Minute}},
}

const fuzzKeys = 2

var fuzzShares = []float64{0.2, 0.5, 1, 0.07}

// fuzzRun is the state of one fuzzed sequence and its reference counts.
type fuzzRun struct {
	t     *testing.T
	st    *fallback.Store
	inner *faultyStore
	clk   *testclock.Clock
	share float64
	ctx   context.Context

	tmin, hw int64            // lowest and highest clock value seen (µs)
	local    map[string]int64 // units admitted by the local share, by scope/key
	localSum int64

	mu          sync.Mutex
	transitions []string
	events      int64
}

// FuzzStoreOps runs a random sequence of operations against a fallback
// Store over a fault-injected memory store (admissions of random batches
// and costs, store failures, stalls past the budget and recoveries, clock
// steps forwards and backwards, breaker time passing, canceled callers,
// explicit reconciles) and checks after every step:
//
//   - nothing panics; Decide fails only for a canceled caller;
//   - every Decide was answered by exactly one of the inner store, the
//     cache of denials (a denial) or the local share, and Degraded is set
//     on its decisions exactly when the local share decided;
//   - an open breaker sends nothing to the store; its transitions are
//     closed→open→half_open→(closed|open);
//   - a batch is allowed exactly when all its decisions are;
//   - local decisions report the scaled policy (Limit = the share's
//     capacity) and fail-closed scopes are denied with ReasonFailClosed;
//   - the local share never admits, per key, more than the scaled policy
//     can over the clock's span: burst + span/T for the bucket family,
//     limit × windows touched for the windows, the clock's backward steps
//     included;
//   - no count, Remaining, Limit or duration is negative, Remaining ≤ Limit,
//     and reconcile never charges back more than was admitted locally.
func FuzzStoreOps(f *testing.F) {
	// A seed is: share, K, probes, cache/ledger switches, then operations
	// (see step).
	f.Add([]byte{0, 2, 1, 0,
		0x10, 0x21, 0x30, 1, // healthy admissions
		3, 1, 0x11, 0x11, 0x11, 0x11, // the store fails: breaker opens
		0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, // drain the local share
		0x42, 0x11, // clock forward
		5, 60, 3, 0, 0x11, 0x11, 0x11, 0x11, // breaker time passes, store back: probes close it
		6, 0x11, // reconcile
	})
	f.Add([]byte{1, 1, 2, 3,
		3, 2, 0x05, 0x05, // stalls past the budget
		4, 0x80, 0x05, 0x05, // clock far backwards
		4, 0x7f, 0x05, 0x15, 0x25, 0x35, // and forwards
		7, 0x05, // canceled caller
		5, 200, 3, 0, 0x05, 0x05, 0x05, 6,
	})
	f.Add([]byte{3, 3, 3, 0,
		0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, // fill a key: denials are cached
		0x3a, 0x3a, 3, 1, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a,
		4, 0xf0, 0x3a, 5, 10, 0x3a, 3, 0, 0x3a, 0x3a, 0x3a, 7, 0x3a, 6,
	})
	f.Add([]byte{2, 4, 1, 2, 3, 1, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 4, 0x10, 0x66, 0x66, 0x66, 0x66, 4, 0x90, 0x66, 0x66, 0x66})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 || len(data) > 4096 {
			return
		}
		synctest.Test(t, func(t *testing.T) { runFuzzOps(t, data) })
	})
}

func runFuzzOps(t *testing.T, data []byte) {
	r := &fuzzRun{t: t, clk: newFakeClock(), local: map[string]int64{}}
	r.share = fuzzShares[int(data[0])%len(fuzzShares)]
	r.inner = &faultyStore{inner: ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: r.clk.Now})}
	s := fallback.Settings{
		Budget:      50 * time.Millisecond,
		Failures:    uint32(data[1]%4) + 1,
		Probes:      uint32(data[2]%3) + 1,
		OpenTimeout: 500 * time.Millisecond,
		Share:       r.share,
		Clock:       r.clk.Now,
		OnStateChange: func(_ string, from, to fallback.State) {
			r.mu.Lock()
			r.transitions = append(r.transitions, from.String()+"→"+to.String())
			r.mu.Unlock()
		},
		OnDegraded: func(fallback.DegradedEvent) { r.mu.Lock(); r.events++; r.mu.Unlock() },
	}
	if data[3]&1 != 0 {
		s.DenyCacheSize = -1
	}
	if data[3]&2 != 0 {
		s.LedgerSize = -1
	}
	st, err := fallback.NewStore(r.inner, s)
	if err != nil {
		t.Fatal(err)
	}
	r.st = st
	r.ctx = context.WithValue(context.Background(), opKey{}, true)
	r.tmin = r.clk.Now().UnixMicro()
	r.hw = r.tmin
	ops := data[4:]
	for i := 0; i < len(ops); {
		n := r.step(ops[i:])
		i += n
		synctest.Wait() // let a background reconcile finish
		r.checkAfter(i)
	}
}

// step runs the operation at the head of ops and returns the bytes it
// used.
func (r *fuzzRun) step(ops []byte) int {
	arg := func(i int) byte {
		if i < len(ops) {
			return ops[i]
		}
		return 0
	}
	switch op := ops[0]; {
	case op == 3: // store mode
		r.inner.mode.Store(int32(arg(1)) % numFaults)
		return 2
	case op == 4: // clock step, −128..127 × 1/16 period, backwards included
		r.clk.Advance(time.Duration(int8(arg(1))) * (time.Minute / 16))
		now := r.clk.Now().UnixMicro()
		r.tmin, r.hw = min(r.tmin, now), max(r.hw, now)
		return 2
	case op == 5: // breaker time passes (synctest's clock), 0..2.55 s
		time.Sleep(time.Duration(arg(1)) * 10 * time.Millisecond)
		return 2
	case op == 6:
		before := r.st.Stats().Reconciled
		err := r.st.Reconcile(r.ctx)
		if err != nil && r.inner.mode.Load() == faultNone && r.st.State() != fallback.Open {
			r.t.Fatalf("Reconcile with a healthy store: %v", err)
		}
		if after := r.st.Stats().Reconciled; after < before {
			r.t.Fatalf("Reconciled went down: %d → %d", before, after)
		}
		return 1
	case op == 7: // a caller that has already given up
		ctx, cancel := context.WithCancel(r.ctx)
		cancel()
		return 1 + r.decide(ctx, arg(1))
	default:
		return r.decide(r.ctx, op)
	}
}

// decide decides the batch b describes: up to three distinct
// (scope, key) items from b's bits, with a cost from the next byte's top
// bits (0, 1, 2 or far above any capacity). It returns 1.
func (r *fuzzRun) decide(ctx context.Context, b byte) int {
	t := r.t
	var items []ratelimit.Item
	seen := map[int]bool{}
	for j := 0; j < 1+int(b>>6)%3; j++ {
		c := (int(b) + j*5) % (len(fuzzScopes) * fuzzKeys)
		if seen[c] {
			continue
		}
		seen[c] = true
		sc := fuzzScopes[c/fuzzKeys]
		cost := int64(1)
		switch (b >> 4) & 3 {
		case 1:
			cost = 0
		case 2:
			cost = 2
		case 3:
			if j == 0 && b&8 != 0 {
				cost = 1000 // never fits
			}
		}
		it := ratelimit.Item{Scope: sc.name, Key: fmt.Sprintf("k%d", c%fuzzKeys), Policy: sc.p, Cost: cost}
		if sc.name == "login" {
			it.Fail = spillway.FailClosed
		}
		items = append(items, it)
	}
	canceled := ctx.Err() != nil
	stBefore := r.st.Stats()
	state := r.st.State()
	calls, oks := r.inner.calls.Load(), r.inner.ok.Load()
	r.mu.Lock()
	events := r.events
	r.mu.Unlock()

	out := make([]spillway.Decision, len(items))
	allowed, err := r.st.Decide(ctx, items, out)

	stAfter := r.st.Stats()
	dCalls, dOK := r.inner.calls.Load()-calls, r.inner.ok.Load()-oks
	answered := stAfter.Calls - stBefore.Calls
	degraded := stAfter.Degraded - stBefore.Degraded
	cached := stAfter.CacheHits - stBefore.CacheHits
	if state == fallback.Open && dCalls != 0 {
		t.Fatalf("breaker open: %d calls reached the store", dCalls)
	}
	if err != nil {
		if !canceled || !errors.Is(err, context.Canceled) {
			t.Fatalf("Decide(%v): %v", items, err)
		}
		if degraded != 0 || answered != 0 {
			t.Fatalf("canceled Decide counted: %d degraded, %d answered", degraded, answered)
		}
		return 1
	}
	if answered+degraded+cached != 1 || answered != dOK {
		t.Fatalf("Decide(%v) answered %d times by the store (%d store answers), %d locally, %d from the cache; want exactly one",
			items, answered, dOK, degraded, cached)
	}
	r.mu.Lock()
	gotEvents := r.events - events
	r.mu.Unlock()
	if gotEvents != degraded {
		t.Fatalf("%d OnDegraded events for %d local decisions", gotEvents, degraded)
	}
	if cached == 1 && allowed {
		t.Fatalf("a cached answer allowed %v", items)
	}
	all := true
	for i, d := range out {
		it := items[i]
		all = all && d.Allowed
		if d.Degraded != (degraded == 1) {
			t.Fatalf("item %d (%s/%s): Degraded %v, but local decision: %v (store %d, cache %d)", i, it.Scope, it.Key, d.Degraded, degraded == 1, answered, cached)
		}
		if d.Remaining < 0 || d.Limit < 0 || d.RetryAfter < 0 || d.ResetAfter < 0 || d.Remaining > d.Limit {
			t.Fatalf("item %d (%s/%s cost %d): out of range: %+v", i, it.Scope, it.Key, it.Cost, d)
		}
		if degraded == 1 {
			if it.Scope == "login" {
				if d.Allowed || d.Reason != spillway.ReasonFailClosed {
					t.Fatalf("fail-closed %s/%s decided locally: %+v", it.Scope, it.Key, d)
				}
			} else if want := fallback.ScalePolicy(it.Policy, r.share).Capacity(); d.Limit != want {
				t.Fatalf("local decision of %s/%s: Limit %d, want the share's capacity %d", it.Scope, it.Key, d.Limit, want)
			}
		}
	}
	if allowed != all {
		t.Fatalf("batch allowed %v, but its decisions %+v", allowed, out)
	}
	if degraded == 1 && allowed {
		for _, it := range items {
			k := it.Scope + "/" + it.Key
			r.local[k] += it.Cost
			r.localSum += it.Cost
			if bound := r.localBound(it.Policy); r.local[k] > bound {
				t.Fatalf("%s: the local share admitted %d units over a clock span of %v; the scaled policy %v allows at most %d",
					k, r.local[k], time.Duration(r.hw-r.tmin)*time.Microsecond, fallback.ScalePolicy(it.Policy, r.share), bound)
			}
		}
	}
	return 1
}

// localBound is the most the local share of p can admit for one key while
// the clock stays within [tmin, hw]: the algorithms never take time going
// backwards as elapsed, so what a key can be given is bounded by the
// highest clock value seen.
func (r *fuzzRun) localBound(p ratelimit.Policy) int64 {
	q := fallback.ScalePolicy(p, r.share)
	span := r.hw - r.tmin
	switch q.Algorithm {
	case ratelimit.FixedWindow, ratelimit.SlidingWindowCounter, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowBuckets:
		// (a conservative bucketed window, as fuzzScopes has: never more
		// than Limit in any window of one Period)
		P := q.Period.Microseconds()
		return q.Limit * (r.hw/P - r.tmin/P + 1)
	}
	return q.Capacity() + span/rateHooks.EmissionInterval(q)
}

var validTransitions = map[string]bool{
	"closed→open": true, "open→half_open": true, "half_open→closed": true, "half_open→open": true,
}

func (r *fuzzRun) checkAfter(pos int) {
	t := r.t
	r.mu.Lock()
	for _, tr := range r.transitions {
		if !validTransitions[tr] {
			r.mu.Unlock()
			t.Fatalf("after op byte %d: breaker transition %s", pos, tr)
		}
	}
	r.mu.Unlock()
	s := r.st.Stats()
	if s.Calls < 0 || s.Degraded < 0 || s.CacheHits < 0 || s.Reconciled < 0 || s.Skipped < 0 {
		t.Fatalf("after op byte %d: negative stats %+v", pos, s)
	}
	if s.Reconciled > r.localSum {
		t.Fatalf("after op byte %d: reconcile charged %d units back, more than the %d admitted locally", pos, s.Reconciled, r.localSum)
	}
}
