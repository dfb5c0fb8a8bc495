package clientside_test

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/internal/testclock"
)

// Any sequence of requests, accepts and clock moves keeps the reject
// probability in [0, 1) and the counts non-negative.
func FuzzThrottle(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 0, 3, 255, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		clk := testclock.New(time.Unix(1_700_000_000, 0))
		th, err := clientside.NewThrottle(clientside.ThrottleSettings{Window: 10 * time.Second, Buckets: 5, Rand: func() float64 { return 0.5 }, Clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			switch op % 4 {
			case 0:
				th.Allow()
			case 1:
				th.Accepted()
			case 2:
				clk.Advance(time.Duration(op) * 100 * time.Millisecond)
			case 3:
				clk.Advance(-time.Duration(op) * 10 * time.Millisecond)
			}
			p := th.Probability()
			req, acc := th.Counts()
			if p < 0 || p >= 1 || req < 0 || acc < 0 {
				t.Fatalf("p=%v counts %d/%d", p, req, acc)
			}
		}
	})
}
