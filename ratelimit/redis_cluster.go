package ratelimit

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/lua"
)

// group is the part of a batch that lives in one Cluster slot (one Ring
// shard): one script call.
type group struct {
	shard   int    // slot, or the index of the tag among the batch's tags
	tag     string // byTag only
	idx     []int  // positions in the caller's batch
	items   []Item // items[idx[j]]
	out     []spillway.Decision
	uids    []string   // the log ids sent, for a refund
	old     [][3]int64 // the state each item saw before its charge, for a refund (see refundArgs)
	now     int64      // the µs time the script decided at
	allowed bool
	err     error
}

func (g *group) charged() bool {
	if !g.allowed || g.err != nil {
		return false
	}
	for i := range g.items {
		if g.items[i].Cost > 0 {
			return true
		}
	}
	return false
}

// decideGroups decides a batch whose items may live on several Cluster
// slots (Ring shards): one script per group (see runGroup), in parallel;
// if a group denies or fails while another charged, the charged groups are
// refunded.
func (s *RedisStore) decideGroups(ctx context.Context, items []Item, out []spillway.Decision, by sharding) (bool, error) {
	groups := s.split(items, by)
	if len(groups) == 1 {
		return s.runGroup(ctx, items, out, nil)
	}
	var eg errgroup.Group
	for _, g := range groups {
		eg.Go(func() error {
			g.allowed, g.err = s.runGroup(ctx, g.items, g.out, g)
			return nil
		})
	}
	_ = eg.Wait()
	allowed := true
	var errs []error
	for _, g := range groups {
		for j, i := range g.idx {
			out[i] = g.out[j]
		}
		if g.err != nil {
			errs = append(errs, g.err)
		}
		allowed = allowed && g.allowed && g.err == nil
	}
	if allowed {
		return true, nil
	}
	// A group that failed may or may not have charged (a timeout after the
	// script ran): it is not refunded, since refunding what was never
	// charged would admit more than the policy allows.
	if err := s.refund(ctx, groups); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return false, errors.Join(errs...)
	}
	return false, nil
}

// split groups items by slot (bySlot) or hash tag (byTag), in order of
// first appearance.
func (s *RedisStore) split(items []Item, by sharding) []*group {
	var groups []*group
	for i := range items {
		k := redisKey(s.prefix, &items[i])
		tag := keys.Tag(k)
		sl := -1
		if by == bySlot {
			sl = slot(k)
		}
		var g *group
		for _, h := range groups {
			if (by == bySlot && h.shard == sl) || (by == byTag && h.tag == tag) {
				g = h
				break
			}
		}
		if g == nil {
			g = &group{shard: sl, tag: tag}
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.items = append(g.items, items[i])
	}
	for _, g := range groups {
		g.out = make([]spillway.Decision, len(g.items))
		g.uids = make([]string, len(g.items))
		g.old = make([][3]int64, len(g.items))
	}
	return groups
}

// refundFields is the number of ARGV values per item of the refund script.
const refundFields = 10

// refund gives back, with lua/ratelimit_refund.lua, what the charged groups
// took; the groups run in parallel. It runs even when ctx is done: a
// charge must not outlive the batch that was denied.
func (s *RedisStore) refund(ctx context.Context, groups []*group) error {
	ctx = context.WithoutCancel(ctx)
	var eg errgroup.Group
	for _, g := range groups {
		if !g.charged() {
			continue
		}
		eg.Go(func() error {
			keys := make([]string, len(g.items))
			args := make([]any, 1, 1+refundFields*len(g.items))
			args[0] = s.nowArg()
			for i := range g.items {
				keys[i] = redisKey(s.prefix, &g.items[i])
				args = refundArgs(args, &g.items[i], g.uids[i], g.old[i], g.now)
			}
			if err := lua.Script("ratelimit_refund").Run(ctx, s.client, keys, args...).Err(); err != nil {
				return fmt.Errorf("ratelimit: redis: refund script: %w", err)
			}
			return nil
		})
	}
	return eg.Wait()
}

// refundArgs appends the refund script's ARGV for it: the item, the state
// it saw before its charge (old, as the charging script replied it) and
// the state the charge wrote, recomputed here from old and the script's
// now with the functions of algorithms.go, which the scripts follow line
// by line. When the key still holds that state, the script restores old
// exactly, as the memory store's rollback of a denied batch does; else it
// gives back the cost (not exact).
func refundArgs(args []any, it *Item, uid string, old [3]int64, now int64) []any {
	p := it.Policy
	lim := p.limits()
	var wrote [3]int64
	switch p.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		// a negative TAT (garbage) decides as 0 does, and cannot overflow
		_, wrote[0] = bucketDecide(max(old[0], 0), now, lim, it.Cost)
	case FixedWindow:
		_, st := fixedDecide(fixedState{old[0], old[1]}, now, lim, it.Cost)
		wrote = [3]int64{st.window, st.count}
	case SlidingWindowCounter:
		_, st := counterDecide(counterState{old[0], old[1], old[2]}, now, lim, it.Cost)
		wrote = [3]int64{st.window, st.prev, st.cur}
	case SlidingWindowBuckets:
		return append(args, bucketsRefundArgs(it, uid, now)...)
	}
	return append(args, p.Algorithm.String(), p.emissionInterval(), it.Cost, uid, old[0], old[1], old[2], wrote[0], wrote[1], wrote[2])
}

// bucketsRefundArgs is the refund script's ARGV for a bucketed window's
// item whose state before the charge was old (runBatch put its value in
// the uid's place): the value before, the sub-window charged, N, and the
// value the charge wrote, recomputed with algorithms.go.
func bucketsRefundArgs(it *Item, old string, now int64) []any {
	p := it.Policy
	lim := p.limits()
	h, c := parseBuckets(old, lim.N, lim.L)
	_, k := bucketsDecide(h, c, now, lim, it.Cost)
	if c == nil {
		c = make([]int64, lim.N+1)
	} else {
		shiftBuckets(c, k-h)
	}
	c[0] += it.Cost
	return []any{p.Algorithm.String(), p.emissionInterval(), it.Cost, old, k, lim.N, lim.L, formatBuckets(k, c, lim.L), 0, 0}
}

// slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (the text between the first '{' and the next '}', when not
// empty) or of the whole key, modulo 16384. It agrees with CLUSTER KEYSLOT.
func slot(key string) int {
	return int(crc16(keys.Tag(key)) & 16383)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
