package concurrency

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/contracttest"
)

// heldStore counts the units a limiter holds in its store: acquired and
// not yet released. A release of an id that is not held (a second
// release) counts against it, so a done that releases twice shows.
type heldStore struct {
	Store
	mu    sync.Mutex
	units map[string]int64
	extra int64 // releases of ids not held
}

func newHeldStore(s Store) *heldStore {
	return &heldStore{Store: s, units: map[string]int64{}}
}

func (s *heldStore) acquire(ctx context.Context, scope, key, id string, cost, limit int64, ttl time.Duration) (result, error) {
	res, err := s.Store.acquire(ctx, scope, key, id, cost, limit, ttl)
	if err == nil && res.Allowed {
		s.mu.Lock()
		s.units[id] = cost
		s.mu.Unlock()
	}
	return res, err
}

func (s *heldStore) release(ctx context.Context, scope, key, id string, cost int64) error {
	s.mu.Lock()
	if _, ok := s.units[id]; ok {
		delete(s.units, id)
	} else {
		s.extra++
	}
	s.mu.Unlock()
	return s.Store.release(ctx, scope, key, id, cost)
}

func (s *heldStore) held() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, c := range s.units {
		n += c
	}
	return n - s.extra
}

// PerKey conforms over both stores: it holds a unit per admission until
// done, denies a full key, and over a Redis that is gone returns an error
// with the zero Decision (the release of an admission made before the
// outage does not panic).
func TestPerKeyContract(t *testing.T) {
	instance := func(t *testing.T, store Store, brk func(*testing.T)) contracttest.Instance {
		hs := newHeldStore(store)
		lim, err := New(hs, 64, Settings{Name: "contract", ReleaseTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{
			Limiter: PerKey(lim, spillway.DimUser),
			Held:    hs.held,
			Deny: func(t *testing.T) {
				if d, _, err := lim.Acquire(context.Background(), "u-contract", 64); err != nil || !d.Allowed {
					t.Fatalf("filling the key: %+v, %v", d, err)
				}
			},
			Break: brk,
		}
	}
	t.Run("memory", func(t *testing.T) {
		contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
			return instance(t, NewMemoryStore(MemorySettings{}), nil)
		}})
	})
	t.Run("redis", func(t *testing.T) {
		contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
			c, brk := contracttest.Redis(t)
			st, err := NewRedisStore(c, RedisSettings{})
			if err != nil {
				t.Fatal(err)
			}
			return instance(t, st, brk)
		}})
	})
}

// Adaptive conforms: it holds one per admission (InFlight) and sheds when
// its limit is reached.
func TestAdaptiveContract(t *testing.T) {
	contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
		alg, err := NewAIMD(AIMDConfig{Initial: 4, Min: 4, Max: 4})
		if err != nil {
			t.Fatal(err)
		}
		a, err := NewAdaptive(alg, "")
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{
			Limiter: a,
			Held:    func() int64 { return int64(a.InFlight()) },
			Deny: func(t *testing.T) {
				for a.InFlight() < a.Limit() {
					if d, _, err := a.Admit(context.Background(), contracttest.Request()); err != nil || !d.Allowed {
						t.Fatalf("filling: %+v, %v", d, err)
					}
				}
			},
		}
	}})
}
