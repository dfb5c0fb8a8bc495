package tiers

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// maxNodes bounds the YAML nodes a config may expand to (aliases count each
// time they are used), so a small hostile file cannot make the parser work
// without bound.
const maxNodes = 100_000

// maxConfigBytes bounds the size of a config file.
const maxConfigBytes = 4 << 20

// ParseFile reads and parses a config file; errors name the file's base
// name and the line.
func ParseFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tiers: %w", err)
	}
	return Parse(filepath.Base(path), data)
}

// Parse parses a YAML config. name is the file name used in error messages
// ("limits.yaml"). The config is fully validated: unknown fields,
// malformed values and contradictory rules are errors (a *ConfigError that
// names the line and the field). Parse never panics, whatever data holds.
func Parse(name string, data []byte) (*Config, error) {
	c, err := parse(name, data)
	if err != nil {
		return nil, err
	}
	if _, err := compile(c); err != nil {
		return nil, err
	}
	return c, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func parse(name string, data []byte) (*Config, error) {
	p := &parser{file: name}
	if len(data) > maxConfigBytes {
		return nil, p.errf(nil, "", "file is %d bytes, more than the %d allowed", len(data), maxConfigBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := err.Error()
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, &ConfigError{File: name, Line: line, Msg: m[2]}
		}
		return nil, &ConfigError{File: name, Msg: strings.TrimPrefix(msg, "yaml: ")}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, p.errf(nil, "", "empty config (want a mapping with limits:)")
	}
	root, err := p.resolve(doc.Content[0])
	if err != nil {
		return nil, err
	}
	c := &Config{File: name}
	if err := p.mapping(root, "config", func(key string, k, v *yaml.Node) error {
		switch key {
		case "limits":
			return p.limits(c, v)
		case "plans":
			return p.plans(c, v)
		case "default_plan":
			s, err := p.str(v, key)
			c.DefaultPlan = s
			c.defaultPlanLine = v.Line
			return err
		}
		return p.errf(k, "", "unknown field %q (want limits, plans or default_plan)", key)
	}); err != nil {
		return nil, err
	}
	if !p.sawLimits {
		return nil, p.errf(root, "", "missing limits")
	}
	return c, nil
}

type parser struct {
	file      string
	nodes     int
	sawLimits bool
}

func (p *parser) errf(n *yaml.Node, field, format string, args ...any) error {
	e := &ConfigError{File: p.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line = n.Line
	}
	return e
}

// resolve follows aliases and counts the node against the budget.
func (p *parser) resolve(n *yaml.Node) (*yaml.Node, error) {
	for depth := 0; n != nil && n.Kind == yaml.AliasNode; depth++ {
		if depth > 32 || n.Alias == nil {
			return nil, p.errf(n, "", "alias %q cannot be resolved", n.Value)
		}
		n = n.Alias
	}
	if n == nil {
		return nil, p.errf(nil, "", "missing value")
	}
	p.nodes++
	if p.nodes > maxNodes {
		return nil, p.errf(n, "", "config expands to more than %d nodes", maxNodes)
	}
	return n, nil
}

// mapping walks a mapping node, rejecting duplicate keys, and calls f for
// each key with the resolved value.
func (p *parser) mapping(n *yaml.Node, what string, f func(key string, k, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "", "%s: want a mapping, got %s", what, kindName(n))
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := p.resolve(n.Content[i])
		if err != nil {
			return err
		}
		if k.Kind != yaml.ScalarNode {
			return p.errf(k, "", "%s: want a field name, got %s", what, kindName(k))
		}
		key := k.Value
		if key == "<<" {
			return p.errf(k, "", "merge keys (<<) are not supported")
		}
		if line, dup := seen[key]; dup {
			return p.errf(k, key, "duplicate field (first at line %d)", line)
		}
		seen[key] = k.Line
		v, err := p.resolve(n.Content[i+1])
		if err != nil {
			return err
		}
		if err := f(key, k, v); err != nil {
			return err
		}
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "a document"
}

// str returns a scalar's text; null, lists and mappings are errors.
func (p *parser) str(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return "", p.errf(n, field, "want a string, got %s", kindName(n))
	}
	return n.Value, nil
}

// strs accepts a string or a list of strings.
func (p *parser) strs(n *yaml.Node, field string) ([]string, error) {
	if n.Kind == yaml.SequenceNode {
		if len(n.Content) == 0 {
			return nil, p.errf(n, field, "empty list")
		}
		out := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			c, err := p.resolve(c)
			if err != nil {
				return nil, err
			}
			s, err := p.str(c, field)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	s, err := p.str(n, field)
	if err != nil {
		return nil, err
	}
	return []string{s}, nil
}

func (p *parser) limits(c *Config, n *yaml.Node) error {
	p.sawLimits = true
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil // "limits:" with nothing: no rules
	}
	if n.Kind != yaml.SequenceNode {
		return p.errf(n, "limits", "want a list of rules, got %s", kindName(n))
	}
	for _, item := range n.Content {
		item, err := p.resolve(item)
		if err != nil {
			return err
		}
		r, err := p.rule(item)
		if err != nil {
			return err
		}
		c.Rules = append(c.Rules, r)
	}
	return nil
}

var ruleFields = "id, name, endpoint, method, by, bucket, algorithm, buckets, mode, fail, shadow, plan, cost, estimate"

func (p *parser) rule(n *yaml.Node) (Rule, error) {
	r := Rule{Line: n.Line}
	if n.Kind != yaml.MappingNode {
		return r, p.errf(n, "", "rule: want a mapping, got %s", kindName(n))
	}
	var (
		haveBucket bool
		bucketNode *yaml.Node
		algoNode   *yaml.Node
		costNode   *yaml.Node
		estNode    *yaml.Node
		winNode    *yaml.Node // buckets or mode, the later one
		idField    string
	)
	err := p.mapping(n, "rule", func(key string, k, v *yaml.Node) error {
		switch key {
		case "id", "name":
			if idField != "" {
				return p.errf(k, key, "contradicts %s (a rule has one id)", idField)
			}
			idField = key
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			if s == "" {
				return p.errf(v, key, "must not be empty")
			}
			r.ID = s
		case "endpoint":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			if m, path, ok := strings.Cut(strings.TrimSpace(s), " "); ok {
				path = strings.TrimSpace(path)
				m = strings.ToUpper(m)
				if !validMethod(m) {
					return p.errf(v, fmt.Sprintf("endpoint %q", s), "%q is not an HTTP method (write \"POST /path\")", m)
				}
				if len(r.Methods) > 0 && (len(r.Methods) != 1 || r.Methods[0] != m) {
					return p.errf(v, fmt.Sprintf("endpoint %q", s), "method %s contradicts method: %s", m, strings.Join(r.Methods, ","))
				}
				r.Methods = []string{m}
				s = path
			}
			r.Endpoint = s
			if err := checkEndpoint(s); err != nil {
				return p.errf(v, fmt.Sprintf("endpoint %q", s), "%s", err)
			}
		case "method":
			ms, err := p.strs(v, key)
			if err != nil {
				return err
			}
			for i, m := range ms {
				ms[i] = strings.ToUpper(strings.TrimSpace(m))
				if !validMethod(ms[i]) {
					return p.errf(v, fmt.Sprintf("method %q", m), "not an HTTP method")
				}
			}
			if len(r.Methods) > 0 && !sameSet(r.Methods, ms) {
				return p.errf(v, key, "%s contradicts the method in endpoint (%s)", strings.Join(ms, ","), strings.Join(r.Methods, ","))
			}
			r.Methods = ms
		case "by":
			by, err := p.strs(v, key)
			if err != nil {
				return err
			}
			for _, d := range by {
				if !dimName(d) {
					return p.errf(v, fmt.Sprintf("by %q", d), "not a dimension name (lower-case letters, digits, _ - ., starting with a letter)")
				}
			}
			r.By = by
		case "bucket":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			b, err := parseBucket(s)
			if err != nil {
				return p.errf(v, fmt.Sprintf("bucket %q", s), "%s", err)
			}
			if b.Unlimited {
				return p.errf(v, fmt.Sprintf("bucket %q", s), "unlimited is only allowed in plans (remove the rule instead)")
			}
			r.Bucket, haveBucket, bucketNode = b, true, v
		case "algorithm":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			var a ratelimit.Algorithm
			if err := a.UnmarshalText([]byte(s)); err != nil {
				return p.errf(v, fmt.Sprintf("algorithm %q", s), "unknown (want one of %s)", ratelimit.AlgorithmNames)
			}
			r.Algorithm, algoNode = a, v
		case "buckets":
			n, err := p.count(v, key)
			if err != nil {
				return err
			}
			if n < 1 || n > ratelimit.MaxBuckets {
				return p.errf(v, fmt.Sprintf("buckets %d", n), "want 1 to %d sub-windows per period", ratelimit.MaxBuckets)
			}
			r.Buckets = n
			if winNode == nil || v.Line > winNode.Line {
				winNode = v
			}
		case "mode":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			switch s {
			case ratelimit.Interpolated.String():
				r.Mode = ratelimit.Interpolated
			case ratelimit.Conservative.String():
				r.Mode = ratelimit.Conservative
			default:
				return p.errf(v, fmt.Sprintf("mode %q", s), "want interpolated (the default) or conservative")
			}
			if winNode == nil || v.Line > winNode.Line {
				winNode = v
			}
		case "fail":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			f, err := spillway.ParseFailMode(s)
			if err != nil || s != f.String() {
				return p.errf(v, fmt.Sprintf("fail %q", s), "want open or closed")
			}
			r.Fail = f
		case "shadow":
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" {
				return p.errf(v, key, "want true or false, got %s", kindName(v))
			}
			b, err := strconv.ParseBool(strings.ToLower(v.Value))
			if err != nil {
				return p.errf(v, key, "want true or false, got %q", v.Value)
			}
			r.Shadow = b
		case "plan":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			if !dimName(s) {
				return p.errf(v, fmt.Sprintf("plan %q", s), "not a bucket name (lower-case letters, digits, _ - ., starting with a letter)")
			}
			r.Plan = s
		case "cost":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			switch s {
			case "request":
				r.Cost = CostRequest
			case "response":
				r.Cost = CostResponse
			default:
				return p.errf(v, fmt.Sprintf("cost %q", s), "want request (charged at admission, the default) or response (held at admission, settled to the actual cost)")
			}
			costNode = v
		case "estimate":
			n, err := p.count(v, key)
			if err != nil {
				return err
			}
			r.Estimate, estNode = n, v
		default:
			return p.errf(k, "", "unknown field %q in rule (want one of %s)", key, ruleFields)
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	// Per-rule checks that can name the exact line; compile repeats them
	// (with the rule's line) for configs built in Go.
	if len(r.By) == 0 {
		return r, p.errf(n, "", "rule: missing by (ip, user, api_key, endpoint or a dimension name)")
	}
	if haveBucket && r.Plan != "" {
		return r, p.errf(bucketNode, "bucket", "contradicts plan: %s (a rule takes its rate from one of them)", r.Plan)
	}
	if winNode != nil && r.Algorithm != ratelimit.SlidingWindowBuckets {
		return r, p.errf(winNode, winNode.Value, "buckets and mode are for algorithm: sliding_window_buckets, not %s", r.Algorithm)
	}
	if !haveBucket && r.Plan == "" {
		return r, p.errf(n, "", "rule: missing bucket (e.g. bucket: 10/minute) or plan")
	}
	if haveBucket {
		if err := r.policy(r.Bucket).Validate(); err != nil {
			at, field := bucketNode, fmt.Sprintf("bucket %q", bucketNode.Value)
			if algoNode != nil && algoNode.Line > at.Line {
				at = algoNode
			}
			if winNode != nil && winNode.Line > at.Line {
				at = winNode
			}
			return r, p.errf(at, field, "%s", strings.TrimPrefix(err.Error(), "ratelimit: invalid policy: "))
		}
	}
	switch {
	case estNode != nil && r.Cost != CostResponse:
		return r, p.errf(estNode, "estimate", "only a rule with cost: response holds an estimate")
	case r.Cost != CostResponse:
	case !holds(r.Algorithm):
		at := costNode
		if algoNode != nil && algoNode.Line > at.Line {
			at = algoNode
		}
		e := p.errf(at, "cost: response", "%s keeps no holds: use token_bucket, gcra or leaky_bucket", r.Algorithm).(*ConfigError)
		e.Err = ratelimit.ErrHoldUnsupported
		return r, e
	case estNode == nil:
		return r, p.errf(costNode, "cost: response", "missing estimate (the units held at admission, e.g. estimate: 250)")
	case r.Estimate < 1 || haveBucket:
		if msg, span := checkEstimate(r.policy(r.Bucket), r.Estimate); msg != "" {
			at, field := estNode, ""
			if haveBucket && (span || bucketNode.Line > at.Line) {
				at, field = bucketNode, fmt.Sprintf("bucket %q", bucketNode.Value)
			}
			return r, p.errf(at, field, "%s", msg)
		}
	}
	return r, nil
}

// count parses a whole number ≥ 0 written as a plain YAML number.
func (p *parser) count(n *yaml.Node, field string) (int64, error) {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		return 0, p.errf(n, field, "want a whole number, got %s", kindName(n))
	}
	v, err := parseCount(n.Value, field)
	if err != nil {
		return 0, p.errf(n, "", "%s", err)
	}
	return v, nil
}

func (p *parser) plans(c *Config, n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "plans", "want a mapping of plan names to buckets, got %s", kindName(n))
	}
	c.Plans = make(map[string]Plan)
	return p.mapping(n, "plans", func(name string, k, v *yaml.Node) error {
		if !dimName(name) {
			return p.errf(k, fmt.Sprintf("plan %q", name), "not a plan name (lower-case letters, digits, _ - ., starting with a letter)")
		}
		pl := Plan{Name: name, Buckets: map[string]Bucket{}, Line: k.Line}
		if v.Kind != yaml.MappingNode {
			return p.errf(v, fmt.Sprintf("plan %q", name), "want a mapping of bucket names to rates (api: 100/minute), got %s", kindName(v))
		}
		err := p.mapping(v, "plan "+name, func(entry string, ek, ev *yaml.Node) error {
			if !dimName(entry) {
				return p.errf(ek, fmt.Sprintf("plan %q", name), "bucket name %q: lower-case letters, digits, _ - ., starting with a letter", entry)
			}
			s, err := p.str(ev, fmt.Sprintf("plan %q: %s", name, entry))
			if err != nil {
				return err
			}
			b, err := parseBucket(s)
			if err != nil {
				return p.errf(ev, fmt.Sprintf("plan %q: %s %q", name, entry, s), "%s", err)
			}
			pl.Buckets[entry] = b
			return nil
		})
		c.Plans[name] = pl
		return err
	})
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := append([]string(nil), a...), append([]string(nil), b...)
	sort.Strings(x)
	sort.Strings(y)
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}
