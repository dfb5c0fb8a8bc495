package scenario

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/ratelimit"
)

// compareWindows: the exact log against itself errs never; a conservative
// bucketed window never over-admits but denies some requests that fit,
// and on the log's own history it never allows what the log denies; the
// counter differs from the log on sources near their limit, both ways.
func TestCompareWindows(t *testing.T) {
	const sources = 20
	ev := poissonSources(1, sources, 0.8, 1.2, windowLimit, windowPeriod, 5*time.Minute)
	if len(ev) < 5000 {
		t.Fatalf("%d requests, want about 10000", len(ev))
	}
	p := func(a ratelimit.Algorithm, n int64, m ratelimit.WindowMode) ratelimit.Policy {
		return ratelimit.Policy{Algorithm: a, Limit: windowLimit, Period: windowPeriod, Buckets: n, Mode: m}
	}
	rows := compareWindows(ev, sources, []ratelimit.Policy{
		p(ratelimit.SlidingWindowLog, 0, 0),
		p(ratelimit.SlidingWindowCounter, 0, 0),
		p(ratelimit.SlidingWindowBuckets, 10, ratelimit.Conservative),
		p(ratelimit.SlidingWindowBuckets, 10, ratelimit.Interpolated),
	})
	for _, r := range rows {
		if r.Decisions != int64(len(ev)) {
			t.Fatalf("%+v: want %d decisions", r, len(ev))
		}
	}
	if l := rows[0]; l.Differ != 0 || l.OverAdmit != 0 || l.UnderAdmit != 0 || l.OneStep != 0 {
		t.Fatalf("the exact log against itself: %+v", l)
	}
	if c := rows[1]; c.Differ == 0 || c.Differ != c.WrongAllowed+c.WrongDenied || c.OneStep == 0 || c.OneStepAllowed == 0 || c.OneStepAllowed == c.OneStep {
		t.Fatalf("counter: %+v", c)
	}
	if b := rows[2]; b.Contender != "buckets" || b.Buckets != 10 || b.Mode != "conservative" || b.OverAdmit != 0 || b.UnderAdmit == 0 || b.OneStep == 0 || b.OneStepAllowed != 0 {
		t.Fatalf("conservative: %+v", b)
	}
	if b := rows[3]; b.Mode != "interpolated" || b.OverAdmit == 0 {
		t.Fatalf("interpolated: %+v (it over-admits a little on sources at their limit)", b)
	}
}
