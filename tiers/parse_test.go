package tiers

import (
	"errors"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// "cost: response" rules: every way to get one wrong is an error naming
// the line; the algorithms that cannot hold wrap ErrHoldUnsupported too.
func TestParseResponseErrors(t *testing.T) {
	const rule = "limits:\n  - id: gen\n    by: api_key\n    bucket: 2000/minute\n"
	for _, tc := range []struct {
		in, want string
		hold     bool // wraps ratelimit.ErrHoldUnsupported
	}{
		{rule + "    cost: response\n",
			"tiers: limits.yaml:5: cost: response: missing estimate (the units held at admission, e.g. estimate: 250)", false},
		{rule + "    cost: response\n    estimate: -1\n",
			"tiers: limits.yaml:6: estimate -1 must not be negative", false},
		{rule + "    cost: response\n    estimate: 2.5\n",
			"tiers: limits.yaml:6: estimate \"2.5\" is not a whole number", false},
		{rule + "    cost: response\n    estimate: 1e3\n",
			"tiers: limits.yaml:6: estimate \"1e3\" is not a whole number", false},
		{rule + "    cost: response\n    estimate: \"250\"\n",
			"tiers: limits.yaml:6: estimate: want a whole number, got \"250\"", false},
		{rule + "    cost: response\n    estimate:\n",
			"tiers: limits.yaml:6: estimate: want a whole number, got nothing", false},
		{rule + "    cost: response\n    estimate: 9223372036854775808\n",
			"tiers: limits.yaml:6: estimate 9223372036854775808 is too large", false},
		{rule + "    cost: response\n    estimate: 0\n",
			"tiers: limits.yaml:6: estimate 0 must be at least 1 (holding nothing, a request would be admitted even while its key is in debt)", false},
		{rule + "    cost: response\n    estimate: 2001\n",
			"tiers: limits.yaml:6: estimate 2001 is above the burst 2000: no request could ever be admitted", false},
		{"limits:\n  - by: ip\n    cost: response\n    estimate: 50\n    bucket: 10/minute, burst 20\n",
			"tiers: limits.yaml:5: bucket \"10/minute, burst 20\": estimate 50 is above the burst 20: no request could ever be admitted", false},
		{rule + "    estimate: 250\n",
			"tiers: limits.yaml:5: estimate: only a rule with cost: response holds an estimate", false},
		{rule + "    cost: request\n    estimate: 250\n",
			"tiers: limits.yaml:6: estimate: only a rule with cost: response holds an estimate", false},
		{rule + "    cost: tokens\n",
			"tiers: limits.yaml:5: cost \"tokens\": want request (charged at admission, the default) or response (held at admission, settled to the actual cost)", false},
		{rule + "    cost: [response]\n",
			"tiers: limits.yaml:5: cost: want a string, got a list", false},
		{rule + "    algorithm: fixed_window\n    cost: response\n    estimate: 250\n",
			"tiers: limits.yaml:6: cost: response: fixed_window keeps no holds: use token_bucket, gcra or leaky_bucket", true},
		{rule + "    cost: response\n    estimate: 250\n    algorithm: sliding_window_log\n",
			"tiers: limits.yaml:7: cost: response: sliding_window_log keeps no holds: use token_bucket, gcra or leaky_bucket", true},
		{rule + "    cost: response\n    algorithm: sliding_window_counter\n",
			"tiers: limits.yaml:6: cost: response: sliding_window_counter keeps no holds: use token_bucket, gcra or leaky_bucket", true},
		{"plans:\n  free:\n    tokens: 100/minute\n  pro:\n    tokens: 5000/minute\ndefault_plan: free\nlimits:\n  - by: api_key\n    plan: tokens\n    cost: response\n    estimate: 250\n",
			"tiers: limits.yaml:2: plan \"free\": tokens \"100/minute\": estimate 250 is above the burst 100: no request could ever be admitted (the estimate of the rule at line 8)", false},
		{"limits:\n  - by: ip\n    bucket: 1/365d, burst 100\n    cost: response\n    estimate: 1\n",
			"tiers: limits.yaml:3: bucket \"1/365d, burst 100\": burst 100 × interval 31536000000000µs exceeds 2^51 µs, the bound for holds", false},
		// A request-count rule and a tokens rule on the same requests,
		// same period: layered, not a contradiction.
		{"limits:\n  - by: ip\n    bucket: 10/minute\n  - by: ip\n    bucket: 10/minute\n    cost: response\n    estimate: 5\n  - by: ip\n    bucket: 20/minute\n    cost: response\n    estimate: 5\n",
			"tiers: limits.yaml:8: contradicts the rule at line 4: same endpoint, method and by with another bucket of the same period", false},
	} {
		_, err := Parse("limits.yaml", []byte(tc.in))
		if err == nil {
			t.Errorf("Parse(%q) = nil error, want %s", tc.in, tc.want)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("Parse(%q)\n got: %s\nwant: %s", tc.in, err, tc.want)
		}
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Parse(%q): %v does not wrap ErrInvalidConfig", tc.in, err)
		}
		if errors.Is(err, ratelimit.ErrHoldUnsupported) != tc.hold {
			t.Errorf("Parse(%q): wraps ErrHoldUnsupported = %v, want %v", tc.in, !tc.hold, tc.hold)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"limits:\n  - endpoint: /a\n    by: ip\n    bucket: 10/minit\n",
			"tiers: limits.yaml:4: bucket \"10/minit\": unknown unit \"minit\""},
		{"limits:\n  - by: ip\n    bukket: 10/minute\n",
			"tiers: limits.yaml:3: unknown field \"bukket\" in rule (want one of id, name, endpoint, method, by, bucket, algorithm, buckets, mode, fail, shadow, plan, cost, estimate)"},
		{"limit:\n  - by: ip\n    bucket: 10/minute\n",
			"tiers: limits.yaml:1: unknown field \"limit\" (want limits, plans or default_plan)"},
		{"limits:\n  - by: ip\n    bucket: 10/minute\n    fail: maybe\n",
			"tiers: limits.yaml:4: fail \"maybe\": want open or closed"},
		{"limits:\n  - by: ip\n    bucket: 10/minute, burst -1\n",
			"tiers: limits.yaml:3: bucket \"10/minute, burst -1\": burst -1 must not be negative"},
		{"limits:\n  - id: a\n    by: ip\n    bucket: 10/minute\n  - id: a\n    by: user\n    bucket: 10/minute\n",
			"tiers: limits.yaml:5: id \"a\": same as the rule at line 2 (set a distinct id:)"},
		{"limits:\n  - endpoint: /login\n    by: ip\n    bucket: 10/minute\n  - endpoint: /login\n    by: ip\n    bucket: 20/minute\n",
			"tiers: limits.yaml:5: contradicts the rule at line 2: same endpoint, method and by with another bucket of the same period"},
		{"limits:\n  - endpoint: /login\n    by: ip\n    bucket: 10/minute\n  - endpoint: /login\n    by: ip\n    bucket: 10/minute\n",
			"tiers: limits.yaml:5: duplicates the rule at line 2 (same endpoint, method, by and bucket)"},
		{"plans:\n  free:\n    api: 10/minute\ndefault_plan: free\nlimits:\n  - by: api_key\n    bucket: 10/minute\n    plan: api\n",
			"tiers: limits.yaml:7: bucket: contradicts plan: api (a rule takes its rate from one of them)"},
		{"limits:\n  - by: ip\n",
			"tiers: limits.yaml:2: rule: missing bucket (e.g. bucket: 10/minute) or plan"},
		{"limits:\n  - endpoint: /a\n    bucket: 10/minute\n",
			"tiers: limits.yaml:2: rule: missing by (ip, user, api_key, endpoint or a dimension name)"},
		{"limits:\n  - by: ip\n    bucket: 10/minute\n    algorithm: token-bucket\n",
			"tiers: limits.yaml:4: algorithm \"token-bucket\": unknown (want one of token_bucket, gcra, fixed_window, sliding_window_log, sliding_window_counter, leaky_bucket, sliding_window_buckets)"},
		{"limits:\n  - by: ip\n    bucket: 10/minute\n    buckets: 20\n",
			"tiers: limits.yaml:4: 20: buckets and mode are for algorithm: sliding_window_buckets, not token_bucket"},
		{"limits:\n  - by: ip\n    bucket: 10/second\n    algorithm: sliding_window_buckets\n    buckets: 7\n",
			"tiers: limits.yaml:5: bucket \"10/second\": period 1s is not a whole multiple of 7 buckets (in µs)"},
		{"limits:\n  - by: ip\n    bucket: 10/second\n    algorithm: sliding_window_buckets\n    buckets: 0\n",
			"tiers: limits.yaml:5: buckets 0: want 1 to 1000 sub-windows per period"},
		{"limits:\n  - by: ip\n    bucket: 10/second\n    algorithm: sliding_window_buckets\n    mode: exact\n",
			"tiers: limits.yaml:5: mode \"exact\": want interpolated (the default) or conservative"},
		{"limits:\n  - by: ip\n    bucket: 10/minute, burst 5\n    algorithm: fixed_window\n",
			"tiers: limits.yaml:4: bucket \"10/minute, burst 5\": burst 5 is not supported by fixed_window (windows admit Limit per Period; leave burst 0)"},
		{"limits:\n  - endpoint: api/v1\n    by: ip\n    bucket: 10/minute\n",
			"tiers: limits.yaml:2: endpoint \"api/v1\": must start with '/' (or be \"*\" for every endpoint)"},
		{"limits:\n  - endpoint: /api*\n    by: ip\n    bucket: 10/minute\n",
			"tiers: limits.yaml:2: endpoint \"/api*\": '*' must be a whole path segment (\"/api/*\", not \"/api*\")"},
		{"limits:\n  - method: GET\n    endpoint: POST /x\n    by: ip\n    bucket: 10/minute\n",
			"tiers: limits.yaml:3: endpoint \"POST /x\": method POST contradicts method: GET"},
		{"limits:\n  - by: ip\n    bucket: 10/minute\n    shadow: yes\n",
			"tiers: limits.yaml:4: shadow: want true or false, got \"yes\""},
		{"plans:\n  free:\n    api: 10/minute\n  pro:\n    search: 10/minute\ndefault_plan: free\nlimits:\n  - by: api_key\n    plan: api\n",
			"tiers: limits.yaml:4: plan \"pro\": no bucket \"api\" (used by the rule at line 8; write api: unlimited if the plan has no limit)"},
		{"plans:\n  free:\n    api: 10/minute\ndefault_plan: gold\nlimits:\n  - by: api_key\n    plan: api\n",
			"tiers: limits.yaml:4: default_plan \"gold\": no such plan (have free)"},
		{"limits:\n  - by: api_key\n    plan: api\n",
			"tiers: limits.yaml:2: plan \"api\": no plans: section defines it"},
		{"limits:\n  by: ip\n",
			"tiers: limits.yaml:2: limits: want a list of rules, got a mapping"},
		{"limits:\n  - by: ip\n    by: user\n    bucket: 10/minute\n",
			"tiers: limits.yaml:3: by: duplicate field (first at line 2)"},
		{"limits:\n  - by: ip\n    bucket: unlimited\n",
			"tiers: limits.yaml:3: bucket \"unlimited\": unlimited is only allowed in plans (remove the rule instead)"},
		{"limits:\n  - by: ip\n    bucket: 0/minute\n",
			"tiers: limits.yaml:3: bucket \"0/minute\": limit must be positive"},
		{"limits:\n  - by: IP\n    bucket: 10/minute\n",
			"tiers: limits.yaml:2: by \"IP\": not a dimension name (lower-case letters, digits, _ - ., starting with a letter)"},
		{"limits:\n  - by: ip\n    bucket: 10000000/second\n",
			"tiers: limits.yaml:3: bucket \"10000000/second\": limit 10000000 per 1s is more than one per microsecond"},
		{"limits:\n  - by: ip\n    bucket: [10/minute\n",
			"tiers: limits.yaml:2: did not find expected ',' or ']'"},
		{"",
			"tiers: limits.yaml: empty config (want a mapping with limits:)"},
		{"limits:\n  - by: ip\n    bucket: 10 per minute\n",
			"tiers: limits.yaml:3: bucket \"10 per minute\": want N/unit, e.g. 10/minute, got \"10 per minute\""},
		{"limits:\n  - by: ip\n    bucket: 10/minute burst 5\n",
			"tiers: limits.yaml:3: bucket \"10/minute burst 5\": want \", burst N\" after the rate (with a comma), got \"10/minute burst 5\""},
		{"limits:\n  - by: ip\n    bucket: 10/minute, burst five\n",
			"tiers: limits.yaml:3: bucket \"10/minute, burst five\": burst \"five\" is not a whole number"},
		{"limits:\n  - by: ip\n    bucket: 99999999999999999999/minute\n",
			"tiers: limits.yaml:3: bucket \"99999999999999999999/minute\": limit 99999999999999999999 is too large"},
		{"limits:\n  - by: ip\n    bucket: 10/400d\n",
			"tiers: limits.yaml:3: bucket \"10/400d\": period 400d is longer than a year"},
		{"plans:\n  free:\n    api: 10/minute\nlimits:\n  - by: api_key\n    plan: api\n",
			"tiers: limits.yaml: default_plan: missing (the plan of a request whose plan is not known)"},
		{"limits:\n  - by: [ip, ip]\n    bucket: 10/minute\n",
			"tiers: limits.yaml:2: by \"ip\": listed twice"},
		{"limits:\n  - by: ip\n    bucket: 10/minute\n    id: x\n    name: y\n",
			"tiers: limits.yaml:5: name: contradicts id (a rule has one id)"},
		{"limits:\n  - by: ip\n    bucket: 10/minute\n    method: [GET, GET]\n",
			"tiers: limits.yaml:2: method \"GET\": listed twice"},
		{"limits:\n  - &r\n    by: ip\n    bucket: 10/minute\n  - *r\n",
			"tiers: limits.yaml:2: duplicates the rule at line 2 (same endpoint, method, by and bucket)"},
		{"limits:\n  - by: ip\n    bucket:\n",
			"tiers: limits.yaml:3: bucket: want a string, got nothing"},
		{"limits:\n  - by: ip\n    bucket: 10/minute\n    plan: api\n",
			"tiers: limits.yaml:3: bucket: contradicts plan: api (a rule takes its rate from one of them)"},
	} {
		_, err := Parse("limits.yaml", []byte(tc.in))
		if err == nil {
			t.Errorf("Parse(%q) = nil error, want %s", tc.in, tc.want)
			continue
		}
		if errors.Is(err, ratelimit.ErrHoldUnsupported) {
			t.Errorf("Parse(%q): %v wraps ErrHoldUnsupported", tc.in, err)
		}
		if err.Error() != tc.want {
			t.Errorf("Parse(%q)\n got: %s\nwant: %s", tc.in, err, tc.want)
		}
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Parse(%q): %v does not wrap ErrInvalidConfig", tc.in, err)
		}
	}
}

const fullConfig = `# every field
plans:
  free:
    api: 60/minute
    search: 10/minute
  pro:
    api: 600/minute, burst 100
    search: 100/minute
  enterprise:
    api: 6000/minute, burst 1000
    search: unlimited
default_plan: free

limits:
  - id: login-ip
    endpoint: POST /api/v1/login
    by: ip
    bucket: 10/minute
    fail: closed
  - endpoint: /api/v1/login
    method: [post, PUT]
    by: user
    bucket: 5/minute
    algorithm: gcra
  - name: api
    endpoint: /api/v1/*
    by: api_key
    plan: api
  - endpoint: /api/v1/search
    by: api_key
    plan: search
    algorithm: sliding_window_counter
  - id: posts-burst
    endpoint: /api/v1/posts
    by: [api_key, endpoint]
    bucket: 100/second, burst 50
  - id: posts-hour
    endpoint: /api/v1/posts
    by: [endpoint, api_key]
    bucket: 1000/h
  - endpoint: /users/*/posts
    by: tenant
    bucket: 50/10s
    shadow: true
  - by: ip
    bucket: 100000/day
    algorithm: fixed_window
`

func TestParseFull(t *testing.T) {
	c, err := Parse("limits.yaml", []byte(fullConfig))
	if err != nil {
		t.Fatal(err)
	}
	if c.DefaultPlan != "free" || len(c.Plans) != 3 || len(c.Rules) != 8 {
		t.Fatalf("default %q, %d plans, %d rules", c.DefaultPlan, len(c.Plans), len(c.Rules))
	}
	wantPlan := Plan{Name: "enterprise", Line: 9, Buckets: map[string]Bucket{
		"api":    {Limit: 6000, Period: time.Minute, Burst: 1000},
		"search": {Unlimited: true},
	}}
	if got := c.Plans["enterprise"]; !reflect.DeepEqual(got, wantPlan) {
		t.Errorf("enterprise = %+v, want %+v", got, wantPlan)
	}
	want := []Rule{
		{ID: "login-ip", Endpoint: "/api/v1/login", Methods: []string{"POST"}, By: []string{"ip"}, Bucket: Bucket{Limit: 10, Period: time.Minute}, Fail: spillway.FailClosed, Line: 15},
		{Endpoint: "/api/v1/login", Methods: []string{"POST", "PUT"}, By: []string{"user"}, Bucket: Bucket{Limit: 5, Period: time.Minute}, Algorithm: ratelimit.GCRA, Line: 20},
		{ID: "api", Endpoint: "/api/v1/*", By: []string{"api_key"}, Plan: "api", Line: 25},
		{Endpoint: "/api/v1/search", By: []string{"api_key"}, Plan: "search", Algorithm: ratelimit.SlidingWindowCounter, Line: 29},
		{ID: "posts-burst", Endpoint: "/api/v1/posts", By: []string{"api_key", "endpoint"}, Bucket: Bucket{Limit: 100, Period: time.Second, Burst: 50}, Line: 33},
		{ID: "posts-hour", Endpoint: "/api/v1/posts", By: []string{"endpoint", "api_key"}, Bucket: Bucket{Limit: 1000, Period: time.Hour}, Line: 37},
		{Endpoint: "/users/*/posts", By: []string{"tenant"}, Bucket: Bucket{Limit: 50, Period: 10 * time.Second}, Shadow: true, Line: 41},
		{By: []string{"ip"}, Bucket: Bucket{Limit: 100000, Period: 24 * time.Hour}, Algorithm: ratelimit.FixedWindow, Line: 45},
	}
	for i := range want {
		if !reflect.DeepEqual(c.Rules[i], want[i]) {
			t.Errorf("rule %d:\n got %+v\nwant %+v", i, c.Rules[i], want[i])
		}
	}
	l, err := New(c, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range l.cur.Load().rules {
		ids = append(ids, r.id)
	}
	wantIDs := []string{"login-ip", "POST,PUT /api/v1/login:user", "api", "/api/v1/search:api_key:plan=search", "posts-burst", "posts-hour", "/users/*/posts:tenant:shadow", "*:ip"}
	if !reflect.DeepEqual(ids, wantIDs) {
		t.Errorf("ids = %q, want %q", ids, wantIDs)
	}
	fails := map[string]spillway.FailMode{}
	for _, r := range l.cur.Load().rules {
		fails[r.id] = r.fail
	}
	if fails["login-ip"] != spillway.FailClosed || fails["api"] != spillway.FailOpen {
		t.Errorf("fail modes = %v; want login-ip closed, api open", fails)
	}
}

func TestParseDemoFile(t *testing.T) {
	c, err := ParseFile("../examples/httpserver/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules) != 6 || c.Rules[2].Bucket != (Bucket{Limit: 60, Period: time.Minute, Burst: 20}) || c.Rules[2].By[0] != "client" {
		t.Fatalf("demo config parsed as %+v", c.Rules)
	}
	if g := c.Rules[5]; g.ID != "generate_tokens" || g.Cost != CostResponse || g.Estimate != 250 || g.Bucket != (Bucket{Limit: 2000, Period: time.Minute}) || g.Line != 34 {
		t.Fatalf("generate_tokens parsed as %+v", g)
	}
	if _, err := ParseFile("testdata/does-not-exist.yaml"); err == nil {
		t.Fatal("missing file parsed")
	}
}

func TestParseMethodInEndpoint(t *testing.T) {
	c, err := Parse("x.yaml", []byte("limits:\n  - endpoint: post /login\n    method: POST\n    by: ip\n    bucket: 1/s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Rules[0]; r.Endpoint != "/login" || len(r.Methods) != 1 || r.Methods[0] != "POST" {
		t.Fatalf("rule = %+v", r)
	}
	_, err = Parse("x.yaml", []byte("limits:\n  - endpoint: p0st /login\n    by: ip\n    bucket: 1/s\n"))
	if err == nil || err.Error() != `tiers: x.yaml:2: endpoint "p0st /login": "P0ST" is not an HTTP method (write "POST /path")` {
		t.Fatalf("err = %v", err)
	}
}

func TestParseEmptyLimits(t *testing.T) {
	for _, in := range []string{"limits:\n", "limits: []\n"} {
		c, err := Parse("x.yaml", []byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if len(c.Rules) != 0 {
			t.Fatalf("%q: %d rules", in, len(c.Rules))
		}
	}
}

func TestParseBucket(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Bucket
		err  string
	}{
		{in: "10/minute", want: Bucket{Limit: 10, Period: time.Minute}},
		{in: "10/minutes", want: Bucket{Limit: 10, Period: time.Minute}},
		{in: "10/min", want: Bucket{Limit: 10, Period: time.Minute}},
		{in: "10/m", want: Bucket{Limit: 10, Period: time.Minute}},
		{in: "5/s", want: Bucket{Limit: 5, Period: time.Second}},
		{in: "5/sec", want: Bucket{Limit: 5, Period: time.Second}},
		{in: "5/second", want: Bucket{Limit: 5, Period: time.Second}},
		{in: "5/seconds", want: Bucket{Limit: 5, Period: time.Second}},
		{in: "7/h", want: Bucket{Limit: 7, Period: time.Hour}},
		{in: "7/hour", want: Bucket{Limit: 7, Period: time.Hour}},
		{in: "7/hours", want: Bucket{Limit: 7, Period: time.Hour}},
		{in: "1/d", want: Bucket{Limit: 1, Period: 24 * time.Hour}},
		{in: "1/day", want: Bucket{Limit: 1, Period: 24 * time.Hour}},
		{in: "1/days", want: Bucket{Limit: 1, Period: 24 * time.Hour}},
		{in: " 100 / 15 minutes , burst 20 ", want: Bucket{Limit: 100, Period: 15 * time.Minute, Burst: 20}},
		{in: "100/10s", want: Bucket{Limit: 100, Period: 10 * time.Second}},
		{in: "1000/minute, burst 200", want: Bucket{Limit: 1000, Period: time.Minute, Burst: 200}},
		{in: "unlimited", want: Bucket{Unlimited: true}},
		{in: "10/minit", err: `unknown unit "minit"`},
		{in: "10/", err: `missing unit after "" (want second, minute, hour or day)`},
		{in: "10/5", err: `missing unit after "5" (want second, minute, hour or day)`},
		{in: "/minute", err: "missing limit"},
		{in: "-1/minute", err: "limit -1 must not be negative"},
		{in: "1.5/minute", err: `limit "1.5" is not a whole number`},
		{in: "0/minute", err: "limit must be positive"},
		{in: "1/0s", err: "period must be positive"},
		{in: "10/minute, burst", err: `want ", burst N" after the rate, got "burst"`},
		{in: "10/minute, burst 1 2", err: `want ", burst N" after the rate, got "burst 1 2"`},
		{in: "10/minute, bust 2", err: `want ", burst N" after the rate, got "bust 2"`},
		{in: "10/minute, burst -2", err: "burst -2 must not be negative"},
		{in: "", err: `want N/unit, e.g. 10/minute, got ""`},
		{in: "10/99999999999999999999s", err: "period 99999999999999999999 is too large"},
	} {
		got, err := parseBucket(tc.in)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("parseBucket(%q) error = %v, want %s", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseBucket(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		// String round-trips.
		back, err := parseBucket(got.text())
		if err != nil || back != got {
			t.Errorf("parseBucket(%q.String() = %q) = %+v, %v", tc.in, got.text(), back, err)
		}
	}
}

// Configs built in Go get the same validation, naming the rule.
func TestConfigInGo(t *testing.T) {
	min := Bucket{Limit: 10, Period: time.Minute}
	for _, tc := range []struct {
		cfg  *Config
		want string
	}{
		{nil, "tiers: nil config"},
		{&Config{Rules: []Rule{{By: []string{"ip"}}}}, "tiers: rule 1: missing bucket (e.g. bucket: 10/minute) or plan"},
		{&Config{Rules: []Rule{{ID: "x", Bucket: min}}}, `tiers: rule "x": missing by (ip, user, api_key, endpoint or a dimension name)`},
		{&Config{Rules: []Rule{{By: []string{"ip"}, Bucket: min, Fail: 9}}}, "tiers: rule 1: fail: unknown fail mode 9 (want spillway.FailOpen or spillway.FailClosed)"},
		{&Config{Rules: []Rule{{By: []string{"ip"}, Bucket: Bucket{Limit: 10, Period: time.Minute, Burst: -1}}}}, `tiers: rule 1: bucket "10/minute, burst -1": burst -1 must not be negative`},
		{&Config{Rules: []Rule{{By: []string{"ip"}, Bucket: min, Methods: []string{"get"}}}}, `tiers: rule 1: method "get": not an HTTP method (upper case)`},
		{&Config{Rules: []Rule{{By: []string{"ip"}, Bucket: min}, {By: []string{"ip"}, Bucket: Bucket{Limit: 5, Period: time.Minute}}}}, "tiers: rule 2: contradicts the rule at line 0: same endpoint, method and by with another bucket of the same period"},
		{&Config{File: "a.yaml", Rules: []Rule{{By: []string{"ip"}, Plan: "api"}}}, `tiers: a.yaml: rule 1: plan "api": no plans: section defines it`},
		{&Config{DefaultPlan: "x", Rules: []Rule{}}, `tiers: default_plan "x": no such plan (have none)`},
	} {
		_, err := New(tc.cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{})
		if err == nil || err.Error() != tc.want {
			t.Errorf("New(%+v)\n got: %v\nwant: %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := New(&Config{}, nil, Settings{}); err == nil || err.Error() != "tiers: nil store" {
		t.Errorf("New with nil store: %v; want tiers: nil store", err)
	}
	if _, err := New(nil, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{}); err == nil || err.Error() != "tiers: nil config" {
		t.Errorf("New with nil config: %v; want tiers: nil config", err)
	}
	if _, err := New(&Config{}, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{IPv6Prefix: 129}); err == nil {
		t.Error("New with /129 succeeded")
	}
}

// FuzzParse: nothing panics on any input, and what parses compiles.
func FuzzParse(f *testing.F) {
	f.Add([]byte(fullConfig))
	if b, err := os.ReadFile("../examples/httpserver/limits.yaml"); err == nil {
		f.Add(b)
	}
	for _, tc := range []string{
		"limits:\n  - by: ip\n    bucket: 10/minit\n",
		"limits:\n  - &r\n    by: ip\n    bucket: 10/minute\n  - *r\n",
		"a: &a [*a]",
		"limits: !!binary aGVsbG8=",
		"plans:\n  free: {api: 1/s}\ndefault_plan: free\nlimits: [{by: api_key, plan: api}]",
		"plans:\n  free: {t: 100/s}\ndefault_plan: free\nlimits: [{by: api_key, plan: t, cost: response, estimate: 9}]",
		tokensConfig,
	} {
		f.Add([]byte(tc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *ConfigError", err)
			}
			return
		}
		l, err := New(c, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), Settings{})
		if err != nil {
			t.Fatalf("parsed config does not compile: %v", err)
		}
		if err := l.reload("fuzz.yaml", data); err != nil {
			t.Fatalf("reload: %v", err)
		}
	})
}
