package bench

import (
	"strings"
	"testing"
)

// -md's body: one table per round and the medians of the ratios.
func TestMarkdown(t *testing.T) {
	round := func(sp, rr float64) map[string]result {
		return map[string]result{
			"spillway":   {n: 100, dps: sp, p50: 300, p99: 900, trim: 350.5, usec: 12.25, cpu: 20.5, calls: 4, allowed: 1},
			"redis_rate": {n: 100, dps: rr, p50: 600, p99: 1800, trim: 700, usec: 10, cpu: 18, calls: 1, allowed: 1},
		}
	}
	md := markdown([]string{"spillway", "redis_rate"}, []map[string]result{round(3000, 1000), round(2000, 1000), round(2500, 1000)}, "{}")
	for _, want := range []string{
		"Round 1, 100 decisions per contender:\n\n| contender | decisions/s |",
		"| spillway | 3000 | 300 | 900 | 350.5 | 12.25 | 20.50 | 4.0 | 1.000 |\n",
		"| spillway / redis_rate decisions/s | 2.50× | 3.00 2.00 2.50 |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
