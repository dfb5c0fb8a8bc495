package concurrency

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/lua"
)

// Store holds the in-flight sets. MemoryStore and RedisStore implement it
// with the same semantics:
//
//   - Acquire first reaps the entries of (scope, key) that started more than
//     ttl ago, then adds id with the current time when fewer than limit
//     entries remain. Acquiring an id that is already present admits it
//     without adding a second entry.
//   - Release removes id; releasing an id that is absent (released before,
//     or reaped) does nothing.
type Store interface {
	Acquire(ctx context.Context, scope, key, id string, limit int64, ttl time.Duration) (Result, error)
	Release(ctx context.Context, scope, key, id string) error
}

// Result is the outcome of Store.Acquire.
type Result struct {
	// Allowed reports whether id was admitted.
	Allowed bool
	// InFlight is the number of live entries after the call, the new one
	// included when allowed.
	InFlight int64
	// Wait is, when denied, the time until the oldest entry is reaped: the
	// longest a caller waits for a slot if no request ever releases. It is
	// at least 1 ms when denied and 0 when allowed.
	Wait time.Duration
}

// StoreOption configures a store.
type StoreOption func(*storeOptions)

type storeOptions struct {
	clock   func() time.Time
	prefix  string
	maxKeys int
}

// WithClock sets the clock. The memory store uses it instead of time.Now;
// the Redis store sends it to the script instead of the script reading
// Redis TIME (for tests, and for managed Redis that rejects TIME in
// scripts; every client of one Redis then needs synchronized clocks).
func WithClock(now func() time.Time) StoreOption {
	return func(o *storeOptions) { o.clock = now }
}

// WithPrefix sets the prefix of every Redis key (default "spillway:"). It
// must not contain '{' or '}'. The memory store ignores it.
func WithPrefix(prefix string) StoreOption { return func(o *storeOptions) { o.prefix = prefix } }

// WithMaxKeys sets how many keys the memory store holds before it sweeps
// every key for reaped entries (default 1<<16). Keys disappear when their
// last entry is released or reaped, so the store holds at most as many keys
// as there are requests in flight plus leaks younger than the TTL. The Redis
// store ignores it: its keys carry a TTL.
func WithMaxKeys(n int) StoreOption { return func(o *storeOptions) { o.maxKeys = n } }

func buildStoreOptions(opts []StoreOption) storeOptions {
	o := storeOptions{prefix: "spillway:", maxKeys: 1 << 16}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// RedisStore keeps each key's in-flight set in a Redis sorted set. One
// Acquire is one EVALSHA; one Release is one ZREM.
type RedisStore struct {
	client redis.UniversalClient
	o      storeOptions
}

// NewRedisStore returns a store on client (a single node, Sentinel or
// Cluster client). It fails when the prefix contains a brace.
func NewRedisStore(client redis.UniversalClient, opts ...StoreOption) (*RedisStore, error) {
	if client == nil {
		return nil, fmt.Errorf("concurrency: NewRedisStore: client is nil")
	}
	o := buildStoreOptions(opts)
	if err := keys.ValidatePrefix(o.prefix); err != nil {
		return nil, fmt.Errorf("concurrency: NewRedisStore: %w", err)
	}
	return &RedisStore{client: client, o: o}, nil
}

// Key returns the Redis key that holds the in-flight set of (scope, key).
func (s *RedisStore) Key(scope, key string) string {
	return keys.Key(s.o.prefix, "cc:"+scope, key)
}

// Acquire implements Store with one script call.
func (s *RedisStore) Acquire(ctx context.Context, scope, key, id string, limit int64, ttl time.Duration) (Result, error) {
	if err := checkAcquire(limit, ttl, id); err != nil {
		return Result{}, err
	}
	now := ""
	if s.o.clock != nil {
		now = strconv.FormatInt(s.o.clock().UnixMicro(), 10)
	}
	raw, err := lua.ConcurrencyAcquire.Run(ctx, s.client, []string{s.Key(scope, key)},
		limit, ttlMillis(ttl), id, now).Result()
	if err != nil {
		return Result{}, fmt.Errorf("concurrency: acquire: %w", err)
	}
	vals, ok := raw.([]any)
	if !ok || len(vals) != 3 {
		return Result{}, fmt.Errorf("concurrency: acquire: unexpected reply %v (want 3 integers)", raw)
	}
	var n [3]int64
	for i, v := range vals {
		x, ok := v.(int64)
		if !ok {
			return Result{}, fmt.Errorf("concurrency: acquire: reply element %d is %T, want integer", i, v)
		}
		n[i] = x
	}
	return Result{Allowed: n[0] == 1, InFlight: n[1], Wait: time.Duration(n[2]) * time.Millisecond}, nil
}

// Release implements Store with one ZREM.
func (s *RedisStore) Release(ctx context.Context, scope, key, id string) error {
	if err := s.client.ZRem(ctx, s.Key(scope, key), id).Err(); err != nil {
		return fmt.Errorf("concurrency: release: %w", err)
	}
	return nil
}

// ttlMillis rounds ttl up to whole milliseconds, at least 1.
func ttlMillis(ttl time.Duration) int64 {
	ms := int64((ttl + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return ms
}

func checkAcquire(limit int64, ttl time.Duration, id string) error {
	switch {
	case limit < 1:
		return fmt.Errorf("concurrency: acquire: limit %d must be at least 1", limit)
	case ttl <= 0:
		return fmt.Errorf("concurrency: acquire: ttl %v must be positive", ttl)
	case id == "":
		return fmt.Errorf("concurrency: acquire: id is empty")
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
}

// NewMemoryStore returns an empty memory store.
func NewMemoryStore(opts ...StoreOption) *MemoryStore {
	s := &MemoryStore{o: buildStoreOptions(opts), seed: maphash.MakeSeed()}
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

// Acquire implements Store.
func (s *MemoryStore) Acquire(_ context.Context, scope, key, id string, limit int64, ttl time.Duration) (Result, error) {
	if err := checkAcquire(limit, ttl, id); err != nil {
		return Result{}, err
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
			delete(set.m, m)
			continue
		}
		if !haveOldest || start < oldest {
			oldest, haveOldest = start, true
		}
	}
	n := int64(len(set.m))
	if n < limit {
		if _, dup := set.m[id]; !dup {
			set.m[id] = now
			n++
		}
		return Result{Allowed: true, InFlight: n}, nil
	}
	waitUS := oldest + ttlUS - now
	waitMS := (waitUS + 999) / 1000
	if waitMS < 1 {
		waitMS = 1
	}
	return Result{InFlight: n, Wait: time.Duration(waitMS) * time.Millisecond}, nil
}

// sweep drops the reaped entries of every key of the shard (each by its
// own TTL), and the keys left empty.
func (sh *memShard) sweep(now int64) {
	for k, set := range sh.sets {
		for m, start := range set.m {
			if start <= now-set.ttlUS {
				delete(set.m, m)
			}
		}
		if len(set.m) == 0 {
			delete(sh.sets, k)
		}
	}
}

// Release implements Store.
func (s *MemoryStore) Release(_ context.Context, scope, key, id string) error {
	k := memKey(scope, key)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if set, ok := sh.sets[k]; ok {
		delete(set.m, id)
		if len(set.m) == 0 {
			delete(sh.sets, k)
		}
	}
	return nil
}

// Len returns the number of keys the store holds (for tests and metrics).
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].sets)
		s.shards[i].mu.Unlock()
	}
	return n
}
