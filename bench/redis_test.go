// Package bench compares spillway's Redis rate limiter with its peers. It
// is a module of its own so that the library's users never inherit the
// peers as dependencies. Run from this folder:
//
//	go test -run '^$' -bench Decisions -benchtime 200000x
//	go test -run '^$' -bench MemoryPerKey -benchtime 1x
//
// Each benchmark starts its own redis-server on a free loopback port
// (internal/redistest) and stops it at the end.
package bench

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/lua"
	"github.com/spillway-go/spillway/ratelimit"
)

var (
	goroutines = flag.Int("goroutines", 64, "concurrent callers in BenchmarkRedisDecisions")
	numKeys    = flag.Int("keys", 10_000, "distinct keys in BenchmarkRedisDecisions")
	memKeys    = flag.Int("memkeys", 1_000_000, "keys written by BenchmarkRedisMemoryPerKey")
)

// reference is the HMGET/HMSET token-bucket script of issue 2.
const reference = `local d=redis.call("HMGET",KEYS[1],"tokens","ts") local c=tonumber(ARGV[1]) local r=tonumber(ARGV[2]) local now=tonumber(ARGV[3]) local t=tonumber(d[1]) or c local ts=tonumber(d[2]) or now t=math.min(c,t+math.max(0,now-ts)/1000*r) local a=0 if t>=1 then t=t-1 a=1 end redis.call("HMSET",KEYS[1],"tokens",t,"ts",now) redis.call("PEXPIRE",KEYS[1],math.ceil(c/r*1000)+1000) return {a,t}`

var referenceScript = redis.NewScript(reference)

// entity names the i-th key's entity, the same for every contender.
func entity(i int) string { return fmt.Sprintf("user:%07d", i) }

// decider is one contender: it decides one request for entity e.
type decider func(ctx context.Context, e string) (allowed bool, err error)

// The policy every contender applies: 1000 per second, burst 1000.
const (
	rate  = 1000
	burst = 1000
)

func contenders(b *testing.B, c *redis.Client) map[string]decider {
	lim, err := ratelimit.New(ratelimit.NewRedisStore(c), ratelimit.Policy{Limit: rate, Period: time.Second, Burst: burst}, ratelimit.WithScope("api"))
	if err != nil {
		b.Fatal(err)
	}
	rr := redis_rate.NewLimiter(c)
	rrLimit := redis_rate.Limit{Rate: rate, Burst: burst, Period: time.Second}
	return map[string]decider{
		"spillway": func(ctx context.Context, e string) (bool, error) {
			d, err := lim.Allow(ctx, e)
			return d.Allowed, err
		},
		"redis_rate": func(ctx context.Context, e string) (bool, error) {
			r, err := rr.Allow(ctx, e, rrLimit)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		},
		"reference_script": func(ctx context.Context, e string) (bool, error) {
			v, err := referenceScript.Run(ctx, c, []string{keys.Key("ref:", "api", e)}, burst, rate, time.Now().UnixMilli()).Slice()
			if err != nil {
				return false, err
			}
			a, _ := v[0].(int64)
			return a == 1, nil
		},
	}
}

// BenchmarkRedisDecisions: decisions per second and latency percentiles of
// -goroutines callers over -keys keys against one local redis-server, for
// spillway's RedisStore, go-redis/redis_rate v10 and the reference script,
// side by side. b.N is the total number of decisions.
func BenchmarkRedisDecisions(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = c.Close() })
	cs := contenders(b, c)
	for _, name := range []string{"spillway", "redis_rate", "reference_script"} {
		decide := cs[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			for i := 0; i < 1000; i++ { // warm up connections and scripts
				if _, err := decide(ctx, entity(i%*numKeys)); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([][]time.Duration, *goroutines)
			var next, allowed atomic.Int64
			var firstErr atomic.Value
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for g := range lat {
				lat[g] = make([]time.Duration, 0, b.N / *goroutines + 1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						e := entity(int(i*7919) % *numKeys)
						t := time.Now()
						ok, err := decide(ctx, e)
						lat[g] = append(lat[g], time.Since(t))
						if err != nil {
							firstErr.CompareAndSwap(nil, err)
							return
						}
						if ok {
							allowed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if err, _ := firstErr.Load().(error); err != nil {
				b.Fatal(err)
			}
			all := slices.Concat(lat...)
			slices.Sort(all)
			pct := func(p float64) float64 {
				return float64(all[int(p*float64(len(all)-1))].Microseconds())
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
			b.ReportMetric(pct(0.50), "p50-µs")
			b.ReportMetric(pct(0.99), "p99-µs")
			b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed")
		})
	}
}

// usedMemory reads used_memory from INFO memory.
func usedMemory(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}

// BenchmarkRedisMemoryPerKey: Redis memory per rate-limit key, as the
// used_memory delta over -memkeys keys written by each contender on a
// fresh redis-server. spillway's keys are keys.Key("spillway:", "api",
// "user:NNNNNNN") (27 bytes), or 13-byte keys "rl:{uNNNNNNN}" (Redis
// 7.0 allocates a key of up to 14 bytes in a 16-byte class, 15 to 30 bytes
// in a 32-byte one), written by its token-bucket script in pipelines of
// 1000; the reference script's are "ref:api:{user:NNNNNNN}"; redis_rate
// adds its own "rate:" prefix to the entity and, having no pipeline API, is
// driven by -goroutines callers.
func BenchmarkRedisMemoryPerKey(b *testing.B) {
	for _, name := range []string{"spillway_token_bucket", "spillway_token_bucket_14B_keys", "reference_script", "redis_rate"} {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				srv := redistest.Start(b)
				c := redis.NewClient(&redis.Options{Addr: srv.Addr})
				ctx := context.Background()
				n := *memKeys
				before := usedMemory(b, c)
				now := time.Now()
				nowUS := strconv.FormatInt(now.UnixMicro(), 10)
				// 1 per hour: no key expires during the run
				const T = 3_600_000_000
				switch name {
				case "spillway_token_bucket", "spillway_token_bucket_14B_keys", "reference_script":
					script := lua.RateLimitTokenBucket
					if name == "reference_script" {
						script = referenceScript
					}
					if err := script.Load(ctx, c).Err(); err != nil {
						b.Fatal(err)
					}
					for i := 0; i < n; i += 1000 {
						pipe := c.Pipeline()
						for j := i; j < min(i+1000, n); j++ {
							switch name {
							case "reference_script":
								// capacity 1000, 1 token per 1000 s: TTL 10^6 s
								script.EvalSha(ctx, pipe, []string{keys.Key("ref:", "api", entity(j))}, 1000, 0.001, now.UnixMilli())
							case "spillway_token_bucket":
								script.EvalSha(ctx, pipe, []string{keys.Key("spillway:", "api", entity(j))}, nowUS, T, 1000*T, 1)
							default: // "rl:{u0000001}": WithPrefix(""), scope "rl", a 8-byte entity
								script.EvalSha(ctx, pipe, []string{keys.Key("", "rl", fmt.Sprintf("u%07d", j))}, nowUS, T, 1000*T, 1)
							}
						}
						if _, err := pipe.Exec(ctx); err != nil {
							b.Fatal(err)
						}
					}
				case "redis_rate":
					rr := redis_rate.NewLimiter(c)
					lim := redis_rate.Limit{Rate: 1, Burst: 1000, Period: time.Hour}
					var next atomic.Int64
					var wg sync.WaitGroup
					for range *goroutines {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for {
								i := next.Add(1) - 1
								if i >= int64(n) {
									return
								}
								if _, err := rr.Allow(ctx, entity(int(i)), lim); err != nil {
									b.Error(err)
									return
								}
							}
						}()
					}
					wg.Wait()
				}
				if got := c.DBSize(ctx).Val(); got != int64(n) {
					b.Fatalf("DBSIZE = %d, want %d", got, n)
				}
				after := usedMemory(b, c)
				b.ReportMetric(float64(after-before)/float64(n), "bytes/key")
				_ = c.Close()
				srv.Stop()
			}
		})
	}
}
