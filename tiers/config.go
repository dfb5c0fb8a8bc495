package tiers

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// Bucket is a rate as written in a config: Limit per Period, with an
// optional Burst ("1000/minute, burst 200"). Unlimited is only meaningful
// in a plan: that plan is not limited by the rules that use the entry.
type Bucket struct {
	Limit     int64         // requests per Period
	Period    time.Duration // a whole number of seconds when parsed
	Burst     int64         // bucket capacity; 0 means Limit
	Unlimited bool          // plans only: no limit
}

// Policy returns the ratelimit policy of b under algorithm a.
func (b Bucket) policy(a ratelimit.Algorithm) ratelimit.Policy {
	return ratelimit.Policy{Algorithm: a, Limit: b.Limit, Period: b.Period, Burst: b.Burst}
}

// policy returns the ratelimit policy of the rule at rate b.
func (r *Rule) policy(b Bucket) ratelimit.Policy {
	p := b.policy(r.Algorithm)
	p.Buckets, p.Mode = r.Buckets, r.Mode
	return p
}

// text formats b the way parseBucket reads it ("1000/minute, burst 200").
func (b Bucket) text() string {
	if b.Unlimited {
		return "unlimited"
	}
	var s string
	switch b.Period {
	case time.Second:
		s = fmt.Sprintf("%d/second", b.Limit)
	case time.Minute:
		s = fmt.Sprintf("%d/minute", b.Limit)
	case time.Hour:
		s = fmt.Sprintf("%d/hour", b.Limit)
	case 24 * time.Hour:
		s = fmt.Sprintf("%d/day", b.Limit)
	default:
		s = fmt.Sprintf("%d/%ds", b.Limit, int64(b.Period/time.Second))
		if b.Period%time.Second != 0 {
			s = fmt.Sprintf("%d/%v", b.Limit, b.Period) // not re-parsable; Validate rejects it
		}
	}
	if b.Burst != 0 {
		s += fmt.Sprintf(", burst %d", b.Burst)
	}
	return s
}

var units = map[string]time.Duration{
	"s": time.Second, "sec": time.Second, "secs": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "mins": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hrs": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

// maxPeriod bounds a period (a year): longer ones are surely a mistake and
// would overflow the scripts' arithmetic sooner or later.
const maxPeriod = 366 * 24 * time.Hour

// parseBucket parses "N/unit", "N/Kunit" (e.g. "100/10s", "100/15
// minutes") with an optional ", burst B", or "unlimited". Units: second,
// minute, hour, day, their plurals and s, sec, m, min, h, hr, d. Its
// errors name only the offending part, without the package or the field:
// the config parser adds file, line and field.
func parseBucket(s string) (Bucket, error) {
	text := strings.TrimSpace(s)
	if text == "unlimited" {
		return Bucket{Unlimited: true}, nil
	}
	rate, rest, hasRest := strings.Cut(text, ",")
	var b Bucket
	num, per, ok := strings.Cut(rate, "/")
	if !ok {
		return b, fmt.Errorf("want N/unit, e.g. 10/minute, got %q", text)
	}
	n, err := parseCount(strings.TrimSpace(num), "limit")
	if err != nil {
		return b, err
	}
	if n == 0 {
		return b, errors.New("limit must be positive")
	}
	b.Limit = n
	per = strings.TrimSpace(per)
	i := 0
	for i < len(per) && per[i] >= '0' && per[i] <= '9' {
		i++
	}
	mult := int64(1)
	if i > 0 {
		m, err := parseCount(per[:i], "period")
		if err != nil {
			return b, err
		}
		if m == 0 {
			return b, errors.New("period must be positive")
		}
		mult = m
	}
	unit := strings.TrimSpace(per[i:])
	d, ok := units[unit]
	if !ok && strings.Contains(unit, "burst") {
		return b, fmt.Errorf("want \", burst N\" after the rate (with a comma), got %q", text)
	}
	if !ok {
		if unit == "" {
			return b, fmt.Errorf("missing unit after %q (want second, minute, hour or day)", per)
		}
		return b, fmt.Errorf("unknown unit %q", unit)
	}
	if mult > int64(maxPeriod/d) {
		return b, fmt.Errorf("period %s is longer than a year", per)
	}
	b.Period = time.Duration(mult) * d
	if hasRest {
		f := strings.Fields(rest)
		if len(f) != 2 || f[0] != "burst" {
			return b, fmt.Errorf("want \", burst N\" after the rate, got %q", strings.TrimSpace(rest))
		}
		burst, err := parseCount(f[1], "burst")
		if err != nil {
			return b, err
		}
		b.Burst = burst
	}
	return b, nil
}

// parseCount parses a non-negative decimal integer; a sign is an error
// naming what.
func parseCount(s, what string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("missing %s", what)
	}
	if s[0] == '-' {
		return 0, fmt.Errorf("%s %s must not be negative", what, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%s %q is not a whole number", what, s)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %s is too large", what, s)
	}
	return n, nil
}

// Plan is one API-key tier (free, pro, enterprise): named buckets that the
// rules with a Plan field take their rate from.
type Plan struct {
	Name    string            // the plan's name, as the resolver returns it
	Buckets map[string]Bucket // bucket name (a rule's Plan) → rate
	Line    int               // where it was defined, 0 when built in Go
}

// Rule is one limit of a config. Every rule that matches a request is
// checked in the same store call.
type Rule struct {
	// ID names the rule: it is the Limiter of the decisions it makes, the
	// name in telemetry, and (with the policy) the identity that keeps its
	// counters across a Swap. Default: derived from Method, Endpoint and
	// By, e.g. "POST /api/v1/login:ip".
	ID string
	// Endpoint selects requests by Request.Endpoint: an exact path, a
	// prefix "/api/v1/*" (the path itself and everything below it), a path
	// with "*" segments ("/users/*/posts" matches one segment each), or
	// empty / "*" for every endpoint.
	Endpoint string
	// Methods restricts the rule to these HTTP methods (upper case);
	// empty means any method.
	Methods []string
	// By names the dimensions that key the rule: "ip", "user", "api_key",
	// "endpoint" or any dimension the caller sets on the Request. Several
	// dimensions key one counter per combination. A request that lacks one
	// of them is not limited by the rule.
	By []string
	// Algorithm counts the rule; the zero value is token_bucket.
	Algorithm ratelimit.Algorithm
	// Buckets and Mode configure a sliding_window_buckets rule: its
	// sub-windows per period (0: ratelimit.DefaultBuckets) and how it
	// counts the oldest one (the zero value: interpolated). Other
	// algorithms leave them zero. See ratelimit.Policy.
	Buckets int64
	Mode    ratelimit.WindowMode
	// Bucket is the rate. Exactly one of Bucket and Plan is set.
	Bucket Bucket
	// Plan names the plan entry this rule takes its rate from: the bucket
	// Plans[p].Buckets[Plan] of the request's plan p.
	Plan string
	// Fail says what the rule wants when the store cannot answer: every
	// store item of the rule carries it (ratelimit.Item.Fail), so a
	// fallback.Store under the Limiter fails the rule closed on its own,
	// and a store error names it (spillway.StoreError). A shadow rule
	// never fails closed.
	Fail spillway.FailMode
	// Shadow rules are evaluated, counted and reported, but never deny
	// (dark launches).
	Shadow bool
	// Cost says what the rule charges a request: CostRequest (the zero
	// value) charges Request.Cost when it is admitted; CostResponse
	// charges what the work really cost, reported while or after it runs
	// (Request.Usage): the rule holds an estimate at admission and done
	// settles it to the actual cost (see Limiter.Admit). CostResponse
	// needs an algorithm of the bucket family and a store that holds
	// (reserver).
	Cost CostSource
	// Estimate is what a CostResponse rule holds at admission when the
	// request brings no estimate of its own (Request.Cost 0): at least 1
	// and at most the burst of the rule's bucket (of every plan's bucket
	// for a plan rule). Only CostResponse rules have one.
	Estimate int64
	// Line is where the rule starts in its file, 0 when built in Go.
	Line int
}

// CostSource says what a rule charges a request.
type CostSource uint8

const (
	// CostRequest charges Request.Cost (0 means 1) when the request is
	// admitted: "cost: request", the default.
	CostRequest CostSource = iota
	// CostResponse charges the actual cost of the work, known while or
	// after it runs: "cost: response".
	CostResponse
)

// Config is a parsed tiers configuration. Build one with Parse, ParseFile or
// by hand; New and Swap validate it.
type Config struct {
	// File is the name used in error messages ("limits.yaml").
	File        string
	Rules       []Rule          // in file order; ties in decisions go to the first
	Plans       map[string]Plan // by name
	DefaultPlan string          // the plan of a request whose plan is not known

	defaultPlanLine int
}

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("tiers: invalid config")

// ConfigError is a configuration error that names where it is: the file,
// the line (when known) and the field.
type ConfigError struct {
	File  string // "" when the config was built in Go
	Line  int    // 0 when unknown
	Field string // the field or rule it is about, as written in the message
	Msg   string
	// Err is the sentinel behind the error, when there is one
	// (ratelimit.ErrHoldUnsupported for "cost: response" on a window,
	// or over a store that does not hold).
	Err error
}

// Error formats "tiers: limits.yaml:7: bucket "10/minit": unknown unit "minit"".
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("tiers: ")
	if e.File != "" || e.Line > 0 {
		file := e.File
		if file == "" {
			file = "config"
		}
		b.WriteString(file)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) true, and errors.Is(err,
// e.Err) when Err is set.
func (e *ConfigError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalidConfig, e.Err}
	}
	return []error{ErrInvalidConfig}
}

// dimName reports whether s is a usable dimension name: lower-case letters,
// digits, '_', '-' and '.', starting with a letter. Names appear in keys
// ("ip=…"), so they must not contain '=', ',' or braces.
func dimName(s string) bool {
	if s == "" || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// validMethod reports whether m looks like an HTTP method token.
func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// defaultID derives a rule's id from what it matches.
func defaultID(r *Rule) string {
	var b strings.Builder
	if len(r.Methods) > 0 {
		b.WriteString(strings.Join(r.Methods, ","))
		b.WriteByte(' ')
	}
	ep := r.Endpoint
	if ep == "" {
		ep = "*"
	}
	b.WriteString(ep)
	b.WriteByte(':')
	b.WriteString(strings.Join(r.By, "+"))
	if r.Plan != "" {
		b.WriteString(":plan=")
		b.WriteString(r.Plan)
	}
	if r.Cost == CostResponse {
		b.WriteString(":cost=response")
	}
	if r.Shadow {
		b.WriteString(":shadow")
	}
	return b.String()
}
