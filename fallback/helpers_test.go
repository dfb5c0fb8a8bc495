package fallback_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/genmd"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/ratelimit"
)

// newFakeClock returns a settable clock shared by the Redis store (its
// Clock), the local share and the fallback, so decisions are exact.
func newFakeClock() *testclock.Clock {
	return testclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// bed is one redis-server behind a fault proxy, and a tuned client through
// the proxy.
type bed struct {
	srv    *redistest.Server
	proxy  *faultproxy.Proxy
	client *redis.Client
	clock  *testclock.Clock
}

func newBed(t *testing.T) *bed {
	t.Helper()
	srv := redistest.Start(t)
	p, err := faultproxy.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	// Long socket timeouts: only the budget's context deadline can cut a
	// stalled call short, so the tests prove that it does.
	opt := &redis.Options{Addr: p.Addr(), ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	fallback.TuneOptions(opt)
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return &bed{srv: srv, proxy: p, client: c, clock: newFakeClock()}
}

// warm opens a pooled connection through the proxy and loads the scripts,
// so that the first measured call is an ordinary one.
func (b *bed) warm(t *testing.T) {
	t.Helper()
	st := b.redisStore()
	out := make([]spillway.Decision, 2)
	if _, err := st.Decide(context.Background(), []ratelimit.Item{{Scope: "warm", Key: "w", Policy: hourly}}, out); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Decide(context.Background(), []ratelimit.Item{{Scope: "warm", Key: "w", Policy: hourly}, {Scope: "warm", Key: "x", Policy: hourly}}, out); err != nil {
		t.Fatal(err)
	}
}

// redisStore is the real Redis store over the proxy, on the fake clock.
func (b *bed) redisStore() *ratelimit.RedisStore {
	return mustRedisStore(b.client, ratelimit.RedisSettings{Clock: b.clock.Now})
}

// directStore talks to the server without the proxy, for assertions.
func (b *bed) directStore(t *testing.T) *ratelimit.RedisStore {
	return mustRedisStore(b.srv.Client(t), ratelimit.RedisSettings{Clock: b.clock.Now})
}

func (b *bed) fallback(t *testing.T, s fallback.Settings) *fallback.Store {
	t.Helper()
	if s.Clock == nil {
		s.Clock = b.clock.Now
	}
	if s.Budget == 0 {
		// Tests not about the budget must not trip on a loaded machine.
		s.Budget = time.Second
	}
	st, err := fallback.NewStore(b.redisStore(), s)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (b *bed) setMode(t *testing.T, m faultproxy.Mode) {
	t.Helper()
	if err := b.proxy.SetMode(m); err != nil {
		t.Fatal(err)
	}
}

// hourly is 100 per hour, burst 100: refill is one token per 36s, so with a
// frozen fake clock every count is exact; its share is 20.
var hourly = ratelimit.Policy{Limit: 100, Period: time.Hour}

func decide(t *testing.T, s ratelimit.Store, scope, key string, p ratelimit.Policy, cost int64) spillway.Decision {
	t.Helper()
	return decideItem(t, s, ratelimit.Item{Scope: scope, Key: key, Policy: p, Cost: cost})
}

// decideItem decides one item.
func decideItem(t *testing.T, s ratelimit.Store, it ratelimit.Item) spillway.Decision {
	t.Helper()
	out := make([]spillway.Decision, 1)
	_, err := s.Decide(context.Background(), []ratelimit.Item{it}, out)
	if err != nil {
		t.Fatalf("Decide(%s/%s): %v", it.Scope, it.Key, err)
	}
	return out[0]
}

// count decides n unit requests and returns how many were allowed, and
// how many of all decisions were degraded.
func count(t *testing.T, s ratelimit.Store, scope, key string, p ratelimit.Policy, n int) (allowed, degraded int) {
	t.Helper()
	for i := 0; i < n; i++ {
		d := decide(t, s, scope, key, p, 1)
		if d.Allowed {
			allowed++
		}
		if d.Degraded {
			degraded++
		}
	}
	return allowed, degraded
}

// states records breaker transitions.
type states struct {
	mu  sync.Mutex
	log []string
}

func (s *states) hook(_ string, from, to fallback.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, from.String()+"→"+to.String())
}

func (s *states) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

// waitFor polls cond every 10ms for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	redistest.WaitFor(t, what, 10*time.Millisecond, cond)
}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the tests fail dials on purpose.
	redis.SetLogger(quietLogger{})
	load := genmd.LoadAvg()
	code := m.Run()
	if code == 0 {
		// -md: the failover tests' figures, once every test passed
		if err := writeFailoverFigures(load); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// mustRedisStore is ratelimit.NewRedisStore for a client and settings that
// are valid.
func mustRedisStore(c redis.UniversalClient, set ...ratelimit.RedisSettings) *ratelimit.RedisStore {
	s, err := ratelimit.NewRedisStore(c, append(set, ratelimit.RedisSettings{})[0])
	if err != nil {
		panic(err)
	}
	return s
}
