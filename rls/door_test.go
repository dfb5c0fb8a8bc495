package rls

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/fallbackview"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

// slowStore holds each call in this process (before the store behind it,
// a real Redis) for as long as wait says: the server's own work, which
// SPILLWAY_MAX_IN_FLIGHT bounds.
type slowStore struct {
	ratelimit.Store
	wait atomic.Pointer[func()]
}

func (s *slowStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	if w := s.wait.Load(); w != nil {
		(*w)()
	}
	return s.Store.Decide(ctx, items, out)
}

// userPerDay returns a Service on store with one rule, 100 calls a day per
// user, and a call of user u1.
func userPerDay(t *testing.T, store ratelimit.Store, set Settings) (*Service, *pb.RateLimitRequest) {
	t.Helper()
	svc := NewService(store, set, nil)
	cfg, err := load(t, `
domain: door
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 100}
`)
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(cfg)
	return svc, &pb.RateLimitRequest{Domain: "door", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}}}}
}

// With SPILLWAY_MAX_IN_FLIGHT calls in flight and a mean call longer than
// the callers' deadline, every further call is refused at once, undecided
// (nothing charged, nothing decided by the local share), answered as
// SPILLWAY_LATE_ANSWER says and counted as shed; the calls in flight are
// decided by Redis.
func TestMaxInFlightShedsWhatItCannotServeInTime(t *testing.T) {
	rs := redistest.Start(t)
	set := DefaultSettings()
	if set.MaxInFlight != 256 {
		t.Fatalf("default SPILLWAY_MAX_IN_FLIGHT %d, want 256", set.MaxInFlight)
	}
	set.MaxInFlight, set.Budget = 2, 5*time.Second
	fs, err := newStore(rs.Client(t), set)
	if err != nil {
		t.Fatal(err)
	}
	store := &slowStore{Store: fs}
	svc, req := userPerDay(t, store, set)
	call := func(timeout time.Duration) (*pb.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return svc.ShouldRateLimit(ctx, req)
	}

	// One call of 60 ms teaches the door how long a call holds its slot.
	slow := func() { time.Sleep(60 * time.Millisecond) }
	store.wait.Store(&slow)
	if resp, err := call(time.Second); err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("first call: %v %v", resp, err)
	}
	// Two calls take both slots and stay.
	release, entered := make(chan struct{}), make(chan struct{}, 2)
	held := func() { entered <- struct{}{}; <-release }
	store.wait.Store(&held)
	var wg sync.WaitGroup
	var heldOK atomic.Int64
	for range 2 {
		wg.Go(func() {
			if resp, err := call(10 * time.Second); err == nil && resp.OverallCode == pb.RateLimitResponse_OK && resp.Statuses[0].LimitRemaining < 99 {
				heldOK.Add(1)
			}
		})
	}
	<-entered
	<-entered

	// 40 callers with 20 ms: none can be served in time.
	const callers = 40
	var refused, other atomic.Int64
	var cwg sync.WaitGroup
	for range callers {
		cwg.Go(func() {
			resp, err := call(20 * time.Millisecond)
			if status.Code(err) == codes.DeadlineExceeded && resp == nil {
				refused.Add(1)
			} else {
				other.Add(1)
			}
		})
	}
	cwg.Wait()
	close(release)
	wg.Wait()
	store.wait.Store(nil)

	shed, late := svc.stats.Shed.Load(), svc.stats.Late.Load()
	degraded, _ := fallbackview.StoreDegraded(fs)
	t.Logf("refused %d of %d (shed %d, late %d); held calls answered OK %d; local decisions %d", refused.Load(), callers, shed, late, heldOK.Load(), degraded)
	if refused.Load() != callers || other.Load() != 0 || shed != callers || late != 0 {
		t.Fatalf("%d refused, %d otherwise answered; shed %d, late %d; want all %d refused at once as shed", refused.Load(), other.Load(), shed, late, callers)
	}
	if heldOK.Load() != 2 || degraded != 0 || svc.stats.Degraded.Load() != 0 {
		t.Fatalf("held calls OK %d, local decisions %d, degraded descriptors %d; want 2 decided by Redis, none locally", heldOK.Load(), degraded, svc.stats.Degraded.Load())
	}
	if hs := fallbackview.StoreHealth(fs).(*fallback.Health).Stats(); hs.Failures != 0 || hs.Opened != 0 {
		t.Fatalf("health %+v; want no failure", hs)
	}
	// Nothing was charged for the refused calls: 100 - 1 - 2 - 1.
	if resp, err := call(time.Second); err != nil || resp.Statuses[0].LimitRemaining != 96 {
		t.Fatalf("call after: %v %v; want OK with 96 left", resp, err)
	}
}

// A call whose budget (SPILLWAY_BUDGET) runs out in this process before
// Redis could answer — here every call waits for the one pooled
// connection, which another caller holds idle — is shed: refused at once
// as SPILLWAY_LATE_ANSWER says, nothing decided locally, the breaker
// closed.
func TestOverloadedStoreCallIsShed(t *testing.T) {
	rs := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr, PoolSize: 1, PoolTimeout: 10 * time.Second})
	t.Cleanup(func() { client.Close() })
	set := DefaultSettings()
	set.Budget, set.LateAnswer = 40*time.Millisecond, "over_limit"
	fs, err := newStore(client, set)
	if err != nil {
		t.Fatal(err)
	}
	svc, req := userPerDay(t, fs, set)
	call := func() (*pb.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return svc.ShouldRateLimit(ctx, req)
	}
	if resp, err := call(); err != nil || resp.Statuses[0].LimitRemaining != 99 {
		t.Fatalf("first call: %v %v; want OK with 99 left", resp, err)
	}
	held := client.Conn()
	if err := held.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := range n {
		resp, err := call()
		if err != nil || resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || len(resp.Statuses) != 0 {
			t.Fatalf("call %d with the pool held: %v %v; want OVER_LIMIT at once, undecided", i, resp, err)
		}
	}
	_ = held.Close()
	degraded, _ := fallbackview.StoreDegraded(fs)
	hs := fallbackview.StoreHealth(fs).(*fallback.Health).Stats()
	t.Logf("shed %d, late %d, local %d; health %+v", svc.stats.Shed.Load(), svc.stats.Late.Load(), degraded, hs)
	if svc.stats.Shed.Load() != n || svc.stats.Late.Load() != 0 || degraded != 0 || fallbackview.StoreRefused(fs) != n {
		t.Fatalf("shed %d, late %d, local %d, refused by the store %d; want %d shed, none local", svc.stats.Shed.Load(), svc.stats.Late.Load(), degraded, fallbackview.StoreRefused(fs), n)
	}
	if hs.State != fallback.Closed || hs.Failures != 0 || hs.Overloaded != n {
		t.Fatalf("health %+v; want closed, no failure, %d overloaded", hs, n)
	}
	if resp, err := call(); err != nil || resp.Statuses[0].LimitRemaining != 98 {
		t.Fatalf("after: %v %v; want OK with 98 left", resp, err)
	}
}
