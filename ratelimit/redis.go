package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/lua"
)

// RedisStore keeps rate-limit state in Redis, shared by every server of a
// fleet. Each decision is one Lua script call (one round trip), whatever
// the number of items in the batch, and decisions made while the store's
// call is in flight are coalesced into one script call (RedisSettings.Coalescing,
// on by default); see docs/ratelimit-redis.md.
//
// Keys are prefix + scope + sep + "{" + key + "}" (internal/keys): the
// entity is the Redis Cluster hash tag, so the tiers of one entity share a
// slot. TokenBucket, GCRA and LeakyBucket share one string per (scope,
// key), "<prefix><scope>;{<key>}", the theoretical arrival time in µs (as
// in the memory store); with Redis TIME it is kept compact, the key's
// expiry in ms and the remaining µs as a small integer (see
// docs/ratelimit-redis.md). The windows' keys are
// "<prefix><scope>:{<key>}" with a suffix outside the tag (":fw", ":swc",
// ":swl") so that a policy that changes algorithm never reads another
// layout's state. Every key carries a millisecond TTL that ends when its
// state is back to full.
//
// On a *redis.ClusterClient (and a *redis.Ring) the items of a batch are
// grouped by slot (by shard), the groups run in parallel, and when one
// group denies or fails after another charged, the charged groups are
// refunded by a second script: the only second round trip, on the rare
// path. No CROSSSLOT error reaches the caller: a client of another type
// whose server answers CROSSSLOT (a wrapper around a ClusterClient) gets
// the same grouping on a second try (Redis rejects such a script before
// running it, so nothing was charged).
//
// By default the scripts read Redis TIME, so servers with skewed clocks
// agree; RedisSettings.Clock makes the client send its own time instead.
//
// A RedisStore is safe for concurrent use.
type RedisStore struct {
	client  redis.UniversalClient
	prefix  string
	clock   func() time.Time
	sharded sharding
	idBase  string
	idSeq   atomic.Uint64
	holdIDs holdIDs
	co      *coalescer // nil: coalescing off
	nodeCo  sync.Map   // on a Cluster: primary's *redis.Client -> its *coalescer (see coalescerFor)
	sq      *settleQueue
	gate    atomic.Pointer[func() bool] // setGate; nil: always call

	settleLoaded atomic.Bool // the settle script was loaded (redis_settle.go: run)
}

var _ boundedStore = (*RedisStore)(nil)

// sharding says how the client spreads keys over servers.
type sharding uint8

const (
	oneServer sharding = iota // a *redis.Client, failover client, …: any keys in one script
	bySlot                    // *redis.ClusterClient: one script per hash slot
	byTag                     // *redis.Ring: one script per hash tag (ring shards hash the tag)
)

// NewRedisStore returns a store over client (a *redis.Client, a
// *redis.ClusterClient, a failover client or a *redis.Ring) configured by
// set (the zero RedisSettings: the defaults; without a Clock the scripts
// read Redis TIME). It fails when client is nil or the prefix contains
// '{' or '}'.
func NewRedisStore(client redis.UniversalClient, set RedisSettings) (*RedisStore, error) {
	if set.Prefix == "" {
		set.Prefix = "spillway:"
	}
	if set.Coalescing == 0 {
		set.Coalescing = DefaultCoalescing
	}
	s := &RedisStore{client: client, prefix: set.Prefix, clock: set.Clock, holdIDs: newHoldIDs(), sq: newSettleQueue(set.SettleQueue)}
	if set.Coalescing > 0 {
		s.co = &coalescer{max: set.Coalescing}
	}
	nilClient := client == nil
	switch c := client.(type) {
	case *redis.Client:
		nilClient = c == nil
	case *redis.ClusterClient:
		nilClient = c == nil
		s.sharded = bySlot
	case *redis.Ring:
		nilClient = c == nil
		s.sharded = byTag
	}
	if nilClient {
		return nil, errors.New("ratelimit: NewRedisStore: client is nil")
	}
	if err := keys.ValidatePrefix(set.Prefix); err != nil {
		return nil, fmt.Errorf("ratelimit: NewRedisStore: %w", err)
	}
	var b [9]byte
	_, _ = rand.Read(b[:])
	s.idBase = base64.RawURLEncoding.EncodeToString(b[:]) + "."
	return s, nil
}

// bucketSep separates the scope from the entity's hash tag in the bucket
// family's keys: ';' since the compact encoding of a TAT (lua/
// ratelimit_holds.lua), which the versions before it read as a full
// bucket, so that the two never share a key (keys.KeyWith).
const bucketSep = ';'

// layout suffixes: the bucket family's key is keys.KeyWith(…, bucketSep, …)
// with nothing after the tag (the common, memory-bound case); the windows'
// keys are keys.Key and end after the hash tag.
func redisKey(prefix string, it *Item) string {
	switch it.Policy.Algorithm {
	case FixedWindow:
		return keys.KeySuffix(prefix, it.Scope, it.Key, ":fw")
	case SlidingWindowCounter:
		return keys.KeySuffix(prefix, it.Scope, it.Key, ":swc")
	case SlidingWindowLog:
		return keys.KeySuffix(prefix, it.Scope, it.Key, ":swl")
	case SlidingWindowBuckets:
		return keys.KeySuffix(prefix, it.Scope, it.Key, ":swb")
	}
	return keys.KeyWith(prefix, it.Scope, bucketSep, it.Key)
}

// nowArg is ARGV[1] of the scripts: the client's µs time, or "" for TIME.
func (s *RedisStore) nowArg() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock().UnixMicro(), 10)
}

// Decide implements Store. One item of the bucket family runs the lean
// token-bucket script, several items all of the bucket family the lean
// buckets script, anything else the batch script; once per slot on a
// Cluster (see RedisStore). While the store's calls are in flight,
// concurrent batches are coalesced into one call (see RedisSettings.Coalescing).
func (s *RedisStore) Decide(ctx context.Context, items []Item, out []spillway.Decision) (bool, error) {
	return s.DecideBy(ctx, time.Time{}, items, out)
}

// DecideBy is Decide, bounded by deadline as well as by ctx (the zero
// deadline: no bound but ctx's; fallback.Store calls it with its budget's
// end instead of making a context with a timer per call). A call of its own gets a context with the deadline (as the
// caller would have made it); a batch queued for a coalesced call waits
// on a channel shared by the batches whose deadlines fall in the same
// millisecond, closed at its end by one timer: the bound is then up to
// 1 ms later than deadline, and no timer is made per call.
func (s *RedisStore) DecideBy(ctx context.Context, deadline time.Time, items []Item, out []spillway.Decision) (bool, error) {
	if err := validateBatch(items, out); err != nil {
		return false, err
	}
	if len(items) == 0 {
		return true, nil
	}
	if d, ok := ctx.Deadline(); ok && !deadline.IsZero() && !d.After(deadline) {
		deadline = time.Time{} // ctx ends first: it alone bounds the call
	}
	if s.co != nil {
		return s.coalescerFor(ctx, &items[0]).decide(ctx, deadline, s, items, out)
	}
	return s.decideBy(ctx, deadline, items, out)
}

// coalescerFor returns the coalescer of a batch whose first item is it: on
// a Cluster, the one of the primary serving its slot, so that a batch
// waits only for the calls in flight to its own node — a primary that
// stalls or dies holds up its own slots, not the others' — else the
// store's.
func (s *RedisStore) coalescerFor(ctx context.Context, it *Item) *coalescer {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok || s.sharded != bySlot {
		return s.co
	}
	n, err := cc.MasterForKey(ctx, redisKey(s.prefix, it))
	if err != nil || n == nil {
		return s.co
	}
	if c, ok := s.nodeCo.Load(n); ok {
		return c.(*coalescer)
	}
	c, _ := s.nodeCo.LoadOrStore(n, &coalescer{max: s.co.max})
	return c.(*coalescer)
}

// decideBy is decide within deadline (the zero time: ctx's alone).
func (s *RedisStore) decideBy(ctx context.Context, deadline time.Time, items []Item, out []spillway.Decision) (bool, error) {
	if deadline.IsZero() {
		return s.decide(ctx, items, out)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return s.decide(ctx, items, out)
}

// decide decides a valid, non-empty batch with calls of its own.
func (s *RedisStore) decide(ctx context.Context, items []Item, out []spillway.Decision) (bool, error) {
	if len(items) == 1 {
		switch items[0].Policy.Algorithm {
		case TokenBucket, GCRA, LeakyBucket:
			return s.decideBucket(ctx, &items[0], &out[0])
		}
	}
	if s.sharded != oneServer {
		return s.decideGroups(ctx, items, out, s.sharded)
	}
	allowed, err := s.runGroup(ctx, items, out, nil)
	if err != nil && strings.Contains(err.Error(), "CROSSSLOT") {
		// A client that is a Cluster in disguise (a wrapper around a
		// ClusterClient): Redis refused the script before it ran, so
		// nothing was charged; decide again, one call per slot.
		return s.decideGroups(ctx, items, out, bySlot)
	}
	return allowed, err
}

// decideBucket runs lua/ratelimit_token_bucket.lua for one item. The
// script replies only wait (how far the bucket is from full); the decision
// follows from it as in bucketDecide.
func (s *RedisStore) decideBucket(ctx context.Context, it *Item, out *spillway.Decision) (bool, error) {
	p := it.Policy
	T := p.emissionInterval()
	tau := p.effectiveBurst() * T
	key := redisKey(s.prefix, it)
	res, err := s.run(ctx, lua.Script("ratelimit_token_bucket"), []string{key}, s.nowArg(), T, tau, it.scriptCost()).Result()
	if err != nil {
		return false, fmt.Errorf("ratelimit: redis: token bucket script: %w", err)
	}
	wait, ok := res.(int64)
	if !ok || wait < 0 || wait > 2*tau { // 2τ: a key in debt (see hold.go)
		return false, fmt.Errorf("ratelimit: redis: token bucket script: unexpected reply %T %v, want an integer in [0, %d]", res, res, 2*tau)
	}
	o := bucketOutcome(it, wait)
	*out = o.decision(it.Scope, p)
	return o.allowed, nil
}

// bucketOutcome derives the decision of a bucket-family item from wait,
// how far its bucket was from full (in [0, tau]), as bucketDecide does.
func bucketOutcome(it *Item, wait int64) outcome {
	p := it.Policy
	T := p.emissionInterval()
	B := p.effectiveBurst()
	lim := limits{B: B, T: T, tau: B * T}
	o := waitOutcome(wait, &lim, it.Cost)
	o.delay = 0
	return o
}

// bucketsOnly reports whether every item is of the bucket family.
func bucketsOnly(items []Item) bool {
	for i := range items {
		switch items[i].Policy.Algorithm {
		case TokenBucket, GCRA, LeakyBucket:
		default:
			return false
		}
	}
	return true
}

// fixedOnly reports whether every item is a fixed window.
func fixedOnly(items []Item) bool {
	for i := range items {
		if items[i].Policy.Algorithm != FixedWindow {
			return false
		}
	}
	return true
}

// runGroup decides items (all in one slot): with the buckets script when
// they are all of the bucket family, with the fixed-window script when
// they are all fixed windows and no refund may follow, else with the
// batch script. g, when not nil, receives what a refund needs (see
// runBatch and runBuckets).
func (s *RedisStore) runGroup(ctx context.Context, items []Item, out []spillway.Decision, g *group) (bool, error) {
	if bucketsOnly(items) {
		return s.runBuckets(ctx, items, out, g)
	}
	if g == nil && fixedOnly(items) {
		return s.runFixed(ctx, items, out)
	}
	allowed, _, err := s.runBatch(ctx, items, out, g)
	return allowed, err
}

// runBuckets runs lua/ratelimit_buckets.lua over items (all of the bucket
// family, all in one slot) and writes their decisions to out. The script
// replies its now and each item's wait (and, for g, the TAT each saw); the
// decisions follow from the waits as in decideBucket, and the batch is
// allowed when every item is. g, when not nil, receives now and the TATs
// (for a refund).
func (s *RedisStore) runBuckets(ctx context.Context, items []Item, out []spillway.Decision, g *group) (bool, error) {
	keys := make([]string, len(items))
	for i := range items {
		keys[i] = redisKey(s.prefix, &items[i])
	}
	var b bucketsArgs
	b.add(items)
	res, err := s.run(ctx, lua.Script("ratelimit_buckets"), keys, b.argv(s.nowArg(), g != nil)...).Result()
	if err != nil {
		return false, fmt.Errorf("ratelimit: redis: buckets script: %w", err)
	}
	r, err := bucketsReply(res, len(items), g != nil)
	if err != nil {
		return false, err
	}
	allowed, err := bucketsDecisions(items, r[1:1+len(items)], 1, out)
	if err != nil {
		return false, err
	}
	if g != nil {
		g.now = r[0]
		for i, tat := range r[1+len(items):] {
			g.old[i] = [3]int64{tat} // TAT, no mark
			if tat < 0 {
				g.old[i] = [3]int64{-tat - 1, 1} // the script's code for a marked TAT
			}
		}
	}
	return allowed, nil
}

// runFixed runs lua/ratelimit_fixed.lua over items (all fixed windows,
// all in one slot) and writes their decisions to out.
func (s *RedisStore) runFixed(ctx context.Context, items []Item, out []spillway.Decision) (bool, error) {
	keys := make([]string, len(items))
	for i := range items {
		keys[i] = redisKey(s.prefix, &items[i])
	}
	var b bucketsArgs
	b.addFixed(items)
	res, err := s.run(ctx, lua.Script("ratelimit_fixed"), keys, b.argv(s.nowArg(), false)...).Result()
	if err != nil {
		return false, fmt.Errorf("ratelimit: redis: fixed window script: %w", err)
	}
	r, err := fixedReply(res, len(items))
	if err != nil {
		return false, err
	}
	return fixedDecisions(items, r[0], r[1:], out), nil
}

// fixedReply checks the fixed-window script's reply for n items: 1 + n
// integers, the first (now) ≥ 0.
func fixedReply(res any, n int) ([]int64, error) {
	r, err := intSlice(res, 1+n)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: redis: fixed window script: %w", err)
	}
	if r[0] < 0 {
		return nil, fmt.Errorf("ratelimit: redis: fixed window script: unexpected reply value 0 (now) = %d, want an integer ≥ 0", r[0])
	}
	return r, nil
}

// fixedDecisions writes the decisions of fixed-window items from the
// counts the script replied (see lua/ratelimit_fixed.lua) to out, exactly
// as the batch script decides a fixed_window item, and reports whether every item had
// room.
func fixedDecisions(items []Item, now int64, counts []int64, out []spillway.Decision) bool {
	allowed := true
	for i := range items {
		it := &items[i]
		L, P, n := it.Policy.Limit, it.Policy.Period.Microseconds(), it.scriptCost()
		c, left := counts[i], P-now%P // left: µs to the end of the window
		if c < 0 {                    // the clock was behind the stored window: decided at its start
			c, left = -c-1, P
		}
		var o outcome
		if n > L || c+n > L {
			o.remaining = max(L-c, 0)
			if c > 0 {
				o.reset = left
			}
			if n <= L {
				o.retry = left
			}
			o.exceeds = it.Cost > it.Policy.Capacity()
		} else {
			c += n
			o.allowed, o.remaining = true, L-c
			if c > 0 {
				o.reset = left
			}
		}
		out[i] = o.decisionCap(it.Scope, L)
		allowed = allowed && o.allowed
	}
	return allowed
}

// bucketsArgs gathers the ARGV of one call of the buckets script (and of
// the fixed-window script): each distinct policy once, the groups' sizes
// and one code per item (two for a cost other than 1), so that a
// coalesced call of many requests of the same policies sends little more
// than one small integer per item.
type bucketsArgs struct {
	pol   [][2]int64 // T, tau of each distinct policy (fixed windows: L, P)
	sizes []int      // items per group
	codes []int64    // per item: policy index (1-based), or −index then the cost

	// fixed windows: the codes of the last group that sent its own
	// (codes[prev:]), and its size; a group with the same codes sends
	// −size instead (lua/ratelimit_fixed.lua reads them again)
	prev, prevSize int
}

// add appends items (of the bucket family) as one group.
func (b *bucketsArgs) add(items []Item) { b.addWith(items, false) }

// addFixed appends items (fixed windows) as one group.
func (b *bucketsArgs) addFixed(items []Item) { b.addWith(items, true) }

func (b *bucketsArgs) addWith(items []Item, fixed bool) {
	b.sizes = append(b.sizes, len(items))
	start := len(b.codes)
	last := 0
	for i := range items {
		p := &items[i].Policy
		var pt [2]int64
		if fixed {
			pt = [2]int64{p.Limit, p.Period.Microseconds()}
		} else {
			T := p.emissionInterval()
			pt = [2]int64{T, p.effectiveBurst() * T}
		}
		j := 0
		if last > 0 && b.pol[last-1] == pt {
			j = last
		} else {
			for k := range b.pol {
				if b.pol[k] == pt {
					j = k + 1
					break
				}
			}
			if j == 0 {
				b.pol = append(b.pol, pt)
				j = len(b.pol)
			}
			last = j
		}
		if c := items[i].scriptCost(); c != 1 {
			b.codes = append(b.codes, -int64(j), c)
		} else {
			b.codes = append(b.codes, int64(j))
		}
	}
	if !fixed {
		return
	}
	if g := len(b.sizes); g > 1 && b.prevSize == len(items) && slices.Equal(b.codes[b.prev:start], b.codes[start:]) {
		b.codes = b.codes[:start] // the previous group's codes again
		b.sizes[g-1] = -len(items)
		return
	}
	b.prev, b.prevSize = start, len(items)
}

// repeatSizes are the sizes −1 … −63 of groups that repeat the previous
// group's codes, boxed once (an int outside 0…255 in an interface
// allocates).
var repeatSizes = func() (a [64]any) {
	for i := range a {
		a[i] = -i
	}
	return a
}()

// argv returns the script's ARGV: now, ±P (negative: reply the TATs),
// the policies, G and the groups' sizes, the items' codes.
func (b *bucketsArgs) argv(now string, tats bool) []any {
	args := make([]any, 0, 3+2*len(b.pol)+len(b.sizes)+len(b.codes))
	P := len(b.pol)
	if tats {
		P = -P
	}
	args = append(args, now, P)
	for _, pt := range b.pol {
		args = append(args, pt[0], pt[1])
	}
	args = append(args, len(b.sizes))
	for _, n := range b.sizes {
		if n < 0 && -n < len(repeatSizes) {
			args = append(args, repeatSizes[-n]) // boxed once: a negative int would allocate
			continue
		}
		args = append(args, n)
	}
	for _, c := range b.codes {
		args = append(args, c)
	}
	return args
}

// bucketsReply checks the buckets script's reply for n items: 1 + n
// integers (1 + 2n with the TATs), the first (now) ≥ 0.
func bucketsReply(res any, n int, tats bool) ([]int64, error) {
	want := 1 + n
	if tats {
		want += n
	}
	r, err := intSlice(res, want)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: redis: buckets script: %w", err)
	}
	if r[0] < 0 {
		return nil, fmt.Errorf("ratelimit: redis: buckets script: unexpected reply value 0 (now) = %d, want an integer ≥ 0", r[0])
	}
	return r, nil
}

// bucketsDecisions writes the decisions of items from their waits (reply
// values first, first+1, …) to out and reports whether every item had
// room. A wait outside [0, tau] is an error and writes nothing.
func bucketsDecisions(items []Item, waits []int64, first int, out []spillway.Decision) (bool, error) {
	for i := range items {
		it := &items[i]
		if tau := it.Policy.effectiveBurst() * it.Policy.emissionInterval(); waits[i] < 0 || waits[i] > 2*tau { // 2τ: a key in debt
			return false, fmt.Errorf("ratelimit: redis: buckets script: unexpected reply value %d = %d, want an integer in [0, %d]", first+i, waits[i], 2*tau)
		}
	}
	allowed := true
	for i := range items {
		o := bucketOutcome(&items[i], waits[i])
		out[i] = o.decision(items[i].Scope, items[i].Policy)
		allowed = allowed && o.allowed
	}
	return allowed, nil
}

// outcome reads {ok, remaining, reset, retry} from v.
func (s *RedisStore) outcome(it *Item, v []int64) outcome {
	ok := v[0] == 1
	return outcome{
		allowed:   ok,
		exceeds:   !ok && it.Cost > it.Policy.Capacity(),
		remaining: v[1],
		reset:     v[2],
		retry:     v[3],
	}
}

// batchFields is the number of ARGV values per item of the batch script,
// batchReplyFields the number of reply values per item.
const (
	batchFields      = 7
	batchReplyFields = 7
)

// runBatch runs lua/ratelimit_batch.lua over items (all in one slot) and
// writes their decisions to out. g, when not nil, receives what a refund
// needs: the script's now, the state each item saw and the log ids sent.
// It returns whether the batch was allowed and the script's now.
func (s *RedisStore) runBatch(ctx context.Context, items []Item, out []spillway.Decision, g *group) (bool, int64, error) {
	keys := make([]string, len(items))
	for i := range items {
		keys[i] = redisKey(s.prefix, &items[i])
	}
	var uids []string
	if g != nil {
		uids = g.uids
	}
	args := s.batchArgs(make([]any, 1, 1+batchFields*len(items)), items, uids)
	args[0] = s.nowArg()
	res, err := s.run(ctx, lua.Script("ratelimit_batch"), keys, args...).Result()
	if err != nil {
		return false, 0, fmt.Errorf("ratelimit: redis: batch script: %w", err)
	}
	var v []int64
	if g != nil {
		v, err = intSlice(res, 2+batchReplyFields*len(items)+windowCounts(items))
		if err != nil {
			err = fmt.Errorf("ratelimit: redis: batch script: %w", err)
		}
	} else {
		v, err = batchReply(res, len(items))
	}
	if err != nil {
		return false, 0, err
	}
	allowed := s.batchDecisions(items, v[2:], out)
	if g != nil {
		counts := v[2+batchReplyFields*len(items):]
		for i := range items {
			g.old[i] = [3]int64(v[2+batchReplyFields*i+4 : 2+batchReplyFields*(i+1)])
			if p := &items[i].Policy; p.Algorithm == SlidingWindowBuckets {
				// the bucketed window's state before the charge, for a
				// refund, in the uid's place (see refundArgs)
				n := int(p.effectiveBuckets()) + 1
				g.uids[i] = formatBuckets(g.old[i][0], counts[:n], p.Limit)
				counts = counts[n:]
			}
		}
		g.now = v[0]
	}
	return allowed, v[0], nil
}

// windowCounts is the number of counts the batch script appends to its
// reply when asked for the state of items' bucketed windows (batchArgs
// with uids): Buckets+1 for each.
func windowCounts(items []Item) int {
	n := 0
	for i := range items {
		if p := &items[i].Policy; p.Algorithm == SlidingWindowBuckets {
			n += int(p.effectiveBuckets()) + 1
		}
	}
	return n
}

// bucketsWidth is the bytes of one count of a bucketed window of limit L
// in Redis: the smallest of 1, 2, 4 and 7 that holds L (no count exceeds
// it).
func bucketsWidth(L int64) int {
	switch {
	case L < 1<<8:
		return 1
	case L < 1<<16:
		return 2
	case L < 1<<32:
		return 4
	}
	return 7
}

// formatBuckets is a bucketed window's value in Redis, as
// lua/ratelimit_subwindows.lua packs it: h in 7 bytes, then each count in
// bucketsWidth(L) bytes, big-endian; "" when every count is 0 (no state).
func formatBuckets(h int64, c []int64, L int64) string {
	nonzero := false
	for _, x := range c {
		nonzero = nonzero || x > 0
	}
	if !nonzero {
		return ""
	}
	w := bucketsWidth(L)
	b := make([]byte, 0, 7+w*len(c))
	put := func(x int64, w int) {
		for i := w - 1; i >= 0; i-- {
			b = append(b, byte(uint64(x)>>(8*i)))
		}
	}
	put(h, 7)
	for _, x := range c {
		put(x, w)
	}
	return string(b)
}

// parseBuckets reads what formatBuckets wrote for N sub-windows and limit
// L: h and N+1 counts, or 0, nil (a value of another length).
func parseBuckets(s string, N, L int64) (int64, []int64) {
	w := bucketsWidth(L)
	if int64(len(s)) != 7+int64(w)*(N+1) {
		return 0, nil
	}
	get := func(s string) int64 {
		var x uint64
		for i := 0; i < len(s); i++ {
			x = x<<8 | uint64(s[i])
		}
		return int64(x)
	}
	c := make([]int64, N+1)
	for i := range c {
		c[i] = get(s[7+i*w : 7+(i+1)*w])
	}
	return get(s[:7]), c
}

// batchArgs appends the batch script's ARGV values of items. Each item of
// the sliding window log with a cost gets a unique id, recorded in uids
// when it is not nil.
func (s *RedisStore) batchArgs(args []any, items []Item, uids []string) []any {
	for i := range items {
		it := &items[i]
		p := it.Policy
		uid := ""
		if p.Algorithm == SlidingWindowLog && it.Cost > 0 {
			uid = s.idBase + strconv.FormatUint(s.idSeq.Add(1), 36)
		}
		if uids != nil {
			uids[i] = uid
		}
		if p.Algorithm == SlidingWindowBuckets {
			// B and T carry N and the mode; uid "1" asks for the counts
			// the item saw (a refund's)
			mode := 0
			if p.Mode == Conservative {
				mode = 1
			}
			if uids != nil {
				uid = "1"
			}
			args = append(args, p.Algorithm.String(), p.Limit, p.Period.Microseconds(), p.effectiveBuckets(), mode, it.scriptCost(), uid)
			continue
		}
		args = append(args, p.Algorithm.String(), p.Limit, p.Period.Microseconds(), p.effectiveBurst(), p.emissionInterval(), it.scriptCost(), uid)
	}
	return args
}

// batchReply checks the batch script's reply for n items.
func batchReply(res any, n int) ([]int64, error) {
	v, err := intSlice(res, 2+batchReplyFields*n)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: redis: batch script: %w", err)
	}
	return v, nil
}

// batchDecisions writes the decisions of items from their reply values v
// (batchReplyFields per item) to out and reports whether every item was
// allowed.
func (s *RedisStore) batchDecisions(items []Item, v []int64, out []spillway.Decision) bool {
	allowed := true
	for i := range items {
		r := v[batchReplyFields*i : batchReplyFields*(i+1)]
		o := s.outcome(&items[i], r)
		out[i] = o.decision(items[i].Scope, items[i].Policy)
		allowed = allowed && o.allowed
	}
	return allowed
}

// Reset implements Store: it deletes the key of (scope, key) under the
// layout of p (TokenBucket, GCRA and LeakyBucket share one).
func (s *RedisStore) Reset(ctx context.Context, scope, key string, p Policy) error {
	it := &Item{Scope: scope, Key: key, Policy: p}
	k := redisKey(s.prefix, it)
	if err := s.client.Del(ctx, k).Err(); err != nil {
		return fmt.Errorf("ratelimit: redis: reset %q: %w", k, err)
	}
	return nil
}

// intSlice checks that a script reply is an array of want integers.
func intSlice(res any, want int) ([]int64, error) {
	arr, ok := res.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected reply of type %T, want an array", res)
	}
	if len(arr) != want {
		return nil, fmt.Errorf("unexpected reply of %d values, want %d", len(arr), want)
	}
	v := make([]int64, want)
	for i, x := range arr {
		n, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("unexpected reply value %d of type %T, want an integer", i, x)
		}
		v[i] = n
	}
	return v, nil
}
