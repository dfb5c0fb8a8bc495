package rls

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
)

// Service implements envoy.service.ratelimit.v3.RateLimitService over a
// ratelimit.Store. Every descriptor of a request that a limit applies to
// becomes one item per limit, and all items are decided in ONE Store call,
// all or nothing: a request denied by one limit charges none of the
// others. Shadow-mode descriptors are decided apart, each alone, so that
// they never change the answer or what the others are charged.
//
// A Service is safe for concurrent use; SetConfig swaps configs atomically.
type Service struct {
	pb.UnimplementedRateLimitServiceServer

	cfg   atomic.Pointer[Config]
	store ratelimit.Store
	stats *svcStats
	set   Settings
	now   func() time.Time
	log   *slog.Logger
	// door bounds the calls decided at once (SPILLWAY_MAX_IN_FLIGHT; nil:
	// no bound): past it they wait in a queue that refuses, at once, a
	// call it could not serve by its deadline.
	door *shedder.Queue

	// seen is set when the store answers denials from a local cache
	// (LOCAL_CACHE_SIZE_IN_BYTES): its inner store then marks every call
	// it gets, so that a denial it never saw is known to be the cache's.
	seen bool
}

// seenKey carries a call's mark through the store to seenStore.
type seenKey struct{}

// seenStore marks, through the context, that a call reached the store
// behind a caching one.
// boundedStore is a store that bounds one Decide by a deadline given apart
// from the context (ratelimit.RedisStore.DecideBy): no timer per call.
type boundedStore interface {
	ratelimit.Store
	DecideBy(ctx context.Context, deadline time.Time, items []ratelimit.Item, out []spillway.Decision) (bool, error)
}

type seenStore struct{ boundedStore }

func mark(ctx context.Context) {
	if p, ok := ctx.Value(seenKey{}).(*bool); ok {
		*p = true
	}
}

func (s seenStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	mark(ctx)
	return s.boundedStore.Decide(ctx, items, out)
}

func (s seenStore) DecideBy(ctx context.Context, deadline time.Time, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	mark(ctx)
	return s.boundedStore.DecideBy(ctx, deadline, items, out)
}

// NewService returns a Service deciding with store (the binary's is a
// ratelimit.RedisStore behind a fallback.Store). set supplies the
// near-limit ratio, SHADOW_MODE and the response headers; log (nil: the
// default logger) receives what a call cannot say in its answer.
func NewService(store ratelimit.Store, set Settings, log *slog.Logger) *Service {
	return newService(store, set, newStats(), log)
}

func newService(store ratelimit.Store, set Settings, stats *svcStats, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	svc := &Service{store: store, stats: stats, set: set, now: time.Now, log: log}
	if set.MaxInFlight > 0 {
		q, err := shedder.NewQueue(int64(set.MaxInFlight), shedder.QueueSettings{Name: "rls"})
		if err != nil {
			panic(err) // a positive number of slots is never refused
		}
		svc.door = q
	}
	return svc
}

// doorRequest is what a call asks of the door: one slot.
var doorRequest = spillway.Request{}

// SetConfig makes c the config of every call from now on. Counters of
// rules whose stats key is unchanged carry on.
func (s *Service) SetConfig(c *Config) {
	for _, r := range c.rules {
		r.stats = s.stats.get(r.FullKey, true)
	}
	s.cfg.Store(c)
}

// config returns the config in use (nil before the first SetConfig).
func (s *Service) config() *Config { return s.cfg.Load() }

// plan is one descriptor's part of a call.
type plan struct {
	rule     *rule
	stats    *counters
	hits     int64
	first    int // index of its first item in the batch; -1 when it has none
	n        int // its items
	shadow   bool
	denyAll  int // index+1 of a requests_per_unit: 0 limit
	replaced bool
}

// scratch holds a call's buffers, pooled: a call allocates only what it
// returns and the items' keys.
type scratch struct {
	plans  []plan
	items  []ratelimit.Item
	out    []spillway.Decision
	sitems []ratelimit.Item // shadow items, decided apart
	sout   []spillway.Decision
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// errService is a malformed request or a server without config: answered
// with an error as the reference does.
type errService string

func (e errService) Error() string { return string(e) }

// ShouldRateLimit decides a request. See Service.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	s.stats.TotalRequests.Add(1)
	defer s.stats.observe(time.Now())
	if ctx.Err() != nil {
		return s.late(ctx)
	}
	if s.door != nil {
		d, done, _ := s.door.Admit(ctx, &doorRequest)
		if !d.Allowed {
			if passed(ctx) {
				return s.late(ctx)
			}
			return s.shed()
		}
		defer done(spillway.Success)
	}
	resp, err := s.shouldRateLimit(ctx, req)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && passed(ctx) {
		return s.late(ctx)
	}
	if err != nil && errors.Is(err, spillway.ErrBudgetSpent) {
		// the store refused it: its budget went in this process
		return s.shed()
	}
	if err != nil {
		var se errService
		if errors.As(err, &se) {
			s.stats.ServiceErrors.Add(1)
			return nil, status.Error(codes.Unknown, se.Error())
		}
		s.stats.RedisErrors.Add(1)
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return resp, nil
}

// passed reports whether ctx's deadline has passed (its timer may not
// have fired yet).
func passed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || (ok && !time.Now().Before(d))
}

// late answers a call whose deadline passed before it was decided, at
// once and without deciding it (nothing charged): the caller has stopped
// waiting, and an overloaded server must not spend its CPU on answers
// nobody reads. What it answers is SPILLWAY_LATE_ANSWER.
func (s *Service) late(ctx context.Context) (*pb.RateLimitResponse, error) {
	s.stats.Late.Add(1)
	return s.refuse("rls: the call's deadline passed before it was decided")
}

// shed answers, at once and undecided, a call this server could not serve
// by its deadline (SPILLWAY_MAX_IN_FLIGHT's queue refused it, or its
// budget went in this process): SPILLWAY_LATE_ANSWER says what.
func (s *Service) shed() (*pb.RateLimitResponse, error) {
	s.stats.Shed.Add(1)
	return s.refuse("rls: overloaded: the call could not be decided by its deadline")
}

// refuse is SPILLWAY_LATE_ANSWER's answer to an undecided call.
func (s *Service) refuse(msg string) (*pb.RateLimitResponse, error) {
	switch s.set.LateAnswer {
	case "ok":
		return &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK}, nil
	case "over_limit":
		return &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OVER_LIMIT}, nil
	}
	return nil, status.Error(codes.DeadlineExceeded, msg)
}

func (s *Service) shouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, errService("rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, errService("rate limit descriptor list must not be empty")
	}
	cfg := s.cfg.Load()
	if cfg == nil {
		return nil, errService("no rate limit configuration loaded")
	}
	sc := scratchPool.Get().(*scratch)
	defer func() {
		clear(sc.items)
		clear(sc.sitems)
		clear(sc.plans)
		scratchPool.Put(sc)
	}()
	n := len(req.Descriptors)
	plans := grow(sc.plans, n)
	sc.plans = plans
	items, sitems := sc.items[:0], sc.sitems[:0]

	notFound := false
	for i, d := range req.Descriptors {
		p := &plans[i]
		*p = plan{first: -1, hits: hitsOf(req, d)}
		r, err := s.ruleOf(cfg, req.Domain, d)
		if err != nil {
			notFound = true
			continue
		}
		if r == nil {
			continue
		}
		p.rule = r
		p.stats = r.stats
		if r.Detailed || r.valueToMetric {
			if c := s.stats.get(cfg.metricKey(r, req.Domain, d.Entries), false); c != nil {
				p.stats = c
			}
		}
		p.shadow = r.Shadow || s.set.GlobalShadowMode
	}
	if notFound {
		s.stats.domainNotFound(req.Domain)
	}
	// replaces: a rule named in another matched rule's replaces is not
	// checked (unlimited rules replace too), as in the reference.
	for i := range plans {
		for _, name := range replacesOf(plans[i].rule) {
			for j := range plans {
				if r := plans[j].rule; r != nil && r.Name == name {
					plans[j].replaced = true
				}
			}
		}
	}
	denyAll := false
	for i, d := range req.Descriptors {
		p := &plans[i]
		r := p.rule
		if r == nil || p.replaced || r.Unlimited {
			continue
		}
		key, refKey := entityOf(d.Entries), ""
		for li := range r.Limits {
			lim := &r.Limits[li]
			if lim.denyAll {
				p.denyAll = li + 1
				if !p.shadow {
					denyAll = true
				}
				continue
			}
			it := ratelimit.Item{Scope: lim.scope, Key: key, Policy: lim.Policy, Cost: p.hits}
			if s.set.ReferenceKeys && refLimit(lim) {
				if refKey == "" {
					refKey = refKeyOf(req.Domain, d.Entries)
				}
				it.Scope, it.Key = refScope, refKey
			}
			if p.shadow {
				if p.first < 0 {
					p.first = len(sitems)
				}
				sitems = append(sitems, it)
			} else {
				if p.first < 0 {
					p.first = len(items)
				}
				items = append(items, it)
			}
			p.n++
		}
	}
	sc.items, sc.sitems = items, sitems
	if denyAll {
		// a requests_per_unit: 0 limit denies the request: the others are
		// only looked at, so that their answers say what they have left
		for i := range items {
			items[i].Cost = 0
		}
	}
	out := grow(sc.out, len(items))
	sc.out = out
	allowed, cached := true, false
	if len(items) > 0 {
		var reached *bool
		dctx := ctx
		if s.seen {
			reached = new(bool)
			dctx = context.WithValue(ctx, seenKey{}, reached)
		}
		var err error
		if allowed, err = s.store.Decide(dctx, items, out); err != nil {
			return nil, err
		}
		if out[0].Degraded {
			// Redis did not decide this call (it failed, or the breaker
			// is open): the reference counts such a call as redis_error
			s.stats.RedisErrors.Add(1)
		}
		cached = reached != nil && !*reached && !allowed && !out[0].Degraded
	}
	allowed = allowed && !denyAll
	sout := grow(sc.sout, len(sitems))
	sc.sout = sout
	for i := range plans {
		// shadow descriptors, each alone: they never change the answer
		if p := &plans[i]; p.shadow && p.n > 0 {
			if _, err := s.store.Decide(ctx, sitems[p.first:p.first+p.n], sout[p.first:p.first+p.n]); err != nil {
				return nil, err
			}
		}
	}
	return s.answer(plans, out, sout, allowed, denyAll, cached), nil
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

func replacesOf(r *rule) []string {
	if r == nil {
		return nil
	}
	return r.Replaces
}

// ruleOf is the rule for one descriptor: the limit the request carries
// (an override, as Envoy's descriptor.limit), else the config's.
func (s *Service) ruleOf(cfg *Config, domain string, d *rlv3.RateLimitDescriptor) (*rule, error) {
	if o := d.GetLimit(); o != nil {
		return s.overrideRule(domain, d, o)
	}
	return cfg.lookup(domain, d.GetEntries())
}

func (s *Service) overrideRule(domain string, d *rlv3.RateLimitDescriptor, o *rlv3.RateLimitDescriptor_RateLimitOverride) (*rule, error) {
	unit := pb.RateLimitResponse_RateLimit_Unit(o.GetUnit())
	period, ok := unitPeriods[unit]
	if !ok {
		return nil, nil
	}
	var b strings.Builder
	b.WriteString(domain)
	b.WriteByte('.')
	for i, e := range d.GetEntries() {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.GetKey())
		if e.GetValue() != "" {
			b.WriteByte('_')
			b.WriteString(e.GetValue())
		}
	}
	r := &rule{Domain: domain, FullKey: b.String()}
	lim := ruleLimit{Unit: unit, RequestsPerUnit: o.GetRequestsPerUnit(), Name: r.FullKey,
		Policy: ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: int64(o.GetRequestsPerUnit()), Period: period}}
	if lim.RequestsPerUnit == 0 {
		lim.denyAll, lim.Policy.Limit = true, 1
	}
	lim.scope = scopeOf(domain, lim.Policy)
	lim.current = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: lim.RequestsPerUnit, Unit: unit}
	r.Limits = []ruleLimit{lim}
	r.stats = s.stats.get(r.FullKey, false)
	if r.stats == nil {
		r.stats = s.stats.get("_overflow", true)
	}
	return r, nil
}

// hitsOf is the descriptor's hits_addend, else the request's, else 1.
func hitsOf(req *pb.RateLimitRequest, d *rlv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), math.MaxInt64))
	}
	return int64(max(req.GetHitsAddend(), 1))
}

// entityOf is the store key of a descriptor's entries: key=value pairs
// joined by '|', with '%', '=' and '|' percent-encoded so no two
// descriptors share a key. Stores hash long keys and escape braces.
func entityOf(es []*rlv3.RateLimitDescriptor_Entry) string {
	n := 0
	for _, e := range es {
		n += len(e.GetKey()) + len(e.GetValue()) + 2
	}
	b := make([]byte, 0, n)
	for i, e := range es {
		if i > 0 {
			b = append(b, '|')
		}
		b = appendEscaped(b, e.GetKey())
		b = append(b, '=')
		b = appendEscaped(b, e.GetValue())
	}
	if len(b) == 0 {
		return ""
	}
	// b is never written again: the string may share its bytes
	return keys.Escape(unsafe.String(&b[0], len(b)))
}

func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '=', '|':
			b = append(b, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
		default:
			b = append(b, c)
		}
	}
	return b
}

// result is what one descriptor reports: the limit that decides its
// answer (the denied one, else the one with the least left).
type result struct {
	lim     *ruleLimit
	d       spillway.Decision
	over    bool
	charged bool
}

// pick chooses a descriptor's deciding limit among its decisions.
func pick(r *rule, p *plan, ds []spillway.Decision, batchAllowed bool) result {
	var res result
	best := -1
	k := 0
	for li := range r.Limits {
		lim := &r.Limits[li]
		if lim.denyAll {
			if p.denyAll == li+1 {
				return result{lim: lim, over: true}
			}
			continue
		}
		d := ds[k]
		k++
		if !d.Allowed {
			return result{lim: lim, d: d, over: true}
		}
		if best < 0 || d.Remaining < res.d.Remaining {
			best = li
			res = result{lim: lim, d: d}
		}
	}
	res.charged = batchAllowed
	return res
}

type statusSlot struct {
	st  pb.RateLimitResponse_DescriptorStatus
	dur durationpb.Duration
}

// newResponse returns an OK response with n statuses, and the slots
// that hold them: for up to 3 descriptors (nearly every call) the
// response, its statuses and their list are one allocation.
func newResponse(n int) (*pb.RateLimitResponse, []statusSlot) {
	switch {
	case n == 1:
		b := new(struct {
			resp  pb.RateLimitResponse
			slots [1]statusSlot
			list  [1]*pb.RateLimitResponse_DescriptorStatus
		})
		b.resp.Statuses = b.list[:]
		return &b.resp, b.slots[:]
	case n <= 3:
		b := new(struct {
			resp  pb.RateLimitResponse
			slots [3]statusSlot
			list  [3]*pb.RateLimitResponse_DescriptorStatus
		})
		b.resp.Statuses = b.list[:n:n]
		return &b.resp, b.slots[:n:n]
	}
	resp := &pb.RateLimitResponse{Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, n)}
	return resp, make([]statusSlot, n) // one allocation for the statuses and their durations
}

// answer builds the response and counts the stats. peeked says the batch
// was only looked at (cost 0) because a requests_per_unit: 0 limit denied
// the request; cached that the local cache of denials answered it.
func (s *Service) answer(plans []plan, out, sout []spillway.Decision, allowed, peeked, cached bool) *pb.RateLimitResponse {
	resp, slots := newResponse(len(plans))
	resp.OverallCode = pb.RateLimitResponse_OK
	now := s.now()
	var closest *pb.RateLimitResponse_DescriptorStatus
	closestRemaining := uint32(math.MaxUint32)
	headers := s.set.HeadersEnabled
	var policy, state []byte
	over, globalShadow := false, false
	for i := range plans {
		p := &plans[i]
		st := &slots[i].st
		resp.Statuses[i] = st
		st.Code = pb.RateLimitResponse_OK
		r := p.rule
		switch {
		case r == nil || p.replaced:
			continue
		case r.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		var ds []spillway.Decision
		batch := allowed
		if p.n > 0 {
			if p.shadow {
				ds = sout[p.first : p.first+p.n]
				batch = true
				for _, d := range ds {
					batch = batch && d.Allowed
				}
			} else {
				ds = out[p.first : p.first+p.n]
			}
		}
		res := pick(r, p, ds, batch)
		if res.d.Degraded {
			s.stats.Degraded.Add(1)
		}
		lim := res.lim
		capacity := lim.Policy.Capacity()
		if lim.denyAll {
			capacity = 0
		}
		// used: the units in use before this call; after: with this call's
		// hits, as the reference's counter would read
		var used int64
		switch {
		case lim.denyAll:
		case res.over:
			used = capacity - res.d.Remaining
		case res.charged:
			used = capacity - res.d.Remaining - p.hits
		case peeked && !p.shadow:
			used = capacity - res.d.Remaining
		case cached:
			// room, but the cache of denials answered for another
			// descriptor: nothing was asked of Redis for this one
		default: // room, but another descriptor denied the request: nothing charged
			used = capacity - res.d.Remaining - p.hits
			res.d.Remaining = min(res.d.Remaining+p.hits, capacity)
		}
		used = max(used, 0)
		if cached && res.over && !p.shadow {
			// the reference counts a local cache hit as over the limit, all of it
			used = capacity
			if p.stats != nil {
				p.stats.overLimitLocalCache.Add(uint64(p.hits))
			}
		}
		s.count(p, capacity, used, res.over)
		st.CurrentLimit = lim.current
		if res.over {
			st.LimitRemaining = 0
			switch {
			case r.Shadow:
				st.Code = pb.RateLimitResponse_OK
			case p.shadow: // SHADOW_MODE: the status says it, the overall code does not
				st.Code = pb.RateLimitResponse_OVER_LIMIT
				globalShadow = true
			default:
				st.Code = pb.RateLimitResponse_OVER_LIMIT
				over = true
			}
		} else {
			st.LimitRemaining = uint32(min(max(res.d.Remaining, 0), math.MaxUint32))
		}
		reset := resetOf(lim, &res.d, now)
		dur := &slots[i].dur
		dur.Seconds, dur.Nanos = int64(reset/time.Second), int32(reset%time.Second)
		st.DurationUntilReset = dur
		if headers {
			if st.Code == pb.RateLimitResponse_OVER_LIMIT {
				closest, closestRemaining = st, 0
			} else if st.LimitRemaining < closestRemaining {
				closest, closestRemaining = st, st.LimitRemaining
			}
			if s.set.IETFHeaders {
				policy, state = appendIETF(policy, state, r, p.hits, ds, res.charged || (peeked && !p.shadow), now)
			}
		}
	}
	if over {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
	} else if globalShadow {
		s.stats.GlobalShadowMode.Add(1)
	}
	if headers && closest != nil {
		resp.ResponseHeadersToAdd = []*core.HeaderValue{
			{Key: s.set.HeaderLimit, Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			{Key: s.set.HeaderRemaining, Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: s.set.HeaderReset, Value: strconv.FormatInt(ceilSeconds(closest.DurationUntilReset.AsDuration()), 10)},
		}
	}
	if len(policy) > 0 {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&core.HeaderValue{Key: "RateLimit-Policy", Value: string(policy)},
			&core.HeaderValue{Key: "RateLimit", Value: string(state)})
	}
	return resp
}

// count adds one descriptor's hits to its stats exactly as the reference
// does, from the units used before the call and after it.
func (s *Service) count(p *plan, limit, before int64, over bool) {
	c := p.stats
	if c == nil {
		return
	}
	hits := uint64(p.hits)
	c.totalHits.Add(hits)
	L := uint64(limit)
	b := uint64(before)
	after := b + hits
	near := uint64(math.Floor(float64(float32(L) * s.set.NearLimitRatio)))
	if over {
		if b >= L {
			c.overLimit.Add(hits)
		} else {
			c.overLimit.Add(after - L)
			c.nearLimit.Add(L - max(near, b))
		}
		if p.rule.Shadow {
			if b >= L {
				c.shadow.Add(hits)
			} else {
				c.shadow.Add(after - L)
			}
		}
		return
	}
	c.withinLimit.Add(hits)
	if after > near {
		if b >= near {
			c.nearLimit.Add(hits)
		} else {
			c.nearLimit.Add(after - near)
		}
	}
}

// resetOf is duration_until_reset: for a fixed window, the time to the
// end of the current window on this server's clock, in whole seconds for
// a period of whole seconds (as the reference computes it); otherwise the
// time until the state is back to full.
func resetOf(lim *ruleLimit, d *spillway.Decision, now time.Time) time.Duration {
	if lim.Policy.Algorithm != ratelimit.FixedWindow && !lim.denyAll {
		return d.ResetAfter
	}
	p := lim.Policy.Period
	if p%time.Second == 0 {
		sec := int64(p / time.Second)
		return time.Duration(sec-now.Unix()%sec) * time.Second
	}
	us := p.Microseconds()
	return time.Duration(us-now.UnixMicro()%us) * time.Microsecond
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// appendIETF adds a descriptor's limits to the IETF draft headers
// (draft-ietf-httpapi-ratelimit-headers): RateLimit-Policy lists every
// limit as "name";q=QUOTA;w=WINDOW (the capacity and the time it takes to
// grant it from empty), RateLimit as "name";r=REMAINING;t=RESET.
func appendIETF(policy, state []byte, r *rule, hits int64, ds []spillway.Decision, charged bool, now time.Time) ([]byte, []byte) {
	k := 0
	for li := range r.Limits {
		lim := &r.Limits[li]
		var d spillway.Decision
		q := int64(0)
		if !lim.denyAll {
			if k < len(ds) {
				d = ds[k]
			}
			k++
			q = lim.Policy.Capacity()
		}
		if len(policy) > 0 {
			policy = append(policy, ", "...)
			state = append(state, ", "...)
		}
		policy = appendSFString(policy, lim.Name)
		policy = append(policy, ";q="...)
		policy = strconv.AppendInt(policy, q, 10)
		policy = append(policy, ";w="...)
		policy = strconv.AppendInt(policy, ceilSeconds(rateHooks.Window(lim.Policy)), 10)
		remaining := int64(0)
		if d.Allowed {
			remaining = max(d.Remaining, 0)
			if !charged {
				remaining = min(remaining+hits, q)
			}
		}
		state = appendSFString(state, lim.Name)
		state = append(state, ";r="...)
		state = strconv.AppendInt(state, remaining, 10)
		state = append(state, ";t="...)
		state = strconv.AppendInt(state, ceilSeconds(resetOf(lim, &d, now)), 10)
	}
	return policy, state
}

// appendSFString appends s as a structured-field string: quoted, with '"'
// and '\' escaped and anything outside printable ASCII dropped.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
