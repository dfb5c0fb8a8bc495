package clientside_test

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/clientside"
)

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", "Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15 07:28:00 GMT", "Wed Oct 21 07:28:00 2015", "-1", "1e3", ""} {
		f.Add(s)
	}
	now := time.Date(2015, 10, 21, 7, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := clientside.ParseRetryAfter(s, now)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v", s, d, ok)
		}
	})
}

// Any sequence of requests, accepts and clock moves keeps the reject
// probability in [0, 1) and the counts non-negative.
func FuzzThrottle(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 0, 3, 255, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		now := time.Unix(1_700_000_000, 0)
		th, err := clientside.NewThrottle(clientside.ThrottleSettings{Window: 10 * time.Second, Buckets: 5, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			switch op % 4 {
			case 0:
				th.AllowAt(now)
			case 1:
				th.AcceptedAt(now)
			case 2:
				now = now.Add(time.Duration(op) * 100 * time.Millisecond)
			case 3:
				now = now.Add(-time.Duration(op) * 10 * time.Millisecond)
			}
			p := th.ProbabilityAt(now)
			req, acc := th.CountsAt(now)
			if p < 0 || p >= 1 || req < 0 || acc < 0 {
				t.Fatalf("p=%v counts %d/%d", p, req, acc)
			}
		}
	})
}
