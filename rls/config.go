package rls

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/ratelimit"
)

// ConfigError is a config file that cannot be loaded: it names the file
// and, when known, the line.
type ConfigError struct {
	File string
	Line int // 0 when the error is about the whole file
	Msg  string
}

func (e *ConfigError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("rls: %s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("rls: %s: %s", e.File, e.Msg)
}

// File is one config file to load: its name (used in errors) and content.
type File struct {
	Name    string
	Content []byte
}

// Config is a set of loaded domains: the reference server's descriptor
// trees, with spillway's policies behind each rate_limit. A Config is
// immutable once built and safe for concurrent use.
type Config struct {
	domains map[string]*node
	rules   []*rule // every rule, in load order (for the stats page)
}

// node is one level of a descriptor tree: the descriptors below it, by key.
type node struct {
	keys          map[string]*keyLevel
	rule          *rule  // the rate_limit at this node; nil when it has none
	valueToMetric bool   // value_to_metric
	pattern       string // the wildcard value this node was declared with, if any
}

// keyLevel holds the descriptors of one key at one level: by exact value,
// by wildcard value (in file order), and the default (key without value).
type keyLevel struct {
	values    map[string]*node
	wildcards []wildcard
	any       *node
}

type wildcard struct {
	parts []string // the pattern split at '*'
	node  *node
}

// match reports whether value matches a pattern split at '*': each '*'
// stands for any run of characters, possibly empty.
func (w *wildcard) match(value string) bool {
	p := w.parts
	if len(p) == 1 {
		return p[0] == value
	}
	if !strings.HasPrefix(value, p[0]) || !strings.HasSuffix(value[len(p[0]):], p[len(p)-1]) {
		return false
	}
	rest := value[len(p[0]) : len(value)-len(p[len(p)-1])]
	for _, part := range p[1 : len(p)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// rule is one rate_limit of a config: the limits a matching descriptor is
// charged against and how its answer and stats are made.
type rule struct {
	Domain    string
	FullKey   string // the stats key: domain.key_value.key2 as the reference names it
	Unlimited bool   // answer OK with no store call
	Shadow    bool   // shadow_mode: count and report, always answer OK
	Detailed  bool   // detailed_metric: stats per request values
	Name      string // rate_limit.name, for replaces
	Replaces  []string
	Limits    []ruleLimit // empty when Unlimited; several with rate_limits
	File      string
	Line      int

	valueToMetric bool // some node on the rule's path has value_to_metric
	stats         *counters
}

// ruleLimit is one limit of a rule.
type ruleLimit struct {
	Policy ratelimit.Policy
	// Unit and RequestsPerUnit are what the answer's current_limit says:
	// the reference unit when Period is one (UNKNOWN otherwise) and Limit.
	Unit            pb.RateLimitResponse_RateLimit_Unit
	RequestsPerUnit uint32
	Name            string // the name in RateLimit-Policy (rate_limit.name, else the rule's key)
	denyAll         bool   // requests_per_unit: 0: every hit is over the limit, no store call
	scope           string // the store scope: domain and policy, so no two policies share state
	current         *pb.RateLimitResponse_RateLimit
}

// unitPeriods are the reference's units and their lengths (a month is 30
// days, a year 365, as the reference counts them).
var unitPeriods = map[pb.RateLimitResponse_RateLimit_Unit]time.Duration{
	pb.RateLimitResponse_RateLimit_SECOND: time.Second,
	pb.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	pb.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	pb.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	pb.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	pb.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	pb.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

func unitOf(period time.Duration) pb.RateLimitResponse_RateLimit_Unit {
	for u, p := range unitPeriods {
		if p == period {
			return u
		}
	}
	return pb.RateLimitResponse_RateLimit_UNKNOWN
}

// The keys of each level: the reference's, read where its config structs
// have them, and spillway's extensions. The reference checks every key of
// a file against one flat set (refKeys) and then ignores a known key where
// its structs have no field for it, so a known key at another level is
// accepted and ignored here too; an extension key at another level is
// refused (the reference would refuse it as unknown anywhere).
var (
	refKeys = keySet("domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit",
		"unlimited", "shadow_mode", "quota_mode", "name", "replaces", "detailed_metric", "value_to_metric",
		"share_threshold", "metadata")
	extKeys = map[string]string{"rate_limits": "a descriptor", "algorithm": "a rate_limit",
		"period": "a rate_limit", "burst": "a rate_limit"}
	rootKeys       = keySet("domain", "descriptors")
	descriptorKeys = keySet("key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode",
		"detailed_metric", "value_to_metric", "metadata", "quota_mode", "share_threshold")
	rateLimitKeys = keySet("unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "period", "burst")
	replacesKeys = keySet("name")
)

func keySet(k ...string) map[string]bool {
	m := make(map[string]bool, len(k))
	for _, s := range k {
		m[s] = true
	}
	return m
}

// LoadOptions configures how files are loaded.
type LoadOptions struct {
	// MergeDomains lets several files add descriptors to one domain
	// (MERGE_DOMAIN_CONFIG); otherwise a domain in two files is an error.
	MergeDomains bool
}

// Load builds a Config from files, in order. It returns a *ConfigError
// naming the file and line of the first problem.
func Load(files []File, o LoadOptions) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	for _, f := range files {
		if err := c.loadFile(f, o); err != nil {
			return nil, err
		}
	}
	return c, nil
}

type loader struct {
	file string
	c    *Config
}

func (l *loader) errf(n *yaml.Node, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &ConfigError{File: l.file, Line: line, Msg: fmt.Sprintf(format, args...)}
}

func (c *Config) loadFile(f File, o LoadOptions) error {
	l := &loader{file: f.Name, c: c}
	var doc yaml.Node
	if err := yaml.Unmarshal(f.Content, &doc); err != nil {
		msg, line := strings.TrimPrefix(err.Error(), "yaml: "), 0
		// "line N: what": the line goes where every other error has it
		if rest, ok := strings.CutPrefix(msg, "line "); ok {
			if n, what, ok := strings.Cut(rest, ": "); ok {
				if v, err := strconv.Atoi(n); err == nil {
					msg, line = what, v
				}
			}
		}
		return &ConfigError{File: f.Name, Line: line, Msg: "error loading config file: " + msg}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	r := resolver{l: l, active: map[*yaml.Node]bool{}}
	root, err := r.resolve(root)
	if err != nil {
		return err
	}
	if root.Kind == 0 || (root.Kind == yaml.ScalarNode && root.Tag == "!!null") {
		return l.errf(nil, "config file cannot have empty domain")
	}
	if root.Kind != yaml.MappingNode {
		return l.errf(root, "config file must be a mapping with domain and descriptors")
	}
	fields, err := l.fields(root, rootKeys)
	if err != nil {
		return err
	}
	domain, err := l.str(fields["domain"])
	if err != nil {
		return err
	}
	if domain == "" {
		return l.errf(root, "config file cannot have empty domain")
	}
	d, ok := c.domains[domain]
	if ok && !o.MergeDomains {
		return l.errf(fields["domain"], "duplicate domain '%s' in config file", domain)
	}
	if !ok {
		d = &node{}
		c.domains[domain] = d
	}
	return l.descriptors(d, domain, domain+".", fields["descriptors"], false)
}

// fields returns the values of mapping n by key: the keys in allowed, the
// last one when a key appears twice (as the reference reads them). A
// reference key that belongs elsewhere is checked (checkTree) and ignored,
// as the reference ignores it; any other key is refused.
func (l *loader) fields(n *yaml.Node, allowed map[string]bool) (map[string]*yaml.Node, error) {
	m := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if err := l.key(k); err != nil {
			return nil, err
		}
		if allowed[k.Value] {
			if err := l.checkScalar(k.Value, v); err != nil {
				return nil, err
			}
			m[k.Value] = v
			continue
		}
		if where, ok := extKeys[k.Value]; ok {
			return nil, l.errf(k, "config error, key '%s' belongs in %s", k.Value, where)
		}
		if err := l.checkTree(k.Value, v); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// key checks one mapping key: a string the reference or spillway knows.
func (l *loader) key(k *yaml.Node) error {
	if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
		return l.errf(k, "config error, key is not of type string: %s", k.Value)
	}
	if !refKeys[k.Value] && extKeys[k.Value] == "" {
		return l.errf(k, "config error, unknown key '%s'", k.Value)
	}
	return nil
}

// checkTree checks the value of a key that is ignored where it stands, as
// the reference checks every value of a file: mappings of known keys, lists
// of mappings, and scalars that are strings, integers, booleans or null.
func (l *loader) checkTree(name string, v *yaml.Node) error {
	if name == "metadata" {
		return nil // free-form, as in the reference
	}
	switch v.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(v.Content); i += 2 {
			if err := l.key(v.Content[i]); err != nil {
				return err
			}
			if err := l.checkTree(v.Content[i].Value, v.Content[i+1]); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, e := range v.Content {
			if e.Kind != yaml.MappingNode {
				return l.errf(e, "config error, yaml file contains list of type other than map: %s", e.Value)
			}
			if err := l.checkTree("", e); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		return l.checkScalar(name, v)
	}
	return nil
}

// checkScalar refuses the scalars the reference refuses anywhere: a
// number with a fraction, a timestamp with an explicit tag, binary.
func (l *loader) checkScalar(name string, v *yaml.Node) error {
	if v.Kind != yaml.ScalarNode || name == "metadata" {
		return nil
	}
	switch v.ShortTag() {
	case "!!str", "!!int", "!!bool", "!!null", "!!timestamp":
		return nil
	}
	return l.errf(v, "%s: %q is not a string, an integer or a boolean", name, v.Value)
}

func (l *loader) str(n *yaml.Node) (string, error) {
	if n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		return "", l.errf(n, "expected a string")
	}
	return n.Value, nil
}

func (l *loader) boolean(n *yaml.Node, name string) (bool, error) {
	if n == nil {
		return false, nil
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		return false, l.errf(n, "%s: expected true or false, got %q", name, n.Value)
	}
	return b, nil
}

func (l *loader) integer(n *yaml.Node, name string, max uint64) (uint64, error) {
	if n == nil {
		return 0, nil
	}
	v, err := strconv.ParseUint(n.Value, 10, 64)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || err != nil || v > max {
		return 0, l.errf(n, "%s: expected an integer from 0 to %d, got %q", name, max, n.Value)
	}
	return v, nil
}

// descriptors loads a descriptors list into parent. path is the stats key
// so far ("domain." at the top); v2m says a node above has value_to_metric.
func (l *loader) descriptors(parent *node, domain, path string, list *yaml.Node, v2m bool) error {
	if list == nil || (list.Kind == yaml.ScalarNode && list.Tag == "!!null") {
		return nil
	}
	if list.Kind != yaml.SequenceNode {
		return l.errf(list, "descriptors: expected a list")
	}
	for _, dn := range list.Content {
		if dn.Kind != yaml.MappingNode {
			return l.errf(dn, "config error, yaml file contains list of type other than map: %s", dn.Value)
		}
		f, err := l.fields(dn, descriptorKeys)
		if err != nil {
			return err
		}
		key, err := l.str(f["key"])
		if err != nil {
			return err
		}
		if key == "" {
			return l.errf(dn, "descriptor has empty key")
		}
		value, err := l.str(f["value"])
		if err != nil {
			return err
		}
		finalKey := key
		if value != "" {
			finalKey += "_" + value
		}
		for _, unsupported := range []string{"quota_mode", "share_threshold"} {
			if b, err := l.boolean(f[unsupported], unsupported); err != nil {
				return err
			} else if b {
				return l.errf(f[unsupported], "%s is not supported by this server", unsupported)
			}
		}
		shadow, err := l.boolean(f["shadow_mode"], "shadow_mode")
		if err != nil {
			return err
		}
		detailed, err := l.boolean(f["detailed_metric"], "detailed_metric")
		if err != nil {
			return err
		}
		valueToMetric, err := l.boolean(f["value_to_metric"], "value_to_metric")
		if err != nil {
			return err
		}
		if m := f["metadata"]; m != nil && m.Kind != yaml.MappingNode && m.Tag != "!!null" {
			return l.errf(m, "metadata: expected a mapping")
		}

		if parent.keys == nil {
			parent.keys = map[string]*keyLevel{}
		}
		kl := parent.keys[key]
		if kl == nil {
			kl = &keyLevel{}
			parent.keys[key] = kl
		}
		n := &node{valueToMetric: valueToMetric}
		switch {
		case value == "":
			if kl.any != nil {
				return l.errf(dn, "duplicate descriptor composite key '%s'", path+finalKey)
			}
			kl.any = n
		case strings.Contains(value, "*"):
			for _, w := range kl.wildcards {
				if strings.Join(w.parts, "*") == value {
					return l.errf(dn, "duplicate descriptor composite key '%s'", path+finalKey)
				}
			}
			n.pattern = value
			kl.wildcards = append(kl.wildcards, wildcard{parts: strings.Split(value, "*"), node: n})
		default:
			if kl.values == nil {
				kl.values = map[string]*node{}
			}
			if kl.values[value] != nil {
				return l.errf(dn, "duplicate descriptor composite key '%s'", path+finalKey)
			}
			kl.values[value] = n
		}

		r := &rule{Domain: domain, FullKey: path + finalKey, Shadow: shadow, Detailed: detailed,
			File: l.file, Line: dn.Line, valueToMetric: v2m || valueToMetric}
		has := false
		if rl := f["rate_limit"]; rl != nil && rl.Tag != "!!null" {
			if err := l.rateLimit(r, rl, true); err != nil {
				return err
			}
			has = true
		}
		if rls := f["rate_limits"]; rls != nil && rls.Tag != "!!null" {
			if rls.Kind != yaml.SequenceNode || len(rls.Content) == 0 {
				return l.errf(rls, "rate_limits: expected a non-empty list of rate_limit entries")
			}
			if r.Unlimited {
				return l.errf(rls, "rate_limits: the descriptor's rate_limit is unlimited")
			}
			for _, e := range rls.Content {
				if err := l.rateLimit(r, e, !has); err != nil {
					return err
				}
				has = true
			}
		}
		if has {
			n.rule = r
			l.c.rules = append(l.c.rules, r)
		}
		if err := l.descriptors(n, domain, path+finalKey+".", f["descriptors"], v2m || valueToMetric); err != nil {
			return err
		}
	}
	return nil
}

// rateLimit adds one rate_limit block to r. first says it is the block
// that carries the rule's name, replaces and unlimited.
func (l *loader) rateLimit(r *rule, n *yaml.Node, first bool) error {
	if n.Kind != yaml.MappingNode {
		return l.errf(n, "rate_limit: expected a mapping")
	}
	f, err := l.fields(n, rateLimitKeys)
	if err != nil {
		return err
	}
	unlimited, err := l.boolean(f["unlimited"], "unlimited")
	if err != nil {
		return err
	}
	name, err := l.str(f["name"])
	if err != nil {
		return err
	}
	unitStr, err := l.str(f["unit"])
	if err != nil {
		return err
	}
	periodStr, err := l.str(f["period"])
	if err != nil {
		return err
	}
	unit, known := pb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unitStr)]
	validUnit := known && unit != int32(pb.RateLimitResponse_RateLimit_UNKNOWN)
	if unlimited {
		if !first {
			return l.errf(n, "unlimited is allowed only in the descriptor's rate_limit")
		}
		if validUnit || periodStr != "" {
			return l.errf(n, "should not specify rate limit unit when unlimited")
		}
		for _, k := range []string{"algorithm", "burst"} {
			if f[k] != nil {
				return l.errf(f[k], "%s: not allowed when unlimited", k)
			}
		}
		r.Unlimited = true
	} else {
		var period time.Duration
		switch {
		case periodStr != "" && unitStr != "":
			return l.errf(f["period"], "set either unit or period, not both")
		case validUnit:
			period = unitPeriods[pb.RateLimitResponse_RateLimit_Unit(unit)]
		case unitStr != "" || periodStr != "":
			// spillway's extension: any duration ("30s", "1m30s") as unit or period
			s, at := unitStr, f["unit"]
			if s == "" {
				s, at = periodStr, f["period"]
			}
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				return l.errf(at, "invalid rate limit unit '%s' (want second, minute, hour, day, week, month, year or a duration like 30s)", s)
			}
			period = d
		default:
			return l.errf(n, "invalid rate limit unit ''")
		}
		rpu, err := l.integer(f["requests_per_unit"], "requests_per_unit", math.MaxUint32)
		if err != nil {
			return err
		}
		alg := ratelimit.FixedWindow
		if a := f["algorithm"]; a != nil {
			if err = alg.UnmarshalText([]byte(a.Value)); err != nil {
				return l.errf(a, "algorithm: %s", strings.TrimPrefix(err.Error(), "ratelimit: "))
			}
		}
		burst, err := l.integer(f["burst"], "burst", math.MaxUint32)
		if err != nil {
			return err
		}
		lim := ruleLimit{RequestsPerUnit: uint32(rpu), Unit: unitOf(period), Name: name}
		if lim.Name == "" {
			lim.Name = r.FullKey
		}
		lim.Policy = ratelimit.Policy{Algorithm: alg, Limit: int64(rpu), Period: period, Burst: int64(burst)}
		if rpu == 0 {
			lim.denyAll = true
			lim.Policy.Limit = 1 // a valid policy for the headers' window; never sent to a store
		} else if err := lim.Policy.Validate(); err != nil {
			return l.errf(n, "%s", strings.TrimPrefix(err.Error(), "ratelimit: "))
		}
		lim.scope = scopeOf(r.Domain, lim.Policy)
		for _, o := range r.Limits {
			if o.scope == lim.scope {
				return l.errf(n, "two limits of one descriptor with the same algorithm and period (%s)", lim.Policy)
			}
		}
		lim.current = &pb.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: lim.RequestsPerUnit, Unit: lim.Unit}
		r.Limits = append(r.Limits, lim)
	}
	if !first {
		if f["replaces"] != nil {
			return l.errf(f["replaces"], "replaces is allowed only in the descriptor's rate_limit")
		}
		return nil
	}
	r.Name = name
	if rp := f["replaces"]; rp != nil && rp.Tag != "!!null" {
		if rp.Kind != yaml.SequenceNode {
			return l.errf(rp, "replaces: expected a list of {name: ...}")
		}
		for _, e := range rp.Content {
			if e.Kind != yaml.MappingNode {
				return l.errf(e, "config error, yaml file contains list of type other than map: %s", e.Value)
			}
			ef, err := l.fields(e, replacesKeys)
			if err != nil {
				return err
			}
			rn, err := l.str(ef["name"])
			if err != nil {
				return err
			}
			if rn == "" {
				return l.errf(e, "should not have an empty replaces entry")
			}
			if rn == name {
				return l.errf(e, "replaces should not contain name of same descriptor")
			}
			r.Replaces = append(r.Replaces, rn)
		}
	}
	return nil
}

// scopeOf is the store scope of a limit: the domain and the policy, so
// that a config change of a limit's unit or algorithm starts it afresh
// instead of reading another layout's state.
func scopeOf(domain string, p ratelimit.Policy) string {
	var b strings.Builder
	b.WriteString(keys.Escape(domain))
	b.WriteByte('/')
	b.WriteString(p.Algorithm.String())
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(p.Period.Microseconds(), 10))
	if p.Burst != 0 {
		b.WriteByte('/')
		b.WriteString(strconv.FormatInt(p.Burst, 10))
	}
	return b.String()
}

// Domains returns the loaded domains, sorted.
func (c *Config) domainNames() []string {
	d := make([]string, 0, len(c.domains))
	for k := range c.domains {
		d = append(d, k)
	}
	sort.Strings(d)
	return d
}

// Rules returns every rule, in load order.
func (c *Config) allRules() []*rule { return c.rules }

var errNoDomain = errors.New("rls: unknown domain")

// step finds the node for one entry below cur exactly as the reference
// does: the exact key_value first, then the wildcard values in file order,
// then the key alone. how is 'e' (exact), 'w' (wildcard) or 'd' (default).
func step(cur *node, k, v string) (next *node, how byte) {
	kl := cur.keys[k]
	if kl == nil {
		return nil, 0
	}
	if next = kl.values[v]; next != nil {
		return next, 'e'
	}
	for j := range kl.wildcards {
		if kl.wildcards[j].match(v) {
			return kl.wildcards[j].node, 'w'
		}
	}
	return kl.any, 'd'
}

// lookup finds the rule of a descriptor: the rule applies only when the
// last entry lands on a node with a rate_limit. A request with more
// entries than the tree is deep matches nothing, as in the reference.
func (c *Config) lookup(domain string, es []*rlv3.RateLimitDescriptor_Entry) (*rule, error) {
	cur := c.domains[domain]
	if cur == nil {
		return nil, errNoDomain
	}
	n := len(es)
	for i := 0; i < n; i++ {
		k, v := es[i].GetKey(), es[i].GetValue()
		next, _ := step(cur, k, v)
		if next == nil {
			return nil, nil
		}
		if i == n-1 {
			return next.rule, nil
		}
		if len(next.keys) == 0 {
			return nil, nil
		}
		cur = next
	}
	return nil, nil
}

// metricKey is the stats key of a rule matched by es when the rule has
// detailed_metric (every entry as key_value) or value_to_metric on its
// path (the request's value where a node asks for it, else what the node
// was declared with), built as the reference builds it. It walks the tree
// again: the rare path.
func (c *Config) metricKey(r *rule, domain string, es []*rlv3.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	if r.Detailed {
		for _, e := range es {
			k, v := e.GetKey(), e.GetValue()
			b.WriteByte('.')
			b.WriteString(k)
			b.WriteByte('_')
			b.WriteString(v)
		}
		return b.String()
	}
	cur := c.domains[domain]
	for _, e := range es {
		k, v := e.GetKey(), e.GetValue()
		next, how := step(cur, k, v)
		if next == nil {
			break
		}
		b.WriteByte('.')
		b.WriteString(k)
		use := ""
		switch how {
		case 'w':
			use = next.pattern
			if next.valueToMetric {
				use = v
			}
		case 'e':
			use = v
		case 'd':
			if next.valueToMetric {
				use = v
			}
		}
		if use != "" {
			b.WriteByte('_')
			b.WriteString(use)
		}
		cur = next
	}
	return b.String()
}

// resolver expands a file's aliases and merge keys ("<<") into plain
// nodes, as the reference's YAML library reads them, keeping each node's
// line. A merged mapping's own keys win over the merged ones, and among
// several merged mappings the first wins.
type resolver struct {
	l      *loader
	active map[*yaml.Node]bool // anchors being expanded: a cycle
	nodes  int                 // nodes made so far: aliases can multiply a small file
}

// maxNodes bounds what a file's aliases may expand to.
const maxNodes = 1 << 20

func (r *resolver) resolve(n *yaml.Node) (*yaml.Node, error) {
	if n == nil {
		return nil, nil
	}
	if r.nodes++; r.nodes > maxNodes {
		return nil, r.l.errf(n, "error loading config file: aliases expand to more than %d nodes", maxNodes)
	}
	switch n.Kind {
	case yaml.AliasNode:
		if n.Alias == nil {
			return nil, r.l.errf(n, "error loading config file: unknown anchor '%s' referenced", n.Value)
		}
		if r.active[n.Alias] {
			return nil, r.l.errf(n, "error loading config file: anchor '%s' value contains itself", n.Value)
		}
		r.active[n.Alias] = true
		defer delete(r.active, n.Alias)
		return r.resolve(n.Alias)
	case yaml.SequenceNode:
		c := *n
		c.Content = make([]*yaml.Node, len(n.Content))
		for i, e := range n.Content {
			var err error
			if c.Content[i], err = r.resolve(e); err != nil {
				return nil, err
			}
		}
		return &c, nil
	case yaml.MappingNode:
		c := *n
		c.Content = nil
		var merges []*yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
				merges = append(merges, v)
				continue
			}
			rv, err := r.resolve(v)
			if err != nil {
				return nil, err
			}
			c.Content = append(c.Content, k, rv)
		}
		for _, m := range merges {
			rm, err := r.resolve(m)
			if err != nil {
				return nil, err
			}
			srcs := []*yaml.Node{rm}
			if rm.Kind == yaml.SequenceNode {
				srcs = rm.Content
			}
			for _, src := range srcs {
				if src.Kind != yaml.MappingNode {
					return nil, r.l.errf(m, "error loading config file: map merge requires map or sequence of maps as the value")
				}
				for i := 0; i+1 < len(src.Content); i += 2 {
					if !hasKey(&c, src.Content[i]) {
						c.Content = append(c.Content, src.Content[i], src.Content[i+1])
					}
				}
			}
		}
		return &c, nil
	}
	return n, nil
}

func hasKey(m, k *yaml.Node) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Kind == yaml.ScalarNode && m.Content[i].Value == k.Value {
			return true
		}
	}
	return false
}
