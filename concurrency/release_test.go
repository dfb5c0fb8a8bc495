package concurrency

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/redistest"
)

// A release that fails while Redis is unreachable is kept and retried
// after the next Acquire Redis answers: the slot is free again at once
// once Redis is back, not after the TTL (a minute).
func TestFailedReleaseIsRetried(t *testing.T) {
	srv := redistest.Start(t)
	p, err := faultproxy.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	store, err := NewRedisStore(rdb, RedisSettings{})
	if err != nil {
		t.Fatal(err)
	}
	var releaseErrs int
	lim, err := New(store, 1, Settings{OnReleaseError: func(error) { releaseErrs++ }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, done, err := lim.Acquire(ctx, "k", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("first acquire: %+v %v", d, err)
	}
	if err := p.SetMode(faultproxy.Refuse); err != nil {
		t.Fatal(err)
	}
	done(spillway.Success)
	lim.WaitReleases() // done hands the release to the background
	if pending, dropped := lim.pendingReleases(); pending != 1 || dropped != 0 || releaseErrs != 1 {
		t.Fatalf("after a failed release: %d pending, %d dropped, %d errors; want 1, 0, 1", pending, dropped, releaseErrs)
	}
	if err := p.SetMode(faultproxy.Pass); err != nil {
		t.Fatal(err)
	}
	// The key is still held in Redis until the retry lands.
	if n, err := srv.Client(t).ZCard(ctx, store.key("concurrency", "k")).Result(); err != nil || n != 1 {
		t.Fatalf("in flight before the retry: %d %v; want 1", n, err)
	}
	// An Acquire Redis answers (another key) starts the retry.
	if d, done2, err := lim.Acquire(ctx, "other", 1); err != nil || !d.Allowed {
		t.Fatalf("acquire after the outage: %+v %v", d, err)
	} else {
		done2(spillway.Success)
	}
	lim.WaitReleases()
	if pending, dropped := lim.pendingReleases(); pending != 0 || dropped != 0 {
		t.Fatalf("after the retry: %d pending, %d dropped; want 0, 0", pending, dropped)
	}
	if d, _, err := lim.Acquire(ctx, "k", 1); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the released slot: %+v %v; want allowed (the retry freed it)", d, err)
	}
}

// A done whose release Redis does not answer returns at once, within the
// 1 ms the response may be delayed by: the release stays in flight on its
// own goroutine (not yet failed, so not kept for a retry) while the
// caller's response goes out, and it lands once Redis answers again.
func TestDoneReturnsBeforeAStalledRelease(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	store, err := NewRedisStore(rdb, RedisSettings{})
	if err != nil {
		t.Fatal(err)
	}
	const calls = 9
	lim, err := New(store, calls, Settings{ReleaseTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dones := make([]spillway.Done, calls)
	for i := range dones {
		d, done, err := lim.Acquire(ctx, "k", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("acquire %d: %+v %v", i, d, err)
		}
		dones[i] = done
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	took := make([]time.Duration, calls)
	for i, done := range dones {
		start := time.Now()
		done(spillway.Success)
		took[i] = time.Since(start)
	}
	// Every release is still waiting on the stopped Redis: none has
	// failed (its timeout is 2 s), so done returned without it.
	if pending, dropped := lim.pendingReleases(); pending != 0 || dropped != 0 {
		t.Fatalf("releases kept or dropped while Redis is stopped: %d, %d; want 0, 0 (still in flight)", pending, dropped)
	}
	slices.Sort(took)
	t.Logf("done with Redis stopped: min %v, median %v, max %v", took[0], took[calls/2], took[calls-1])
	if took[calls/2] >= time.Millisecond {
		t.Fatalf("median done took %v with Redis stopped: it waited for the release", took[calls/2])
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	lim.WaitReleases()
	if n, err := srv.Client(t).ZCard(ctx, store.key("concurrency", "k")).Result(); err != nil || n != 0 {
		t.Fatalf("in flight after Redis answered the releases: %d %v; want 0", n, err)
	}
}

// A client that sends its next request as soon as the last one answered
// finds its slot free under a limit of 1, although done returns before its
// release lands: the denied Acquire waits for the key's release in flight
// and asks again.
func TestSequentialClientFindsItsSlotFree(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	store, err := NewRedisStore(rdb, RedisSettings{})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := New(store, 1, Settings{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 200 {
		d, done, err := lim.Acquire(ctx, "k", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("request %d of a sequential client: %+v %v; want allowed", i, d, err)
		}
		done(spillway.Success)
	}
	lim.WaitReleases()
	if n, err := srv.Client(t).ZCard(ctx, store.key("concurrency", "k")).Result(); err != nil || n != 0 {
		t.Fatalf("in flight after the last release: %d %v; want 0", n, err)
	}
}
