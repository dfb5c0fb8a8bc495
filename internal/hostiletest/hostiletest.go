// Package hostiletest is the hostile-input suite that every Limiter and
// Store of spillway runs beside its contract suite: the costs an attacker
// can send (0, 1, the capacity and one more, 2^53−1, 2^53, 2^53+1, 2^62,
// math.MaxInt64, negative), each alone and inside batches with other
// items. It checks that nothing is admitted above the capacity, that a
// denial charges nothing (the block's state read back byte for byte) and,
// with RunDifferential, that two implementations (memory and Redis) decide
// every step alike.
//
// The package knows no block: a test describes its block as a Subject.
package hostiletest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
)

// The edge values around the exact range of a double and of int64.
const (
	Exact    = 1 << 53 // every integer up to it is exact in a double (Lua's number)
	Pow62    = 1 << 62
	MaxInt64 = math.MaxInt64
)

// Costs returns the hostile costs for a block of the given capacity, in
// a fixed order, without duplicates: 0, 1, capacity, capacity+1 (unless
// capacity is MaxInt64), 2^53−1, 2^53, 2^53+1, 2^62, MaxInt64, −1 and
// MinInt64.
func Costs(capacity int64) []int64 {
	all := []int64{0, 1, capacity}
	if capacity < math.MaxInt64 {
		all = append(all, capacity+1)
	}
	all = append(all, Exact-1, Exact, Exact+1, Pow62, MaxInt64, -1, math.MinInt64)
	var out []int64
	for _, c := range all {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// Subject is one block under test, seen through what the suite needs.
type Subject struct {
	// Capacity is the largest cost one request can ever be admitted at,
	// from an empty state.
	Capacity int64
	// Limit is the largest cost that is not denied as exceeding (default
	// Capacity): above it every cost is denied with Exceeds; between
	// Capacity and Limit it is denied for another reason (a fallback's
	// local share: the full limit could admit it once the store is back).
	Limit int64
	// Batch is how many items Decide accepts at once (1 for a block that
	// decides one request).
	Batch int
	// ZeroIsOne says cost 0 means 1 (spillway.Request.Cost); otherwise
	// cost 0 is a peek: allowed, charging nothing.
	ZeroIsOne bool
	// Warm is the cost the suite charges first, so that the state is
	// neither empty nor able to take the capacity (default 1). A Redis
	// block whose state of one unit expires within milliseconds of the
	// server's clock (a burst of 2^52 at one µs per unit) needs a larger
	// one.
	Warm int64
	// Exceeds is the Reason of a cost above the capacity (default
	// spillway.ReasonCostExceedsLimit).
	Exceeds spillway.Reason
	// Decide decides the costs together (all or nothing) and returns
	// whether they were admitted and one decision per cost. A negative
	// cost may fail with an error or be denied with ReasonInvalid. Time
	// must not move between calls (a fixed clock): the suite counts what
	// the block admits.
	Decide func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error)
	// State returns an image of every byte of state the block holds;
	// equal images mean nothing changed (see RedisState).
	State func(ctx context.Context) (string, error)
	// Reset returns the block to an empty state.
	Reset func(ctx context.Context) error
}

// Run runs the suite on s.
func Run(t *testing.T, s Subject) {
	t.Helper()
	s.defaults()
	ctx := context.Background()
	t.Run("alone", func(t *testing.T) {
		for _, c := range Costs(s.Capacity) {
			s.checkOne(ctx, t, []int64{c}, 0)
		}
	})
	if s.Batch > 1 {
		t.Run("batches", func(t *testing.T) {
			for _, c := range Costs(s.Capacity) {
				s.checkOne(ctx, t, []int64{1, c}, 1)
				s.checkOne(ctx, t, []int64{c, 1}, 0)
			}
			if s.Batch > 2 {
				s.checkOne(ctx, t, []int64{1, MaxInt64, 1}, 1)
				s.checkOne(ctx, t, []int64{Exact + 1, 0, -1}, 0)
			}
		})
	}
	t.Run("capacity", func(t *testing.T) { s.checkCapacity(ctx, t) })
}

func (s *Subject) defaults() {
	if s.Exceeds == spillway.ReasonNone {
		s.Exceeds = spillway.ReasonCostExceedsLimit
	}
	if s.Warm == 0 {
		s.Warm = 1
	}
	if s.Limit == 0 {
		s.Limit = s.Capacity
	}
}

// charge is what a cost charges when admitted.
func (s *Subject) charge(c int64) int64 {
	if c == 0 && s.ZeroIsOne {
		return 1
	}
	return c
}

func (s *Subject) mustReset(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := s.Reset(ctx); err != nil {
		t.Fatalf("reset: %v", err)
	}
}

func (s *Subject) mustState(ctx context.Context, t *testing.T) string {
	t.Helper()
	st, err := s.State(ctx)
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	return st
}

// checkOne starts from a state charged with Warm units (so a cost equal
// to the capacity does not fit), decides costs, and checks the outcome
// against the capacity; hostile is the index of the item under test.
func (s *Subject) checkOne(ctx context.Context, t *testing.T, costs []int64, hostile int) {
	t.Helper()
	s.mustReset(ctx, t)
	if ok, d, err := s.Decide(ctx, []int64{s.Warm}); err != nil || !ok {
		t.Fatalf("warm-up cost %d on an empty state: %v %+v %v", s.Warm, ok, d, err)
	}
	before := s.mustState(ctx, t)
	used := s.Warm
	var total int64
	neg, exceeds := false, false
	for _, c := range costs {
		switch {
		case c < 0:
			neg = true
		case s.charge(c) > s.Capacity:
			exceeds = true
		default:
			total = satAdd(total, s.charge(c))
		}
	}
	ok, ds, err := s.Decide(ctx, costs)
	after := s.mustState(ctx, t)
	fits := !neg && !exceeds && total <= s.Capacity-used
	switch {
	case neg:
		if ok {
			t.Errorf("costs %v with a negative cost admitted: %+v", costs, ds)
		}
		if err == nil && (len(ds) <= hostile || (costs[hostile] < 0 && ds[hostile].Reason != spillway.ReasonInvalid)) {
			t.Errorf("costs %v: a negative cost was neither an error nor ReasonInvalid: %+v", costs, ds)
		}
	case err != nil:
		t.Errorf("costs %v: %v", costs, err)
		return
	case exceeds:
		if ok {
			t.Errorf("costs %v (capacity %d) admitted: %+v", costs, s.Capacity, ds)
		}
		if d := ds[hostile]; s.charge(costs[hostile]) > s.Limit && (d.Allowed || d.Reason != s.Exceeds || d.RetryAfter != 0) {
			t.Errorf("costs %v: item %d decided %+v, want %v with no RetryAfter", costs, hostile, d, s.Exceeds)
		}
	case ok != fits:
		t.Errorf("costs %v after %d of capacity %d: admitted %v, want %v: %+v", costs, used, s.Capacity, ok, fits, ds)
	}
	if !ok && before != after {
		t.Errorf("costs %v denied but the state changed:\nbefore %s\nafter  %s", costs, before, after)
	}
	if ok && total == 0 && before != after {
		t.Errorf("costs %v charge nothing but the state changed:\nbefore %s\nafter  %s", costs, before, after)
	}
}

// checkCapacity sends every hostile cost in turn to one state, then fills
// what is left in one request: the total admitted is exactly the
// capacity, and one more unit is denied.
func (s *Subject) checkCapacity(ctx context.Context, t *testing.T) {
	t.Helper()
	s.mustReset(ctx, t)
	var admitted int64
	for _, c := range append([]int64{s.Warm}, Costs(s.Capacity)...) {
		ok, ds, err := s.Decide(ctx, []int64{c})
		if err != nil {
			if c < 0 {
				continue
			}
			t.Fatalf("cost %d: %v", c, err)
		}
		if ok {
			admitted = satAdd(admitted, s.charge(c))
		}
		if admitted > s.Capacity {
			t.Fatalf("cost %d admitted (%+v): %d admitted in all, capacity %d", c, ds, admitted, s.Capacity)
		}
	}
	if left := s.Capacity - admitted; left > 0 {
		if ok, ds, err := s.Decide(ctx, []int64{left}); err != nil || !ok {
			t.Fatalf("after hostile costs admitting %d, the %d left: %v %+v %v", admitted, left, ok, ds, err)
		}
	}
	if ok, ds, err := s.Decide(ctx, []int64{1}); err != nil || ok {
		t.Fatalf("one unit past the capacity %d: %v %+v %v", s.Capacity, ok, ds, err)
	}
}

// RunDifferential sends the same hostile sequence — every cost alone and
// in batches, onto one state that fills up — to a and b (say the memory
// and the Redis store over one fixed clock) and requires the same outcome,
// error or not, and the same decisions at every step.
func RunDifferential(t *testing.T, a, b Subject) {
	t.Helper()
	ctx := context.Background()
	for _, s := range []*Subject{&a, &b} {
		s.defaults()
		s.mustReset(ctx, t)
	}
	steps := [][]int64{{a.Warm}}
	for _, c := range Costs(a.Capacity) {
		steps = append(steps, []int64{c}, []int64{1})
		if a.Batch > 1 && b.Batch > 1 {
			steps = append(steps, []int64{1, c}, []int64{c, 0})
		}
	}
	steps = append(steps, []int64{a.Capacity}, []int64{0})
	for i, costs := range steps {
		okA, dA, errA := a.Decide(ctx, costs)
		okB, dB, errB := b.Decide(ctx, costs)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("step %d costs %v: errors differ: %v / %v", i, costs, errA, errB)
		}
		if errA != nil {
			continue
		}
		if okA != okB || !slices.Equal(dA, dB) {
			t.Fatalf("step %d costs %v: decisions differ:\n%v %+v\n%v %+v", i, costs, okA, dA, okB, dB)
		}
	}
}

// RedisState returns an image of every key of client that matches
// pattern: its name, type and DUMP payload (the value byte for byte; not
// the TTL, which runs with the server's clock), sorted by name. On a
// Cluster it scans every primary.
func RedisState(ctx context.Context, client redis.UniversalClient, pattern string) (string, error) {
	names, err := scanKeys(ctx, client, pattern)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, k := range names {
		typ, err := client.Type(ctx, k).Result()
		if err != nil {
			return "", fmt.Errorf("hostiletest: type %s: %w", k, err)
		}
		dump, err := client.Dump(ctx, k).Result()
		if err != nil && err != redis.Nil {
			return "", fmt.Errorf("hostiletest: dump %s: %w", k, err)
		}
		fmt.Fprintf(&b, "%s %s %q\n", k, typ, dump)
	}
	return b.String(), nil
}

// RedisDelete deletes every key of client that matches pattern (a
// Subject's Reset).
func RedisDelete(ctx context.Context, client redis.UniversalClient, pattern string) error {
	names, err := scanKeys(ctx, client, pattern)
	if err != nil {
		return err
	}
	for _, k := range names { // one by one: on a Cluster the keys live in many slots
		if err := client.Del(ctx, k).Err(); err != nil {
			return fmt.Errorf("hostiletest: del %s: %w", k, err)
		}
	}
	return nil
}

func scanKeys(ctx context.Context, client redis.UniversalClient, pattern string) ([]string, error) {
	var (
		mu    sync.Mutex
		names []string
	)
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			names = append(names, it.Val())
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		return nil, fmt.Errorf("hostiletest: unsupported client %T", client)
	}
	if err != nil {
		return nil, fmt.Errorf("hostiletest: scan: %w", err)
	}
	slices.Sort(names)
	return names, nil
}

func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
