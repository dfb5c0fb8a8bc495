package tiers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/hostiletest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

const hostileRules = `
limits:
  - id: per_ip
    endpoint: GET /x
    by: ip
    bucket: 10/hour
  - id: per_user
    endpoint: GET /x
    by: user
    bucket: 20/hour, burst 30
`

// hostileResponse is hostileRules with the user tier charged on the
// response (an estimate of 1, so that cost 0 means 1 for both tiers): the
// two are held in one Reserve, and done (nothing reported) lets the
// estimate, Request.Cost, stand.
const hostileResponse = `
limits:
  - id: per_ip
    endpoint: GET /x
    by: ip
    bucket: 10/hour
  - id: per_user
    endpoint: GET /x
    by: user
    bucket: 20/hour, burst 30
    cost: response
    estimate: 1
`

// TestHostileTiers runs the hostile-input suite on a two-tier rule set
// (10 per IP, 30 per user; both checked in one batch) over the memory
// store and over Redis and a 3×3 Cluster: a cost the IP tier can never
// admit is CostExceedsLimit and charges neither tier. The same again with
// the user tier charged on the response (held, then settled).
func TestHostileTiers(t *testing.T) {
	redisClients := map[string]redis.UniversalClient{"redis": redistest.Start(t).Client(t), "cluster": redistest.StartCluster(t).Client(t)}
	for _, rules := range []struct{ name, yml string }{{"request", hostileRules}, {"response", hostileResponse}} {
		t.Run(rules.name, func(t *testing.T) { hostileTiers(t, rules.yml, redisClients) })
	}
}

func hostileTiers(t *testing.T, yml string, redisClients map[string]redis.UniversalClient) {
	cfg, err := Parse("hostile.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC) }
	subject := func(mk func() ratelimit.Store, state func(context.Context) (string, error)) hostiletest.Subject {
		var l *Limiter
		reset := func(context.Context) error {
			var err error
			l, err = New(cfg, mk(), Settings{})
			return err
		}
		return hostiletest.Subject{
			Capacity:  10,
			Batch:     1,
			ZeroIsOne: true,
			Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
				r := &spillway.Request{Method: "GET", Endpoint: "/x", Priority: spillway.Critical, Cost: costs[0]}
				r.Set(spillway.DimIP, "10.0.0.1")
				r.Set(spillway.DimUser, "ann")
				d, done, err := l.Admit(ctx, r)
				done(spillway.Success)
				if ferr := l.Flush(ctx); ferr != nil { // the settle, sent in the background
					return false, nil, ferr
				}
				return d.Allowed, []spillway.Decision{d}, err
			},
			State: state,
			Reset: reset,
		}
	}
	var mem *peekStore
	mkMem := func() ratelimit.Store {
		mem = &peekStore{MemoryStore: ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clock})}
		return mem
	}
	memState := func(ctx context.Context) (string, error) { return mem.state(ctx) }
	t.Run("memory", func(t *testing.T) { hostiletest.Run(t, subject(mkMem, memState)) })
	for name, c := range redisClients {
		mkRed := func() ratelimit.Store {
			_ = hostiletest.RedisDelete(context.Background(), c, "hostile:*")
			return mustRedisStore(c, ratelimit.RedisSettings{Clock: clock, Prefix: "hostile:"})
		}
		state := func(ctx context.Context) (string, error) { return hostiletest.RedisState(ctx, c, "hostile:*") }
		t.Run(name, func(t *testing.T) { hostiletest.Run(t, subject(mkRed, state)) })
		t.Run(name+"/differential", func(t *testing.T) {
			hostiletest.RunDifferential(t, subject(mkMem, memState), subject(mkRed, state))
		})
	}
}

// peekStore is a memory store that remembers every item it was asked
// about, so a test can read back the state of each: remaining and reset,
// by a peek (cost 0, which writes nothing).
type peekStore struct {
	*ratelimit.MemoryStore
	seen []ratelimit.Item
}

func (p *peekStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	for _, it := range items {
		it.Cost = 0
		if !slices.Contains(p.seen, it) {
			p.seen = append(p.seen, it)
		}
	}
	return p.MemoryStore.Decide(ctx, items, out)
}

func (p *peekStore) Reserve(ctx context.Context, items []ratelimit.Item, ttl time.Duration) (*ratelimit.Hold, error) {
	for _, it := range items {
		it.Cost = 0
		if !slices.Contains(p.seen, it) {
			p.seen = append(p.seen, it)
		}
	}
	return p.MemoryStore.Reserve(ctx, items, ttl)
}

func (p *peekStore) state(ctx context.Context) (string, error) {
	out := make([]spillway.Decision, len(p.seen))
	if _, err := p.MemoryStore.Decide(ctx, p.seen, out); err != nil {
		return "", err
	}
	return fmt.Sprintf("%v %+v", p.seen, out), nil
}
