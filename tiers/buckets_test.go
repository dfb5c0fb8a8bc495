package tiers

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// A sliding_window_buckets rule with its buckets and mode, from YAML to
// decisions: 3 per minute in 20 sub-windows of 3 s, conservative.
func TestSlidingWindowBucketsRule(t *testing.T) {
	const yml = `limits:
  - endpoint: /login
    by: ip
    bucket: 3/minute
    algorithm: sliding_window_buckets
    buckets: 20
    mode: conservative
  - endpoint: /search
    by: ip
    bucket: 3/minute
    algorithm: sliding_window_buckets
`
	c, err := Parse("limits.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	r0, r1 := c.Rules[0], c.Rules[1]
	if r0.Algorithm != ratelimit.SlidingWindowBuckets || r0.Buckets != 20 || r0.Mode != ratelimit.Conservative {
		t.Fatalf("rule 0: %+v", r0)
	}
	if r1.Buckets != 0 || r1.Mode != ratelimit.Interpolated {
		t.Fatalf("rule 1 (defaults): %+v", r1)
	}
	clk := newClock()
	clk.Advance(time.Second) // 1_700_000_001 s: a sub-window starts
	l, err := New(c, ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now}), Settings{})
	if err != nil {
		t.Fatal(err)
	}
	login := req("POST", "/login", "ip", "1.2.3.4")
	ctx := context.Background()
	for i := range 4 {
		d, done, err := l.Admit(ctx, login)
		if err != nil {
			t.Fatal(err)
		}
		done(spillway.Success)
		if d.Allowed != (i < 3) || d.Window != time.Minute {
			t.Fatalf("request %d: %+v", i, d)
		}
		// the first sub-window [0, 3s) stops overlapping the window a
		// minute and 3 s − 1 µs later
		if i == 3 && (d.RetryAfter != 63*time.Second || d.Remaining != 0) {
			t.Fatalf("denied: %+v, want RetryAfter 63s", d)
		}
	}
	clk.Advance(63*time.Second - time.Microsecond)
	if d, done, err := l.Admit(ctx, login); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("after RetryAfter: %+v %v", d, err)
	} else {
		done(spillway.Success)
	}
}
