package tiers

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/ratelimit"
)

// newClock returns a settable clock for the memory store.
func newClock() *testclock.Clock { return testclock.New(time.Unix(1_700_000_000, 0)) }

func mustLimiter(t testing.TB, yml string, store ratelimit.Store, s ...Settings) *Limiter {
	t.Helper()
	c, err := Parse("limits.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	var set Settings
	if len(s) > 0 {
		set = s[0]
	}
	l, err := New(c, store, set)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func req(method, endpoint string, dims ...string) *spillway.Request {
	r := &spillway.Request{Method: method, Endpoint: endpoint, Priority: spillway.Critical}
	for i := 0; i+1 < len(dims); i += 2 {
		r.Set(dims[i], dims[i+1])
	}
	return r
}

// step is one Admit and the decision it must return.
type step struct {
	r    *spillway.Request
	want spillway.Decision
}

func run(t *testing.T, l *Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		d, done, err := l.Admit(context.Background(), s.r)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if done == nil {
			t.Fatalf("step %d: nil done", i)
		}
		done(spillway.Success)
		// Every decision that names a rule's limit carries its window
		// (TestWindow checks the values); the tables leave it out.
		if (d.Limit > 0) != (d.Window > 0) {
			t.Fatalf("step %d: Limit %d with Window %v", i, d.Limit, d.Window)
		}
		d.Window = 0
		if d != s.want {
			t.Fatalf("step %d:\n got %+v\nwant %+v", i, d, s.want)
		}
	}
}

// peek returns what every rule that matches r has left, by rule id,
// without charging anything.
// flushT waits for the settles of the requests done so far (sent in the
// background) to reach the store.
func flushT(t *testing.T, l *Limiter) {
	t.Helper()
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func peek(t *testing.T, l *Limiter, store ratelimit.Store, r *spillway.Request) map[string]int64 {
	t.Helper()
	if err := l.Flush(context.Background()); err != nil { // the settles of done, sent in the background
		t.Fatal(err)
	}
	ms, err := l.matches(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	items := make([]ratelimit.Item, len(ms))
	for i, m := range ms {
		items[i] = m.Item
		items[i].Cost = 0
	}
	out := make([]spillway.Decision, len(items))
	if _, err := store.Decide(context.Background(), items, out); err != nil {
		t.Fatal(err)
	}
	left := map[string]int64{}
	for i, m := range ms {
		left[m.Rule] = out[i].Remaining
	}
	return left
}

const loginConfig = `
limits:
  - endpoint: /api/v1/login
    method: POST
    by: ip
    bucket: 3/minute
  - endpoint: /api/v1/login
    by: user
    bucket: 2/minute
  - endpoint: /api/v1/*
    by: api_key
    bucket: 100/second, burst 50
`

func TestAdmitMultiRule(t *testing.T) {
	clk := newClock()
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	l := mustLimiter(t, loginConfig, store)
	login := func() *spillway.Request { return req("POST", "/api/v1/login", "ip", "10.0.0.1", "user", "ann") }
	const ipRule, userRule = "POST /api/v1/login:ip", "/api/v1/login:user"
	run(t, l, []step{
		// The most restrictive of the allowed rules: the user rule.
		{login(), spillway.Decision{Allowed: true, Limiter: userRule, Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
		{login(), spillway.Decision{Allowed: true, Limiter: userRule, Limit: 2, Remaining: 0, ResetAfter: time.Minute}},
		// The user rule denies; the IP rule had room but is not charged.
		{login(), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: userRule, Limit: 2, Remaining: 0, ResetAfter: time.Minute, RetryAfter: 30 * time.Second}},
	})
	if got := peek(t, l, store, login()); got[ipRule] != 1 || got[userRule] != 0 || len(got) != 2 {
		t.Fatalf("after denial: %v, want ip 1 left (2 charges), user 0", got)
	}
	// Another user from the same IP: only the IP rule binds now.
	run(t, l, []step{
		{req("POST", "/api/v1/login", "ip", "10.0.0.1", "user", "bob"), spillway.Decision{Allowed: true, Limiter: ipRule, Limit: 3, Remaining: 0, ResetAfter: time.Minute}},
		{req("POST", "/api/v1/login", "ip", "10.0.0.1", "user", "cat"), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: ipRule, Limit: 3, Remaining: 0, ResetAfter: time.Minute, RetryAfter: 20 * time.Second}},
	})
	// GET is not limited by the POST-only IP rule; without a user, the
	// user rule does not apply either.
	run(t, l, []step{
		{req("GET", "/api/v1/login", "ip", "10.0.0.1"), spillway.Decision{Allowed: true, Limiter: "tiers"}},
		{req("GET", "/api/v1/login", "ip", "10.0.0.1", "api_key", "k1"), spillway.Decision{Allowed: true, Limiter: "/api/v1/*:api_key", Limit: 50, Remaining: 49, ResetAfter: 10 * time.Millisecond}},
	})
	clk.Advance(20 * time.Second)
	run(t, l, []step{
		{req("POST", "/api/v1/login", "ip", "10.0.0.1", "user", "cat"), spillway.Decision{Allowed: true, Limiter: ipRule, Limit: 3, Remaining: 0, ResetAfter: time.Minute}},
	})
	st := l.stats()
	if st[ipRule] != (ruleCounts{Matched: 6, Denied: 1}) || st[userRule] != (ruleCounts{Matched: 6, Denied: 1}) {
		t.Fatalf("stats = %+v", st)
	}
}

func TestAdmitDenialChoice(t *testing.T) {
	clk := newClock()
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	l := mustLimiter(t, `
limits:
  - id: slow
    by: ip
    bucket: 1/hour
  - id: fast
    by: user
    bucket: 1/second
  - id: small
    by: api_key
    bucket: 10/second, burst 3
`, store)
	run(t, l, []step{
		{req("", "/x", "ip", "a", "user", "u"), spillway.Decision{Allowed: true, Limiter: "slow", Limit: 1, Remaining: 0, ResetAfter: time.Hour}},
		// Both deny: the longest wait is named.
		{req("", "/x", "ip", "a", "user", "u"), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "slow", Limit: 1, ResetAfter: time.Hour, RetryAfter: time.Hour}},
	})
	// A cost that can never fit wins over any wait.
	l2 := mustLimiter(t, `
limits:
  - id: wait
    by: ip
    bucket: 10/hour
  - id: small
    by: api_key
    bucket: 10/second, burst 3
`, store)
	burn := req("", "/x", "ip", "b")
	burn.Cost = 10
	r := req("", "/x", "ip", "b", "api_key", "k")
	r.Cost = 4
	run(t, l2, []step{
		{burn, spillway.Decision{Allowed: true, Limiter: "wait", Limit: 10, Remaining: 0, ResetAfter: time.Hour}},
		{r, spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "small", Limit: 3, Remaining: 3}},
	})
}

func TestAdmitInvalidAndEmpty(t *testing.T) {
	l := mustLimiter(t, "limits: []\n", ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{Name: "api-tiers"})
	r := req("GET", "/", "ip", "a")
	r.Cost = -1
	run(t, l, []step{
		{r, spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: "api-tiers"}},
		{req("GET", "/"), spillway.Decision{Allowed: true, Limiter: "api-tiers"}},
	})
}

func TestShadow(t *testing.T) {
	clk := newClock()
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	var (
		mu   sync.Mutex
		seen []spillway.Decision
	)
	hook := func(_ context.Context, r *spillway.Request, d spillway.Decision) {
		mu.Lock()
		seen = append(seen, d)
		mu.Unlock()
	}
	l := mustLimiter(t, `
limits:
  - id: real
    by: ip
    bucket: 5/minute
  - id: dark
    by: ip
    bucket: 2/minute
    shadow: true
`, store, Settings{Shadow: hook})
	r := func() *spillway.Request { return req("GET", "/", "ip", "10.0.0.9") }
	var steps []step
	for i := int64(0); i < 5; i++ {
		steps = append(steps, step{r(), spillway.Decision{Allowed: true, Limiter: "real", Limit: 5, Remaining: 4 - i, ResetAfter: time.Duration(i+1) * 12 * time.Second}})
	}
	// The sixth is denied by the real rule.
	steps = append(steps, step{r(), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "real", Limit: 5, ResetAfter: time.Minute, RetryAfter: 12 * time.Second}})
	run(t, l, steps)

	// The shadow rule allowed (and was charged for) the first two, would
	// have denied the next three, and saw the sixth denied by the real
	// rule, like any rule in the batch.
	if len(seen) != 6 {
		t.Fatalf("shadow hook saw %d decisions, want 6", len(seen))
	}
	for i, d := range seen {
		if d.Limiter != "dark" || d.Allowed != (i < 2) {
			t.Fatalf("shadow decision %d = %+v", i, d)
		}
	}
	if seen[2] != (spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "dark", Limit: 2, ResetAfter: time.Minute, RetryAfter: 30 * time.Second}) {
		t.Fatalf("shadow denial = %+v", seen[2])
	}
	if got := peek(t, l, store, r()); got["real"] != 0 || got["dark"] != 0 {
		t.Fatalf("peek = %v", got)
	}
	if st := l.stats(); st["dark"] != (ruleCounts{Matched: 6, ShadowDenied: 4}) || st["real"] != (ruleCounts{Matched: 6, Denied: 1}) {
		t.Fatalf("stats = %+v", st)
	}

	// After a minute the shadow bucket is full again but the real one has
	// had only its refill: a shadow rule charged only when it allowed.
	clk.Advance(time.Minute)
	if got := peek(t, l, store, r()); got["real"] != 5 || got["dark"] != 2 {
		t.Fatalf("peek after a minute = %v", got)
	}

	// Shadow-only matches never deny.
	l2 := mustLimiter(t, "limits:\n  - id: dark\n    by: ip\n    bucket: 1/hour\n    shadow: true\n", store)
	run(t, l2, []step{
		{r(), spillway.Decision{Allowed: true, Limiter: "tiers"}},
		{r(), spillway.Decision{Allowed: true, Limiter: "tiers"}},
	})
	if st := l2.stats(); st["dark"] != (ruleCounts{Matched: 2, ShadowDenied: 1}) {
		t.Fatalf("shadow-only stats = %+v", st)
	}
}

const plansConfig = `
plans:
  free:
    api: 2/minute
  pro:
    api: 4/minute
  enterprise:
    api: unlimited
default_plan: free
limits:
  - id: api
    endpoint: /api/*
    by: api_key
    plan: api
`

func TestPlans(t *testing.T) {
	clk := newClock()
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	plans := map[string]string{"kp": "pro", "ke": "enterprise", "kx": "platinum"}
	calls := 0
	resolver := func(_ context.Context, key string) (string, error) {
		calls++
		if key == "broken" {
			return "", errors.New("db down")
		}
		return plans[key], nil
	}
	l := mustLimiter(t, plansConfig, store, Settings{PlanResolver: resolver})
	k := func(key string) *spillway.Request { return req("GET", "/api/things", "api_key", key) }
	run(t, l, []step{
		{k("kf"), spillway.Decision{Allowed: true, Limiter: "api", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
		{k("kp"), spillway.Decision{Allowed: true, Limiter: "api", Limit: 4, Remaining: 3, ResetAfter: 15 * time.Second}},
		{k("ke"), spillway.Decision{Allowed: true, Limiter: "tiers"}},
	})
	// DimPlan overrides the resolver.
	r := k("kf")
	r.Set(DimPlan, "pro")
	run(t, l, []step{{r, spillway.Decision{Allowed: true, Limiter: "api", Limit: 4, Remaining: 3, ResetAfter: 15 * time.Second}}})
	if calls != 3 {
		t.Fatalf("resolver calls = %d, want 3", calls)
	}
	_, _, err := l.Admit(context.Background(), k("kx"))
	if !errors.Is(err, ErrUnknownPlan) || err.Error() != `tiers: unknown plan "platinum"` {
		t.Fatalf("unknown plan: %v", err)
	}
	_, _, err = l.Admit(context.Background(), k("broken"))
	if err == nil || err.Error() != "tiers: plan resolver: db down" {
		t.Fatalf("resolver error: %v", err)
	}
	// Not an /api request: the resolver is not called.
	run(t, l, []step{{req("GET", "/health", "api_key", "broken"), spillway.Decision{Allowed: true, Limiter: "tiers"}}})

	// Without a resolver every key is on the default plan.
	l2 := mustLimiter(t, plansConfig, ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now}))
	run(t, l2, []step{{k("kp"), spillway.Decision{Allowed: true, Limiter: "api", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}}})
}

func TestSwapCarriesOver(t *testing.T) {
	clk := newClock()
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	l := mustLimiter(t, `
limits:
  - id: keep
    by: ip
    bucket: 10/minute
  - id: change
    by: user
    bucket: 10/minute
  - id: gone
    by: api_key
    bucket: 10/minute
`, store)
	r := func() *spillway.Request { return req("GET", "/", "ip", "i", "user", "u", "api_key", "k") }
	for i := 0; i < 4; i++ {
		if d, _, err := l.Admit(context.Background(), r()); err != nil || !d.Allowed {
			t.Fatalf("admit %d: %+v %v", i, d, err)
		}
	}
	if got := peek(t, l, store, r()); got["keep"] != 6 || got["change"] != 6 || got["gone"] != 6 {
		t.Fatalf("before swap: %v", got)
	}
	err := l.reload("limits.yaml", []byte(`
limits:
  - id: keep
    by: ip
    bucket: 10/minute
  - id: change
    by: user
    bucket: 20/minute
  - id: new
    by: api_key
    bucket: 5/minute
`))
	if err != nil {
		t.Fatal(err)
	}
	// keep: same id and policy, counters carry over; change: new policy,
	// fresh bucket; new: fresh.
	if got := peek(t, l, store, r()); got["keep"] != 6 || got["change"] != 20 || got["new"] != 5 || len(got) != 3 {
		t.Fatalf("after swap: %v", got)
	}
	st := l.stats()
	if st["keep"].Matched != 4 || st["change"].Matched != 0 || st["new"].Matched != 0 {
		t.Fatalf("stats after swap: %+v", st)
	}
	// A bad config leaves the old one in place.
	err = l.reload("limits.yaml", []byte("limits:\n  - by: ip\n    bucket: 10/minit\n"))
	if err == nil || err.Error() != `tiers: limits.yaml:3: bucket "10/minit": unknown unit "minit"` {
		t.Fatalf("bad reload: %v", err)
	}
	if got := l.config().Rules[1].Bucket; got != (Bucket{Limit: 20, Period: time.Minute}) {
		t.Fatalf("config after failed reload: %+v", got)
	}
}

// Swap while requests run: every Admit sees one whole config (run with
// -race).
func TestSwapConcurrent(t *testing.T) {
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{})
	a := "limits:\n  - id: a\n    by: ip\n    bucket: 1000000/second\n"
	b := "limits:\n  - id: b\n    by: ip\n    bucket: 1000000/second\n  - id: c\n    by: ip\n    bucket: 1000000/minute\n"
	l := mustLimiter(t, a, store)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, _, err := l.Admit(context.Background(), req("GET", "/", "ip", "1.2.3.4"))
				if err != nil || !d.Allowed || (d.Limiter != "a" && d.Limiter != "b" && d.Limiter != "c") {
					t.Errorf("admit: %+v %v", d, err)
					return
				}
			}
		}()
	}
	for i := 0; i < 200; i++ {
		cfg := a
		if i%2 == 0 {
			cfg = b
		}
		if err := l.reload("x.yaml", []byte(cfg)); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestEndpointMatching(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		yes, no []string
	}{
		{"", []string{"", "/", "/a/b"}, nil},
		{"*", []string{"", "/x"}, nil},
		{"/api/v1/login", []string{"/api/v1/login"}, []string{"/api/v1/login/", "/api/v1/logins", "/api/v1", ""}},
		{"/api/v1/*", []string{"/api/v1", "/api/v1/", "/api/v1/x", "/api/v1/x/y"}, []string{"/api/v10", "/api/v2/x", "/api", ""}},
		{"/*", []string{"/", "/a", "/a/b"}, []string{"", "a"}},
		{"/users/*/posts", []string{"/users/42/posts"}, []string{"/users//posts", "/users/42/posts/1", "/users/42", "/users/4/2/posts"}},
		{"/users/*/posts/*", []string{"/users/42/posts", "/users/42/posts/7/x"}, []string{"/users/42/post"}},
		{"/pkg.Service/*", []string{"/pkg.Service/Get"}, []string{"/pkg.Other/Get"}},
	} {
		m := newMatcher(tc.pattern)
		for _, p := range tc.yes {
			if !m.match(p) {
				t.Errorf("%q should match %q", tc.pattern, p)
			}
		}
		for _, p := range tc.no {
			if m.match(p) {
				t.Errorf("%q should not match %q", tc.pattern, p)
			}
		}
	}
}

func TestNormalizeIP(t *testing.T) {
	for _, tc := range []struct {
		in   string
		bits int
		want string
	}{
		{"10.0.0.1", 0, "10.0.0.1"},
		{"10.0.0.1", 64, "10.0.0.1"},
		{"255.255.255.255", 0, "255.255.255.255"},
		{"010.0.0.1", 0, "010.0.0.1"}, // not canonical: not an IP, kept as it came
		{" 10.0.0.1 ", 0, "10.0.0.1"},
		{"::ffff:10.0.0.1", 64, "10.0.0.1"},
		{"2001:DB8::1", 0, "2001:db8::1"},
		{"2001:db8:0:0:0:0:0:1", 0, "2001:db8::1"},
		{"[2001:db8::1]", 0, "2001:db8::1"},
		{"fe80::1%eth0", 0, "fe80::1"},
		{"2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::1", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 48, "2001:db8:1::/48"},
		{"2001:db8:1:2:3:4:5:6", 128, "2001:db8:1:2:3:4:5:6"},
		{"not-an-ip", 64, "not-an-ip"},
		{"{evil}", 64, "{evil}"},
	} {
		if got := normalizeIP(tc.in, tc.bits); got != tc.want {
			t.Errorf("normalizeIP(%q, %d) = %q, want %q", tc.in, tc.bits, got, tc.want)
		}
	}
}

func TestIPv6Grouping(t *testing.T) {
	cfg := "limits:\n  - id: ip\n    by: ip\n    bucket: 2/minute\n"
	r := func(ip string) *spillway.Request { return req("GET", "/", "ip", ip) }
	clk := newClock()
	grouped := mustLimiter(t, cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now}), Settings{IPv6Prefix: 64})
	run(t, grouped, []step{
		{r("2001:db8::1"), spillway.Decision{Allowed: true, Limiter: "ip", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
		{r("2001:db8::2"), spillway.Decision{Allowed: true, Limiter: "ip", Limit: 2, Remaining: 0, ResetAfter: time.Minute}},
		{r("2001:db8::ffff:3"), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "ip", Limit: 2, ResetAfter: time.Minute, RetryAfter: 30 * time.Second}},
		{r("2001:db8:0:1::1"), spillway.Decision{Allowed: true, Limiter: "ip", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
	})
	whole := mustLimiter(t, cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now}))
	run(t, whole, []step{
		{r("2001:db8::1"), spillway.Decision{Allowed: true, Limiter: "ip", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
		{r("2001:db8::2"), spillway.Decision{Allowed: true, Limiter: "ip", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
		// Another spelling of the first address is the same client.
		{r("2001:DB8:0::1"), spillway.Decision{Allowed: true, Limiter: "ip", Limit: 2, Remaining: 0, ResetAfter: time.Minute}},
	})
}

// Keys: dimensions and rules never share counters; braces cannot pick a
// slot; long values are bounded; all rules about one entity share a tag.
func TestKeySafety(t *testing.T) {
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{})
	l := mustLimiter(t, `
limits:
  - id: by-ip
    by: ip
    bucket: 1/minute
  - id: by-user
    by: user
    bucket: 1/minute
  - id: by-user-2
    endpoint: /other
    by: user
    bucket: 1/minute
  - id: pair
    by: [user, tenant]
    bucket: 1/minute
`, store)
	ctx := context.Background()
	// The same value in two dimensions: two counters.
	for _, r := range []*spillway.Request{req("GET", "/", "ip", "x"), req("GET", "/", "user", "x")} {
		if d, _, err := l.Admit(ctx, r); err != nil || !d.Allowed {
			t.Fatalf("%+v: %+v %v", r.Dims, d, err)
		}
	}
	// Two multi-dimension requests whose naive joins collide.
	a := req("GET", "/", "user", "u,tenant=t", "tenant", "s")
	b := req("GET", "/", "user", "u", "tenant", "t,tenant=s")
	ma, _ := l.matches(ctx, a)
	mb, _ := l.matches(ctx, b)
	if ma[1].Item.Key == mb[1].Item.Key {
		t.Fatalf("entities collide: %q", ma[1].Item.Key)
	}
	if ma[1].Item.Key != "tenant=s,user=u%2Ctenant=t" {
		t.Fatalf("entity = %q", ma[1].Item.Key)
	}

	// Every item of one request about one user shares a hash tag; the tag
	// of a brace-laden value is escaped.
	r := req("GET", "/other", "user", "{slot}", "ip", "10.0.0.1")
	ms, err := l.matches(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	tags := map[string][]string{}
	for _, m := range ms {
		k := keys.Key("spillway:", m.Item.Scope, m.Item.Key)
		tags[keys.Tag(k)] = append(tags[keys.Tag(k)], m.Rule)
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Fatalf("key %q has user braces", k)
		}
	}
	if len(tags) != 2 || len(tags["user=%7Bslot%7D"]) != 2 || len(tags["ip=10.0.0.1"]) != 1 {
		t.Fatalf("tags = %v", tags)
	}

	// A huge value is hashed to a bounded key.
	long := strings.Repeat("a", 10_000)
	ms, _ = l.matches(ctx, req("GET", "/", "user", long))
	k := keys.Key("spillway:", ms[0].Item.Scope, ms[0].Item.Key)
	if len(k) > 120 {
		t.Fatalf("key of a 10 kB value is %d bytes", len(k))
	}
	ms2, _ := l.matches(ctx, req("GET", "/", "user", long+"b"))
	if keys.Key("spillway:", ms2[0].Item.Scope, ms2[0].Item.Key) == k {
		t.Fatal("two long values share a key")
	}

	// Scopes: id and policy digest; same id under another policy differs.
	if s1, s2 := scopeOf("r", ratelimit.Policy{Limit: 1, Period: time.Second}), scopeOf("r", ratelimit.Policy{Limit: 2, Period: time.Second}); s1 == s2 || !strings.HasPrefix(s1, "r@") {
		t.Fatalf("scopes %q %q", s1, s2)
	}
}

// failingStore fails every call: it stands for an unreachable backend.
type failingStore struct{ err error }

func (s failingStore) Decide(context.Context, []ratelimit.Item, []spillway.Decision) (bool, error) {
	return false, s.err
}
func (s failingStore) Reset(context.Context, string, string, ratelimit.Policy) error { return s.err }

func TestStoreErrorCarriesFailMode(t *testing.T) {
	boom := errors.New("connection refused")
	l := mustLimiter(t, `
limits:
  - id: login
    endpoint: /login
    by: ip
    bucket: 10/minute
    fail: closed
  - id: all
    by: ip
    bucket: 100/minute
  - id: dark
    by: ip
    bucket: 1/minute
    shadow: true
`, failingStore{boom})
	d, done, err := l.Admit(context.Background(), req("POST", "/login", "ip", "1.1.1.1"))
	var se *spillway.StoreError
	if !errors.As(err, &se) || !errors.Is(err, boom) || !errors.Is(err, spillway.ErrStoreUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if se.Fail != spillway.FailClosed || se.Limiter != "tiers" || strings.Join(se.Rules, ",") != "login,all" {
		t.Fatalf("store error = %+v", se)
	}
	if d != (spillway.Decision{}) || done == nil {
		t.Fatalf("decision on error = %+v", d)
	}
	if err.Error() != "spillway: store unavailable (tiers, rules [login all], fail closed): connection refused" {
		t.Fatalf("message = %q", err)
	}
	_, _, err = l.Admit(context.Background(), req("GET", "/x", "ip", "1.1.1.1"))
	if !errors.As(err, &se) || se.Fail != spillway.FailOpen || strings.Join(se.Rules, ",") != "all" {
		t.Fatalf("open rule error = %v", err)
	}
}

// degradingStore marks the decision of items of one scope Degraded, as a
// fallback store does when it decided them locally.
type degradingStore struct {
	ratelimit.Store
	scope string
}

func (s degradingStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	ok, err := s.Store.Decide(ctx, items, out)
	for i := range items {
		if items[i].Scope == s.scope {
			out[i].Degraded = true
		}
	}
	return ok, err
}

func TestDegradedAndFailModeByScope(t *testing.T) {
	const cfg = `
plans:
  free: {api: 10/minute}
  pro: {api: unlimited}
default_plan: free
limits:
  - id: login
    by: ip
    bucket: 1/minute
    fail: closed
  - id: api
    by: api_key
    plan: api
    fail: closed
  - id: user
    by: user
    bucket: 100/minute
`
	clk := newClock()
	mem := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	probe := mustLimiter(t, cfg, mem)
	ms, err := probe.matches(context.Background(), req("GET", "/", "ip", "a", "user", "u", "api_key", "k"))
	if err != nil || len(ms) != 3 {
		t.Fatalf("matches %+v %v", ms, err)
	}
	for _, m := range ms {
		want := spillway.FailOpen
		if m.Rule != "user" {
			want = spillway.FailClosed
		}
		if m.Fail != want || m.Item.Fail != want {
			t.Errorf("rule %q: Fail %v, Item.Fail %v, want %v", m.Rule, m.Fail, m.Item.Fail, want)
		}
	}
	// The user rule's item is decided by a "fallback": the decision,
	// named after the most restrictive rule (login), is Degraded.
	l := mustLimiter(t, cfg, degradingStore{mem, ms[2].Item.Scope})
	run(t, l, []step{
		{req("GET", "/", "ip", "a", "user", "u"), spillway.Decision{Allowed: true, Limiter: "login", Limit: 1, Remaining: 0, ResetAfter: time.Minute, Degraded: true}},
		{req("GET", "/", "ip", "a", "user", "u"), spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "login", Limit: 1, ResetAfter: time.Minute, RetryAfter: time.Minute, Degraded: true}},
		{req("GET", "/", "ip", "b"), spillway.Decision{Allowed: true, Limiter: "login", Limit: 1, Remaining: 0, ResetAfter: time.Minute}},
	})
}

// More rules than the pooled scratch holds: the batch spills to the heap
// and still decides all or nothing.
func TestManyRules(t *testing.T) {
	var b strings.Builder
	b.WriteString("limits:\n")
	r := req("GET", "/x")
	for i := 0; i < 12; i++ {
		dim := "d" + string(rune('a'+i))
		limit := "5"
		if i == 11 {
			limit = "2"
		}
		b.WriteString("  - id: r" + dim + "\n    by: " + dim + "\n    bucket: " + limit + "/minute\n")
		r.Set(dim, "v")
	}
	clk := newClock()
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
	l := mustLimiter(t, b.String(), store)
	run(t, l, []step{
		{r, spillway.Decision{Allowed: true, Limiter: "rdl", Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
		{r, spillway.Decision{Allowed: true, Limiter: "rdl", Limit: 2, Remaining: 0, ResetAfter: time.Minute}},
		{r, spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "rdl", Limit: 2, ResetAfter: time.Minute, RetryAfter: 30 * time.Second}},
	})
	left := peek(t, l, store, r)
	if len(left) != 12 || left["rda"] != 3 || left["rdk"] != 3 || left["rdl"] != 0 {
		t.Fatalf("peek = %v", left)
	}
}

// A nil request is malformed like a negative cost: Admit denies it with
// ReasonInvalid and Matches returns an error, never a panic.
func TestNilRequest(t *testing.T) {
	l := mustLimiter(t, "limits:\n  - id: ip\n    by: ip\n    bucket: 1/second\n", ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{Name: "api-tiers"})
	d, done, err := l.Admit(context.Background(), nil)
	if want := (spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: "api-tiers"}); d != want || err != nil || done == nil {
		t.Fatalf("Admit(nil) = %+v, %v; want %+v", d, err, want)
	}
	if ms, err := l.matches(context.Background(), nil); !errors.Is(err, spillway.ErrInvalidRequest) || ms != nil {
		t.Fatalf("Matches(nil) = %v, %v; want an error wrapping ErrInvalidRequest", ms, err)
	}
}

// Decisions carry their rule's window: Period for the windows, the time to
// refill the burst for the bucket family; the chain prefers them and httpx
// sends it as RateLimit-Policy's w=.
func TestWindow(t *testing.T) {
	cfg := `
limits:
  - id: login
    endpoint: /login
    by: ip
    bucket: 5/minute
  - id: search
    endpoint: /search
    by: ip
    bucket: 1000/minute, burst 200
  - id: hourly
    endpoint: /report
    by: ip
    bucket: 100/hour
    algorithm: fixed_window
`
	l := mustLimiter(t, cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
	for _, c := range []struct {
		endpoint string
		window   time.Duration
	}{{"/login", time.Minute}, {"/search", 12 * time.Second}, {"/report", time.Hour}} {
		d, _, err := l.Admit(context.Background(), req("GET", c.endpoint, "ip", "10.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Window != c.window {
			t.Errorf("%s: %+v, want allowed with Window %v", c.endpoint, d, c.window)
		}
	}
}
