package clientside_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/internal/testclock"
)

var t0 = time.Unix(1_700_000_000, 0) // a multiple of the 2 s bucket width

// constRand returns a source that always yields v.
func constRand(v *float64) func() float64 { return func() float64 { return *v } }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestThrottleFormula(t *testing.T) {
	r := 0.99
	th, err := clientside.NewThrottle(clientside.ThrottleSettings{Rand: constRand(&r), Clock: testclock.New(t0).Now})
	if err != nil {
		t.Fatal(err)
	}
	// 10 requests, 3 accepted: p = (10 − 2·3) / (10 + 1) = 4/11.
	for i := 0; i < 10; i++ {
		if !th.Allow() {
			t.Fatalf("request %d rejected", i)
		}
		if i < 3 {
			th.Accepted()
		}
	}
	if p := th.Probability(); !near(p, 4.0/11) {
		t.Fatalf("p = %v, want 4/11", p)
	}
	// A draw below p rejects locally, and the rejected request still
	// counts: p = (11 − 6) / 12.
	r = 0.3
	if th.Allow() {
		t.Fatal("draw 0.3 < 4/11 was allowed")
	}
	if p := th.Probability(); !near(p, 5.0/12) {
		t.Fatalf("p = %v, want 5/12", p)
	}
	// A draw at or above p passes.
	r = 5.0 / 12
	if !th.Allow() {
		t.Fatal("draw equal to p was rejected")
	}
	if req, acc := th.Counts(); req != 12 || acc != 3 {
		t.Fatalf("counts %d/%d, want 12/3", req, acc)
	}
	// Accepts beyond half the requests: p = 0, never negative.
	for i := 0; i < 4; i++ {
		th.Accepted()
	}
	if p := th.Probability(); p != 0 {
		t.Fatalf("p = %v with 12 requests and 7 accepts, want 0", p)
	}
}

func TestThrottleWindowSlides(t *testing.T) {
	r := 0.99
	clk := testclock.New(t0)
	th, err := clientside.NewThrottle(clientside.ThrottleSettings{Rand: constRand(&r), K: 1.5, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		th.Allow()
	}
	clk.Advance(time.Minute)
	for i := 0; i < 10; i++ {
		th.Allow()
		th.Accepted()
	}
	steps := []struct {
		at       time.Duration
		req, acc int64
		p        float64
	}{
		{0, 20, 0, 20.0 / 21},
		{time.Minute, 30, 10, (30 - 15.0) / 31},
		{118 * time.Second, 30, 10, 15.0 / 31}, // the first bucket is still in the window
		{120 * time.Second, 10, 10, 0},         // and gone one bucket later
		{179 * time.Second, 10, 10, 0},
		{180 * time.Second, 0, 0, 0},
		{-time.Hour, 0, 0, 0}, // time far in the past sees nothing
	}
	for _, s := range steps {
		clk.Set(t0.Add(s.at))
		req, acc := th.Counts()
		if req != s.req || acc != s.acc {
			t.Errorf("at %v: counts %d/%d, want %d/%d", s.at, req, acc, s.req, s.acc)
		}
		if p := th.Probability(); !near(p, s.p) {
			t.Errorf("at %v: p = %v, want %v", s.at, p, s.p)
		}
	}
}

// A backend that accepts half of what it is sent gets everything with K=2;
// one that accepts nothing soon gets almost nothing.
func TestThrottleConverges(t *testing.T) {
	i := 0
	seq := []float64{0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95}
	clk := testclock.New(t0)
	th, _ := clientside.NewThrottle(clientside.ThrottleSettings{Rand: func() float64 { i++; return seq[i%len(seq)] }, Clock: clk.Now})
	sent := 0
	for n := 0; n < 1000; n++ {
		if th.Allow() {
			sent++
			if sent%2 == 1 { // the backend accepts every other request
				th.Accepted()
			}
		}
	}
	// Accepting half: requests − 2·accepts stays ≤ 1, so p < 1/n: all sent.
	if sent != 1000 {
		t.Fatalf("sent %d of 1000 to a backend accepting half, want all", sent)
	}
	th2, _ := clientside.NewThrottle(clientside.ThrottleSettings{Rand: func() float64 { i++; return seq[i%len(seq)] }, Clock: clk.Now})
	sent = 0
	for n := 0; n < 1000; n++ {
		if th2.Allow() {
			sent++
		}
	}
	// p = n/(n+1) after n requests, and no draw is above 0.95: once
	// n/(n+1) > 0.95 (n ≥ 20) nothing passes.
	if sent > 20 {
		t.Fatalf("sent %d of 1000 to a backend accepting nothing, want ≤ 20", sent)
	}
}

func TestThrottleValidates(t *testing.T) {
	for _, c := range []struct {
		s     clientside.ThrottleSettings
		field string
	}{
		{clientside.ThrottleSettings{K: 0.5}, "K"},
		{clientside.ThrottleSettings{K: math.NaN()}, "K"},
		{clientside.ThrottleSettings{Window: time.Minute, Buckets: -1}, "buckets"},
		{clientside.ThrottleSettings{Window: 5, Buckets: 10}, "window"},
	} {
		if _, err := clientside.NewThrottle(c.s); err == nil || !strings.Contains(err.Error(), c.field) || !strings.HasPrefix(err.Error(), "clientside: ") {
			t.Errorf("err %v, want one naming %q", err, c.field)
		}
	}
}

func TestRetryBudgetHandComputed(t *testing.T) {
	clk := testclock.New(t0)
	b, err := clientside.NewRetryBudget(clientside.RetryBudgetSettings{Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	// Starts full: 10 retries, the 11th refused.
	for i := 0; i < 10; i++ {
		if !b.TryRetry() {
			t.Fatalf("retry %d refused with a full budget", i)
		}
	}
	if b.TryRetry() {
		t.Fatal("11th retry allowed")
	}
	// Ten requests deposit exactly one token.
	for i := 0; i < 10; i++ {
		b.Deposit()
	}
	if got := b.Balance(); got != 1 {
		t.Fatalf("balance %v after 10 deposits, want 1", got)
	}
	if !b.TryRetry() || b.TryRetry() {
		t.Fatal("want exactly one retry from ten deposits")
	}
	// The minimum: one token per second, half a token after 500ms.
	clk.Advance(500 * time.Millisecond)
	if got := b.Balance(); got != 0.5 || b.TryRetry() {
		t.Fatalf("balance %v after 500ms, want 0.5 and no retry", got)
	}
	for i := 0; i < 5; i++ {
		b.Deposit()
	}
	if !b.TryRetry() {
		t.Fatal("0.5 from time + 0.5 from five requests did not pay for a retry")
	}
	// Time going backwards credits nothing, and the later return to the
	// present is not credited twice.
	now := clk.Now()
	clk.Set(now.Add(-time.Hour))
	if got := b.Balance(); got != 0 {
		t.Fatalf("balance %v after time went back, want 0", got)
	}
	clk.Set(now)
	if got := b.Balance(); got != 10 {
		// An hour later (from the past instant) the budget is full again.
		t.Fatalf("balance %v, want 10 (capped)", got)
	}
	clk.Set(now.Add(time.Hour))
	if got := b.Balance(); got != 10 {
		t.Fatalf("balance %v, want 10 (capped)", got)
	}
	// Fractions of a token carry over between refills.
	clk.Set(now)
	for b.TryRetry() {
	}
	for i := 0; i < 4; i++ {
		clk.Advance(250 * time.Millisecond)
		b.Balance()
	}
	if !b.TryRetry() {
		t.Fatal("four 250ms refills did not add up to a token")
	}
}

// Every request wants a retry: over 1000 requests the budget allows 109
// retries (hand-computed in the comment), about 10%.
func TestRetryBudgetTenPercent(t *testing.T) {
	b, err := clientside.NewRetryBudget(clientside.RetryBudgetSettings{MinRetriesPerSecond: -1, Clock: testclock.New(t0).Now})
	if err != nil {
		t.Fatal(err)
	}
	// Balance B starts at 10. Request 1 deposits into a full budget (capped
	// at 10) and retries: 9. Requests 2…11 each add 0.1 and spend 1, the
	// 11th leaving 9 − 10·0.9 = 0. From then every tenth request (21, 31,
	// …, 991) has saved a token: 98 more. 11 + 98 = 109.
	retries := 0
	for i := 0; i < 1000; i++ {
		b.Deposit()
		if b.TryRetry() {
			retries++
		}
	}
	if retries != 109 {
		t.Fatalf("retries %d, want 109", retries)
	}
}

func TestRetryBudgetValidates(t *testing.T) {
	for _, c := range []struct {
		s     clientside.RetryBudgetSettings
		field string
	}{
		{clientside.RetryBudgetSettings{Ratio: 1.5}, "ratio"},
		{clientside.RetryBudgetSettings{Ratio: math.NaN()}, "ratio"},
		{clientside.RetryBudgetSettings{MinRetriesPerSecond: math.NaN()}, "min retries"},
		{clientside.RetryBudgetSettings{MinRetriesPerSecond: math.Inf(1)}, "min retries"},
		{clientside.RetryBudgetSettings{MaxTokens: 0.5}, "max tokens"},
		{clientside.RetryBudgetSettings{MaxTokens: math.Inf(1)}, "max tokens"},
	} {
		if _, err := clientside.NewRetryBudget(c.s); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("err %v, want one naming %q", err, c.field)
		}
	}
}

func TestBackoff(t *testing.T) {
	half := 0.5
	b := clientside.Backoff{Rand: constRand(&half)}
	cases := []struct {
		attempt    int
		retryAfter time.Duration
		want       time.Duration
		ok         bool
	}{
		{1, 0, 75 * time.Millisecond, true},                 // d=100ms: 50ms + 0.5·50ms
		{0, 0, 75 * time.Millisecond, true},                 // attempt < 1 counts as 1
		{3, 0, 300 * time.Millisecond, true},                // d=400ms
		{20, 0, 7500 * time.Millisecond, true},              // capped at Max=10s
		{1, 2 * time.Second, 2200 * time.Millisecond, true}, // 2s + 0.5·0.2·2s
		{5, 30 * time.Second, 33 * time.Second, true},
		{1, 31 * time.Second, 0, false}, // above MaxRetryAfter: give up
	}
	for _, c := range cases {
		got, ok := b.Delay(c.attempt, c.retryAfter)
		if got != c.want || ok != c.ok {
			t.Errorf("Delay(%d, %v) = %v, %v; want %v, %v", c.attempt, c.retryAfter, got, ok, c.want, c.ok)
		}
	}
	zero := 0.0
	exact := clientside.Backoff{Jitter: -1, Rand: constRand(&zero), Base: time.Second, Max: 3 * time.Second, MaxRetryAfter: time.Minute}
	if got, _ := exact.Delay(1, 45*time.Second); got != 45*time.Second {
		t.Errorf("no jitter: %v, want 45s", got)
	}
	if got, _ := exact.Delay(4, 0); got != 1500*time.Millisecond {
		t.Errorf("attempt 4 capped at 3s: %v, want 1.5s", got)
	}
	// With the real random source the wait stays in its documented range.
	for i := 0; i < 100; i++ {
		got, ok := clientside.Backoff{}.Delay(1, time.Second)
		if !ok || got < time.Second || got >= 1200*time.Millisecond {
			t.Fatalf("Delay with Retry-After 1s = %v, want in [1s, 1.2s)", got)
		}
	}
}
