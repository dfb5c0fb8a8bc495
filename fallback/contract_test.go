package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/contracttest"
)

// A fallback.Limiter around a Redis concurrency limiter conforms: what the
// inner limiter holds is released once, and with Redis gone and the
// breaker open it decides (Degraded) instead of returning the error —
// admitting when it fails open, denying with ReasonFailClosed when it
// fails closed — and still denies a malformed request as such.
func TestLimiterContract(t *testing.T) {
	for _, fail := range []spillway.FailMode{spillway.FailOpen, spillway.FailClosed} {
		t.Run("fail "+fail.String(), func(t *testing.T) {
			contracttest.Run(t, contracttest.Subject{Decides: true, New: func(t *testing.T) contracttest.Instance {
				c, brk := contracttest.Redis(t)
				st, err := concurrency.NewRedisStore(c)
				if err != nil {
					t.Fatal(err)
				}
				inner, err := concurrency.New(st, 64, concurrency.WithName("contract"))
				if err != nil {
					t.Fatal(err)
				}
				l, err := fallback.NewLimiter(concurrency.PerKey(inner, spillway.DimUser), nil, fallback.Settings{Budget: time.Second, Fail: fail})
				if err != nil {
					t.Fatal(err)
				}
				key := st.Key("contract", "u-contract")
				return contracttest.Instance{
					Limiter: l,
					Held: func() int64 {
						n, err := c.ZCard(context.Background(), key).Result()
						if err != nil {
							t.Fatalf("ZCARD %s: %v", key, err)
						}
						return n
					},
					Deny: func(t *testing.T) {
						if d, _, err := inner.AcquireN(context.Background(), "u-contract", 64); err != nil || !d.Allowed {
							t.Fatalf("filling the key: %+v, %v", d, err)
						}
					},
					// Redis stops and the breaker opens: later requests
					// never reach the inner limiter.
					Break: func(t *testing.T) {
						brk(t)
						for i := 0; l.State() != fallback.Open; i++ {
							if i == 100 {
								t.Fatalf("breaker %v after 100 failures", l.State())
							}
							_, done, _ := l.Admit(context.Background(), contracttest.Request())
							done(spillway.Ignored)
						}
					},
				}
			}})
		})
	}
}
