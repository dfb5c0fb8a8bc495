package rls

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway/internal/redistest"
)

// TestReferenceKeys: with SPILLWAY_KEY_FORMAT=reference a fixed window of
// a reference unit counts under the reference's key (prefix, domain,
// key_value_ pairs, window start) as a plain integer; a limit the
// reference has no layout for (a sliding window) stays in spillway's
// keys; a request denied by one of them charges neither (the reference
// count charged first is given back); the count a reference pod left is
// honoured.
func TestReferenceKeys(t *testing.T) {
	rs := redistest.Start(t)
	client := rs.Client(t)
	set := DefaultSettings()
	set.ReferenceKeys, set.CacheKeyPrefix, set.Budget = true, "pre_", 5*time.Second
	store, err := newStore(client, set)
	require.NoError(t, err)
	svc := NewService(store, set, nil)
	c, err := load(t, `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window_counter}
`)
	require.NoError(t, err)
	svc.SetConfig(c)
	ctx := context.Background()
	call := func(ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
		resp, err := svc.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: ds})
		require.NoError(t, err)
		return resp
	}
	d := func(k, v string) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	start := time.Now().Unix() / 60 * 60
	if time.Now().Unix()-start > 50 {
		time.Sleep(time.Duration(61-(time.Now().Unix()-start)) * time.Second)
		start = time.Now().Unix() / 60 * 60
	}
	key := "pre_d_user_u_" + strconv.FormatInt(start, 10)
	count := func() int {
		n, err := client.Get(ctx, key).Int()
		require.NoError(t, err)
		return n
	}

	r := call(d("user", "u"), d("api", "a"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.EqualValues(t, 3, r.Statuses[0].LimitRemaining)
	require.Equal(t, 1, count())
	r = call(d("user", "u"), d("api", "a"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, 2, count())
	// api is over: the request is denied and user's count is given back
	r = call(d("user", "u"), d("api", "a"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code)
	require.EqualValues(t, 2, r.Statuses[0].LimitRemaining)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[1].Code)
	require.Equal(t, 2, count())

	// a reference pod charged one more (its INCRBY): this server sees it
	require.NoError(t, client.IncrBy(ctx, key, 1).Err())
	r = call(d("user", "u"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.EqualValues(t, 0, r.Statuses[0].LimitRemaining)
	r = call(d("user", "u"))
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, 4, count(), "a denied call charges nothing")
	ttl, err := client.TTL(ctx, key).Result()
	require.NoError(t, err)
	require.True(t, ttl > 0 && ttl <= time.Minute, "TTL %v: one unit", ttl)
	// and the sliding window is in spillway's own keys, not the reference's
	keys, err := client.Keys(ctx, "pre_d_*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{key}, keys)
}

// TestReferenceKeysCluster: on a Cluster the reference's keys (no hash
// tags) of one call land in different slots and are decided one at a
// time; a call denied by a later one gives back what an earlier one
// charged.
func TestReferenceKeysCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	set := DefaultSettings()
	set.ReferenceKeys, set.Budget, set.RedisType, set.RedisURL = true, 5*time.Second, "cluster", strings.Join(cl.Addrs(), ",")
	client, err := newRedisClient(set)
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	store, err := newStore(client, set)
	require.NoError(t, err)
	svc := NewService(store, set, nil)
	c, err := load(t, "domain: c\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	require.NoError(t, err)
	svc.SetConfig(c)
	ctx := context.Background()
	d := func(k, v string) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	call := func() *pb.RateLimitResponse {
		resp, err := svc.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "c", Descriptors: []*rlv3.RateLimitDescriptor{d("a", "1"), d("b", "1")}})
		require.NoError(t, err)
		return resp
	}
	start := strconv.FormatInt(time.Now().Unix()/3600*3600, 10)
	get := func(k string) int {
		n, err := client.Get(ctx, k+start).Int()
		require.NoError(t, err)
		return n
	}
	require.Equal(t, pb.RateLimitResponse_OK, call().OverallCode)
	require.Equal(t, 1, get("c_a_1_"))
	require.Equal(t, 1, get("c_b_1_"))
	r := call()
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OK, r.Statuses[0].Code)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[1].Code)
	require.Equal(t, 1, get("c_a_1_"), "a's charge was given back")
	require.Equal(t, 1, get("c_b_1_"))
}
