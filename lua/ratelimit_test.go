package lua

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

// The rate-limit scripts open with their contract and load on a real
// server under the SHA go-redis computes (so EVALSHA finds them).
func TestRateLimitScripts(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for name, sc := range map[string]struct {
		src    string
		script *redis.Script
	}{
		"ratelimit_batch.lua":        {ratelimitBatchSrc, rateLimitBatch},
		"ratelimit_token_bucket.lua": {ratelimitTokenBucketSrc, rateLimitTokenBucket},
		"ratelimit_buckets.lua":      {ratelimitBucketsSrc, rateLimitBuckets},
		"ratelimit_refund.lua":       {ratelimitRefundSrc, rateLimitRefund},
		"ratelimit_hold.lua":         {ratelimitHoldSrc, rateLimitHold},
		"ratelimit_settle.lua":       {ratelimitSettleSrc, rateLimitSettle},
	} {
		if !strings.HasPrefix(sc.src, "-- "+name+":") {
			t.Errorf("%s does not open with its name and purpose", name)
		}
		head := sc.src[:strings.Index(sc.src, "\nlocal ")]
		for _, part := range []string{"KEYS[", "ARGV[", "Reply", "Writes"} {
			if !strings.Contains(head, part) {
				t.Errorf("%s: the opening contract does not mention %s", name, part)
			}
		}
		sha, err := sc.script.Load(ctx, c).Result()
		if err != nil {
			t.Fatalf("%s: SCRIPT LOAD: %v", name, err)
		}
		if sha != sc.script.Hash() {
			t.Errorf("%s: server SHA %s, go-redis %s", name, sha, sc.script.Hash())
		}
	}
}

// bucketsArgs is the buckets script's ARGV for one group of items of one
// policy (T, tau) with the given costs, the reply carrying the TATs.
func bucketsArgs(now string, T, tau int64, costs ...int64) []any {
	args := []any{now, -1, T, tau, 1, len(costs)}
	for _, n := range costs {
		if n == 1 {
			args = append(args, 1)
		} else {
			args = append(args, -1, n)
		}
	}
	return args
}

// rateLimitBuckets replies its now, one wait per item and the TAT each item
// saw, lets an item see the charges of earlier items on its key, clamps a
// clock gone backwards, and writes only when every item has room.
func TestRateLimitBuckets(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T   = 100_000_000 // 100 s: the TTLs outlive any stall of the test
		tau = 5 * T
		now = 1_000_000_000_000
	)
	run := func(now string, keys []string, costs ...int64) []any {
		t.Helper()
		res, err := rateLimitBuckets.Run(ctx, c, keys, bucketsArgs(now, T, tau, costs...)...).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.([]any)
	}
	check := func(got []any, want ...int64) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("reply %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("reply %v, want %v", got, want)
			}
		}
	}
	state := func(key string, want string) {
		t.Helper()
		v, err := c.Get(ctx, key).Result()
		if want == "" {
			if err != redis.Nil {
				t.Fatalf("%s = %q (%v), want absent", key, v, err)
			}
			return
		}
		if err != nil || v != want {
			t.Fatalf("%s = %q (%v), want %q", key, v, err, want)
		}
	}
	if err := c.RPush(ctx, "k3", "x").Err(); err != nil {
		t.Fatal(err)
	}
	// k1 is charged 2 then 3 (the second item waits for the first), k2
	// peeked, k3 (a list) reads as full and is overwritten.
	check(run("1000000000000", []string{"k1", "k1", "k2", "k3"}, 2, 3, 0, 1), now, 0, 2*T, 0, 0, 0, now+2*T, 0, 0)
	state("k1", "1000500000000")
	state("k2", "")
	state("k3", "1000100000000")
	if ttl, err := c.PTTL(ctx, "k1").Result(); err != nil || ttl > 500*time.Second || ttl < 490*time.Second {
		t.Fatalf("PTTL k1 = %v (%v), want 500s", ttl, err)
	}
	// k1 is full: the batch is denied and nothing is written (not k2).
	check(run("1000000000000", []string{"k2", "k1"}, 1, 1), now, 0, tau, 0, now+tau)
	state("k2", "")
	state("k1", "1000500000000")
	// A clock gone backwards is clamped to TAT - tau; a cost above the
	// capacity is denied.
	check(run("0", []string{"k1", "k2"}, 0, 6), 0, tau, 0, now+tau, 0)
	state("k1", "1000500000000")
	state("k2", "")
	// Later: room again.
	check(run("1000300000000", []string{"k1"}, 1), now+3*T, 2*T, now+tau)
	state("k1", "1000600000000")
	// More keys than one MGET reads: the last one still sees its state.
	many := make([]string, 2500)
	costs := make([]int64, len(many))
	for i := range many {
		many[i] = fmt.Sprint("m", i)
		costs[i] = 1
	}
	many[len(many)-1] = "k1"
	got := run("1000300000000", many, costs...)
	want := make([]int64, 1+2*len(many))
	want[0] = now + 3*T
	want[len(many)] = 3 * T
	want[2*len(many)] = now + 6*T
	check(got, want...)
	state("m1999", "1000400000000")
	state("k1", "1000700000000")
}

// rateLimitRefund restores a bucket item's TAT from before the charge
// exactly when the key still holds what the charge wrote: it deletes the
// key only when there was no state, keeps a TAT at or before now (a clock
// that goes back is clamped by it) with the charge's TTL, undoes items last
// first (two items on one key), and gives back n·T when another charge
// landed in between.
func TestRateLimitRefundBucket(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T   = 100_000_000 // 100 s: the TTLs outlive any stall of the test
		tau = 5 * T
		now = 1_000_000_000_000
	)
	nowS := fmt.Sprint(now)
	charge := func(keys []string, costs ...int64) {
		t.Helper()
		if err := rateLimitBuckets.Run(ctx, c, keys, bucketsArgs(nowS, T, tau, costs...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// item: cost n, the TAT it saw (mark) and the TAT' it wrote.
	type item struct {
		key         string
		n           int64
		mark, wrote int64
	}
	refundArgs := func(items []item) ([]string, []any) {
		keys := make([]string, len(items))
		args := []any{nowS}
		for i, it := range items {
			keys[i] = it.key
			args = append(args, "token_bucket", T, it.n, "", it.mark, 0, 0, it.wrote, 0, 0)
		}
		return keys, args
	}
	refund := func(want int64, items ...item) {
		t.Helper()
		keys, args := refundArgs(items)
		got, err := rateLimitRefund.Run(ctx, c, keys, args...).Int64()
		if err != nil || got != want {
			t.Fatalf("refund %+v: %d %v, want %d exactly restored", items, got, err, want)
		}
	}
	state := func(key string, want string, minTTL time.Duration) {
		t.Helper()
		v, err := c.Get(ctx, key).Result()
		if want == "" {
			if err != redis.Nil {
				t.Fatalf("%s = %q (%v), want absent", key, v, err)
			}
			return
		}
		if err != nil || v != want {
			t.Fatalf("%s = %q (%v), want %q", key, v, err, want)
		}
		if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl < minTTL || ttl > minTTL+10*time.Second {
			t.Fatalf("PTTL %s = %v (%v), want about %v", key, ttl, err, minTTL)
		}
	}

	// No state before the charge: the refund deletes the key.
	charge([]string{"a"}, 2)
	refund(1, item{"a", 2, 0, now + 2*T})
	state("a", "", 0)

	// A state the refund leaves not full: set back with its TTL.
	if err := c.Set(ctx, "b", now+2*T, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	charge([]string{"b"}, 1)
	refund(1, item{"b", 1, now + 2*T, now + 3*T})
	state("b", fmt.Sprint(now+2*T), 290*time.Second) // the charge's TTL

	// Two items on one key: undone last first, back to no state.
	charge([]string{"r", "r"}, 1, 2)
	refund(2, item{"r", 1, 0, now + T}, item{"r", 2, now + T, now + 3*T})
	state("r", "", 0)

	// Another charge landed after ours: n·T is given back (not exact).
	charge([]string{"x"}, 1)
	charge([]string{"x"}, 1)
	refund(0, item{"x", 1, 0, now + T})
	state("x", fmt.Sprint(now+T), 90*time.Second)

	// A state at or before now (full, but it clamps a clock that goes back)
	// is kept, not deleted, with the charge's TTL.
	if err := c.Set(ctx, "s", now-5, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	charge([]string{"s"}, 1)
	refund(1, item{"s", 1, now - 5, now + T})
	state("s", fmt.Sprint(now-5), 90*time.Second)
}

// rateLimitRefund restores a window's state from before the charge when
// the key still holds what the charge wrote (even a past window, which
// clamps a clock that goes back), and otherwise takes the cost off the
// charged window.
func TestRateLimitRefundWindows(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	cases := []struct {
		name, key, before string
		alg               string
		n                 int64
		old, wrote        [3]int64
		want              string // "" absent
		exact             int64
	}{
		{"fixed: past window restored", "f1", "8:1", "fixed_window", 1, [3]int64{7, 2}, [3]int64{8, 1}, "7:2", 1},
		{"fixed: no state before", "f2", "8:1", "fixed_window", 1, [3]int64{}, [3]int64{8, 1}, "", 1},
		{"fixed: charged since", "f3", "8:3", "fixed_window", 1, [3]int64{}, [3]int64{8, 1}, "8:2", 0},
		{"counter: past window restored", "c1", "9:2:1", "sliding_window_counter", 1, [3]int64{8, 1, 2}, [3]int64{9, 2, 1}, "8:1:2", 1},
		{"counter: no state before", "c2", "9:0:3", "sliding_window_counter", 3, [3]int64{}, [3]int64{9, 0, 3}, "", 1},
		{"counter: charged window now the previous", "c3", "10:3:0", "sliding_window_counter", 1, [3]int64{8, 1, 2}, [3]int64{9, 2, 1}, "10:2:0", 0},
	}
	for _, tc := range cases {
		if err := c.Set(ctx, tc.key, tc.before, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := rateLimitRefund.Run(ctx, c, []string{tc.key}, "1000000000000", tc.alg, 1000, tc.n, "",
			tc.old[0], tc.old[1], tc.old[2], tc.wrote[0], tc.wrote[1], tc.wrote[2]).Int64()
		if err != nil || got != tc.exact {
			t.Fatalf("%s: refund replied %d %v, want %d", tc.name, got, err, tc.exact)
		}
		v, err := c.Get(ctx, tc.key).Result()
		if tc.want == "" && err != redis.Nil || tc.want != "" && (err != nil || v != tc.want) {
			t.Fatalf("%s: %s = %q (%v), want %q", tc.name, tc.key, v, err, tc.want)
		}
		if tc.want != "" {
			if ttl, err := c.PTTL(ctx, tc.key).Result(); err != nil || ttl < 50*time.Minute {
				t.Fatalf("%s: PTTL %v (%v), want the hour kept", tc.name, ttl, err)
			}
		}
	}
}

// With Redis TIME (ARGV[1] ""), a plain TAT is kept compact: the key
// expires at E = ceil(TAT/1000) ms and holds r = E·1000 − TAT in [0, 999],
// a shared integer of Redis (no value object). Every script that reads a
// bucket gets the TAT back exactly, to the µs: the buckets script's charge,
// then the token-bucket script's, the batch script's and a reservation,
// each on the state the one before wrote (which, past its wait, does not
// depend on the time the script ran); a refund restores a compact key
// exactly.
func TestRateLimitCompactTAT(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T   = 10_000_000 + 123 // 10 s and some µs: the remainders are not round
		tau = 5 * T
	)
	buckets := func(key string, n int64) (now, wait, tat int64) {
		t.Helper()
		res, err := rateLimitBuckets.Run(ctx, c, []string{key}, bucketsArgs("", T, tau, n)...).Result()
		if err != nil {
			t.Fatal(err)
		}
		r := res.([]any)
		return r[0].(int64), r[1].(int64), r[2].(int64)
	}
	// compact checks that key holds tat, compact.
	compact := func(key string, tat int64) {
		t.Helper()
		v, err := c.Get(ctx, key).Int64()
		if err != nil || v < 0 || v > 999 {
			t.Fatalf("%s = %d (%v), want an integer in [0, 999]", key, v, err)
		}
		e, err := c.PExpireTime(ctx, key).Result()
		if err != nil || e.Milliseconds()*1000-v != tat {
			t.Fatalf("%s: PEXPIRETIME %v (%v), value %d: TAT %d, want %d", key, e, err, v, e.Milliseconds()*1000-v, tat)
		}
		if enc, err := c.ObjectEncoding(ctx, key).Result(); err != nil || enc != "int" {
			t.Fatalf("%s: encoding %q (%v), want int", key, enc, err)
		}
		// a shared integer: its reference count is OBJ_SHARED_REFCOUNT
		if rc, err := c.ObjectRefCount(ctx, key).Result(); err != nil || rc != 2147483647 {
			t.Fatalf("%s: refcount %d (%v), want the shared integers' 2147483647", key, rc, err)
		}
	}
	peek := func(key string) int64 {
		t.Helper()
		_, _, tat := buckets(key, 0)
		return tat
	}

	now0, wait, tat := buckets("k", 1) // a fresh key: TAT' = now + T
	if wait != 0 || tat != 0 {
		t.Fatalf("fresh key: wait %d, tat %d, want 0, 0", wait, tat)
	}
	want := now0 + T
	compact("k", want)
	if got := peek("k"); got != want {
		t.Fatalf("buckets script reads TAT %d, want %d", got, want)
	}

	// the token-bucket script: TAT' = TAT + T (the key is not full)
	res, err := rateLimitTokenBucket.Run(ctx, c, []string{"k"}, "", T, tau, 1).Result()
	if err != nil || res.(int64) <= 0 || res.(int64) > T {
		t.Fatalf("token-bucket script: %v %v, want a wait in (0, T]", res, err)
	}
	want += T
	compact("k", want)
	if got := peek("k"); got != want {
		t.Fatalf("after the token-bucket script: TAT %d, want %d", got, want)
	}

	// the batch script (GCRA item): it replies the TAT it saw
	res, err = rateLimitBatch.Run(ctx, c, []string{"k"}, "", "gcra", 1, 5*T, 5, T, 1, "").Result()
	if err != nil {
		t.Fatal(err)
	}
	if r := res.([]any); r[1] != int64(1) || r[6] != want {
		t.Fatalf("batch script: %v, want allowed having seen TAT %d", r, want)
	}
	want += T
	compact("k", want)

	// a refund of a charge of the buckets script restores the TAT it saw
	_, _, seen := buckets("k", 1)
	if seen != want {
		t.Fatalf("buckets script saw %d, want %d", seen, want)
	}
	wrote := want + T
	compact("k", wrote)
	res, err = rateLimitRefund.Run(ctx, c, []string{"k"}, "", "gcra", T, 1, "", want, 0, 0, wrote, 0, 0).Result()
	if err != nil || res != int64(1) {
		t.Fatalf("refund: %v %v, want 1 restored", res, err)
	}
	if got := peek("k"); got != want {
		t.Fatalf("after the refund: TAT %d, want %d", got, want)
	}

	// a reservation sees the TAT and marks the key (a string of its own)
	res, err = rateLimitHold.Run(ctx, c, []string{"k"}, "", -1, 1, 60_000_000, T, tau, 1, "h1/0=1").Result()
	if err != nil {
		t.Fatal(err)
	}
	r0 := func(res any) int64 { return res.([]any)[0].(int64) }
	if r := res.([]any); r[1] != int64(1) || r[3] != want || r[4] != want+T {
		t.Fatalf("hold script: %v, want allowed, having seen TAT %d and left %d", r, want, want+T)
	}
	// "<tat>h<first>:<last>,<member>@<end>": the hold in the key's value
	exp := r0(res) + 60_000_000
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != fmt.Sprintf("%dh%d:%d,h1/0=1@%d", want+T, exp, exp, exp) {
		t.Fatalf("k = %q (%v), want marked with TAT %d and the hold ending at %d", v, err, want+T, exp)
	}
	if n, err := c.Exists(ctx, "k:h").Result(); err != nil || n != 0 {
		t.Fatalf("k:h exists (%d, %v): the hold belongs in k's value", n, err)
	}
}

// The buckets script's ARGV sends each policy once and one code per item:
// two policies, two groups (the second denied as a whole, charging
// nothing), costs 1, 0 and 3, and a reply without the TATs (P positive).
func TestRateLimitBucketsPolicyTable(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T1, tau1 = 100_000_000, 300_000_000 // burst 3
		T2, tau2 = 7_000_000, 7_000_000     // burst 1
		now      = 1_000_000_000_000
	)
	keys := []string{"a", "b", "a", "b", "c"}
	args := []any{fmt.Sprint(now), 2, T1, tau1, T2, tau2,
		2, 3, 2, // G = 2: three items, then two
		1,     // a: policy 1, cost 1
		-2, 0, // b: policy 2, a peek
		-1, 2, // a: policy 1, cost 2 (sees the first item's charge)
		2,     // b: policy 2, cost 1 (room: the peek charged nothing)
		-1, 4, // c: policy 1, cost 4 > burst: the group is denied
	}
	res, err := rateLimitBuckets.Run(ctx, c, keys, args...).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{int64(now), int64(0), int64(0), int64(T1), int64(0), int64(0)}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("reply %v, want %v", res, want)
	}
	if v, err := c.Get(ctx, "a").Result(); err != nil || v != fmt.Sprint(now+3*T1) {
		t.Fatalf("a = %q (%v), want %d (charged 1 then 2)", v, err, now+3*T1)
	}
	if n, err := c.Exists(ctx, "b", "c").Result(); err != nil || n != 0 {
		t.Fatalf("%d of b, c exist (%v), want none (a peek, and a denied group)", n, err)
	}
}

// A key charged by several groups of one call (a hot key shared by the
// requests of several callers) is written once, with its last charge,
// which includes the earlier ones; the charges of denied groups are not
// in it. One SET for four items on the key, two of them in denied groups.
func TestRateLimitBucketsRepeatedKeyWrittenOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T, tau = 100_000_000, 500_000_000 // 100 s, burst 5
		now    = 1_000_000_000_000
	)
	keys := []string{"h", "h", "x", "h", "h", "y"}
	args := []any{fmt.Sprint(now), 1, T, tau,
		4, 1, 2, 1, 2, // G = 4
		1,     // h: cost 1, allowed
		1,     // h: cost 1 ...
		-1, 6, // x: cost 6 > burst: the group is denied
		-1, 2, // h: cost 2, allowed (sees only the first charge)
		1,     // h: cost 1 ...
		-1, 6, // y: cost 6 > burst: the group is denied
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := rateLimitBuckets.Run(ctx, c, keys, args...).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{int64(now), int64(0), int64(T), int64(0), int64(T), int64(3 * T), int64(0)}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("reply %v, want %v", res, want)
	}
	if v, err := c.Get(ctx, "h").Result(); err != nil || v != fmt.Sprint(now+3*T) {
		t.Fatalf("h = %q (%v), want %d (charged 1, then 2)", v, err, now+3*T)
	}
	if ttl, err := c.PTTL(ctx, "h").Result(); err != nil || ttl > 300*time.Second || ttl < 290*time.Second {
		t.Fatalf("PTTL h = %v (%v), want 300s", ttl, err)
	}
	if n, err := c.Exists(ctx, "x", "y").Result(); err != nil || n != 0 {
		t.Fatalf("%d of x, y exist (%v), want none (denied groups)", n, err)
	}
	if calls := redistest.ReadCommandStats(t, c)["set"].Calls; calls != 1 {
		t.Fatalf("%v SET calls, want 1 (h written once)", calls)
	}
}

// The hold script keeps each key's state for the whole call: three
// settles riding on it and two reservations, all on one key that already
// holds three holds, read it once (MGET) and write it once (one SET),
// with every settle and decision seeing the ones before it. The settle
// script does the same for two items on one key.
func TestRateLimitHoldKeyWrittenOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const (
		T, tau = 1_000_000, 10_000_000 // 1 s, burst 10
		now    = 1_000_000_000_000
		ttl    = 60_000_000
		E      = now + ttl // every hold's end
	)
	held := fmt.Sprintf("%dh%d:%d,a/0=2@%d,b/0=3@%d,c/0=1@%d", now+6*T, E, E, E, E, E)
	if err := c.Set(ctx, "k", held, 120*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{"k", "k", "k", "k", "k"}
	args := []any{fmt.Sprint(now), 2, 1, ttl, 1, ttl,
		T, tau, 1, "d/0=1", // group 1: hold 1
		T, tau, 1, "e/0=1", // group 2: hold 1
		T, tau, 2, 1, "a/0=2", E, // settle a: 1 of 2 used, 1 given back
		T, tau, 3, 3, "b/0=3", E, // settle b: as estimated
		T, tau, 1, 1, "x/0=1", E, // no such hold, its end to come: settled before
	}
	res, err := rateLimitHold.Run(ctx, c, keys, args...).Result()
	if err != nil {
		t.Fatal(err)
	}
	// {now, allowed×2, wait×2, settled×3}: the reservations see the refund
	want := []any{int64(now), int64(1), int64(1), int64(5 * T), int64(6 * T), int64(1), int64(1), int64(2)}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("hold script: %v, want %v", res, want)
	}
	st := redistest.ReadCommandStats(t, c)
	if st["mget"].Calls != 1 || st["set"].Calls != 1 || st["get"].Calls != 0 {
		t.Fatalf("mget %v, set %v, get %v calls; want 1, 1, 0 (k read once, written once)", st["mget"].Calls, st["set"].Calls, st["get"].Calls)
	}
	v, err := c.Get(ctx, "k").Result()
	if w := fmt.Sprintf("%dh%d:%d,c/0=1@%d,d/0=1@%d,e/0=1@%d", now+7*T, E, E, E, E, E); err != nil || v != w {
		t.Fatalf("k = %q (%v), want %q", v, err, w)
	}
	pttl, err := c.PTTL(ctx, "k").Result()
	if err != nil || pttl > 60*time.Second || pttl < 59*time.Second {
		t.Fatalf("PTTL k = %v (%v), want the holds' 60s", pttl, err)
	}

	// the settle script: two items on k, both given back in full
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err = rateLimitSettle.Run(ctx, c, []string{"k", "k"}, fmt.Sprint(now), 0,
		T, tau, 1, 0, "c/0=1", E,
		T, tau, 1, 0, "e/0=1", E).Result()
	if err != nil || fmt.Sprint(res) != fmt.Sprint([]any{int64(1), int64(1)}) {
		t.Fatalf("settle script: %v %v, want [1 1]", res, err)
	}
	st = redistest.ReadCommandStats(t, c)
	if st["mget"].Calls != 1 || st["set"].Calls != 1 {
		t.Fatalf("mget %v, set %v calls; want 1, 1", st["mget"].Calls, st["set"].Calls)
	}
	v, err = c.Get(ctx, "k").Result()
	if w := fmt.Sprintf("%dh%d:%d,d/0=1@%d", now+5*T, E, E, E); err != nil || v != w {
		t.Fatalf("k = %q (%v), want %q", v, err, w)
	}
	// a TAT moved back and no hold added: the key keeps its TTL
	if pttl2, err := c.PTTL(ctx, "k").Result(); err != nil || pttl2 > pttl || pttl2 < 59*time.Second {
		t.Fatalf("PTTL k = %v (%v), want the TTL it had (%v)", pttl2, err, pttl)
	}
}

// The settle script reads its keys in chunks that fit Lua's stack: 9000
// items (unpack takes at most 8000 values) settle in one call, each
// answered (no such hold, its end to come: settled before).
func TestRateLimitSettleManyItems(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	const (
		T, tau = 1_000_000, 10_000_000
		now    = 1_000_000_000_000
		n      = 9000
	)
	keys := make([]string, n)
	args := []any{fmt.Sprint(now), 0}
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i%3)
		args = append(args, T, tau, 1, 1, fmt.Sprintf("m%d/0=1", i), now+60_000_000)
	}
	res, err := rateLimitSettle.Run(context.Background(), c, keys, args...).Result()
	if err != nil {
		t.Fatal(err)
	}
	r, ok := res.([]any)
	if !ok || len(r) != n {
		t.Fatalf("settle script: %d results (%T), want %d", len(r), res, n)
	}
	for i, x := range r {
		if x != int64(2) {
			t.Fatalf("item %d: %v, want 2 (already settled)", i, x)
		}
	}
}

// The named slots of ratelimit_holds.lua: every [NAME] of a script that
// carries it is a declared slot (none is left for Lua to read as a
// global), each name is declared once, and they become their numbers.
func TestRateLimitSlots(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range slotLine.FindAllStringSubmatch(ratelimitHoldsSrc, -1) {
		for _, name := range strings.Fields(m[1]) {
			if seen[name] {
				t.Errorf("slot %s declared twice", name)
			}
			seen[name] = true
		}
	}
	if len(seen) != 20 {
		t.Errorf("%d slots declared, want 20 (5 of h, 15 of k)", len(seen))
	}
	for _, src := range []string{ratelimitBatchSrc, ratelimitTokenBucketSrc, ratelimitBucketsSrc, ratelimitRefundSrc, ratelimitHoldSrc, ratelimitSettleSrc} {
		if left := slotRef.FindAllString(slotted(ratelimitHoldsSrc+src), -1); len(left) > 0 {
			t.Errorf("names left after slotted: %v", left)
		}
	}
	for _, src := range []string{ratelimitHoldSrc, ratelimitSettleSrc} {
		if s := slotted(ratelimitHoldsSrc + src); strings.Contains(s, "return APPLIED") || !strings.Contains(s, "return 1\n") {
			t.Error("APPLIED not written as its value")
		}
	}
	if got := slotted("--   slots k: A B\n--   consts: X=7\nk[B] = k[A] .. x[C] + X + XY"); got != "--   slots k: A B\n--   consts: X=7\nk[2] = k[1] .. x[C] + 7 + XY" {
		t.Errorf("slotted: %q", got)
	}
}
