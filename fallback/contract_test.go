package fallback_test

import (
	"context"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/contracttest"
	"github.com/spillway-go/spillway/internal/keys"
)

// A Redis concurrency limiter on a client with a Health conforms: what it
// holds is released once, and with Redis gone it decides by itself
// (Degraded) instead of returning the error — admitting at its share when
// it fails open, denying with ReasonFailClosed when it fails closed — and
// still denies a malformed request as such.
func TestLimiterContract(t *testing.T) {
	for _, fail := range []spillway.FailMode{spillway.FailOpen, spillway.FailClosed} {
		t.Run("fail "+fail.String(), func(t *testing.T) {
			contracttest.Run(t, contracttest.Subject{Decides: true, New: func(t *testing.T) contracttest.Instance {
				c, brk := contracttest.Redis(t)
				st, err := concurrency.NewRedisStore(c, concurrency.RedisSettings{})
				if err != nil {
					t.Fatal(err)
				}
				inner, err := concurrency.New(st, 64, concurrency.Settings{Name: "contract", FailMode: fail})
				if err != nil {
					t.Fatal(err)
				}
				l := concurrency.PerKey(inner, spillway.DimUser)
				key := keys.Concurrency("spillway:", "contract", "u-contract")
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
						if d, _, err := inner.Acquire(context.Background(), "u-contract", 64); err != nil || !d.Allowed {
							t.Fatalf("filling the key: %+v, %v", d, err)
						}
					},
					// Redis stops: the limiter decides by itself.
					Break: func(t *testing.T) {
						brk(t)
						for i := 0; ; i++ {
							if i == 100 {
								t.Fatal("no Degraded decision after 100 admissions")
							}
							d, done, _ := l.Admit(context.Background(), contracttest.Request())
							done(spillway.Ignored)
							if d.Degraded {
								return
							}
						}
					},
				}
			}})
		})
	}
}
