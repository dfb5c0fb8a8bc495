package tiers

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// compiled is a validated config in the shape Admit walks.
type compiled struct {
	cfg         *Config
	rules       []*crule
	byID        map[string]*crule
	byScope     map[string]*crule // every store scope a rule writes
	defaultPlan string
	hasPlanRule bool
	response    *crule // the first "cost: response" rule, nil when none
}

type crule struct {
	id      string
	m       matcher
	methods []string
	by      []string // sorted
	shadow  bool
	fail    spillway.FailMode // FailOpen for shadow rules
	line    int

	// response: "cost: response", holding estimate (or Request.Cost).
	response bool
	estimate int64

	// plan == "": one policy; else perPlan maps a plan name to its bucket.
	policy  ratelimit.Policy
	scope   string
	plan    string
	perPlan map[string]planned

	stats *ruleStats
}

type planned struct {
	policy    ratelimit.Policy
	scope     string
	unlimited bool
}

// scopeOf is the store scope of a rule under a policy: its id and a digest
// of the policy. An unchanged rule keeps its scope (and so its counters)
// across a Swap; a rule whose rate or algorithm changed starts afresh
// instead of reading state written under another policy.
func scopeOf(id string, p ratelimit.Policy) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d/%d", p.Algorithm, p.Limit, int64(p.Period), p.Burst)
	if p.Algorithm == ratelimit.SlidingWindowBuckets {
		fmt.Fprintf(h, "/%d", rateHooks.EffectiveBuckets(p)) // the mode reads the same counts
	}
	return fmt.Sprintf("%s@%012x", id, h.Sum64()>>16)
}

func (c *Config) errAt(line int, field, format string, args ...any) error {
	return &ConfigError{File: c.File, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// compile validates c and builds its matching form. It checks everything
// Parse checks, so configs built in Go get the same errors (with the
// rule's line when it has one).
func compile(c *Config) (*compiled, error) {
	if c == nil {
		return nil, &ConfigError{Msg: "nil config"}
	}
	out := &compiled{cfg: c, byID: make(map[string]*crule, len(c.Rules)), byScope: make(map[string]*crule, len(c.Rules)), defaultPlan: c.DefaultPlan}

	if len(c.Plans) > 0 || c.DefaultPlan != "" {
		if c.DefaultPlan == "" {
			return nil, c.errAt(0, "default_plan", "missing (the plan of a request whose plan is not known)")
		}
		if _, ok := c.Plans[c.DefaultPlan]; !ok {
			return nil, c.errAt(c.defaultPlanLine, fmt.Sprintf("default_plan %q", c.DefaultPlan), "no such plan (have %s)", planNames(c))
		}
	}
	for name, pl := range c.Plans {
		if !dimName(name) || pl.Name != "" && pl.Name != name {
			return nil, c.errAt(pl.Line, fmt.Sprintf("plan %q", name), "not a plan name")
		}
		for entry, b := range pl.Buckets {
			if !dimName(entry) {
				return nil, c.errAt(pl.Line, fmt.Sprintf("plan %q", name), "bucket name %q: lower-case letters, digits, _ - ., starting with a letter", entry)
			}
			_ = b
		}
	}

	type matchKey struct {
		endpoint, methods, by, plan string
		shadow, response            bool
	}
	seen := make(map[matchKey][]*crule)

	for i := range c.Rules {
		r := &c.Rules[i]
		where := func(field string) string {
			if r.Line > 0 {
				return field
			}
			name := fmt.Sprintf("rule %d", i+1)
			if r.ID != "" {
				name = fmt.Sprintf("rule %q", r.ID)
			}
			if field == "" {
				return name
			}
			return name + ": " + field
		}
		if err := checkEndpoint(r.Endpoint); err != nil {
			return nil, c.errAt(r.Line, where(fmt.Sprintf("endpoint %q", r.Endpoint)), "%s", err)
		}
		methods := make([]string, 0, len(r.Methods))
		for _, m := range r.Methods {
			if !validMethod(m) {
				return nil, c.errAt(r.Line, where(fmt.Sprintf("method %q", m)), "not an HTTP method (upper case)")
			}
			methods = append(methods, m)
		}
		sort.Strings(methods)
		for j := 1; j < len(methods); j++ {
			if methods[j] == methods[j-1] {
				return nil, c.errAt(r.Line, where(fmt.Sprintf("method %q", methods[j])), "listed twice")
			}
		}
		if len(r.By) == 0 {
			return nil, c.errAt(r.Line, where(""), "missing by (ip, user, api_key, endpoint or a dimension name)")
		}
		by := append([]string(nil), r.By...)
		sort.Strings(by)
		for j, d := range by {
			if !dimName(d) {
				return nil, c.errAt(r.Line, where(fmt.Sprintf("by %q", d)), "not a dimension name (lower-case letters, digits, _ - ., starting with a letter)")
			}
			if j > 0 && by[j-1] == d {
				return nil, c.errAt(r.Line, where(fmt.Sprintf("by %q", d)), "listed twice")
			}
		}
		if r.Fail > spillway.FailClosed {
			return nil, c.errAt(r.Line, where("fail"), "unknown fail mode %d (want spillway.FailOpen or spillway.FailClosed)", uint8(r.Fail))
		}
		switch {
		case r.Cost > CostResponse:
			return nil, c.errAt(r.Line, where("cost"), "unknown cost source %d (want tiers.CostRequest or tiers.CostResponse)", uint8(r.Cost))
		case r.Cost != CostResponse && r.Estimate != 0:
			return nil, c.errAt(r.Line, where("estimate"), "only a rule with cost: response holds an estimate")
		case r.Cost == CostResponse && !holds(r.Algorithm):
			e := c.errAt(r.Line, where("cost: response"), "%s keeps no holds: use token_bucket, gcra or leaky_bucket", r.Algorithm).(*ConfigError)
			e.Err = ratelimit.ErrHoldUnsupported
			return nil, e
		case r.Cost == CostResponse && r.Estimate < 1:
			msg, _ := checkEstimate(ratelimit.Policy{}, r.Estimate)
			return nil, c.errAt(r.Line, where(""), "%s", msg)
		}
		hasBucket := r.Bucket != (Bucket{})
		switch {
		case hasBucket && r.Plan != "":
			return nil, c.errAt(r.Line, where("plan"), "contradicts bucket (a rule takes its rate from one of them)")
		case !hasBucket && r.Plan == "":
			return nil, c.errAt(r.Line, where(""), "missing bucket (e.g. bucket: 10/minute) or plan")
		case hasBucket && r.Bucket.Unlimited:
			return nil, c.errAt(r.Line, where("bucket"), "unlimited is only allowed in plans")
		}

		cr := &crule{
			id:      r.ID,
			m:       newMatcher(r.Endpoint),
			methods: methods,
			by:      by,
			shadow:  r.Shadow,
			fail:    r.Fail,
			line:    r.Line,
			plan:    r.Plan,
			stats:   &ruleStats{},

			response: r.Cost == CostResponse,
			estimate: r.Estimate,
		}
		if cr.shadow {
			cr.fail = spillway.FailOpen // a shadow rule never denies, not even on failure
		}
		if cr.id == "" {
			norm := *r
			norm.Methods, norm.By = methods, by
			cr.id = defaultID(&norm)
		}
		if len(cr.id) > 200 {
			return nil, c.errAt(r.Line, where("id"), "longer than 200 bytes")
		}

		if hasBucket {
			cr.policy = r.policy(r.Bucket)
			if err := cr.policy.Validate(); err != nil {
				return nil, c.errAt(r.Line, where(fmt.Sprintf("bucket %q", r.Bucket.text())), "%s", strings.TrimPrefix(err.Error(), "ratelimit: invalid policy: "))
			}
			cr.scope = scopeOf(cr.id, cr.policy)
			if cr.response {
				if msg, span := checkEstimate(cr.policy, r.Estimate); msg != "" {
					field := ""
					if span {
						field = fmt.Sprintf("bucket %q", r.Bucket.text())
					}
					return nil, c.errAt(r.Line, where(field), "%s", msg)
				}
			}
		} else {
			if !dimName(r.Plan) {
				return nil, c.errAt(r.Line, where(fmt.Sprintf("plan %q", r.Plan)), "not a bucket name")
			}
			if len(c.Plans) == 0 {
				return nil, c.errAt(r.Line, where(fmt.Sprintf("plan %q", r.Plan)), "no plans: section defines it")
			}
			cr.perPlan = make(map[string]planned, len(c.Plans))
			for _, name := range sortedPlans(c) {
				pl := c.Plans[name]
				b, ok := pl.Buckets[r.Plan]
				if !ok {
					return nil, c.errAt(pl.Line, fmt.Sprintf("plan %q", name), "no bucket %q (used by the rule at line %d; write %s: unlimited if the plan has no limit)", r.Plan, r.Line, r.Plan)
				}
				if b.Unlimited {
					cr.perPlan[name] = planned{unlimited: true}
					continue
				}
				p := r.policy(b)
				if err := p.Validate(); err != nil {
					return nil, c.errAt(pl.Line, fmt.Sprintf("plan %q: %s %q", name, r.Plan, b.text()), "%s", strings.TrimPrefix(err.Error(), "ratelimit: invalid policy: "))
				}
				if cr.response {
					if msg, _ := checkEstimate(p, r.Estimate); msg != "" {
						return nil, c.errAt(pl.Line, fmt.Sprintf("plan %q: %s %q", name, r.Plan, b.text()), "%s (the estimate of the rule at line %d)", msg, r.Line)
					}
				}
				cr.perPlan[name] = planned{policy: p, scope: scopeOf(cr.id, p)}
			}
			out.hasPlanRule = true
		}

		// Two rules that select the same requests by the same dimensions
		// are fine only as layered windows (10/second and 1000/hour);
		// the same period twice is a contradiction (or a duplicate).
		k := matchKey{endpoint: normEndpoint(r.Endpoint), methods: strings.Join(methods, ","), by: strings.Join(by, ","), plan: r.Plan, shadow: r.Shadow, response: r.Cost == CostResponse}
		for _, prev := range seen[k] {
			if prev.plan != "" {
				return nil, c.errAt(r.Line, where(""), "duplicates the rule at line %d (same endpoint, method, by and plan)", prev.line)
			}
			if prev.policy.Period == cr.policy.Period {
				if prev.policy == cr.policy {
					return nil, c.errAt(r.Line, where(""), "duplicates the rule at line %d (same endpoint, method, by and bucket)", prev.line)
				}
				return nil, c.errAt(r.Line, where(""), "contradicts the rule at line %d: same endpoint, method and by with another bucket of the same period", prev.line)
			}
		}
		seen[k] = append(seen[k], cr)
		if prev, dup := out.byID[cr.id]; dup {
			return nil, c.errAt(r.Line, fmt.Sprintf("id %q", cr.id), "same as the rule at line %d (set a distinct id:)", prev.line)
		}

		out.byID[cr.id] = cr
		if cr.plan == "" {
			out.byScope[cr.scope] = cr
		}
		for _, pb := range cr.perPlan {
			if !pb.unlimited {
				out.byScope[pb.scope] = cr
			}
		}
		out.rules = append(out.rules, cr)
		if cr.response && out.response == nil {
			out.response = cr
		}
	}
	return out, nil
}

// holds reports whether algorithm a can hold an estimate (the bucket
// family: see reserver).
func holds(a ratelimit.Algorithm) bool {
	return a == ratelimit.TokenBucket || a == ratelimit.GCRA || a == ratelimit.LeakyBucket
}

// maxHoldSpan is the bound ratelimit puts on Burst·T (µs) of a policy that
// holds.
const maxHoldSpan = 1 << 51

// checkEstimate says what is wrong with holding estimate est under p (of
// the bucket family, valid), or "": span is true when the policy itself
// is what holds cannot take.
func checkEstimate(p ratelimit.Policy, est int64) (msg string, span bool) {
	switch {
	case est < 1:
		return fmt.Sprintf("estimate %d must be at least 1 (holding nothing, a request would be admitted even while its key is in debt)", est), false
	case rateHooks.EffectiveBurst(p) > maxHoldSpan/rateHooks.EmissionInterval(p):
		return fmt.Sprintf("burst %d × interval %dµs exceeds 2^51 µs, the bound for holds", rateHooks.EffectiveBurst(p), rateHooks.EmissionInterval(p)), true
	case est > p.Capacity():
		return fmt.Sprintf("estimate %d is above the burst %d: no request could ever be admitted", est, p.Capacity()), false
	}
	return "", false
}
func normEndpoint(s string) string {
	if s == "" {
		return "*"
	}
	return s
}

func sortedPlans(c *Config) []string {
	names := make([]string, 0, len(c.Plans))
	for n := range c.Plans {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func planNames(c *Config) string {
	names := sortedPlans(c)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
