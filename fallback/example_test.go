package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/ratelimit"
)

// downStore is a shared store that is down.
type downStore struct{}

func (downStore) Decide(context.Context, []ratelimit.Item, []spillway.Decision) (bool, error) {
	return false, errors.New("dial tcp: connection refused")
}
func (downStore) Reset(context.Context, string, string, ratelimit.Policy) error { return nil }

// While the shared store is down, each server admits its 20% share of the
// quota, marked Degraded, and the breaker stops calling the store after K
// failures.
func ExampleNewStore() {
	store, err := fallback.NewStore(downStore{}, fallback.Settings{Failures: 2})
	if err != nil {
		panic(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Policy{Limit: 10, Period: time.Hour}, ratelimit.Settings{Scope: "api"})
	if err != nil {
		panic(err)
	}
	for i := 0; i < 3; i++ {
		d, err := lim.Allow(context.Background(), "alice", 1)
		fmt.Println(d.Allowed, d.Degraded, d.Limit, d.Remaining, err)
	}
	fmt.Println(store.State())
	// Output:
	// true true 2 1 <nil>
	// true true 2 0 <nil>
	// false true 2 0 <nil>
	// open
}

// A limit that must not run unchecked fails closed: its items say so, and
// the Store honours it with no other wiring.
func ExampleStore_failClosed() {
	store, err := fallback.NewStore(downStore{}, fallback.Settings{})
	if err != nil {
		panic(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Policy{Limit: 5, Period: time.Minute}, ratelimit.Settings{Scope: "login", FailMode: spillway.FailClosed})
	if err != nil {
		panic(err)
	}
	d, _ := lim.Allow(context.Background(), "alice", 1)
	fmt.Println(d.Allowed, d.Reason, d.Reason.IsShed(), d.RetryAfter)
	// Output:
	// false fail_closed true 1s
}
