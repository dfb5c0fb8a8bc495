package bench

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"github.com/redis/go-redis/v9"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"
)

var (
	lifecycleGoroutines = flag.String("lgoroutines", "1,64", "BenchmarkRedisLifecycle: goroutine counts, comma-separated")
	lifecycleCommands   = flag.Bool("lcommands", false, "BenchmarkRedisLifecycle: log each turn's Redis commands per request (calls and µs, INFO commandstats)")
)

// The two configs of BenchmarkRedisLifecycle: a request count and a token
// count by API key, both charged at admission ("plain"), or the token
// count charged on the response ("response": held at admission, settled
// by done). The rates admit everything, on one key too (-keys 1, a hot
// key): the benchmark measures the check.
const (
	lifecyclePlain = `
limits:
  - id: calls
    by: api_key
    bucket: 1000000/second
  - id: tokens
    by: api_key
    bucket: 60000000/minute, burst 500000000
`
	lifecycleResponse = lifecyclePlain + `    cost: response
    estimate: 250
`
)

// BenchmarkRedisLifecycle compares, against one redis-server and in one
// run, a tiers request whose two rules are charged at admission ("plain":
// Admit, done) with one whose token rule is charged on the response
// ("response": Admit holds an estimate of 250, the work reports 200, done
// settles; the settle goes to the store's background path). For each
// goroutine count of -lgoroutines, turns of -slice requests alternate
// between the two, -rounds times. Per contender and goroutine count it
// reports:
//
//   - ns/req: the turn's wall time per request (Admit to done returned, all
//     goroutines together): the request path;
//   - server-µs/req: the server time of the script calls (INFO
//     commandstats, evalsha and eval) per request, read after the
//     turn's settles were flushed (ratelimit.RedisStore.Flush);
//   - server-cpu-µs/req: the server process's CPU time (INFO cpu,
//     used_cpu_user + used_cpu_sys) over the turn and its flush, per
//     request: what the scripts cost with the commands' reading and
//     replying, without the time a descheduled server spends inside a
//     script, which the script time counts;
//   - done-p99-µs: the 99th percentile of done's own duration;
//   - and the ratios response/plain of the first three.
//
// Run from this folder:
//
//	go test -run '^$' -bench Lifecycle -benchtime 1x -rounds 5 -slice 20000
func BenchmarkRedisLifecycle(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	store := mustRedisStore(c)
	ctx := context.Background()
	limiters := [2]*tiers.Limiter{}
	for i, yml := range []string{lifecyclePlain, lifecycleResponse} {
		cfg, err := tiers.Parse("bench.yaml", []byte(yml))
		if err != nil {
			b.Fatal(err)
		}
		if limiters[i], err = tiers.New(cfg, store, tiers.Settings{}); err != nil {
			b.Fatal(err)
		}
	}
	names := [2]string{"plain", "response"}
	reqs := make([]*spillway.Request, *numKeys)
	for i := range reqs {
		r := &spillway.Request{Method: "POST", Endpoint: "/v1/generate", Priority: spillway.Critical}
		r.Set(spillway.DimAPIKey, "key-"+strconv.Itoa(i))
		reqs[i] = r
	}
	var gs []int
	for _, f := range strings.Split(*lifecycleGoroutines, ",") {
		g, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || g < 1 {
			b.Fatalf("-lgoroutines %q", *lifecycleGoroutines)
		}
		gs = append(gs, g)
	}
	type tally struct {
		wall  time.Duration
		n     int
		usec  float64
		cpu   float64
		dones []time.Duration
	}
	results := map[string]*tally{}
	var next atomic.Int64
	// turn runs n requests of contender v over g goroutines.
	turn := func(v, g, n int) (time.Duration, []time.Duration) {
		l := limiters[v]
		var wg sync.WaitGroup
		dones := make([][]time.Duration, g)
		start := time.Now()
		for w := range g {
			wg.Go(func() {
				for j := w; j < n; j += g {
					i := int(next.Add(1)) % len(reqs)
					// each goroutine its own request value: Usage is per request
					r := *reqs[i]
					if v == 1 {
						r.Usage = new(spillway.Usage)
					}
					d, done, err := l.Admit(ctx, &r)
					if err != nil || !d.Allowed {
						b.Errorf("%s: %+v %v", names[v], d, err)
						return
					}
					if v == 1 {
						_ = r.Usage.Set(200)
					}
					t0 := time.Now()
					done(spillway.Success)
					dones[w] = append(dones[w], time.Since(t0))
				}
			})
		}
		wg.Wait()
		wall := time.Since(start)
		var all []time.Duration
		for _, d := range dones {
			all = append(all, d...)
		}
		return wall, all
	}
	for _, g := range gs { // warm up: scripts loaded, connections made
		for v := range limiters {
			turn(v, g, 1000)
		}
	}
	if err := rateHooks.Flush(ctx, store); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range *rounds {
		for _, g := range gs {
			for v := range limiters {
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				cpu0 := serverCPU(b, c)
				wall, dones := turn(v, g, *slice)
				if err := rateHooks.Flush(ctx, store); err != nil {
					b.Fatal(err)
				}
				cpu := serverCPU(b, c) - cpu0
				st := redistest.ReadCommandStats(b, c)
				k := fmt.Sprintf("%s/g%d", names[v], g)
				if *lifecycleCommands {
					logCommands(b, k, st, *slice)
				}
				t := results[k]
				if t == nil {
					t = &tally{}
					results[k] = t
				}
				t.wall += wall
				t.n += *slice
				t.usec += st["evalsha"].Usec + st["eval"].Usec
				t.cpu += cpu
				t.dones = append(t.dones, dones...)
			}
		}
	}
	b.StopTimer()
	for _, g := range gs {
		var perReq, perUsec, perCPU [2]float64
		for v, name := range names {
			t := results[fmt.Sprintf("%s/g%d", name, g)]
			perReq[v] = float64(t.wall.Nanoseconds()) / float64(t.n)
			perUsec[v] = t.usec / float64(t.n)
			perCPU[v] = t.cpu / float64(t.n)
			b.ReportMetric(perCPU[v], fmt.Sprintf("%s-g%d-server-cpu-µs/req", name, g))
			slices.Sort(t.dones)
			p99 := t.dones[len(t.dones)*99/100]
			b.ReportMetric(perReq[v], fmt.Sprintf("%s-g%d-ns/req", name, g))
			b.ReportMetric(perUsec[v], fmt.Sprintf("%s-g%d-server-µs/req", name, g))
			b.ReportMetric(float64(p99.Nanoseconds())/1e3, fmt.Sprintf("%s-g%d-done-p99-µs", name, g))
		}
		b.ReportMetric(perReq[1]/perReq[0], fmt.Sprintf("g%d-wall-response/plain", g))
		b.ReportMetric(perUsec[1]/perUsec[0], fmt.Sprintf("g%d-server-response/plain", g))
		b.ReportMetric(perCPU[1]/perCPU[0], fmt.Sprintf("g%d-server-cpu-response/plain", g))
	}
	if err := store.Close(ctx); err != nil {
		b.Fatal(err)
	}
}

// logCommands logs the commands of a turn of n requests, per request:
// calls and µs of each, the most expensive first.
func logCommands(b *testing.B, turn string, st map[string]redistest.CommandStat, n int) {
	names := make([]string, 0, len(st))
	for name := range st {
		if !strings.HasPrefix(name, "config") && !strings.HasPrefix(name, "info") {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(x, y string) int { return cmp.Compare(st[y].Usec, st[x].Usec) })
	var sb strings.Builder
	for _, name := range names {
		fmt.Fprintf(&sb, " %s %.2f/req %.2fµs/req;", name, st[name].Calls/float64(n), st[name].Usec/float64(n))
	}
	b.Logf("%s:%s", turn, sb.String())
}

// mustRedisStore is ratelimit.NewRedisStore for a client and settings that
// are valid.
func mustRedisStore(c redis.UniversalClient, set ...ratelimit.RedisSettings) *ratelimit.RedisStore {
	s, err := ratelimit.NewRedisStore(c, append(set, ratelimit.RedisSettings{})[0])
	if err != nil {
		panic(err)
	}
	return s
}
