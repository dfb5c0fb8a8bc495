package globalceiling

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/lua"
)

// TestHugeCostDeniedEveryMode reproduces an overflow bug: one
// admission of cost MaxInt64 used to be allowed (the total wrapped, or came
// back negative through a Lua double) and left the ceiling switched off or
// broken. Now it is denied with ReasonCostExceedsLimit before anything is
// charged, and the next 300 requests of cost 1 get exactly the 99 that are
// left, with no error.
func TestHugeCostDeniedEveryMode(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	for _, mode := range []Mode{Exact, Cached, LocalAggregation} {
		t.Run(mode.String(), func(t *testing.T) {
			clock := newFakeClock()
			c, err := New(rdb, "huge-"+mode.String(), 100, time.Hour, Settings{Mode: mode, Clock: clock.Now, manualSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if d, err := c.admitN(ctx, spillway.Critical, 1); err != nil || !d.Allowed {
				t.Fatalf("cost 1: %+v %v", d, err)
			}
			w, _ := c.windowOf(clock.Now())
			before := shardValues(t, c, rdb, w)
			for _, cost := range []int64{math.MaxInt64, 1 << 62, 1<<53 + 1, 1 << 53, 101} {
				d, err := c.admitN(ctx, spillway.Critical, cost)
				want := spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: c.name, Limit: 100, Remaining: 99, ResetAfter: time.Hour}
				if err != nil || d != want {
					t.Fatalf("cost %d: %+v %v, want %+v", cost, d, err, want)
				}
				d, _, err = c.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: cost})
				if err != nil || d != want {
					t.Fatalf("Request.Cost %d: %+v %v, want %+v", cost, d, err, want)
				}
			}
			if after := shardValues(t, c, rdb, w); !equalInts(before, after) {
				t.Fatalf("a denied cost changed the shards: %v → %v", before, after)
			}
			admitted := 0
			for i := 0; i < 300; i++ {
				d, err := c.admitN(ctx, spillway.Critical, 1)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if d.Allowed {
					admitted++
				}
				if i%50 == 0 {
					if err := c.Sync(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			if admitted != 99 {
				t.Fatalf("admitted %d of 300 after the huge costs, want the 99 left", admitted)
			}
		})
	}
}

// TestConcurrentSyncKeepsBound reproduces a concurrent-sync bug: one
// Cached ceiling of 500 per hour, background sync off, 4 goroutines calling
// Sync while 8 admit, used to admit 698–1,620 (an older read overwrote a
// newer total, two syncs subtracted the same local count). Alone on Redis,
// one server's admissions never exceed its ceiling in either mode; with the
// background loop running too.
func TestConcurrentSyncKeepsBound(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []Mode{Cached, LocalAggregation} {
		for _, background := range []bool{false, true} {
			name := mode.String()
			s := Settings{Mode: mode, manualSync: true}
			if background {
				name += "/background"
				s = Settings{Mode: mode, SyncInterval: time.Millisecond, StaleAfter: time.Hour}
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				c := servers(t, srv, 1, 500, time.Hour, s)[0]
				var admitted atomic.Int64
				var stop atomic.Bool
				var wg, syncers sync.WaitGroup
				for g := 0; g < 4; g++ {
					syncers.Add(1)
					go func() {
						defer syncers.Done()
						for !stop.Load() {
							if err := c.Sync(ctx); err != nil {
								t.Error(err)
								return
							}
						}
					}()
				}
				for g := 0; g < 8; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < 400; i++ {
							d, err := c.admitN(ctx, spillway.Critical, 1)
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				stop.Store(true)
				syncers.Wait()
				if n := admitted.Load(); n > 500 {
					t.Fatalf("one server admitted %d, its bound is 500", n)
				}
				if err := c.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				// What it admitted is what Redis counted, once synced.
				w, _ := c.windowOf(time.Now())
				var sum int64
				for _, v := range shardValues(t, c, srv.Client(t), w) {
					sum += v
				}
				if sum != admitted.Load() {
					t.Fatalf("shards hold %d, admitted %d", sum, admitted.Load())
				}
			})
		}
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// gate is a go-redis hook that holds calls at a chosen point, so a test
// can interleave syncs and charges on a real Redis deterministically.
type gate struct {
	mu        sync.Mutex
	pipelines int           // hold the replies of this many more pipelines
	charges   int           // hold this many more single commands before they are sent
	held      chan struct{} // receives once per held call
	release   chan struct{} // closed to let the held calls go on
}

func newGate() *gate { return &gate{held: make(chan struct{}, 64), release: make(chan struct{})} }

func (g *gate) take(n *int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *n == 0 {
		return false
	}
	*n--
	return true
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && g.take(&g.charges) {
			g.held <- struct{}{}
			<-g.release
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		// Only a sync's pipeline (it reads the shards), not the
		// handshake go-redis sends on a new connection.
		if cmds[len(cmds)-1].Name() == "get" && g.take(&g.pipelines) {
			g.held <- struct{}{}
			<-g.release
		}
		return err
	}
}

// admitAll admits cost-1 Critical requests until one is denied and
// returns how many were admitted.
func admitAll(t *testing.T, c *Ceiling) int64 {
	t.Helper()
	var n int64
	for {
		d, err := c.admitN(context.Background(), spillway.Critical, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			return n
		}
		n++
	}
}

// TestOlderSyncNeverOverwritesNewer interleaves two syncs on one server
// deterministically: sync A reads, then is held before applying its read;
// the server admits 50 more; sync B starts. Before the fix B ran at once
// and A then applied its older total (and subtracted the local count
// again), so the server admitted 500 + 50 (LocalAggregation) or 500 + 150
// (Cached) of a ceiling of 500. Now B waits for A, and exactly 500 pass.
func TestOlderSyncNeverOverwritesNewer(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []Mode{Cached, LocalAggregation} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			rdb := srv.Client(t)
			g := newGate()
			rdb.AddHook(g)
			clock := newFakeClock()
			c, err := New(rdb, "older-"+mode.String(), 500, time.Hour, Settings{Mode: mode, Clock: clock.Now, manualSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The script is loaded, so sync A is not held on a NOSCRIPT
			// reply before its flush has landed.
			if err := lua.Script("ceiling_charge").Load(ctx, rdb).Err(); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 100; i++ {
				if d, err := c.admitN(ctx, spillway.Critical, 1); err != nil || !d.Allowed {
					t.Fatalf("admission %d: %+v %v", i, d, err)
				}
			}
			g.mu.Lock()
			g.pipelines = 1
			g.mu.Unlock()
			aDone := make(chan error, 1)
			go func() { aDone <- c.Sync(ctx) }()
			<-g.held // A has read (100) and is held before applying it
			for i := 0; i < 50; i++ {
				if d, err := c.admitN(ctx, spillway.Critical, 1); err != nil || !d.Allowed {
					t.Fatalf("admission %d: %+v %v", 100+i, d, err)
				}
			}
			bDone := make(chan error, 1)
			go func() { bDone <- c.Sync(ctx) }()
			select { // before the fix B finished at once; now it waits for A
			case err := <-bDone:
				bDone <- err
			case <-time.After(time.Second):
			}
			close(g.release)
			for _, ch := range []chan error{aDone, bDone} {
				if err := <-ch; err != nil {
					t.Fatal(err)
				}
			}
			if n := 150 + admitAll(t, c); n != 500 {
				t.Fatalf("the server admitted %d, its ceiling is 500", n)
			}
		})
	}
}

// TestCachedSyncWaitsForChargesInFlight: ten Cached admissions are
// counted locally and their charges held before they reach Redis while a
// sync reads the total. Before the fix the sync dropped them from the
// local count although its read could not include them, so the server
// admitted 510 of 500. Now they stay counted until a sync reads them.
func TestCachedSyncWaitsForChargesInFlight(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	g := newGate()
	rdb.AddHook(g)
	clock := newFakeClock()
	c, err := New(rdb, "inflight", 500, time.Hour, Settings{Mode: Cached, Clock: clock.Now, manualSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g.mu.Lock()
	g.charges = 10
	g.mu.Unlock()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, err := c.admitN(ctx, spillway.Critical, 1); err != nil || !d.Allowed {
				t.Errorf("held admission: %+v %v", d, err)
			}
		}()
	}
	for i := 0; i < 10; i++ {
		<-g.held
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	wg.Wait()
	if n := 10 + admitAll(t, c); n != 500 {
		t.Fatalf("the server admitted %d, its ceiling is 500", n)
	}
}

// TestChargeScriptRepliesExactCounts: the charge and refund scripts reply
// a shard's count exactly past 2^53 (where a Lua number rounds) up to
// MaxInt64, and refuse to wrap past it.
func TestChargeScriptRepliesExactCounts(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, c := range []struct{ start, add, want int64 }{
		{0, 5, 5},
		{1<<53 - 2, 1, 1<<53 - 1},
		{1 << 53, 1, 1<<53 + 1},
		{1<<53 + 1, 2, 1<<53 + 3},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{1, math.MaxInt64 - 1, math.MaxInt64},
	} {
		if err := rdb.Set(ctx, "k", c.start, 0).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := lua.Script("ceiling_charge").Run(ctx, rdb, []string{"k"}, c.add, 60000).Int64()
		if err != nil || n != c.want {
			t.Fatalf("charge %d on %d: %d %v, want %d", c.add, c.start, n, err, c.want)
		}
		back, err := lua.Script("ceiling_refund").Run(ctx, rdb, []string{"k"}, c.add).Int64()
		if err != nil || back != c.start {
			t.Fatalf("refund %d from %d: %d %v, want %d", c.add, c.want, back, err, c.start)
		}
	}
	if err := rdb.Set(ctx, "k", math.MaxInt64, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := lua.Script("ceiling_charge").Run(ctx, rdb, []string{"k"}, 1, 60000).Err(); err == nil || !strings.Contains(err.Error(), "overflow") {
		t.Fatalf("charge past MaxInt64: %v, want an overflow error", err)
	}
	if v, _ := rdb.Get(ctx, "k").Int64(); v != math.MaxInt64 {
		t.Fatalf("after a refused charge the shard holds %d", v)
	}
}
