package concurrency

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/lua"
)

// Store holds the in-flight sets: a *MemoryStore or a *RedisStore (the
// interface is sealed). Both implement the same semantics, counted in
// units: a request of cost c holds c units of the limit.
//
//   - acquire first reaps the entries of (scope, key) that started more
//     than ttl ago, then adds id, holding cost units, with the current time
//     when the units in flight plus cost are at most limit. Acquiring an id
//     that is already present admits it without adding anything.
//   - release removes id and frees its units; releasing an id that is
//     absent (released before, or reaped) does nothing. cost must be the
//     cost id was acquired with (RedisStore removes that many members).
//
// ids must be non-empty and must not contain '#'; cost must be in
// [1, limit]. Bad arguments are an error, not a denial.
type Store interface {
	acquire(ctx context.Context, scope, key, id string, cost, limit int64, ttl time.Duration) (result, error)
	release(ctx context.Context, scope, key, id string, cost int64) error
}

// result is the outcome of Store.acquire.
type result struct {
	// Allowed reports whether id was admitted.
	Allowed bool
	// InFlight is the number of units in flight after the call, the new
	// request's included when allowed.
	InFlight int64
	// Wait is, when denied, the time until enough of the oldest entries are
	// reaped for the request to fit: the longest a caller waits if no
	// request ever releases. It is at least 1 ms when denied and 0 when
	// allowed.
	Wait time.Duration
}

// MemorySettings configures a MemoryStore (NewMemoryStore). The zero
// value is the default.
type MemorySettings struct {
	// Clock replaces time.Now (for tests).
	Clock func() time.Time
	// MaxKeys is how many keys the store holds before it sweeps every key
	// for reaped entries (≤ 0: 1<<16). Keys disappear when their last
	// entry is released or reaped, so the store holds at most as many keys
	// as there are requests in flight plus leaks younger than the TTL.
	MaxKeys int
}

// RedisSettings configures a RedisStore (NewRedisStore). The zero value
// is the default.
type RedisSettings struct {
	// Clock, when set, is sent to the script instead of the script
	// reading Redis TIME (for tests, and for managed Redis that rejects
	// TIME in scripts; every client of one Redis then needs synchronized
	// clocks).
	Clock func() time.Time
	// Prefix is the prefix of every Redis key ("": "spillway:"). It must
	// not contain '{' or '}'.
	Prefix string
}

type storeOptions struct {
	clock   func() time.Time
	prefix  string
	maxKeys int
}

// RedisStore keeps each key's in-flight set in a Redis sorted set, one
// member per unit: a request of cost c is c members (its id, then id#1 …
// id#(c-1)) with one score, its start time. One Acquire is one EVALSHA;
// one Release is one ZREM of the request's members.
type RedisStore struct {
	client redis.UniversalClient
	o      storeOptions
}

// NewRedisStore returns a store on client (a single node, Sentinel or
// Cluster client). It fails when the prefix contains a brace.
func NewRedisStore(client redis.UniversalClient, s RedisSettings) (*RedisStore, error) {
	if client == nil {
		return nil, fmt.Errorf("concurrency: NewRedisStore: client is nil")
	}
	o := storeOptions{clock: s.Clock, prefix: s.Prefix}
	if o.prefix == "" {
		o.prefix = "spillway:"
	}
	if err := keys.ValidatePrefix(o.prefix); err != nil {
		return nil, fmt.Errorf("concurrency: NewRedisStore: %w", err)
	}
	return &RedisStore{client: client, o: o}, nil
}

// key returns the Redis key that holds the in-flight set of (scope, key).
func (s *RedisStore) key(scope, key string) string {
	return keys.Concurrency(s.o.prefix, scope, key)
}

// MaxRedisLimit is the largest limit a RedisStore accepts: it keeps one
// sorted-set member per unit in flight, so a limit (and a cost under it)
// of 2^20 is already a million members on one key, and a larger one would
// let a single request stall Redis adding members (and a release allocate
// one string per unit). New refuses a larger limit over a RedisStore.
const MaxRedisLimit = 1 << 20

// acquire implements Store with one script call.
func (s *RedisStore) acquire(ctx context.Context, scope, key, id string, cost, limit int64, ttl time.Duration) (result, error) {
	if err := checkAcquire(cost, limit, ttl, id); err != nil {
		return result{}, err
	}
	if limit > MaxRedisLimit {
		return result{}, fmt.Errorf("concurrency: acquire: limit %d exceeds the Redis store's %d (one member per unit)", limit, MaxRedisLimit)
	}
	now := ""
	if s.o.clock != nil {
		now = strconv.FormatInt(s.o.clock().UnixMicro(), 10)
	}
	raw, err := lua.Script("concurrency_acquire").Run(ctx, s.client, []string{s.key(scope, key)},
		limit, ttlMillis(ttl), id, now, cost).Result()
	if err != nil {
		return result{}, fmt.Errorf("concurrency: acquire: %w", err)
	}
	vals, ok := raw.([]any)
	if !ok || len(vals) != 3 {
		return result{}, fmt.Errorf("concurrency: acquire: unexpected reply %v (want 3 integers)", raw)
	}
	var n [3]int64
	for i, v := range vals {
		x, ok := v.(int64)
		if !ok {
			return result{}, fmt.Errorf("concurrency: acquire: reply element %d is %T, want integer", i, v)
		}
		n[i] = x
	}
	return result{Allowed: n[0] == 1, InFlight: n[1], Wait: time.Duration(n[2]) * time.Millisecond}, nil
}

// release implements Store with one ZREM of the request's cost members.
func (s *RedisStore) release(ctx context.Context, scope, key, id string, cost int64) error {
	if err := checkRelease(id, cost); err != nil {
		return err
	}
	if cost > MaxRedisLimit {
		return fmt.Errorf("concurrency: release: cost %d exceeds MaxRedisLimit %d: no request can hold it", cost, MaxRedisLimit)
	}
	var err error
	if cost == 1 {
		err = s.client.ZRem(ctx, s.key(scope, key), id).Err()
	} else {
		members := make([]any, cost)
		members[0] = id
		for u := int64(1); u < cost; u++ {
			members[u] = unitMember(id, u)
		}
		err = s.client.ZRem(ctx, s.key(scope, key), members...).Err()
	}
	if err != nil {
		return fmt.Errorf("concurrency: release: %w", err)
	}
	return nil
}

// unitMember is the member of unit u >= 1 of request id, as the script
// names it.
func unitMember(id string, u int64) string { return id + "#" + strconv.FormatInt(u, 10) }

// ttlMillis rounds ttl up to whole milliseconds, at least 1.
func ttlMillis(ttl time.Duration) int64 {
	ms := int64((ttl + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return ms
}

func checkAcquire(cost, limit int64, ttl time.Duration, id string) error {
	switch {
	case limit < 1:
		return fmt.Errorf("concurrency: acquire: limit %d must be at least 1", limit)
	case cost < 1 || cost > limit:
		return fmt.Errorf("concurrency: acquire: cost %d must be in [1, limit %d]", cost, limit)
	case ttl <= 0:
		return fmt.Errorf("concurrency: acquire: ttl %v must be positive", ttl)
	}
	return checkID("acquire", id)
}

func checkRelease(id string, cost int64) error {
	if cost < 1 {
		return fmt.Errorf("concurrency: release: cost %d must be at least 1", cost)
	}
	return checkID("release", id)
}

// checkID rejects the ids that could name another request's unit member.
func checkID(op, id string) error {
	switch {
	case id == "":
		return fmt.Errorf("concurrency: %s: id is empty", op)
	case strings.IndexByte(id, '#') >= 0:
		return fmt.Errorf("concurrency: %s: id %q contains '#'", op, id)
	}
	return nil
}

// MemoryStore keeps the in-flight sets in process memory, with the same
// semantics as RedisStore (times in whole microseconds, the TTL rounded up
// to whole milliseconds, as the script does).
type MemoryStore struct {
	o      storeOptions
	seed   maphash.Seed
	shards [32]memShard
}

type memShard struct {
	mu   sync.Mutex
	sets map[string]*memSet
}

type memSet struct {
	ttlUS int64            // the TTL of the last Acquire, for sweeps
	m     map[string]int64 // id -> start µs
	// costs holds the cost of the ids in m that cost more than 1; nil
	// until one does, so that cost 1 allocates no more than it did before
	// costs existed.
	costs map[string]int64
}

func (set *memSet) costOf(id string) int64 {
	if c, ok := set.costs[id]; ok {
		return c
	}
	return 1
}

// remove drops id and frees its units.
func (set *memSet) remove(id string) {
	delete(set.m, id)
	delete(set.costs, id)
}

// NewMemoryStore returns an empty memory store.
func NewMemoryStore(ms MemorySettings) *MemoryStore {
	s := &MemoryStore{o: storeOptions{clock: ms.Clock, maxKeys: ms.MaxKeys}, seed: maphash.MakeSeed()}
	if s.o.maxKeys <= 0 {
		s.o.maxKeys = 1 << 16
	}
	if s.o.clock == nil {
		s.o.clock = time.Now
	}
	for i := range s.shards {
		s.shards[i].sets = make(map[string]*memSet)
	}
	return s
}

func (s *MemoryStore) shard(k string) *memShard {
	return &s.shards[maphash.String(s.seed, k)%uint64(len(s.shards))]
}

func memKey(scope, key string) string { return scope + "\x00" + key }

// acquire implements Store.
func (s *MemoryStore) acquire(_ context.Context, scope, key, id string, cost, limit int64, ttl time.Duration) (result, error) {
	if err := checkAcquire(cost, limit, ttl, id); err != nil {
		return result{}, err
	}
	now := s.o.clock().UnixMicro()
	ttlUS := ttlMillis(ttl) * 1000
	k := memKey(scope, key)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	set := sh.sets[k]
	if set == nil {
		if len(sh.sets) >= s.o.maxKeys/len(s.shards)+1 {
			sh.sweep(now)
		}
		set = &memSet{m: make(map[string]int64, 4)}
		sh.sets[k] = set
	}
	set.ttlUS = ttlUS
	oldest, haveOldest := int64(0), false
	for m, start := range set.m {
		if start <= now-ttlUS {
			set.remove(m)
			continue
		}
		if !haveOldest || start < oldest {
			oldest, haveOldest = start, true
		}
	}
	// The units in flight: one per id, plus the extra of the costly ones
	// (none for a key that only ever saw cost 1).
	n := int64(len(set.m))
	for _, c := range set.costs {
		n += c - 1
	}
	if n+cost <= limit {
		if _, dup := set.m[id]; !dup {
			set.m[id] = now
			if cost > 1 {
				if set.costs == nil {
					set.costs = make(map[string]int64)
				}
				set.costs[id] = cost
			}
			n += cost
		}
		return result{Allowed: true, InFlight: n}, nil
	}
	// n + cost - limit units must be reaped, the oldest first: the wait is
	// until the request that holds the last of them is, as the script's
	// ZRANGE at that rank.
	if need := n + cost - limit; need > 1 {
		oldest = set.startOfUnit(need)
	}
	waitUS := oldest + ttlUS - now
	waitMS := (waitUS + 999) / 1000
	if waitMS < 1 {
		waitMS = 1
	}
	return result{InFlight: n, Wait: time.Duration(waitMS) * time.Millisecond}, nil
}

// startOfUnit returns the start of the entry that holds the need-th
// oldest unit (need >= 1, at most the units in the set).
func (set *memSet) startOfUnit(need int64) int64 {
	type entry struct{ start, cost int64 }
	es := make([]entry, 0, len(set.m))
	for id, start := range set.m {
		es = append(es, entry{start, set.costOf(id)})
	}
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(a.start, b.start) })
	for _, e := range es {
		if need -= e.cost; need <= 0 {
			return e.start
		}
	}
	return es[len(es)-1].start // unreachable: need <= units
}

// sweep drops the reaped entries of every key of the shard (each by its
// own TTL), and the keys left empty.
func (sh *memShard) sweep(now int64) {
	for k, set := range sh.sets {
		for m, start := range set.m {
			if start <= now-set.ttlUS {
				set.remove(m)
			}
		}
		if len(set.m) == 0 {
			delete(sh.sets, k)
		}
	}
}

// release implements Store. It frees the cost id was acquired with.
func (s *MemoryStore) release(_ context.Context, scope, key, id string, cost int64) error {
	if err := checkRelease(id, cost); err != nil {
		return err
	}
	k := memKey(scope, key)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if set, ok := sh.sets[k]; ok {
		if _, ok := set.m[id]; ok {
			set.remove(id)
		}
		if len(set.m) == 0 {
			delete(sh.sets, k)
		}
	}
	return nil
}

// size returns the number of keys the store holds (for tests).
func (s *MemoryStore) size() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].sets)
		s.shards[i].mu.Unlock()
	}
	return n
}
