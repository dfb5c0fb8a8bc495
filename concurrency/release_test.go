package concurrency

import (
	"context"
	"testing"

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
