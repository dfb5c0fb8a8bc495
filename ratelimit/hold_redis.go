package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/lua"
)

// Holds on Redis (see ratelimit_holds.lua): a bucket key K keeps its TAT
// as "<tat>" or, marked, "<tat>h<first end>:<last end>" followed by its
// live holds, ",<hold id>/<i>=<estimate>@<end>" each: a reserve and a
// settle write K alone.
//
// Reserve and settle run their own scripts (lua/ratelimit_hold.lua,
// lua/ratelimit_settle.lua), one call per Cluster slot group, so that the
// plain decisions never carry the holds' bookkeeping (two more keys per
// item, the hold id). Both ride on the coalesced calls all the same: the
// reservations queued while a call is in flight go out as one hold script
// call per slot (each reservation one group, all or nothing) in the
// pipeline of the decisions queued with them, and the settles of
// Hold.settleAsync join that pipeline too (redis_settle.go).

// Reserve decides items all or nothing and holds their estimates (see
// Limiter.Reserve): one hold script per Cluster slot group
// (Ring shard), the groups in parallel; when one group denies or fails
// after another held, the held groups are cancelled by the settle script,
// which restores each TAT exactly when nothing else charged the key in
// between. A group that failed (a timeout after the script ran, say) is
// not cancelled: its holds, if any, are released by their TTL.
func (s *RedisStore) Reserve(ctx context.Context, items []Item, ttl time.Duration) (*Hold, error) {
	ttlUS, ttl, err := holdTTLOf(ttl)
	if err != nil {
		return nil, err
	}
	if err := validateHold(items); err != nil {
		return nil, err
	}
	h, id := s.newHold(items, ttl)
	if len(items) == 0 {
		h.allowed, h.id = true, id
		return h, nil
	}
	var allowed bool
	if s.co != nil && len(items) <= maxCoalesceItems {
		allowed, err = s.coalescerFor(ctx, &h.items[0]).reserve(ctx, s, h, ttlUS)
	} else {
		allowed, err = s.reserveDirect(ctx, h, ttlUS)
	}
	if err != nil {
		return nil, err
	}
	if allowed {
		h.allowed, h.id = true, id
	}
	return h, nil
}

// newHold makes the Hold of a reservation of valid items for ttl, not yet
// decided, and its id (h.id is set once it is allowed): the keys and
// members of every item, built once for reserve and settle.
func (s *RedisStore) newHold(items []Item, ttl time.Duration) (*Hold, string) {
	h := &Hold{store: s, ttl: ttl, items: append([]Item(nil), items...), dec: make([]spillway.Decision, len(items)), until: time.Now().Add(ttl)}
	id := s.holdIDs.next()
	h.rkeys = make([]string, len(items))
	h.members = make([]string, len(items))
	for i := range h.items {
		h.rkeys[i] = redisKey(s.prefix, &h.items[i])
		if !h.items[i].Fixed {
			h.members[i] = holdName(holdMember(id, i), h.items[i].Cost)
		}
	}
	return h, id
}

// reserveDirect decides and holds h's items with calls of its own: one
// hold script per slot group, filling h's decisions and release times.
func (s *RedisStore) reserveDirect(ctx context.Context, h *Hold, ttlUS int64) (bool, error) {
	var groups []*group
	var whole [1]*group
	if s.sharded == oneServer {
		whole[0] = &group{items: h.items, out: h.dec}
		groups = whole[:]
	} else {
		groups = s.split(h.items, s.sharded)
	}
	allowed, err := s.reserveGroups(ctx, h, ttlUS, groups)
	if err != nil && s.sharded == oneServer && strings.Contains(err.Error(), "CROSSSLOT") {
		// a Cluster in disguise: nothing ran; one call per slot
		groups = s.split(h.items, bySlot)
		allowed, err = s.reserveGroups(ctx, h, ttlUS, groups)
	}
	if err != nil {
		return false, err
	}
	h.exps = make([]int64, len(h.items))
	for _, g := range groups {
		for j := range g.items {
			i := g.index(j)
			h.dec[i] = g.out[j]
			h.exps[i] = g.now + ttlUS
		}
	}
	return allowed, nil
}

// holdArgs is the hold script's ARGV for the reservations of ws (one
// group each).
func holdArgs(now string, ws []*waiter) []any {
	n := 0
	for _, w := range ws {
		n += len(w.items)
	}
	args := make([]any, 0, 2+2*len(ws)+holdFields*n)
	args = append(args, now, len(ws))
	for _, w := range ws {
		args = append(args, len(w.items), w.ttl)
	}
	for _, w := range ws {
		h := w.hold
		for i := range h.items {
			it := &h.items[i]
			T := it.Policy.emissionInterval()
			args = append(args, T, it.Policy.effectiveBurst()*T, it.scriptCost(), h.members[i])
		}
	}
	return args
}

// deliverHolds reads a coalesced hold call's reply into each reservation
// of ws: its decisions, release times and whether it was allowed.
func deliverHolds(ws []*waiter, res any) error {
	n := 0
	for _, w := range ws {
		n += len(w.items)
	}
	G := len(ws)
	v, err := intSlice(res, 1+G+n)
	if err != nil {
		return fmt.Errorf("ratelimit: redis: hold script: %w", err)
	}
	at := 1 + G
	for g, w := range ws {
		h := w.hold
		allowed, err := holdOutcomes(h.items, v[at:at+len(h.items)], at, v[1+g], h.dec)
		if err != nil {
			return err
		}
		h.exps = make([]int64, len(h.items))
		for i := range h.exps {
			h.exps[i] = v[0] + w.ttl
		}
		w.allowed = allowed
		at += len(h.items)
	}
	return nil
}

// holdOutcomes writes the decisions of a reservation's items from their
// waits (reply values first, first+1, …) to out and reports whether every
// item had room, which must agree with the script's flag ok.
func holdOutcomes(items []Item, waits []int64, first int, ok int64, out []spillway.Decision) (bool, error) {
	allowed := true
	for j := range items {
		it := &items[j]
		lim := it.Policy.limits()
		wait := waits[j]
		if wait < 0 || wait > 2*lim.tau {
			return false, fmt.Errorf("ratelimit: redis: hold script: unexpected reply value %d = %d, want an integer in [0, %d]", first+j, wait, 2*lim.tau)
		}
		o := waitOutcome(wait, &lim, it.Cost)
		out[j] = o.decisionCap(it.Scope, lim.capacity)
		allowed = allowed && o.allowed
	}
	if allowed != (ok == 1) {
		return false, fmt.Errorf("ratelimit: redis: hold script: replied allowed = %d, but the waits say %v", ok, allowed)
	}
	return allowed, nil
}

// index is the position of g's j-th item in the caller's batch (a group
// made without idx is the whole batch).
func (g *group) index(j int) int {
	if g.idx == nil {
		return j
	}
	return g.idx[j]
}

// reserveGroups runs the hold script of every group, in parallel, and
// cancels the held groups when the batch is not allowed.
func (s *RedisStore) reserveGroups(ctx context.Context, h *Hold, ttlUS int64, groups []*group) (bool, error) {
	if len(groups) == 1 {
		g := groups[0]
		g.allowed, g.err = s.runHold(ctx, h, ttlUS, g)
		return g.allowed, g.err
	}
	var eg errgroup.Group
	for _, g := range groups {
		eg.Go(func() error {
			g.allowed, g.err = s.runHold(ctx, h, ttlUS, g)
			return nil
		})
	}
	_ = eg.Wait()
	allowed := true
	var errs []error
	for _, g := range groups {
		if g.err != nil {
			errs = append(errs, g.err)
		}
		allowed = allowed && g.allowed && g.err == nil
	}
	if allowed {
		return true, nil
	}
	cctx := context.WithoutCancel(ctx)
	var cg errgroup.Group
	for _, g := range groups {
		if !g.allowed || g.err != nil {
			continue
		}
		cg.Go(func() error {
			res := make([]SettleResult, g.idx[len(g.idx)-1]+1) // indexed like the batch
			return s.runSettle(cctx, h, true, g, nil, res)
		})
	}
	if err := cg.Wait(); err != nil {
		errs = append(errs, err)
	}
	return false, errors.Join(errs...)
}

// holdFields is the number of ARGV values per item of the hold script,
// settleFields of the settle script's settle, cancelFields of its cancel.
const (
	holdFields   = 4
	settleFields = 6
	cancelFields = 7
)

// runHold runs lua/ratelimit_hold.lua for g (one slot): its decisions go
// to g.out; the TAT each item saw, the TAT it wrote and the mark it saw to
// g.old[j] (what a cancel restores).
func (s *RedisStore) runHold(ctx context.Context, h *Hold, ttlUS int64, g *group) (bool, error) {
	n := len(g.items)
	keys := h.rkeys
	if g.idx != nil {
		keys = make([]string, 0, n)
		for _, i := range g.idx {
			keys = append(keys, h.rkeys[i])
		}
	}
	args := make([]any, 4, 4+holdFields*n)
	args[0], args[1], args[2], args[3] = s.nowArg(), 1, n, ttlUS // one group
	want := 2 + n
	if g.old != nil {
		args[1], want = -1, 2+4*n // one group, and the TATs and marks a cancel restores
	}
	for j := range g.items {
		it := &g.items[j]
		T := it.Policy.emissionInterval()
		args = append(args, T, it.Policy.effectiveBurst()*T, it.scriptCost(), h.members[g.index(j)])
	}
	var res any
	var err error
	settles := s.settlesToRide()
	s.awaitFlights(ctx, keys, settles)
	if len(settles) > 0 {
		// the settles queued so far ride on the call (ratelimit_hold.lua
		// runs them first): one script call for both
		calls := s.settleCalls(settles) // one: a single server
		k, a := calls[0].ride(keys, args)
		res, err = lua.Script("ratelimit_hold").Run(ctx, s.client, k, a...).Result()
		res = calls[0].split(ctx, res, err)
		s.deliverSettles(ctx, settles, calls)
	} else {
		res, err = lua.Script("ratelimit_hold").Run(ctx, s.client, keys, args...).Result()
	}
	if err != nil {
		return false, fmt.Errorf("ratelimit: redis: hold script: %w", err)
	}
	v, err := intSlice(res, want)
	if err != nil {
		return false, fmt.Errorf("ratelimit: redis: hold script: %w", err)
	}
	allowed, err := holdOutcomes(g.items, v[2:2+n], 2, v[1], g.out)
	if err != nil {
		return false, err
	}
	if g.old != nil { // kept for a cancel (several groups)
		for j := range g.items {
			g.old[j] = [3]int64{v[2+n+j], v[2+2*n+j], v[2+3*n+j]}
		}
	}
	g.now = v[0]
	return allowed, nil
}

// settle implements holdSettler: one settle script per slot group, in
// parallel.
func (s *RedisStore) settle(ctx context.Context, h *Hold, actual []int64, res []SettleResult) error {
	if h.fixedOnly(res) {
		return nil
	}
	if !s.open() {
		return fmt.Errorf("ratelimit: redis: settle: %w: %w", errNotSent, errGateClosed)
	}
	var groups []*group
	var whole [1]*group
	if s.sharded == oneServer {
		whole[0] = &group{items: h.items}
		groups = whole[:]
	} else {
		groups = s.split(h.items, s.sharded)
	}
	if len(groups) == 1 {
		err := s.runSettle(ctx, h, false, groups[0], actual, res)
		if err != nil && s.sharded == oneServer && strings.Contains(err.Error(), "CROSSSLOT") {
			groups = s.split(h.items, bySlot)
		} else {
			return err
		}
	}
	var eg errgroup.Group
	for _, g := range groups {
		eg.Go(func() error { return s.runSettle(ctx, h, false, g, actual, res) })
	}
	return eg.Wait()
}

// settleArgs appends the settle script's ARGV values of item i settled
// to actual, or, for a cancel, undoing the reserve that saw old (its
// TAT, the TAT it wrote and its mark; actual is then ignored).
func (h *Hold) settleArgs(args []any, i int, cancel bool, actual int64, old [3]int64) []any {
	it := &h.items[i]
	T := it.Policy.emissionInterval()
	if cancel {
		return append(args, T, it.Policy.effectiveBurst()*T, it.Cost, h.members[i], old[0], old[1], old[2])
	}
	return append(args, T, it.Policy.effectiveBurst()*T, it.Cost, settleCost(it, actual), h.members[i], h.exps[i])
}

// runSettle runs lua/ratelimit_settle.lua for g, writing each item's
// result to res (indexed like h's items, as actual is). With cancel it
// undoes g's holds instead (actual is ignored): see reserveGroups.
func (s *RedisStore) runSettle(ctx context.Context, h *Hold, cancel bool, g *group, actual []int64, res []SettleResult) error {
	n := len(g.items)
	keys := make([]string, 0, n)
	idx := make([]int, 0, n) // the items sent: a settle skips the fixed ones
	fields := settleFields
	if cancel {
		fields = cancelFields
	}
	args := make([]any, 2, 2+fields*n)
	args[0], args[1] = s.nowArg(), 0
	if cancel {
		args[1] = 1
	}
	for j := range g.items {
		i := g.index(j)
		if cancel {
			args = h.settleArgs(args, i, true, 0, g.old[j])
		} else if h.items[i].Fixed {
			res[i] = SettleApplied // charged at admission: nothing to settle
			continue
		} else {
			args = h.settleArgs(args, i, false, actual[i], [3]int64{})
		}
		keys = append(keys, h.rkeys[i])
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return nil
	}
	r, err := lua.Script("ratelimit_settle").Run(ctx, s.client, keys, args...).Result()
	if err != nil {
		return fmt.Errorf("ratelimit: redis: settle script: %w", err)
	}
	v, err := intSlice(r, len(idx))
	if err != nil {
		return fmt.Errorf("ratelimit: redis: settle script: %w", err)
	}
	for j, x := range v {
		r, err := settleResultOf(j, x)
		if err != nil {
			return fmt.Errorf("ratelimit: redis: settle script: %w", err)
		}
		res[idx[j]] = r
	}
	return nil
}

// The settle script's reply values, one per item (ratelimit_holds.lua's
// hsettle returns its locals APPLIED, ALREADY_SETTLED and EXPIRED):
// values of the wire, not SettleResult's, which settleResultOf maps.
// TestScriptConstants checks that both sides name the same values.
const (
	settleReplyApplied        = 1
	settleReplyAlreadySettled = 2
	settleReplyExpired        = 3
)

// settleResultOf is the SettleResult of the settle script's reply value x
// (the reply's j-th).
func settleResultOf(j int, x int64) (SettleResult, error) {
	switch x {
	case settleReplyApplied:
		return SettleApplied, nil
	case settleReplyAlreadySettled:
		return SettleAlreadySettled, nil
	case settleReplyExpired:
		return SettleExpired, nil
	}
	return 0, fmt.Errorf("unexpected reply value %d = %d, want %d, %d or %d", j, x, settleReplyApplied, settleReplyAlreadySettled, settleReplyExpired)
}

// fixedOnly reports whether every item of h is fixed (nothing to settle:
// res gets SettleApplied for each); otherwise it fills res with
// SettleApplied for the fixed items and leaves the others 0.
func (h *Hold) fixedOnly(res []SettleResult) bool {
	all := true
	for i := range h.items {
		if h.items[i].Fixed {
			res[i] = SettleApplied
		} else {
			all = false
		}
	}
	return all
}
