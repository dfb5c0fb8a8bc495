package ratelimit

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/lua"
)

// gateHook counts the script calls of a client and holds the n-th one
// (1-based) until hold[n] is closed; entered[n] is closed when it arrives.
type gateHook struct {
	mu      sync.Mutex
	calls   int
	keys    [][]string // KEYS of each call
	hold    map[int]chan struct{}
	entered map[int]chan struct{}
}

func newGateHook(held ...int) *gateHook {
	h := &gateHook{hold: map[int]chan struct{}{}, entered: map[int]chan struct{}{}}
	for _, n := range held {
		h.hold[n] = make(chan struct{})
		h.entered[n] = make(chan struct{})
	}
	return h
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		args := cmd.Args()
		keys := make([]string, args[2].(int))
		for i := range keys {
			keys[i] = args[3+i].(string)
		}
		h.mu.Lock()
		h.calls++
		n := h.calls
		h.keys = append(h.keys, keys)
		hold, entered := h.hold[n], h.entered[n]
		h.mu.Unlock()
		if hold != nil {
			close(entered)
			<-hold
		}
		return next(ctx, cmd)
	}
}

func (h *gateHook) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// loadScripts loads the rate-limit scripts, so that every script call is
// one EVALSHA (no NOSCRIPT retry) for a gateHook to count.
func loadScripts(t *testing.T, c *redis.Client) {
	t.Helper()
	for _, sc := range []*redis.Script{lua.Script("ratelimit_buckets"), lua.Script("ratelimit_batch"), lua.Script("ratelimit_fixed"), lua.Script("ratelimit_token_bucket")} {
		if err := sc.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// waitQueued waits until s's coalescer holds n queued batches.
func waitQueued(t *testing.T, s *RedisStore, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.co.mu.Lock()
		got := len(s.co.queue)
		s.co.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d batches queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	ok  bool
	out []spillway.Decision
	err error
}

// decideAsync runs s.Decide(ctx, items) in a goroutine.
func decideAsync(ctx context.Context, s Store, items ...Item) <-chan result {
	ch := make(chan result, 1)
	go func() {
		out := make([]spillway.Decision, len(items))
		ok, err := s.Decide(ctx, items, out)
		ch <- result{ok, out, err}
	}()
	return ch
}

// Batches queued behind a call in flight go out as one script call and are
// decided exactly as one after the other in queue order: a denied batch
// charges nothing of its own (not even its items that had room) and
// changes nothing another batch sees, and an allowed batch's charge is
// seen by the batches after it. The memory store, deciding the same
// batches in the same order, is the oracle; the expected decisions are
// also spelled out.
func TestRedisStoreCoalescedAsSequential(t *testing.T) {
	for _, tc := range []struct {
		name string
		alg  Algorithm
	}{{"buckets-script", TokenBucket}, {"fixed-script", FixedWindow}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := redisServer(t)
			c := srv.Client(t)
			ctx := context.Background()
			loadScripts(t, c)
			hook := newGateHook(2) // call 1 pre-drains y, call 2 is the one in flight
			c.AddHook(hook)
			clk := testclock.New(rt0)
			rs := mustRedisStore(c, RedisSettings{Clock: clk.Now, Coalescing: 1})
			ms := NewMemoryStore(MemorySettings{Clock: clk.Now})
			// 3 per 1000 s: nothing refills during the test
			p := Policy{Algorithm: tc.alg, Limit: 3, Period: 1000 * time.Second, Burst: 3}
			it := func(key string, n int64) Item { return Item{Scope: "s", Key: key, Policy: p, Cost: n} }

			batches := [][]Item{
				{it("y", 3)},             // drains y (alone, before the test)
				{it("z", 1)},             // the call in flight
				{it("x", 1), it("y", 1)}, // A: x has room, y not: denied, charges nothing
				{it("x", 3)},             // B: takes all of x, allowed only if A charged nothing
				{it("x", 1)},             // C: sees B's charge: denied
				{it("x", 0), it("w", 2)}, // D: a peek of x and 2 of w: allowed
			}
			var want []result
			for _, b := range batches {
				out := make([]spillway.Decision, len(b))
				ok, err := ms.Decide(ctx, b, out)
				want = append(want, result{ok, out, err})
			}
			got := make([]result, len(batches))
			got[0] = <-decideAsync(ctx, rs, batches[0]...)
			inFlight := decideAsync(ctx, rs, batches[1]...)
			<-hook.entered[2]
			var queued []<-chan result
			for i, b := range batches[2:] {
				queued = append(queued, decideAsync(ctx, rs, b...))
				waitQueued(t, rs, i+1)
			}
			close(hook.hold[2])
			got[1] = <-inFlight
			for i, ch := range queued {
				got[2+i] = <-ch
			}

			if n := hook.count(); n != 3 {
				t.Fatalf("%d script calls, want 3 (one for A, B, C and D together)", n)
			}
			if k := hook.keys[2]; len(k) != 6 {
				t.Fatalf("the coalesced call carried keys %v, want the 6 of A, B, C and D", k)
			}
			for i := range batches {
				if got[i].err != nil || got[i].ok != want[i].ok {
					t.Fatalf("batch %d: redis %v %v, memory %v", i, got[i].ok, got[i].err, want[i].ok)
				}
				for j := range got[i].out {
					if got[i].out[j] != want[i].out[j] {
						t.Fatalf("batch %d item %d:\n redis  %+v\n memory %+v", i, j, got[i].out[j], want[i].out[j])
					}
				}
			}
			// spelled out, so that the oracle cannot drift with the store
			oks := []bool{true, true, false, true, false, true}
			for i, ok := range oks {
				if got[i].ok != ok {
					t.Fatalf("batch %d allowed = %v, want %v", i, got[i].ok, ok)
				}
			}
			if a := got[2].out; !a[0].Allowed || a[0].Remaining != 2 || a[1].Allowed || a[1].Reason != spillway.ReasonRateLimited {
				t.Fatalf("A = %+v, want x with room (2 left) and y denied", a)
			}
			if b := got[3].out[0]; b.Remaining != 0 {
				t.Fatalf("B = %+v, want 0 left", b)
			}
			if d := got[5].out; d[0].Remaining != 0 || d[1].Remaining != 1 {
				t.Fatalf("D = %+v, want x empty and w with 1 left", d)
			}
			// the state left behind is the memory store's
			for _, key := range []string{"x", "y", "z", "w"} {
				var r, m [1]spillway.Decision
				if _, err := rs.Decide(ctx, []Item{it(key, 0)}, r[:]); err != nil {
					t.Fatal(err)
				}
				_, _ = ms.Decide(ctx, []Item{it(key, 0)}, m[:])
				if r != m {
					t.Fatalf("peek %s: redis %+v, memory %+v", key, r[0], m[0])
				}
			}
		})
	}
}

// A caller whose context ends while its batch is queued gets an error
// wrapping ctx.Err(), and its batch is never sent: it charges nothing and
// the others are decided without it. One whose context ends while the
// coalesced call is out returns at once; the others get their results.
func TestRedisStoreCoalescedCancel(t *testing.T) {
	srv, _ := redisServer(t)
	c := srv.Client(t)
	ctx := context.Background()
	loadScripts(t, c)
	hook := newGateHook(1, 2)
	c.AddHook(hook)
	clk := testclock.New(rt0)
	rs := mustRedisStore(c, RedisSettings{Clock: clk.Now, Coalescing: 1})
	p := Policy{Limit: 3, Period: 1000 * time.Second, Burst: 3}
	it := func(key string, n int64) Item { return Item{Scope: "s", Key: key, Policy: p, Cost: n} }

	first := decideAsync(ctx, rs, it("z", 1)) // call 1, held
	<-hook.entered[1]
	ctxA, cancelA := context.WithCancel(ctx)
	a := decideAsync(ctxA, rs, it("x", 3))
	waitQueued(t, rs, 1)
	b := decideAsync(ctx, rs, it("x", 3))
	waitQueued(t, rs, 2)
	ctxC, cancelC := context.WithCancel(ctx)
	defer cancelC()
	cc := decideAsync(ctxC, rs, it("v", 1))
	waitQueued(t, rs, 3)

	cancelA() // A is still queued: never sent
	ra := <-a
	if !errors.Is(ra.err, context.Canceled) || ra.ok {
		t.Fatalf("canceled queued batch: %v %v, want an error wrapping context.Canceled", ra.ok, ra.err)
	}
	waitQueued(t, rs, 2)
	close(hook.hold[1])
	if r := <-first; r.err != nil || !r.ok {
		t.Fatalf("call in flight: %v %v", r.ok, r.err)
	}
	<-hook.entered[2] // B and C, coalesced, are out
	cancelC()
	if r := <-cc; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("canceled sent batch: %v, want an error wrapping context.Canceled", r.err)
	}
	close(hook.hold[2])
	rb := <-b
	if rb.err != nil || !rb.ok || rb.out[0].Remaining != 0 {
		t.Fatalf("B: %v %v %+v, want allowed with 0 left (A charged nothing)", rb.ok, rb.err, rb.out[0])
	}
	if n := hook.count(); n != 2 {
		t.Fatalf("%d script calls, want 2", n)
	}
	if k := hook.keys[1]; len(k) != 2 {
		t.Fatalf("the coalesced call carried keys %v, want B's and C's", k)
	}
}

// Without coalescing every batch makes its own call, even with calls in
// flight.
func TestRedisStoreCoalescingOff(t *testing.T) {
	srv, _ := redisServer(t)
	c := srv.Client(t)
	ctx := context.Background()
	loadScripts(t, c)
	hook := newGateHook(1)
	c.AddHook(hook)
	rs := mustRedisStore(c, RedisSettings{Coalescing: -1})
	if rs.co != nil {
		t.Fatal("Coalescing -1 left coalescing on")
	}
	p := Policy{Limit: 3, Period: 1000 * time.Second, Burst: 3}
	first := decideAsync(ctx, rs, Item{Scope: "s", Key: "a", Policy: p, Cost: 1})
	<-hook.entered[1]
	for _, k := range []string{"b", "c"} {
		if r := <-decideAsync(ctx, rs, Item{Scope: "s", Key: k, Policy: p, Cost: 1}); r.err != nil || !r.ok {
			t.Fatalf("%s: %v %v", k, r.ok, r.err)
		}
	}
	close(hook.hold[1])
	if r := <-first; r.err != nil || !r.ok {
		t.Fatalf("a: %v %v", r.ok, r.err)
	}
	if n := hook.count(); n != 3 {
		t.Fatalf("%d script calls, want 3", n)
	}
	if s := mustRedisStore(c); s.co == nil || s.co.max != DefaultCoalescing {
		t.Fatalf("default store: coalescing %+v, want on with %d calls", s.co, DefaultCoalescing)
	}
}

// A hung Redis (SIGSTOP) holds neither a queued caller past the end of its
// own context nor the coalescer after Redis is back: the caller in flight
// and the queued ones (sent in a coalesced call that hangs too) each
// return at once with an error wrapping their context's, and once Redis
// resumes, decisions succeed again. The queued callers' contexts end by
// cancel, in a fixed order, not by deadlines: on a loaded machine a
// deadline can pass before the test has queued every caller, and the test
// would then check another path.
func TestRedisStoreCoalescedHungRedis(t *testing.T) {
	ctx := context.Background()
	rs, it, resume := hungCoalescingStore(t)
	// A call on the stopped Redis returns at its deadline (go-redis
	// honours deadlines, not cancellation, once a command is sent). The
	// socket's deadline and the context's are two runtime timers set to
	// the same instant: on a loaded machine the read can time out before
	// the context's timer has run, and go-redis then returns the socket's
	// timeout rather than the context's error. Either is the deadline;
	// returning before it, or anything else, is wrong.
	ctx1, cancel1 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel1()
	deadline1, _ := ctx1.Deadline()
	var out1 [1]spillway.Decision
	ok, err := rs.Decide(ctx1, []Item{it("a")}, out1[:])
	if early := time.Now().Before(deadline1); ok || early || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) {
		t.Fatalf("a call on a hung Redis: %v %v (before its deadline: %v), want a timeout at its deadline", ok, err, early)
	}
	// Batches queue behind a call in flight: the test holds the place of
	// one (so no deadline of a real call can pass before every batch is
	// queued), then lets it go.
	rs.co.mu.Lock()
	rs.co.inflight++
	rs.co.mu.Unlock()
	waitInflight(t, rs, 1)
	var (
		queued  []<-chan result
		cancels []context.CancelFunc
	)
	for i, k := range []string{"b", "c", "d"} {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cancels = append(cancels, cancel)
		queued = append(queued, decideAsync(cctx, rs, it(k)))
		waitQueued(t, rs, i+1)
	}
	rs.co.release(rs)
	// The call in flight ended: the three queued batches went out as one
	// coalesced call, which hangs on the stopped Redis.
	waitQueued(t, rs, 0)
	waitInflight(t, rs, 1)
	for i, ch := range queued {
		cancels[i]()
		r := <-ch
		if !errors.Is(r.err, context.Canceled) || r.ok {
			t.Fatalf("queued caller %d on a hung Redis: %v %v, want an error wrapping context.Canceled", i, r.ok, r.err)
		}
		if !strings.Contains(r.err.Error(), "coalesced call") {
			t.Fatalf("queued caller %d: %v, want the error of a sent coalesced call", i, r.err)
		}
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"e", "f"} {
		var out [1]spillway.Decision
		if ok, err := rs.Decide(ctx, []Item{it(k)}, out[:]); err != nil || !ok {
			t.Fatalf("after resume, %s: %v %v", k, ok, err)
		}
	}
}

// waitInflight waits until s's coalescer has n calls in flight.
func waitInflight(t *testing.T, s *RedisStore, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.co.mu.Lock()
		got := s.co.inflight
		s.co.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in flight, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// decideByAsync runs s.DecideBy(ctx, deadline, items) in a goroutine and
// reports when it returned.
func decideByAsync(ctx context.Context, s boundedStore, deadline time.Time, items ...Item) <-chan timedResult {
	ch := make(chan timedResult, 1)
	go func() {
		out := make([]spillway.Decision, len(items))
		ok, err := s.DecideBy(ctx, deadline, items, out)
		ch <- timedResult{result{ok, out, err}, time.Now()}
	}()
	return ch
}

type timedResult struct {
	result
	at time.Time
}

// DecideBy bounds a call by its deadline without a context of the
// caller's: on a stopped Redis a call of its own, a queued batch that is
// never sent, and the batches of a coalesced call in flight each return an
// error wrapping context.DeadlineExceeded, none before its own deadline;
// the unsent batch leaves the queue. Batches whose deadlines fall in one
// millisecond share one expiry.
func TestRedisStoreDecideByHungRedis(t *testing.T) {
	ctx := context.Background()
	rs, it, resume := hungCoalescingStore(t)
	isTimeout := func(err error) bool {
		return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
	}

	// A call of its own: the store gives it a context with the deadline
	// (the socket's deadline or the context's, whichever timer runs first).
	d0 := time.Now().Add(200 * time.Millisecond)
	r0 := <-decideByAsync(ctx, rs, d0, it("a"))
	if r0.ok || r0.at.Before(d0) || !isTimeout(r0.err) {
		t.Fatalf("a call of its own on a hung Redis: %v %v at %v, want a timeout not before %v", r0.ok, r0.err, r0.at, d0)
	}

	// A queued batch that is never sent: the test holds the only place in
	// flight.
	rs.co.mu.Lock()
	rs.co.inflight++
	rs.co.mu.Unlock()
	waitInflight(t, rs, 1)
	d1 := time.Now().Add(200 * time.Millisecond)
	r1 := <-decideByAsync(ctx, rs, d1, it("b"))
	if r1.ok || r1.at.Before(d1) || !errors.Is(r1.err, context.DeadlineExceeded) || !strings.Contains(r1.err.Error(), "not sent") {
		t.Fatalf("a queued batch at its deadline: %v %v at %v, want 'not sent' wrapping context.DeadlineExceeded, not before %v", r1.ok, r1.err, r1.at, d1)
	}
	waitQueued(t, rs, 0)

	// Three batches queue, two with deadlines in one millisecond; then
	// they go out as one coalesced call, which hangs.
	base := time.Now().Add(300 * time.Millisecond).Truncate(time.Millisecond)
	deadlines := []time.Time{base.Add(100 * time.Microsecond), base.Add(900 * time.Microsecond), base.Add(50 * time.Millisecond)}
	var queued []<-chan timedResult
	// the expiry each batch waits on: its deadline rounded up to the
	// millisecond (the third's is a whole millisecond already)
	ats := []time.Time{base.Add(time.Millisecond), base.Add(time.Millisecond), base.Add(50 * time.Millisecond)}
	var exps []*expiry
	for i, k := range []string{"c", "d", "e"} {
		queued = append(queued, decideByAsync(ctx, rs, deadlines[i], it(k)))
		waitQueued(t, rs, i+1)
		waitFor(t, "the batch's expiry", func() bool {
			e := rs.co.exp.Load()
			return e != nil && e.at == ats[i].UnixNano()
		})
		exps = append(exps, rs.co.exp.Load())
	}
	if exps[0] != exps[1] || exps[1] == exps[2] {
		t.Fatalf("expiries %p %p %p: want the first two shared, the third its own", exps[0], exps[1], exps[2])
	}
	rs.co.release(rs)
	waitQueued(t, rs, 0)
	waitInflight(t, rs, 1)
	// The first two leave at their expiry, while the call goes on; the
	// call itself ends at the latest deadline, the third's, which then
	// gets either its expiry or the call's own error.
	for i, ch := range queued {
		r := <-ch
		want := isTimeout(r.err)
		if i < 2 {
			want = errors.Is(r.err, context.DeadlineExceeded) && strings.Contains(r.err.Error(), "coalesced call")
		}
		if r.ok || r.at.Before(deadlines[i]) || !want {
			t.Fatalf("sent batch %d: %v %v at %v, want a timeout (a sent coalesced call's context.DeadlineExceeded for the first two), not before %v", i, r.ok, r.err, r.at, deadlines[i])
		}
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	waitInflight(t, rs, 0)
	var out [1]spillway.Decision
	if ok, err := rs.DecideBy(ctx, time.Now().Add(10*time.Second), []Item{it("f")}, out[:]); err != nil || !ok || out[0].Remaining != 2 {
		t.Fatalf("after resume: %v %+v %v, want allowed with 2 left", ok, out[0], err)
	}
}

// waitFor polls cond until it holds (10s at most).
func waitFor(t *testing.T, what string, cond func() bool) {
	redistest.WaitFor(t, what, time.Millisecond, cond)
}

// hungCoalescingStore is a coalescing RedisStore (Coalescing 1) on a
// redis-server stopped with SIGSTOP until resume runs (at the latest when
// the test ends), its client honouring context deadlines as package
// fallback asks, and a maker of items of a 3-per-1000 s policy.
func hungCoalescingStore(t *testing.T) (rs *RedisStore, it func(key string) Item, resume func() error) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	loadScripts(t, c)
	p := Policy{Limit: 3, Period: 1000 * time.Second, Burst: 3}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var err error
	resume = func() error {
		once.Do(func() { err = srv.Resume() })
		return err
	}
	t.Cleanup(func() { _ = resume() })
	return mustRedisStore(c, RedisSettings{Coalescing: 1}), func(key string) Item { return Item{Scope: "s", Key: key, Policy: p, Cost: 1} }, resume
}
