package rlsload

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
)

func TestQuantiles(t *testing.T) {
	r := &Result{}
	for i := 1; i <= 1000; i++ {
		r.Latencies = append(r.Latencies, time.Duration(i)*time.Millisecond)
	}
	cases := []struct {
		q    float64
		want time.Duration
	}{{0, time.Millisecond}, {0.5, 500 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {0.999, 999 * time.Millisecond}, {1, time.Second}}
	for _, c := range cases {
		if got := r.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := r.Over(990 * time.Millisecond); got != 10 {
		t.Errorf("Over(990ms) = %d, want 10", got)
	}
	if got := r.Max(); got != time.Second {
		t.Errorf("Max = %v, want 1s", got)
	}
	if got := (&Result{}).Quantile(0.99); got != 0 {
		t.Errorf("Quantile of no calls = %v, want 0", got)
	}
}

func TestRequests(t *testing.T) {
	one := Requests("bench", 100, 1)
	three := Requests("bench", 100, 3)
	if len(one) != 100 || len(three) != 100 {
		t.Fatalf("got %d and %d requests, want 100", len(one), len(three))
	}
	if d := one[42].Descriptors; len(d) != 1 || d[0].Entries[0].Key != "user" || d[0].Entries[0].Value != "user:42" {
		t.Errorf("one descriptor: got %v", d)
	}
	seen := map[string]bool{}
	for _, r := range three {
		d := r.Descriptors
		if len(d) != 3 || d[1].Entries[0].Key != "ip" || d[2].Entries[0].Key != "api_key" || r.Domain != "bench" || r.HitsAddend != 1 {
			t.Fatalf("three descriptors: got %v", r)
		}
		seen[d[1].Entries[0].Value] = true
	}
	if len(seen) != 100 { // the ip index is a permutation of the keys
		t.Errorf("%d distinct ips over 100 requests, want 100", len(seen))
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{}, {Target: "x", Descriptors: 2}, {Target: "x", Rate: -1}} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("Run(%+v) = nil error", c)
		}
	}
}

// TestRunAgainstNop runs the generator briefly against the do-nothing
// server, closed and open loop: every call is counted and answered OK.
func TestRunAgainstNop(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	Register(s)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)

	for _, rate := range []float64{0, 400} {
		res, err := Run(context.Background(), Config{Target: l.Addr().String(), Conns: 2, Callers: 4, Keys: 50, Descriptors: 3,
			Warmup: 50 * time.Millisecond, Duration: 250 * time.Millisecond, Rate: rate, CallTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.Calls == 0 || res.OK != res.Calls || res.Errors != 0 || res.OverLimit != 0 || len(res.Latencies) != res.Calls {
			t.Fatalf("rate %v: %d calls, %d OK, %d over, %d errors (%s)", rate, res.Calls, res.OK, res.OverLimit, res.Errors, res.FirstError)
		}
		// open loop: 400/s over 250 ms schedules 100 calls (±1 per caller at the edges)
		if rate > 0 && (res.Calls < 96 || res.Calls > 104) {
			t.Errorf("open loop at 400/s for 250ms: %d calls, want about 100", res.Calls)
		}
	}
}

// TestRunCountsErrors: a server that is not there makes every call an
// error, counted, not a failure of Run.
func TestRunCountsErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	res, err := Run(context.Background(), Config{Target: addr, Conns: 1, Callers: 2, Keys: 10, Duration: 100 * time.Millisecond, CallTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Calls == 0 || res.Errors != res.Calls || res.FirstError == "" {
		t.Fatalf("%d calls, %d errors, first %q", res.Calls, res.Errors, res.FirstError)
	}
}
