package ratelimit

// The conformance suite: every Store implementation must decide these step
// tables exactly. To run it against another store, register a factory from
// an init function in a file of this package, e.g.
//
//	func init() {
//		storeFactories = append(storeFactories, storeFactory{
//			name: "redis",
//			new: func(t *testing.T, now func() time.Time) Store {
//				// a fresh, empty store whose clock is now (its Clock is now)
//			},
//		})
//	}

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/testclock"
)

// storeFactory makes a fresh, empty store whose clock is now.
type storeFactory struct {
	name string
	new  func(t *testing.T, now func() time.Time) Store
}

// storeFactories lists the stores the conformance suite runs against.
var storeFactories = []storeFactory{
	{name: "memory", new: func(t *testing.T, now func() time.Time) Store {
		return NewMemoryStore(MemorySettings{Clock: now})
	}},
}

// confT0 is the suite's epoch: a whole number of seconds since the Unix epoch,
// so the windows of every test policy start at confT0.
var confT0 = time.Unix(1_700_000_000, 0)

// newConfClock returns a settable clock at confT0.
func newConfClock() *testclock.Clock { return testclock.New(confT0) }

type stepOp uint8

const (
	opDecide stepOp = iota
	opReset
)

// step is one call at confT0 + at and the exact decision it must get.
type step struct {
	op   stepOp
	at   time.Duration
	n    int64
	want spillway.Decision // Limit and Limiter are filled in by the runner
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// allow: n at `at` is admitted, leaving rem, full again after reset.
func allow(at time.Duration, n, rem int64, reset time.Duration) step {
	return step{at: at, n: n, want: spillway.Decision{Allowed: true, Remaining: rem, ResetAfter: reset}}
}

// deny: n at `at` is rate limited; it can succeed after retry.
func deny(at time.Duration, n, rem int64, reset, retry time.Duration) step {
	return step{at: at, n: n, want: spillway.Decision{Reason: spillway.ReasonRateLimited, Remaining: rem, ResetAfter: reset, RetryAfter: retry}}
}

// exceeds: n at `at` is above capacity: denied for ever, RetryAfter 0.
func exceeds(at time.Duration, n, rem int64, reset time.Duration) step {
	return step{at: at, n: n, want: spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Remaining: rem, ResetAfter: reset}}
}

// reset: Reset the key at `at`.
func reset(at time.Duration) step { return step{op: opReset, at: at} }

type stepTable struct {
	name   string
	policy Policy
	steps  []step
}

// bucketSteps is the table of the bucket family: 10/s, burst 5, so T = 100
// ms and τ = 500 ms.
func bucketSteps(a Algorithm) stepTable {
	return stepTable{
		name:   a.String(),
		policy: Policy{Algorithm: a, Limit: 10, Period: time.Second, Burst: 5},
		steps: []step{
			allow(0, 1, 4, ms(100)),             // burst: TAT = 100ms
			allow(0, 4, 0, ms(500)),             // cost > 1 up to the burst
			deny(0, 1, 0, ms(500), ms(100)),     // empty
			deny(ms(50), 1, 0, ms(450), ms(50)), // partial refill is not a token
			allow(ms(100), 1, 0, ms(500)),       // refill: one token per 100ms
			allow(ms(100), 0, 0, ms(500)),       // peek
			allow(ms(350), 0, 2, ms(250)),       // peek after 2.5 tokens came back
			deny(ms(350), 3, 2, ms(250), ms(50)),
			exceeds(ms(350), 6, 2, ms(250)), // 6 > burst 5: can never succeed
			allow(ms(350), 2, 0, ms(450)),
			// time going backwards: TAT = 800ms, τ = 500ms: now is clamped
			// to 300ms, where the bucket is empty.
			deny(0, 1, 0, ms(500), ms(100)),
			deny(ms(-5000), 1, 0, ms(500), ms(100)),
			allow(0, 0, 0, ms(500)),
			allow(ms(2000), 0, 5, 0), // back to full
			allow(ms(2000), 5, 0, ms(500)),
			reset(ms(2000)),
			allow(ms(2000), 0, 5, 0),
			allow(ms(2000), 1, 4, ms(100)),
		},
	}
}

var conformanceTables = []stepTable{
	bucketSteps(TokenBucket),
	bucketSteps(GCRA),
	bucketSteps(LeakyBucket),
	{
		// T = ceil(1e6/3) = 333334µs: durations are rounded up to ms.
		name:   "token_bucket_rounding",
		policy: Policy{Limit: 3, Period: time.Second},
		steps: []step{
			allow(0, 1, 2, ms(334)),
			allow(0, 2, 0, ms(1001)), // TAT = 1000002µs
			deny(0, 1, 0, ms(1001), ms(334)),
			deny(333333*time.Microsecond, 1, 0, ms(667), ms(1)), // 1µs short of a token
			allow(333334*time.Microsecond, 1, 0, ms(1001)),
		},
	},
	{
		name:   "fixed_window",
		policy: Policy{Algorithm: FixedWindow, Limit: 3, Period: time.Second},
		steps: []step{
			allow(0, 1, 2, ms(1000)),
			allow(ms(200), 2, 0, ms(800)),
			deny(ms(500), 1, 0, ms(500), ms(500)),
			allow(ms(500), 0, 0, ms(500)),
			exceeds(ms(500), 4, 0, ms(500)),
			deny(999999*time.Microsecond, 1, 0, ms(1), ms(1)), // 1µs before the boundary
			allow(ms(1000), 3, 0, ms(1000)),                   // window boundary: a fresh window
			// time going backwards: stays in the stored window (1), as if at its start.
			deny(ms(900), 1, 0, ms(1000), ms(1000)),
			allow(ms(1500), 0, 0, ms(500)),
			allow(ms(2250), 0, 3, 0), // a later window is empty
			allow(ms(2250), 2, 1, ms(750)),
			reset(ms(2300)),
			allow(ms(2300), 0, 3, 0),
			allow(ms(2300), 3, 0, ms(700)),
		},
	},
	{
		name:   "sliding_window_counter",
		policy: Policy{Algorithm: SlidingWindowCounter, Limit: 4, Period: time.Second},
		steps: []step{
			// reset = rest of the window + drain(3, 0) = 1e6 + ceil((2e6+1)/3)
			allow(0, 3, 1, ms(1667)),
			// cur+n > L: wait for the next window, where est = floor(3·(P−x)/P)
			// ≤ 2 from x = 1µs on: retry = 500000 + 1 µs.
			deny(ms(500), 2, 1, ms(1167), ms(501)),
			allow(ms(500), 1, 0, ms(1251)),
			// window 1: prev 4 weighted by 0.75 = 3.
			allow(ms(1250), 1, 0, ms(751)),
			deny(ms(1250), 1, 0, ms(751), ms(1)), // est ≤ 2 needs x ≥ 250001µs
			exceeds(ms(1250), 5, 0, ms(751)),
			allow(ms(1500), 0, 1, ms(501)),
			// time going backwards: clamped to the start of window 1, where
			// prev weighs fully: est = 4 + 1.
			deny(ms(700), 2, 0, ms(1001), ms(501)),
			allow(ms(3000), 0, 4, 0),        // two windows later: empty
			allow(ms(3000), 4, 0, ms(1751)), // 1e6 + drain(4, 0) = 1e6 + 750001
			reset(ms(3000)),
			allow(ms(3000), 0, 4, 0),
		},
	},
	{
		name:   "sliding_window_log",
		policy: Policy{Algorithm: SlidingWindowLog, Limit: 3, Period: time.Second},
		steps: []step{
			allow(0, 1, 2, ms(1000)),
			allow(ms(300), 1, 1, ms(1000)),
			deny(ms(600), 2, 1, ms(700), ms(400)), // needs the entry of t=0 gone
			allow(ms(600), 1, 0, ms(1000)),
			allow(ms(1000), 1, 0, ms(1000)), // the entry of t=0 left at exactly 1000ms
			allow(ms(1000), 0, 0, ms(1000)),
			exceeds(ms(1000), 4, 0, ms(1000)),
			deny(ms(1000), 1, 0, ms(1000), ms(300)),
			// time going backwards: clamped to the newest entry (1000ms).
			deny(ms(500), 1, 0, ms(1000), ms(300)),
			deny(ms(1300), 2, 1, ms(700), ms(300)),
			allow(ms(2000), 3, 0, ms(1000)), // cost 3: three entries
			deny(2999999*time.Microsecond, 1, 0, ms(1), ms(1)),
			allow(ms(3000), 1, 2, ms(1000)),
			reset(ms(3000)),
			allow(ms(3000), 0, 3, 0),
		},
	},
}

// deciders run one step against a store, through the Store interface or
// through a Limiter (the memory store's allocation-free path).
var deciders = []struct {
	name   string
	decide func(ctx context.Context, st Store, scope, key string, p Policy, n int64) (spillway.Decision, error)
}{
	{"store", func(ctx context.Context, st Store, scope, key string, p Policy, n int64) (spillway.Decision, error) {
		out := make([]spillway.Decision, 1)
		ok, err := st.Decide(ctx, []Item{{Scope: scope, Key: key, Policy: p, Cost: n}}, out)
		if err == nil && ok != out[0].Allowed {
			return out[0], fmt.Errorf("Decide returned %v for a decision with Allowed %v", ok, out[0].Allowed)
		}
		return out[0], err
	}},
	{"limiter", func(ctx context.Context, st Store, scope, key string, p Policy, n int64) (spillway.Decision, error) {
		l, err := New(st, p, Settings{Scope: scope})
		if err != nil {
			return spillway.Decision{}, err
		}
		d, err := l.Allow(ctx, key, n)
		if err == nil && d.Window != p.window() {
			return d, fmt.Errorf("Window %v, want the policy's %v", d.Window, p.window())
		}
		d.Window = 0 // the tables hold what every store decides; Window is the Limiter's
		return d, err
	}},
}

func TestConformance(t *testing.T) {
	for _, f := range storeFactories {
		t.Run(f.name, func(t *testing.T) {
			for _, tab := range conformanceTables {
				for _, dc := range deciders {
					t.Run(tab.name+"/"+dc.name, func(t *testing.T) {
						clock := newConfClock()
						st := f.new(t, clock.Now)
						runSteps(t, st, clock, tab.policy, dc.decide, tab.steps)
					})
				}
			}
		})
	}
}

func runSteps(t *testing.T, st Store, clock *testclock.Clock, p Policy,
	decide func(context.Context, Store, string, string, Policy, int64) (spillway.Decision, error), steps []step) {
	t.Helper()
	ctx := context.Background()
	const scope, key = "conf", "k"
	for i, s := range steps {
		clock.Set(confT0.Add(s.at))
		if s.op == opReset {
			if err := st.Reset(ctx, scope, key, p); err != nil {
				t.Fatalf("step %d: Reset: %v", i, err)
			}
			continue
		}
		got, err := decide(ctx, st, scope, key, p, s.n)
		if err != nil {
			t.Fatalf("step %d (t=%v n=%d): %v", i, s.at, s.n, err)
		}
		want := s.want
		want.Limit = p.Capacity()
		want.Limiter = scope
		if got != want {
			t.Fatalf("step %d (t=%v n=%d):\n got %+v\nwant %+v", i, s.at, s.n, got, want)
		}
	}
}

// TestConformanceBatches checks all-or-nothing batches: a denied batch
// charges nothing, in any algorithm, and items of one batch see each
// other's charges.
func TestConformanceBatches(t *testing.T) {
	tb := Policy{Limit: 2, Period: time.Second}                                   // token bucket, burst 2
	one := Policy{Limit: 1, Period: time.Second}                                  // token bucket, burst 1
	fw := Policy{Algorithm: FixedWindow, Limit: 5, Period: time.Second}           // capacity 5
	swl := Policy{Algorithm: SlidingWindowLog, Limit: 3, Period: time.Second}     // capacity 3
	swc := Policy{Algorithm: SlidingWindowCounter, Limit: 3, Period: time.Second} // capacity 3
	for _, f := range storeFactories {
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newConfClock()
			st := f.new(t, clock.Now)
			out := make([]spillway.Decision, 8)
			batch := func(items ...Item) bool {
				t.Helper()
				ok, err := st.Decide(ctx, items, out)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			peek := func(scope, key string, p Policy) int64 {
				t.Helper()
				if !batch(Item{Scope: scope, Key: key, Policy: p}) {
					t.Fatal("a peek was denied")
				}
				return out[0].Remaining
			}
			// Allowed batch: both charged.
			if !batch(Item{Scope: "ip", Key: "a", Policy: tb, Cost: 1}, Item{Scope: "user", Key: "u", Policy: one, Cost: 1}) {
				t.Fatal("first batch denied")
			}
			if out[0].Remaining != 1 || out[1].Remaining != 0 {
				t.Fatalf("remaining = %d, %d; want 1, 0", out[0].Remaining, out[1].Remaining)
			}
			// Denied batch: the allowed item reports as if charged, but
			// nothing is written anywhere.
			if batch(Item{Scope: "ip", Key: "a", Policy: tb, Cost: 1}, Item{Scope: "user", Key: "u", Policy: one, Cost: 1}) {
				t.Fatal("second batch allowed; user u has no token left")
			}
			want0 := spillway.Decision{Allowed: true, Limiter: "ip", Limit: 2, Remaining: 0, ResetAfter: ms(1000)}
			want1 := spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "user", Limit: 1, Remaining: 0, ResetAfter: ms(1000), RetryAfter: ms(1000)}
			if out[0] != want0 || out[1] != want1 {
				t.Fatalf("denied batch decisions:\n got %+v\n     %+v\nwant %+v\n     %+v", out[0], out[1], want0, want1)
			}
			if r := peek("ip", "a", tb); r != 1 {
				t.Fatalf("ip a remaining %d after a denied batch, want 1 (nothing charged)", r)
			}
			// Every algorithm rolls back, new keys included; the denial is
			// the last item, a cost above capacity.
			if batch(
				Item{Scope: "ip", Key: "b", Policy: tb, Cost: 2},
				Item{Scope: "fw", Key: "b", Policy: fw, Cost: 4},
				Item{Scope: "swl", Key: "b", Policy: swl, Cost: 2},
				Item{Scope: "swc", Key: "b", Policy: swc, Cost: 2},
				Item{Scope: "ip", Key: "a", Policy: tb, Cost: 1},
				Item{Scope: "fw", Key: "a", Policy: fw, Cost: 6},
			) {
				t.Fatal("batch with a cost above capacity allowed")
			}
			if out[5].Reason != spillway.ReasonCostExceedsLimit {
				t.Fatalf("reason %v, want cost_exceeds_limit", out[5].Reason)
			}
			for _, c := range []struct {
				scope string
				p     Policy
				want  int64
			}{{"ip", tb, 2}, {"fw", fw, 5}, {"swl", swl, 3}, {"swc", swc, 3}} {
				if r := peek(c.scope, "b", c.p); r != c.want {
					t.Fatalf("%s b remaining %d after a denied batch, want %d", c.scope, r, c.want)
				}
			}
			if r := peek("ip", "a", tb); r != 1 {
				t.Fatalf("ip a remaining %d, want 1", r)
			}
			// Items naming the same key see each other's charges.
			if batch(Item{Scope: "ip", Key: "c", Policy: tb, Cost: 1}, Item{Scope: "ip", Key: "c", Policy: tb, Cost: 1}, Item{Scope: "ip", Key: "c", Policy: tb, Cost: 1}) {
				t.Fatal("three tokens from a burst of 2 in one batch")
			}
			if !out[0].Allowed || !out[1].Allowed || out[1].Remaining != 0 || out[2].Allowed {
				t.Fatalf("same-key batch: %+v %+v %+v", out[0], out[1], out[2])
			}
			if r := peek("ip", "c", tb); r != 2 {
				t.Fatalf("ip c remaining %d after a denied batch, want 2", r)
			}
			if !batch(Item{Scope: "swl", Key: "c", Policy: swl, Cost: 1}, Item{Scope: "swl", Key: "c", Policy: swl, Cost: 2}) || out[1].Remaining != 0 {
				t.Fatalf("same-key log batch: %+v %+v", out[0], out[1])
			}
			// Peeks never charge, even in a batch.
			if !batch(Item{Scope: "ip", Key: "d", Policy: one, Cost: 0}, Item{Scope: "ip", Key: "d", Policy: one, Cost: 0}) || out[1].Remaining != 1 {
				t.Fatalf("peek batch: %+v %+v", out[0], out[1])
			}
			// Bad input: an error naming the item, nothing charged.
			if _, err := st.Decide(ctx, []Item{{Scope: "ip", Key: "e", Policy: tb, Cost: 1}, {Scope: "ip", Key: "e", Policy: tb, Cost: -1}}, out); err == nil {
				t.Fatal("negative cost accepted")
			}
			if _, err := st.Decide(ctx, []Item{{Scope: "ip", Key: "e", Policy: tb, Cost: 1}, {Scope: "ip", Key: "e", Policy: Policy{Limit: 1}, Cost: 1}}, out); err == nil {
				t.Fatal("zero period accepted")
			}
			if r := peek("ip", "e", tb); r != 2 {
				t.Fatalf("ip e remaining %d after rejected input, want 2", r)
			}
		})
	}
}
