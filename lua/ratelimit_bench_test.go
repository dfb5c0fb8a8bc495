package lua

import (
	"context"
	"flag"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

var liveKeys = flag.Bool("live", false, "BenchmarkBucketsScriptPerKey: 500 entities, whose keys are still there, instead of 10,000")

// bucketsFloor does what a bucket-family charge cannot do without: one
// MGET of the keys and one SET … PXAT per key, with no decision. Its time
// is the floor of RateLimitBuckets on the same keys.
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
// coalesced calls of tiers checks: RateLimitBuckets on calls of 31
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
			scripts := []*redis.Script{RateLimitBuckets, bucketsFloor}
			for _, s := range scripts {
				if err := s.Load(ctx, c).Err(); err != nil {
					b.Fatal(err)
				}
			}
			var usec [2]float64
			cmd := map[string][2]float64{} // name -> usec, calls (RateLimitBuckets' calls)
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
					stats := commandStats(b, c)
					usec[v] += stats["evalsha"][0]
					if v == 0 {
						for name, x := range stats {
							y := cmd[name]
							cmd[name] = [2]float64{y[0] + x[0], y[1] + x[1]}
						}
					}
				}
			}
			keys := float64(b.N * requests * perRequest)
			b.ReportMetric(usec[0]/keys, "script-µs/key")
			b.ReportMetric(usec[1]/keys, "floor-µs/key")
			b.ReportMetric(cmd["set"][0]/cmd["set"][1], "SET-µs")
			b.ReportMetric(cmd["mget"][0]/keys, "MGET-µs/key")
			if x := cmd["pexpiretime"]; x[1] > 0 {
				b.ReportMetric(x[0]/x[1], "PEXPIRETIME-µs")
			}
		})
	}
}

// commandStats reads INFO commandstats: command name -> {usec, calls}.
func commandStats(tb testing.TB, c *redis.Client) map[string][2]float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, line := range strings.Split(info, "\r\n") {
		name, fields, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var x [2]float64
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "usec":
				x[0], _ = strconv.ParseFloat(v, 64)
			case "calls":
				x[1], _ = strconv.ParseFloat(v, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = x
	}
	return out
}
