package fallback

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

func TestScaleIsExactIntegerArithmetic(t *testing.T) {
	for _, c := range []struct {
		n     int64
		share float64
		want  int64
	}{
		{100, 0.2, 20},
		{100, 0.29, 29}, // 0.29 × 100 in floats is 28.999…
		{100, 0.07, 7},
		{3, 0.2, 1}, // at least 1
		{1, 0.01, 1},
		{1 << 62, 0.5, 1 << 61},
		{1000, 1, 1000},
	} {
		if got := scale(c.n, sharePPM(c.share)); got != c.want {
			t.Errorf("scale(%d, %v) = %d; want %d", c.n, c.share, got, c.want)
		}
	}
}

func TestScaleToShare(t *testing.T) {
	for _, c := range []struct {
		in, want ratelimit.Policy
	}{
		{ratelimit.Policy{Limit: 100, Period: time.Second}, ratelimit.Policy{Limit: 20, Period: time.Second}},
		{ratelimit.Policy{Limit: 100, Period: time.Second, Burst: 50}, ratelimit.Policy{Limit: 20, Period: time.Second, Burst: 10}},
		{ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: 10, Period: time.Minute, Burst: 10}, ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: 2, Period: time.Minute, Burst: 2}},
		{ratelimit.Policy{Algorithm: ratelimit.GCRA, Limit: 2, Period: time.Second, Burst: 3}, ratelimit.Policy{Algorithm: ratelimit.GCRA, Limit: 1, Period: time.Second, Burst: 1}},
	} {
		got := scaleToShare(c.in, 0.2)
		if got != c.want {
			t.Errorf("scaleToShare(%v) = %v; want %v", c.in, got, c.want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("scaleToShare(%v) invalid: %v", c.in, err)
		}
	}
	p := ratelimit.Policy{Limit: 7, Period: time.Second}
	if got := scaleToShare(p, 0); got != p {
		t.Errorf("scaleToShare(share 0) = %v; want p unchanged", got)
	}
}

func TestSettingsValidation(t *testing.T) {
	for _, c := range []struct {
		s    Settings
		want string
	}{
		{Settings{Budget: -1}, "budget"},
		{Settings{OpenTimeout: -time.Second}, "open timeout"},
		{Settings{Share: 1.5}, "share"},
		{Settings{Share: -0.1}, "share"},
	} {
		_, err := c.s.withDefaults()
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "fallback: ") {
			t.Errorf("withDefaults(%+v) = %v; want an error naming %q", c.s, err, c.want)
		}
	}
	s, err := Settings{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "fallback" || s.Budget != 50*time.Millisecond || s.Failures != 5 || s.OpenTimeout != time.Second ||
		s.Probes != 3 || s.Share != 0 || s.DenyCacheSize != 1<<16 || s.LedgerSize != 1<<16 || s.Clock == nil {
		t.Fatalf("defaults = %+v", s)
	}
	if _, err := NewStore(nil, Settings{}); err == nil || err.Error() != "fallback: inner store is nil" {
		t.Fatalf("NewStore(nil) = %v; want fallback: inner store is nil", err)
	}
	if _, err := NewStore(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{Budget: -1}); err == nil || !strings.Contains(err.Error(), "budget") {
		t.Fatalf("NewStore with a negative budget = %v; want an error naming the budget", err)
	}
}

func TestLedgerCarriesTheLastPeriod(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	p := ratelimit.Policy{Limit: 100, Period: time.Minute}
	k := itemKey{"api", "k", p}
	for _, c := range []struct {
		name    string
		records [][2]int64 // (at s, units)
		at      int64      // s
		want    int64
	}{
		{"same window", [][2]int64{{0, 10}, {30, 5}}, 59, 15},
		{"previous window weighs by overlap", [][2]int64{{0, 40}}, 90, 20}, // 40 × (60 − 30) / 60
		{"older than two periods is gone", [][2]int64{{0, 40}}, 120, 0},
		{"capped at capacity", [][2]int64{{0, 80}, {61, 80}}, 61, 100}, // 80 + floor(80×59/60) = 158 → 100
		{"time going backwards is no time passing", [][2]int64{{10, 7}}, 5, 7},
	} {
		l := newLedger(10)
		for _, r := range c.records {
			l.record(k, r[1], r[0]*s)
		}
		cs := l.take(c.at * s)
		var got int64
		for _, ch := range cs {
			got += ch.carry
		}
		if got != c.want {
			t.Errorf("%s: carry %d; want %d", c.name, got, c.want)
		}
		if l.pending() {
			t.Errorf("%s: ledger not empty after take", c.name)
		}
	}
	l := newLedger(16) // one key per shard
	for i := 0; i < 100; i++ {
		l.record(itemKey{"api", strconv.Itoa(i), p}, 1, 0)
	}
	if got, skipped := l.size.Load(), l.skipped.Load(); got > 16 || got+skipped != 100 {
		t.Fatalf("ledger holds %d keys, skipped %d; want ≤ 16 held, the rest skipped", got, skipped)
	}
}

func TestDenyCacheIsBounded(t *testing.T) {
	c := newDenyCache(16) // one entry per shard
	p := ratelimit.Policy{Limit: 1, Period: time.Hour}
	d := spillway.Decision{Reason: spillway.ReasonRateLimited, RetryAfter: time.Hour}
	for i := 0; i < 1000; i++ {
		c.add(itemKey{"s", string(rune('a'+i%26)) + strings.Repeat("x", i), p}, 1, 0, d)
	}
	if got := c.len(); got > 16 {
		t.Fatalf("cache holds %d entries; want ≤ 16", got)
	}
	k := itemKey{"s", "k", p}
	c.add(k, 2, 0, d)
	if _, ok := c.lookup(k, 1, 1); ok {
		t.Fatal("a denial of cost 2 answered a request of cost 1")
	}
	if got, ok := c.lookup(k, 3, int64(time.Minute/time.Microsecond)); !ok || got.RetryAfter != 59*time.Minute {
		t.Fatalf("lookup = %+v, %v; want denied for 59m", got, ok)
	}
	if _, ok := c.lookup(k, 2, int64(time.Hour/time.Microsecond)); ok {
		t.Fatal("an expired denial answered")
	}
	c.add(k, 1, 0, spillway.Decision{Reason: spillway.ReasonCostExceedsLimit})
	if _, ok := c.lookup(k, 1, 0); ok {
		t.Fatal("a cost-exceeds-limit denial was cached")
	}
}

func TestStateStrings(t *testing.T) {
	if Closed.String() != "closed" || HalfOpen.String() != "half_open" || Open.String() != "open" || State(9).String() != "state(9)" {
		t.Fatal("State.String")
	}
}

// While closed, calls pass without gobreaker's lock; the breaker still
// counts consecutive failures exactly: a success between failures resets
// the count, and the K-th failure in a row opens it.
func TestHealthClosedFastPathCountsConsecutiveFailures(t *testing.T) {
	h, err := NewHealth(nil, HealthSettings{Failures: 3, OpenTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fail := errors.New("boom")
	call := func(err error) {
		t.Helper()
		done, aerr := h.allow()
		if aerr != nil {
			t.Fatalf("allow: %v", aerr)
		}
		h.report(ctx, done, err, time.Now(), 0)
	}
	step := func(err error, want State, consecutive uint32) {
		t.Helper()
		call(err)
		if st := h.Stats(); st.State != want || st.ConsecutiveFailures != consecutive {
			t.Fatalf("after %v: %v with %d consecutive failures, want %v with %d", err, st.State, st.ConsecutiveFailures, want, consecutive)
		}
	}
	step(nil, Closed, 0)
	step(fail, Closed, 1)
	step(fail, Closed, 2)
	step(nil, Closed, 0) // the success after failures resets the count
	step(nil, Closed, 0)
	step(fail, Closed, 1)
	step(fail, Closed, 2)
	call(fail)
	if st := h.Stats(); st.State != Open || st.Successes != 3 || st.Failures != 5 || st.Opened != 1 {
		t.Fatalf("after 3 failures in a row: %+v, want open, 3 successes, 5 failures, opened once", st)
	}
	if _, err := h.allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("allow on an open health: %v, want ErrOpen", err)
	}
}
