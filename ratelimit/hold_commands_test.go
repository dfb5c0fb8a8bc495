package ratelimit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// scriptCommands returns the calls of each command INFO commandstats
// counts on c's server, leaving out what a client sends itself (script
// calls and loads, INFO, the connection's handshake): what remains is
// what the scripts ran.
func scriptCommands(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	calls := map[string]int64{}
	for name, st := range redistest.ReadCommandStats(t, c) {
		switch strings.Split(name, "|")[0] {
		case "eval", "evalsha", "script", "info", "hello", "client", "ping", "select":
			continue
		}
		calls[name] = int64(st.Calls)
	}
	return calls
}

// commandDelta is what ran between two scriptCommands, formatted in
// name order ("get=1 set=1").
func commandDelta(before, after map[string]int64) string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(after)) {
		if d := after[name] - before[name]; d != 0 {
			out = append(out, fmt.Sprintf("%s=%d", name, d))
		}
	}
	return strings.Join(out, " ")
}

// TestRedisHoldCommandCount pins the Redis commands the hold and settle
// scripts run (INFO commandstats deltas on a server of the test's own),
// with Redis TIME as in production: a reserve then a settle on a fresh
// key, and on a key with another live hold, and a peek of a marked key.
func TestRedisHoldCommandCount(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := mustRedisStore(c, RedisSettings{Prefix: "cmds:"})
	p := Policy{Limit: 100, Period: time.Hour}
	step := func(what, want string, f func()) {
		t.Helper()
		before := scriptCommands(t, c)
		f()
		if got := commandDelta(before, scriptCommands(t, c)); got != want {
			t.Errorf("%s: ran %q, want %q", what, got, want)
		}
	}
	reserve := func(key string) *Hold {
		t.Helper()
		h, err := s.Reserve(ctx, []Item{{Scope: "a", Key: key, Policy: p, Cost: 10}}, time.Minute)
		if err != nil || !h.allowed {
			t.Fatal(h, err)
		}
		return h
	}
	peek := func(key string) {
		t.Helper()
		out := make([]spillway.Decision, 1)
		if _, err := s.Decide(ctx, []Item{{Scope: "a", Key: key, Policy: p}}, out); err != nil {
			t.Fatal(err)
		}
	}
	// load the scripts: a first EVALSHA answered NOSCRIPT runs nothing
	mustSettle(t, reserve("warm"), 1, SettleApplied)
	peek("warm")

	var h *Hold
	step("reserve on a fresh key", "mget=1 set=1 time=1", func() { h = reserve("fresh") })
	step("its settle", "mget=1 set=1 time=1", func() { mustSettle(t, h, 4, SettleApplied) })
	step("its settle retried", "mget=1 time=1", func() { mustSettle(t, h.retried(), 4, SettleAlreadySettled) })

	other := reserve("busy") // a live hold that stays
	step("reserve beside a live hold, the first touch since the key was marked", "mget=1 set=1 time=1", func() { h = reserve("busy") })
	step("its settle", "mget=1 set=1 time=1", func() { mustSettle(t, h, 4, SettleApplied) })
	step("reserve beside a live hold", "mget=1 set=1 time=1", func() { h = reserve("busy") })
	step("its settle", "mget=1 set=1 time=1", func() { mustSettle(t, h, 4, SettleApplied) })
	step("a peek of the key", "get=1 time=1", func() { peek("busy") })
	mustSettle(t, other, 4, SettleApplied)

	other = reserve("peeked")
	step("a peek, the first touch since the key was marked", "get=1 time=1", func() { peek("peeked") })
	step("a peek again", "get=1 time=1", func() { peek("peeked") })
	h = reserve("peeked")
	step("a peek after a reserve", "get=1 time=1", func() { peek("peeked") })
	mustSettle(t, h, 4, SettleApplied)
	mustSettle(t, other, 4, SettleApplied)
}
