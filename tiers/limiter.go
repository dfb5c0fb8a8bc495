package tiers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// DimPlan is the request dimension that names the caller's plan directly
// (set it when authentication already knows the plan); without it the
// plan resolver (Settings.PlanResolver) is asked, then Config.DefaultPlan
// applies.
const DimPlan = "plan"

// ErrUnknownPlan is wrapped by the error Admit returns when a request's plan
// (from DimPlan or the plan resolver) is not in the config.
var ErrUnknownPlan = errors.New("tiers: unknown plan")

// Settings configures New. The zero value means the defaults; a negative
// duration or an out-of-range prefix is an error.
type Settings struct {
	// Name is the Limiter of decisions no rule made (no rule matched, or
	// the request was malformed). Default "tiers".
	Name string

	// PlanResolver maps an API key (the request's "api_key" dimension) to
	// the name of its plan. "" means the config's default plan. It runs
	// at most once per Admit, and only when a rule with a plan matched.
	// Nil: the plan is the request's DimPlan dimension, else the default.
	PlanResolver func(ctx context.Context, apiKey string) (plan string, err error)

	// Shadow receives every shadow rule's decision: d.Allowed is false
	// when the rule would have denied the request; d.Limiter is the
	// rule's id.
	Shadow func(ctx context.Context, r *spillway.Request, d spillway.Decision)

	// IPv6Prefix keys the "ip" dimension of IPv6 clients by their /bits
	// prefix (64 is the usual choice: one subscriber gets a /64). 0 (the
	// default) or 128 keeps whole addresses. IPv4 addresses are
	// unchanged; every IP is normalized either way.
	IPv6Prefix int

	// HoldTTL is how long the hold of a "cost: response" rule lives
	// unsettled before the store releases it by itself (default
	// ratelimit.DefaultHoldTTL, a minute; 1ms to ratelimit.MaxHoldTTL).
	// Make it longer than the longest request: a hold released before
	// done runs is not charged at all (only what the steps charged stays).
	HoldTTL time.Duration

	// SettleTimeout bounds each store call made after admission on the
	// request's behalf: a charge when the work reports a step, the
	// recharge of a request's cost whose hold expired before done
	// (default spillway.DefaultBudget, 50 ms). They run detached from the
	// request's context and budget. The settle of done is not one of
	// them: done hands it to the store's background path and returns; a
	// RedisStore sends it under its own deadline and leaves a hold it
	// could not settle to the TTL.
	SettleTimeout time.Duration

	// HoldObserver is told about the holds of "cost: response" rules
	// (telemetry.NewHoldMetrics returns one).
	HoldObserver HoldObserver
}

// Limiter admits requests against every rule of a config that matches them,
// in one Store.Decide call. It is safe for concurrent use; Swap replaces the
// config atomically while requests run.
type Limiter struct {
	store    ratelimit.Store
	reserver reserver // store, when it holds; nil otherwise
	cur      atomic.Pointer[compiled]
	resolver func(ctx context.Context, apiKey string) (string, error)
	shadowFn func(ctx context.Context, r *spillway.Request, d spillway.Decision)
	v6bits   int
	name     string

	holdTTL       time.Duration
	settleTimeout time.Duration
	observer      HoldObserver
	settling      sync.WaitGroup // settles handed to the store and not yet answered (hold.go)
	recharges     sync.WaitGroup // the recharges after settles (hold.go) under way
}

var _ spillway.Limiter = (*Limiter)(nil)

// New validates cfg and returns a Limiter over store. Do not modify cfg
// afterwards.
func New(cfg *Config, store ratelimit.Store, s Settings) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("tiers: nil store")
	}
	l := &Limiter{store: store, name: "tiers", holdTTL: ratelimit.DefaultHoldTTL, settleTimeout: spillway.DefaultBudget,
		resolver: s.PlanResolver, shadowFn: s.Shadow, v6bits: s.IPv6Prefix, observer: s.HoldObserver}
	l.reserver, _ = store.(reserver)
	if c, ok := store.(interface{ CanReserve() error }); ok && c.CanReserve() != nil {
		l.reserver = nil // a wrapper over stores that cannot hold (fallback.Store.CanReserve)
	}
	if s.Name != "" {
		l.name = s.Name
	}
	if s.HoldTTL != 0 {
		l.holdTTL = s.HoldTTL
	}
	if s.SettleTimeout != 0 {
		l.settleTimeout = s.SettleTimeout
	}
	if l.v6bits < 0 || l.v6bits > 128 {
		return nil, fmt.Errorf("tiers: IPv6 prefix /%d out of range 0..128", l.v6bits)
	}
	if l.holdTTL < time.Millisecond || l.holdTTL > ratelimit.MaxHoldTTL {
		return nil, fmt.Errorf("tiers: hold TTL %v out of range 1ms..%v", l.holdTTL, ratelimit.MaxHoldTTL)
	}
	if l.settleTimeout <= 0 {
		return nil, fmt.Errorf("tiers: settle timeout %v must be positive", l.settleTimeout)
	}
	c, err := l.compile(cfg)
	if err != nil {
		return nil, err
	}
	l.cur.Store(c)
	return l, nil
}

// cannotHold says why store does not hold.
func cannotHold(store ratelimit.Store) string {
	if c, ok := store.(interface{ CanReserve() error }); ok {
		if err := c.CanReserve(); err != nil {
			return err.Error()
		}
	}
	return fmt.Sprintf("%T is not one", store)
}

// compile is compile, plus what depends on the store: a "cost: response"
// rule needs one that holds.
func (l *Limiter) compile(cfg *Config) (*compiled, error) {
	c, err := compile(cfg)
	if err != nil {
		return nil, err
	}
	if r := c.response; r != nil && l.reserver == nil {
		field := fmt.Sprintf("rule %q", r.id)
		return nil, &ConfigError{File: cfg.File, Line: r.line, Field: field, Err: ratelimit.ErrHoldUnsupported,
			Msg: fmt.Sprintf("cost: response needs a store that holds estimates (one with a Reserve method); %s", cannotHold(l.store))}
	}
	return c, nil
}

// Swap validates cfg and makes it the config of every later Admit. A rule
// whose id and policy are unchanged keeps its store scope, so its counters
// carry over; a new or changed rule starts with full
// buckets. On error the old config stays.
func (l *Limiter) Swap(cfg *Config) error {
	c, err := l.compile(cfg)
	if err != nil {
		return err
	}
	old := l.cur.Load()
	for _, r := range c.rules {
		if o, ok := old.byID[r.id]; ok && sameState(o, r) {
			r.stats = o.stats
		}
	}
	l.cur.Store(c)
	return nil
}

// reload parses data (name is used in error messages) and swaps it in.
func (l *Limiter) reload(name string, data []byte) error {
	c, err := parse(name, data)
	if err != nil {
		return err
	}
	return l.Swap(c)
}

// Config returns the config in use.
func (l *Limiter) config() *Config { return l.cur.Load().cfg }

// ruleCounts counts what one rule did since it was loaded (a Swap that keeps
// the rule keeps its counts).
type ruleCounts struct {
	Matched      uint64 // requests the rule applied to
	Denied       uint64 // denials the rule was named in (enforced rules)
	ShadowDenied uint64 // requests a shadow rule would have denied
}

type ruleStats struct{ matched, denied, shadowDenied atomic.Uint64 }

// stats returns the counts of every rule of the config in use, by id.
func (l *Limiter) stats() map[string]ruleCounts {
	c := l.cur.Load()
	m := make(map[string]ruleCounts, len(c.rules))
	for _, r := range c.rules {
		m[r.id] = ruleCounts{Matched: r.stats.matched.Load(), Denied: r.stats.denied.Load(), ShadowDenied: r.stats.shadowDenied.Load()}
	}
	return m
}

// sameState reports whether two compiled rules read and write the same
// store state.
func sameState(a, b *crule) bool {
	if a.scope != b.scope || a.plan != b.plan || len(a.perPlan) != len(b.perPlan) {
		return false
	}
	for k, v := range a.perPlan {
		if b.perPlan[k] != v {
			return false
		}
	}
	return true
}

// batchStack is the number of matching rules a request can have before
// Admit allocates.
const batchStack = 8

// scratch is Admit's working set. The store is an interface, so buffers
// on Admit's stack would escape to the heap on every call; a pool keeps
// Admit allocation-light.
type scratch struct {
	items [batchStack]ratelimit.Item
	rules [batchStack]*crule
	out   [batchStack]spillway.Decision
	used  int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// release clears what the request left (so the pool pins no strings or
// configs) and returns sc to the pool.
func (sc *scratch) release() {
	n := min(sc.used, batchStack)
	clear(sc.items[:n])
	clear(sc.rules[:n])
	sc.used = 0
	scratchPool.Put(sc)
}

// ruleMatch is one rule that applies to a request, with the store item Admit
// decides for it.
type ruleMatch struct {
	Rule   string            // the rule's id
	Shadow bool              // the rule is a shadow rule
	Fail   spillway.FailMode // the rule's fail mode (FailOpen for a shadow rule), also in Item.Fail
	Cost   CostSource        // CostResponse: Item.Cost is the estimate Admit holds
	Item   ratelimit.Item    // what Admit passes to the store for it
}

// matches returns the rules that apply to r and their store items, in
// config order, without deciding anything: for debugging, for peeks
// (decide the items with Cost 0) and for fallbacks that evaluate the same
// items elsewhere.
func (l *Limiter) matches(ctx context.Context, r *spillway.Request) ([]ruleMatch, error) {
	if r == nil {
		return nil, fmt.Errorf("tiers: matches: %w: request is nil", spillway.ErrInvalidRequest)
	}
	c := l.cur.Load()
	var (
		items [batchStack]ratelimit.Item
		rules [batchStack]*crule
	)
	it, rs, err := l.collect(ctx, c, r, items[:0], rules[:0])
	if err != nil {
		return nil, err
	}
	out := make([]ruleMatch, len(it))
	for i := range it {
		out[i] = ruleMatch{Rule: rs[i].id, Shadow: rs[i].shadow, Fail: rs[i].fail, Item: it[i]}
		if rs[i].response {
			out[i].Cost = CostResponse
		}
	}
	return out, nil
}

// collect appends the items of the rules that apply to r.
func (l *Limiter) collect(ctx context.Context, c *compiled, r *spillway.Request, items []ratelimit.Item, rules []*crule) ([]ratelimit.Item, []*crule, error) {
	var (
		plan     string
		resolved bool
		buf      [128]byte
	)
	cost := r.EffectiveCost()
	for _, ru := range c.rules {
		if len(ru.methods) > 0 && !hasMethod(ru.methods, r.Method) {
			continue
		}
		if !ru.m.match(r.Endpoint) {
			continue
		}
		ent, ok := l.entity(buf[:0], ru, r)
		if !ok {
			continue
		}
		policy, scope := ru.policy, ru.scope
		if ru.plan != "" {
			if !resolved {
				var err error
				if plan, err = l.resolvePlan(ctx, c, r); err != nil {
					return items, rules, err
				}
				resolved = true
			}
			pb := ru.perPlan[plan] // resolvePlan checked the plan exists
			if pb.unlimited {
				continue
			}
			policy, scope = pb.policy, pb.scope
		}
		c := cost
		if ru.response && r.Cost == 0 {
			c = ru.estimate
		}
		items = append(items, ratelimit.Item{Scope: scope, Key: ent, Policy: policy, Cost: c, Fail: ru.fail})
		rules = append(rules, ru)
	}
	return items, rules, nil
}

func hasMethod(ms []string, m string) bool {
	for _, x := range ms {
		if x == m {
			return true
		}
	}
	return false
}

// entity builds the store key of rule ru for r: "ip=10.0.0.1", or
// "api_key=k1,endpoint=/x" for several dimensions (values percent-encode
// '%' and ','), so that dimensions never collide. internal/keys (in the
// store) escapes braces and hashes long entities. ok is false when r lacks
// one of the dimensions.
func (l *Limiter) entity(b []byte, ru *crule, r *spillway.Request) (string, bool) {
	for i, d := range ru.by {
		v, ok := r.Get(d)
		if !ok {
			return "", false
		}
		if d == spillway.DimIP {
			v = normalizeIP(v, l.v6bits)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, d...)
		b = append(b, '=')
		if len(ru.by) == 1 {
			b = append(b, v...)
		} else {
			b = appendValue(b, v)
		}
	}
	return string(b), true
}

func (l *Limiter) resolvePlan(ctx context.Context, c *compiled, r *spillway.Request) (string, error) {
	plan, ok := r.Get(DimPlan)
	if !ok && l.resolver != nil {
		if key, has := r.Get(spillway.DimAPIKey); has {
			p, err := l.resolver(ctx, key)
			if err != nil {
				return "", fmt.Errorf("tiers: plan resolver: %w", err)
			}
			plan = p
		}
	}
	if plan == "" {
		plan = c.defaultPlan
	}
	if _, ok := c.cfg.Plans[plan]; !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownPlan, plan)
	}
	return plan, nil
}

// Admit decides r against every rule that matches it, in one
// Store.Decide call, all or nothing: when any enforced rule denies, none is
// charged. A denial names the rule that denied (Decision.Limiter is its
// id): the one whose cost can never fit, else the one with the longest
// RetryAfter. An allowed decision is the most restrictive of the enforced
// rules (the lowest Remaining). With no enforced rule matching, the request
// is allowed with Limit 0 and Limiter = the Settings.Name name.
//
// Shadow rules ride in the same call. When the batch is allowed, they are
// charged like the others. When only shadow rules denied, the enforced
// rules are decided again without them (the one case of a second round
// trip), so a shadow rule neither blocks the request nor changes what the
// enforced rules are charged; the shadow rules are not charged for that
// request. When an enforced rule denies, nothing is charged, shadow or not.
//
// The decision is Degraded when any item's was (a fallback store decided
// it locally). Every item carries its rule's fail mode
// (ratelimit.Item.Fail), so a fallback.Store under the Limiter fails
// `fail: closed` rules closed by itself. A store failure returns a
// *spillway.StoreError (never a silent allow) whose Fail is FailClosed
// when any enforced rule the request matched is fail-closed, and whose
// Rules are the matched enforced rules, the fail-closed ones first; a
// request that matches only shadow rules is allowed if the store fails.
// Done is spillway.Noop for a request that matched no "cost: response"
// rule: a rate limit has nothing to release. A malformed (or nil)
// request is denied with spillway.ReasonInvalid.
//
// A "cost: response" rule charges what the work really cost. Its item
// holds an estimate — Request.Cost when the caller sets one (httpx
// Settings.Cost or EstimateHeader), else the rule's estimate — and the
// batch is decided by one Reserve of the store, all or nothing:
// the other rules of the bucket family are held at their cost in the same
// call (one round trip; one per Cluster slot group, in parallel); rules
// of a window algorithm, which cannot hold, are decided by Decide right
// after, and when they deny the hold is given back (a second round trip
// only when such rules match). The decision's Remaining is what is left
// once the estimate is held. Done then settles, in one round trip: each
// response rule to Request.Usage's total (a refund when the work cost
// less; an extra charge when more, which may put the key up to one burst
// into debt, so that its next requests wait until it is paid), the
// estimate when nothing was reported, or nothing when nothing was
// reported and the outcome is spillway.Ignored (a later block denied, the
// client left); the other rules stay charged their cost. With a Usage,
// the steps the work reports (Usage.Add) are charged as they come: a
// step within the estimate calls no store; a step beyond it charges the
// overrun, and when an enforced response rule has no room for it, Add
// returns a *SpentError (the work should stop; what it reported is still
// settled, as debt). A hold that done does not settle within the hold TTL
// (Settings.HoldTTL) is released by the store: the work is then charged only
// what its steps charged (the request rules were charged at admission;
// one held with it, in a request with window rules, is charged again).
// Settles and steps run detached from ctx, each bounded by
// Settings.SettleTimeout. Settings.HoldObserver sees every hold and settle.
func (l *Limiter) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: l.name}, spillway.Noop, nil
	}
	c := l.cur.Load()
	sc := scratchPool.Get().(*scratch)
	defer sc.release()
	items, rules, err := l.collect(ctx, c, r, sc.items[:0], sc.rules[:0])
	sc.used = len(items)
	if err != nil {
		return spillway.Decision{}, spillway.Noop, err
	}
	if len(items) == 0 {
		return spillway.Decision{Allowed: true, Limiter: l.name}, spillway.Noop, nil
	}
	var out []spillway.Decision
	if len(items) > batchStack {
		out = make([]spillway.Decision, len(items))
	} else {
		out = sc.out[:len(items)]
	}
	shadows, responses := 0, 0
	for _, ru := range rules {
		ru.stats.matched.Add(1)
		if ru.shadow {
			shadows++
		}
		if ru.response {
			responses++
		}
	}
	if responses > 0 {
		return l.admitHeld(ctx, r, items, rules, out, shadows)
	}
	allowed, pass, items, rules, out, err := l.decideEnforced(ctx, r, items, rules, out, shadows, l.store.Decide)
	if err != nil {
		return spillway.Decision{}, spillway.Noop, err
	}
	if pass {
		return spillway.Decision{Allowed: true, Limiter: l.name}, spillway.Noop, nil
	}
	res, err := l.answer(items, rules, out, allowed)
	return res, spillway.Noop, err
}

// answer is the decision a batch decided into out answers with: the most
// restrictive enforced rule's (pick), degraded when any decision was, with
// its rule's window; a denial counts against the rule that denied.
func (l *Limiter) answer(items []ratelimit.Item, rules []*crule, out []spillway.Decision, allowed bool) (spillway.Decision, error) {
	d := pick(rules, out, allowed)
	if d == nil {
		if !allowed {
			return spillway.Decision{}, l.storeError(rules, errors.New("tiers: store denied a batch without denying an item"))
		}
		return spillway.Decision{Allowed: true, Limiter: l.name}, nil
	}
	res := *d
	for i := range out {
		res.Degraded = res.Degraded || out[i].Degraded
		if &out[i] == d {
			res.Window = rateHooks.Window(items[i].Policy)
			if !allowed {
				rules[i].stats.denied.Add(1)
			}
		}
	}
	return res, nil
}

// decideEnforced decides the batch with call and, when only shadow rules
// denied it, once more with the enforced rules alone, so that a shadow
// rule never blocks or skips their charge. It names each decision's rule
// and reports the shadow rules' decisions. pass is true when every rule is
// a shadow and the batch could not be decided or was denied: the request
// goes through untouched. The items, rules and decisions returned are the
// ones the final decision was made on.
func (l *Limiter) decideEnforced(ctx context.Context, r *spillway.Request, items []ratelimit.Item, rules []*crule, out []spillway.Decision, shadows int,
	call func(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error),
) (allowed, pass bool, _ []ratelimit.Item, _ []*crule, _ []spillway.Decision, _ error) {
	allowed, err := call(ctx, items, out)
	if err != nil {
		if shadows == len(items) {
			return false, true, items, rules, out, nil
		}
		return false, false, items, rules, out, l.storeError(rules, err)
	}
	for i := range out {
		out[i].Limiter = rules[i].id
	}
	if shadows > 0 {
		l.reportShadows(ctx, r, rules, out)
	}
	if allowed || shadows == 0 || !onlyShadowsDenied(rules, out) {
		return allowed, false, items, rules, out, nil
	}
	if shadows == len(items) {
		return false, true, items, rules, out, nil
	}
	n := 0
	for i := range items {
		if !rules[i].shadow {
			items[n], rules[n] = items[i], rules[i]
			n++
		}
	}
	items, rules, out = items[:n], rules[:n], out[:n]
	if allowed, err = call(ctx, items, out); err != nil {
		return false, false, items, rules, out, l.storeError(rules, err)
	}
	for i := range out {
		out[i].Limiter = rules[i].id
	}
	return allowed, false, items, rules, out, nil
}

func onlyShadowsDenied(rules []*crule, out []spillway.Decision) bool {
	for i := range rules {
		if !out[i].Allowed && !rules[i].shadow {
			return false
		}
	}
	return true
}

func (l *Limiter) reportShadows(ctx context.Context, r *spillway.Request, rules []*crule, out []spillway.Decision) {
	for i, ru := range rules {
		if !ru.shadow {
			continue
		}
		if !out[i].Allowed {
			ru.stats.shadowDenied.Add(1)
		}
		if l.shadowFn != nil {
			l.shadowFn(ctx, r, out[i])
		}
	}
}

// pick chooses the decision to return among the enforced rules: on denial
// the one that can never succeed, else the longest wait; when allowed the
// lowest Remaining. Ties go to the rule listed first.
func pick(rules []*crule, out []spillway.Decision, allowed bool) *spillway.Decision {
	var best *spillway.Decision
	for i := range out {
		if rules[i].shadow {
			continue
		}
		d := &out[i]
		switch {
		case best == nil:
			if allowed || !d.Allowed {
				best = d
			}
		case allowed:
			if d.Remaining < best.Remaining {
				best = d
			}
		case d.Allowed:
		case best.Reason == spillway.ReasonCostExceedsLimit:
		case d.Reason == spillway.ReasonCostExceedsLimit || d.RetryAfter > best.RetryAfter:
			best = d
		}
	}
	return best
}

func (l *Limiter) storeError(rules []*crule, err error) error {
	e := &spillway.StoreError{Limiter: l.name, Err: err}
	for _, ru := range rules {
		if !ru.shadow && ru.fail == spillway.FailClosed {
			e.Fail = spillway.FailClosed
			e.Rules = append(e.Rules, ru.id)
		}
	}
	for _, ru := range rules {
		if !ru.shadow && ru.fail != spillway.FailClosed {
			e.Rules = append(e.Rules, ru.id)
		}
	}
	return e
}
