package rls

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// The reference's keys (SPILLWAY_KEY_FORMAT=reference): fixed-window
// limits in a reference unit read and write the counters the reference
// server keeps, under its key names, so that during a rolling swap its
// pods and these share every count. A key is
//
//	CACHE_KEY_PREFIX + domain + "_" + (key + "_" + value + "_")… + window start (unix seconds)
//
// holding the count of the window as an integer, expiring one unit after
// its last write, exactly as the reference writes it. A call checks all its
// counters and charges them only if every one has room (a denied call
// charges nothing, as elsewhere in this server); the reference's pods keep
// charging denied calls, which only makes the shared count reach the limit
// sooner, never admits more.

// refScope marks an item whose Key is a reference key without its window.
const refScope = "\x00reference"

// refKeyOf is the reference's key of a descriptor without the window:
// domain_key_value_key_value_ .
func refKeyOf(domain string, es []*rlv3.RateLimitDescriptor_Entry) string {
	n := len(domain) + 1
	for _, e := range es {
		n += len(e.GetKey()) + len(e.GetValue()) + 2
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(domain)
	b.WriteByte('_')
	for _, e := range es {
		b.WriteString(e.GetKey())
		b.WriteByte('_')
		b.WriteString(e.GetValue())
		b.WriteByte('_')
	}
	return b.String()
}

// refLimit says whether a limit is kept under the reference's keys: a
// fixed window of a reference unit.
func refLimit(lim *ruleLimit) bool {
	return lim.Policy.Algorithm == ratelimit.FixedWindow && lim.Policy.Burst == 0 &&
		unitOf(lim.Policy.Period) != 0 && lim.Policy.Period%time.Second == 0
}

// refScript checks every counter of KEYS (the same key may come twice)
// against its limit and, when all have room, charges them: INCRBY, then
// EXPIRE one unit. ARGV holds cost, limit, unit seconds for each key. It
// returns the counts before the call, then 1 when charged, 0 when not.
var refScript = redis.NewScript(`
local counts, pending, ok = {}, {}, 1
for i = 1, #KEYS do
  local k = KEYS[i]
  local c = tonumber(redis.call('GET', k) or '0') or 0
  local cost, limit = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1])
  local before = c + (pending[k] or 0)
  counts[i] = before
  if cost > 0 then
    if before + cost > limit then ok = 0 end
    pending[k] = (pending[k] or 0) + cost
  end
end
if ok == 1 then
  for i = 1, #KEYS do
    local cost = tonumber(ARGV[3*i-2])
    if cost > 0 then
      redis.call('INCRBY', KEYS[i], cost)
      redis.call('EXPIRE', KEYS[i], ARGV[3*i])
    end
  end
end
counts[#KEYS + 1] = ok
return counts
`)

// refStore decides the reference-key items of a batch itself and passes
// the others to next; a batch is still all or nothing (a part charged
// before another part denied is given back).
type refStore struct {
	next   ratelimit.Store
	client redis.UniversalClient
	prefix string
	now    func() time.Time
}

func (s *refStore) Reset(ctx context.Context, scope, key string, p ratelimit.Policy) error {
	if scope != refScope {
		return s.next.Reset(ctx, scope, key, p)
	}
	return s.client.Del(ctx, s.key(key, p, s.now())).Err()
}

func (s *refStore) key(k string, p ratelimit.Policy, now time.Time) string {
	div := int64(p.Period / time.Second)
	return s.prefix + k + strconv.FormatInt(now.Unix()/div*div, 10)
}

func (s *refStore) DecideBy(ctx context.Context, deadline time.Time, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	return s.Decide(ctx, items, out)
}

func (s *refStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	var ref, other []int
	for i := range items {
		if items[i].Scope == refScope {
			ref = append(ref, i)
		} else {
			other = append(other, i)
		}
	}
	if len(ref) == 0 {
		return s.next.Decide(ctx, items, out)
	}
	now := s.now()
	// a Cluster spreads the reference's keys (no hash tags) over slots:
	// one script call per key there, each given back if a later one denies
	groups := [][]int{ref}
	if _, ok := s.client.(*redis.ClusterClient); ok && len(ref) > 1 {
		groups = groups[:0]
		for _, i := range ref {
			groups = append(groups, []int{i})
		}
	}
	allowed := true
	var charged [][]int
	for _, g := range groups {
		if !allowed {
			// denied already: the rest are only looked at
			ok, err := s.run(ctx, items, g, out, now, true)
			if err != nil {
				return false, s.refund(ctx, items, charged, now, err)
			}
			_ = ok
			continue
		}
		ok, err := s.run(ctx, items, g, out, now, false)
		if err != nil {
			return false, s.refund(ctx, items, charged, now, err)
		}
		if ok {
			charged = append(charged, g)
		} else {
			allowed = false
		}
	}
	if len(other) > 0 {
		sub := make([]ratelimit.Item, len(other))
		sout := make([]spillway.Decision, len(other))
		for j, i := range other {
			sub[j] = items[i]
			if !allowed {
				sub[j].Cost = 0
			}
		}
		ok, err := s.next.Decide(ctx, sub, sout)
		if err != nil {
			return false, s.refund(ctx, items, charged, now, err)
		}
		for j, i := range other {
			out[i] = sout[j]
			if !allowed {
				// looked at with no cost: say what this item alone would see
				c := items[i].Cost
				out[i].Remaining -= c
				out[i].Allowed = out[i].Remaining >= 0
			}
		}
		if !ok {
			allowed = false
		}
	}
	if !allowed && len(charged) > 0 {
		if err := s.refund(ctx, items, charged, now, nil); err != nil {
			return false, err
		}
	}
	return allowed, nil
}

// run decides the items g with one script call; peek charges nothing.
func (s *refStore) run(ctx context.Context, items []ratelimit.Item, g []int, out []spillway.Decision, now time.Time, peek bool) (bool, error) {
	keys := make([]string, len(g))
	args := make([]any, 0, 3*len(g))
	for j, i := range g {
		it := &items[i]
		keys[j] = s.key(it.Key, it.Policy, now)
		cost := it.Cost
		if peek {
			cost = 0
		}
		args = append(args, cost, it.Policy.Limit, int64(it.Policy.Period/time.Second))
	}
	res, err := refScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		return false, err
	}
	if len(res) != len(g)+1 {
		return false, errors.New("rls: the reference-key script answered " + strconv.Itoa(len(res)) + " values")
	}
	for j, i := range g {
		it := &items[i]
		div := int64(it.Policy.Period / time.Second)
		reset := time.Duration(div-now.Unix()%div) * time.Second
		after := res[j] + it.Cost
		d := spillway.Decision{Allowed: it.Cost == 0 || after <= it.Policy.Limit, Limit: it.Policy.Limit,
			Remaining: it.Policy.Limit - after, ResetAfter: reset, Window: it.Policy.Period}
		if it.Cost == 0 {
			d.Remaining = it.Policy.Limit - res[j]
		}
		if !d.Allowed {
			d.Reason = spillway.ReasonRateLimited
			d.RetryAfter = reset
		}
		out[i] = d
	}
	return res[len(g)] == 1, nil
}

// refund gives back what groups charged (DECRBY), and returns err.
func (s *refStore) refund(ctx context.Context, items []ratelimit.Item, groups [][]int, now time.Time, err error) error {
	for _, g := range groups {
		for _, i := range g {
			if items[i].Cost > 0 {
				if e := s.client.DecrBy(ctx, s.key(items[i].Key, items[i].Policy, now), items[i].Cost).Err(); e != nil && err == nil {
					err = e
				}
			}
		}
	}
	return err
}
