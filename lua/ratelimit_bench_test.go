package lua

import (
	"context"
	"flag"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

var liveKeys = flag.Bool("live", false, "BenchmarkBucketsScriptPerKey: 500 entities, whose keys are still there, instead of 10,000")

// bucketsFloor does what a bucket-family charge cannot do without: one
// MGET of the keys and one SET … PXAT per key, with no decision. Its time
// is the floor of rateLimitBuckets on the same keys.
var bucketsFloor = redis.NewScript(`local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
redis.call('MGET', unpack(KEYS))
local reply = {now}
for i = 1, #KEYS do
  local tat = now + 10000
  local e = math.floor((tat + 999) / 1000)
  redis.call('SET', KEYS[i], e * 1000 - tat, 'PXAT', e)
  reply[i + 1] = 0
end
return reply`)

// BenchmarkBucketsScriptPerKey measures where Redis spends its time on the
// coalesced calls of tiers checks: rateLimitBuckets on calls of 31
// requests (what 64 goroutines coalesce into one call) of one key each and
// of three keys each (ip, user, api_key), the policy of bench/ (GCRA
// 100/s, burst 100) on 10,000 entities (so a key has expired since its
// last use, as in bench/), against bucketsFloor on the same calls, in
// alternating calls, from INFO commandstats (CONFIG RESETSTAT before each
// call). It reports the script µs per key of each, and the µs the
// commands themselves take inside the scripts: SET and PEXPIRETIME per
// call, MGET per key. b.N is the number of calls per variant.
//
//	go test -run '^$' -bench BucketsScriptPerKey -benchtime 3000x ./lua/
//
// -live runs it on 500 entities instead, whose keys are still there.
func BenchmarkBucketsScriptPerKey(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	const (
		requests = 31
		T, tau   = 10_000, 1_000_000 // 100/s, burst 100
	)
	entities := 10_000
	if *liveKeys {
		entities = 500
	}
	for _, perRequest := range []int{1, 3} {
		b.Run(strconv.Itoa(perRequest)+"_keys_per_request", func(b *testing.B) {
			scripts := []*redis.Script{rateLimitBuckets, bucketsFloor}
			for _, s := range scripts {
				if err := s.Load(ctx, c).Err(); err != nil {
					b.Fatal(err)
				}
			}
			var usec [2]float64
			cmd := map[string]redistest.CommandStat{} // rateLimitBuckets' calls
			for i := range b.N {
				for v, s := range scripts {
					keys := make([]string, 0, requests*perRequest)
					args := []any{"", 1, T, tau, requests}
					for range requests {
						args = append(args, perRequest)
					}
					for r := range requests {
						e := strconv.Itoa((i*requests + r) * 7919 % entities)
						for _, dim := range []string{"user", "ip", "api_key"}[:perRequest] {
							// one key space per variant: each sees the keys as it left them
							keys = append(keys, "spillway:"+strconv.Itoa(v)+dim+"@digest;{"+dim+"="+e+"}")
							args = append(args, 1)
						}
					}
					if err := c.ConfigResetStat(ctx).Err(); err != nil {
						b.Fatal(err)
					}
					if err := s.Run(ctx, c, keys, args...).Err(); err != nil {
						b.Fatal(err)
					}
					stats := redistest.ReadCommandStats(b, c)
					usec[v] += stats["evalsha"].Usec
					if v == 0 {
						for name, x := range stats {
							y := cmd[name]
							cmd[name] = redistest.CommandStat{Calls: y.Calls + x.Calls, Usec: y.Usec + x.Usec}
						}
					}
				}
			}
			keys := float64(b.N * requests * perRequest)
			b.ReportMetric(usec[0]/keys, "script-µs/key")
			b.ReportMetric(usec[1]/keys, "floor-µs/key")
			b.ReportMetric(cmd["set"].Usec/cmd["set"].Calls, "SET-µs")
			b.ReportMetric(cmd["mget"].Usec/keys, "MGET-µs/key")
			if x := cmd["pexpiretime"]; x.Calls > 0 {
				b.ReportMetric(x.Usec/x.Calls, "PEXPIRETIME-µs")
			}
		})
	}
}

// BenchmarkFixedScriptPerKey compares, on the same coalesced calls, the
// batch script and the lean fixed-window script deciding fixed windows:
// calls of 31 requests of one key each and of three keys each (user, ip,
// api_key), 100 per second each, on 10,000 entities, in alternating calls,
// each script on its own key space. It reports each script's µs per key
// from INFO commandstats (CONFIG RESETSTAT before each call) and Redis's
// CPU (INFO cpu, user+sys) per key over all the calls of both (the
// commands' parsing and replies included). b.N is the number of calls
// per script.
//
//	go test -run '^$' -bench FixedScriptPerKey -benchtime 3000x ./lua/
func BenchmarkFixedScriptPerKey(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	const (
		requests = 31
		L, P     = 100, 1_000_000 // 100 per second
		entities = 10_000
	)
	for _, perRequest := range []int{1, 3} {
		b.Run(strconv.Itoa(perRequest)+"_keys_per_request", func(b *testing.B) {
			scripts := []*redis.Script{rateLimitBatch, rateLimitFixed}
			for _, s := range scripts {
				if err := s.Load(ctx, c).Err(); err != nil {
					b.Fatal(err)
				}
			}
			var usec [2]float64
			for i := range b.N {
				for v, s := range scripts {
					keys := make([]string, 0, requests*perRequest)
					args := []any{""}
					if v == 0 {
						args = append(args, requests)
					} else {
						args = append(args, 1, L, P, requests)
					}
					for range requests {
						args = append(args, perRequest)
					}
					for r := range requests {
						e := strconv.Itoa((i*requests + r) * 7919 % entities)
						for _, dim := range []string{"user", "ip", "api_key"}[:perRequest] {
							keys = append(keys, "spillway:"+strconv.Itoa(v)+dim+":{"+dim+"="+e+"}:fw")
							if v == 0 {
								args = append(args, "fixed_window", L, P, 1, P/L, 1, "")
							} else {
								args = append(args, 1)
							}
						}
					}
					if err := c.ConfigResetStat(ctx).Err(); err != nil {
						b.Fatal(err)
					}
					if err := s.Run(ctx, c, keys, args...).Err(); err != nil {
						b.Fatal(err)
					}
					usec[v] += redistest.ReadCommandStats(b, c)["evalsha"].Usec
				}
			}
			keys := float64(b.N * requests * perRequest)
			b.ReportMetric(usec[0]/keys, "batch-µs/key")
			b.ReportMetric(usec[1]/keys, "fixed-µs/key")
		})
	}
}
