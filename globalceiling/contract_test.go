package globalceiling_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/internal/contracttest"
)

const contractLimit = 1000

// newCeiling returns a ceiling of 1000 units an hour on c, closed when the
// test ends; a Cached or LocalAggregation one syncs every 10 ms and is
// stale after 2 s (generous: a loaded machine delays syncs).
func newCeiling(t *testing.T, c redis.UniversalClient, mode globalceiling.Mode) *globalceiling.Ceiling {
	t.Helper()
	ce, err := globalceiling.New(c, "contract", contractLimit, time.Hour, globalceiling.Settings{Mode: mode, SyncInterval: 10 * time.Millisecond, StaleAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ce.Close() })
	return ce
}

// spend admits the whole ceiling in one Critical request.
func spend(t *testing.T, l spillway.Limiter) {
	t.Helper()
	r := contracttest.Request()
	r.Cost = contractLimit
	if d, _, err := l.Admit(context.Background(), r); err != nil || !d.Allowed {
		t.Fatalf("spending the ceiling: %+v, %v", d, err)
	}
}

// breakUntil stops Redis and waits until l's Admit says so: an error, or
// (for a Guard with a fallback) a Degraded decision.
func breakUntil(l spillway.Limiter, brk func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) {
		brk(t)
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			r := contracttest.Request()
			r.Priority = spillway.CriticalPlus
			d, done, err := l.Admit(context.Background(), r)
			done(spillway.Ignored)
			if err != nil || d.Degraded {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the ceiling still admits from Redis 15 s after it stopped")
			}
		}
	}
}

// Every mode conforms: nothing held, a denial once the window is spent, a
// Degraded decision once Redis is gone (Cached and LocalAggregation when
// their view goes stale): the ceiling falls back by itself.
func TestCeilingContract(t *testing.T) {
	for _, mode := range []globalceiling.Mode{globalceiling.Exact, globalceiling.Cached, globalceiling.LocalAggregation} {
		t.Run(mode.String(), func(t *testing.T) {
			contracttest.Run(t, contracttest.Subject{Decides: true, New: func(t *testing.T) contracttest.Instance {
				c, brk := contracttest.Redis(t)
				ce := newCeiling(t, c, mode)
				return contracttest.Instance{Limiter: ce, Deny: func(t *testing.T) { spend(t, ce) }, Break: breakUntil(ce, brk)}
			}})
		})
	}
}

// A Guard around a ceiling conforms: the ceiling decides, Degraded, when
// Redis is gone.
func TestGuardContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{Decides: true, New: func(t *testing.T) contracttest.Instance {
		c, brk := contracttest.Redis(t)
		g, err := globalceiling.NewGuard(newCeiling(t, c, globalceiling.Exact))
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{Limiter: g, Deny: func(t *testing.T) { spend(t, g) }, Break: breakUntil(g, brk)}
	}})
}
