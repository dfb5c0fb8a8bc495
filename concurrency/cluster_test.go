package concurrency

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// TestRedisCluster: on a 3-primary Cluster each key's set lives in the
// slot of its entity's hash tag, so the limit holds per key exactly as on
// one node, and keys of different users land on different primaries.
func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	ctx := context.Background()
	store, err := NewRedisStore(cl.Client(t), RedisSettings{})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := New(store, 2, Settings{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]bool{}
	for u := 0; u < 12; u++ {
		key := "user-" + strconv.Itoa(u)
		var dones []spillway.Done
		for i := 0; i < 3; i++ {
			d, done, err := lim.Acquire(ctx, key, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (i < 2) {
				t.Fatalf("%s acquisition %d: %+v", key, i, d)
			}
			dones = append(dones, done)
		}
		for _, done := range dones {
			done(spillway.Success)
		}
		lim.WaitReleases()
		if d, _, err := lim.Acquire(ctx, key, 1); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%s after release: %+v %v", key, d, err)
		}
		owner, err := cl.OwnerOfKey(ctx, store.key("concurrency", key))
		if err != nil {
			t.Fatal(err)
		}
		owners[owner.Addr] = true
	}
	if len(owners) < 2 {
		t.Fatalf("12 users' sets all on %d primary", len(owners))
	}
	// A request of cost 2 is 2 members of the user's one key: one slot,
	// one script call, no CROSSSLOT.
	for u := 0; u < 12; u++ {
		key := "weighted-" + strconv.Itoa(u)
		d, done, err := lim.Acquire(ctx, key, 2)
		if err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s cost 2: %+v %v", key, d, err)
		}
		if d, _, err := lim.Acquire(ctx, key, 1); err != nil || d.Allowed {
			t.Fatalf("%s cost 1 beside a cost 2: %+v %v; want denied", key, d, err)
		}
		done(spillway.Success)
		lim.WaitReleases()
		if d, _, err := lim.Acquire(ctx, key, 1); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%s after the cost 2 is done: %+v %v", key, d, err)
		}
	}
}
