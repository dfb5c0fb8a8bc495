package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
)

// While the backend is down, a request too big for the local share (but
// not for the full limit) is refused for now (fail closed, retry after the
// open timeout), not told "never" by the share; one the share holds is
// admitted, degraded.
func TestLimiterLocalCostExceedsIsNotNever(t *testing.T) {
	inner := &slowLimiter{}
	inner.fail.Store(true)
	local, err := concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), 2, concurrency.Settings{Name: "local"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := fallback.NewLimiter(inner, concurrency.PerKey(local, spillway.DimAPIKey), fallback.Settings{Name: "conc", OpenTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := func(cost int64) *spillway.Request {
		r := &spillway.Request{Endpoint: "/x", Cost: cost}
		r.Set(spillway.DimAPIKey, "k1")
		return r
	}
	d, _, err := l.Admit(context.Background(), req(5))
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Reason != spillway.ReasonFailClosed || d.RetryAfter != 3*time.Second || !d.Degraded {
		t.Fatalf("cost 5 against a local share of 2: %+v; want denied fail_closed, RetryAfter 3s, degraded", d)
	}
	d, done, err := l.Admit(context.Background(), req(2))
	if err != nil || !d.Allowed || !d.Degraded {
		t.Fatalf("cost 2 against a local share of 2: %+v, %v; want admitted, degraded", d, err)
	}
	done(spillway.Success)
}
