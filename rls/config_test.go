package rls

import (
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway/ratelimit"
)

func load(t *testing.T, files ...string) (*Config, error) {
	t.Helper()
	fs := make([]File, len(files))
	for i, f := range files {
		fs[i] = File{Name: "f" + string(rune('0'+i)) + ".yaml", Content: []byte(f)}
	}
	return Load(fs, LoadOptions{})
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, err string }{
		{"", "f0.yaml: config file cannot have empty domain"},
		{"descriptors: []", "f0.yaml:1: config file cannot have empty domain"},
		{"domain: d\nfoo: 1", "f0.yaml:2: config error, unknown key 'foo'"},
		{"domain: d\ndescriptors:\n  - value: v", "f0.yaml:3: descriptor has empty key"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", "f0.yaml:4: invalid rate limit unit 'fortnight'"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}", "f0.yaml:4: invalid rate limit unit ''"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}", "f0.yaml:4: requests_per_unit: expected an integer from 0 to 4294967295, got \"-1\""},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unlimited: true}", "f0.yaml:4: should not specify rate limit unit when unlimited"},
		{"domain: d\ndescriptors:\n  - key: k\n  - key: k", "f0.yaml:4: duplicate descriptor composite key 'd.k'"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v*\n  - key: k\n    value: v*", "f0.yaml:5: duplicate descriptor composite key 'd.k_v*'"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: n\n      replaces: [{name: n}]", "f0.yaml:8: replaces should not contain name of same descriptor"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: ''}]", "f0.yaml:7: should not have an empty replaces entry"},
		{"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe", "f0.yaml:4: shadow_mode: expected true or false, got \"maybe\""},
		{"domain: d\ndescriptors:\n  - key: k\n    quota_mode: true", "f0.yaml:4: quota_mode is not supported by this server"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}", "f0.yaml:4: algorithm: unknown algorithm \"magic\""},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: 1s, period: 2s, requests_per_unit: 1}", "f0.yaml:4: set either unit or period, not both"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window, burst: 20}", "f0.yaml:4: invalid policy: burst 20 is not supported by fixed_window"},
		{"domain: d\ndescriptors: [1]", "f0.yaml:2: config error, yaml file contains list of type other than map"},
		{"domain: d\ndescriptors:\n\t- key: k", "f0.yaml:3: error loading config file: found character that cannot start any token"},
	} {
		_, err := load(t, tc.yaml)
		require.Error(t, err, tc.yaml)
		require.Contains(t, err.Error(), tc.err, tc.yaml)
	}
	// a domain in two files
	_, err := load(t, "domain: d", "domain: d")
	require.ErrorContains(t, err, "f1.yaml:1: duplicate domain 'd' in config file")
	c, err := Load([]File{{"a", []byte("domain: d\ndescriptors: [{key: a}]")}, {"b", []byte("domain: d\ndescriptors: [{key: b}]")}}, LoadOptions{MergeDomains: true})
	require.NoError(t, err)
	require.Equal(t, []string{"d"}, c.domainNames())
}

func entries(pairs ...string) []*rlv3.RateLimitDescriptor_Entry {
	es := make([]*rlv3.RateLimitDescriptor_Entry, len(pairs)/2)
	for i := range es {
		es[i] = &rlv3.RateLimitDescriptor_Entry{Key: pairs[2*i], Value: pairs[2*i+1]}
	}
	return es
}

func TestLookup(t *testing.T) {
	c, err := load(t, `
domain: d
descriptors:
  - key: k
    value: a*z
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4}
    descriptors:
      - key: sub
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
`)
	require.NoError(t, err)
	limit := func(es ...string) int64 {
		r, err := c.lookup("d", entries(es...))
		require.NoError(t, err)
		if r == nil {
			return -1
		}
		return r.Limits[0].Policy.Limit
	}
	require.EqualValues(t, 3, limit("k", "abc"))        // exact first
	require.EqualValues(t, 1, limit("k", "abz"))        // then wildcards in file order
	require.EqualValues(t, 2, limit("k", "abd"))        //
	require.EqualValues(t, 1, limit("k", "a-middle-z")) // a '*' inside the value
	require.EqualValues(t, 4, limit("k", "other"))      // then the key alone
	require.EqualValues(t, 5, limit("k", "x", "sub", "y"))
	require.EqualValues(t, -1, limit("k", "abc", "sub", "y")) // abc has no descriptors below
	require.EqualValues(t, -1, limit("nope", "x"))
	_, err = c.lookup("other", entries("k", "x"))
	require.ErrorIs(t, err, errNoDomain)

	r, _ := c.lookup("d", entries("k", "x", "sub", "y"))
	require.Equal(t, "d.k.sub", r.FullKey)
	require.Equal(t, "d.k_x.sub_y", c.metricKey(r, "d", entries("k", "x", "sub", "y")))
}

func TestExtensions(t *testing.T) {
	c, err := load(t, `
domain: d
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 100
      algorithm: sliding_window_counter
    rate_limits:
      - {period: 1s, requests_per_unit: 10, algorithm: token_bucket, burst: 20, name: burst}
      - {unit: 30s, requests_per_unit: 40, algorithm: gcra}
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
`)
	require.NoError(t, err)
	r, _ := c.lookup("d", entries("user", "u"))
	require.Len(t, r.Limits, 3)
	require.Equal(t, ratelimit.Policy{Algorithm: ratelimit.SlidingWindowCounter, Limit: 100, Period: time.Minute}, r.Limits[0].Policy)
	require.Equal(t, pb.RateLimitResponse_RateLimit_MINUTE, r.Limits[0].Unit)
	require.Equal(t, ratelimit.Policy{Algorithm: ratelimit.TokenBucket, Limit: 10, Period: time.Second, Burst: 20}, r.Limits[1].Policy)
	require.Equal(t, "burst", r.Limits[1].Name)
	require.Equal(t, pb.RateLimitResponse_RateLimit_SECOND, r.Limits[1].Unit)
	require.Equal(t, ratelimit.Policy{Algorithm: ratelimit.GCRA, Limit: 40, Period: 30 * time.Second}, r.Limits[2].Policy)
	require.Equal(t, pb.RateLimitResponse_RateLimit_UNKNOWN, r.Limits[2].Unit)
	require.Equal(t, "d.user", r.Limits[2].Name)
	// different policies never share state
	require.NotEqual(t, r.Limits[0].scope, r.Limits[1].scope)
	require.NotEqual(t, r.Limits[1].scope, r.Limits[2].scope)

	z, _ := c.lookup("d", entries("zero", "x"))
	require.True(t, z.Limits[0].denyAll)
}

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"foo*", "foo", true}, {"foo*", "foobar", true}, {"foo*", "fo", false},
		{"*bar", "bar", true}, {"*bar", "xbar", true}, {"*bar", "barx", false},
		{"a*b*c", "abc", true}, {"a*b*c", "aXbYc", true}, {"a*b*c", "acb", false},
		{"ab*ba", "aba", false}, {"ab*ba", "abba", true}, {"*", "", true},
	} {
		w := wildcard{parts: strings.Split(tc.pattern, "*")}
		require.Equal(t, tc.want, w.match(tc.value), "%s ~ %s", tc.pattern, tc.value)
	}
}
