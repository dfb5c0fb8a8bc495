// Package bench compares spillway's Redis rate limiter with its peers. It
// is a module of its own so that the library's users never inherit the
// peers as dependencies. Run from this folder:
//
//	go test -run '^$' -bench Decisions -benchtime 100000x -rounds 3
//	go test -run '^$' -bench Decisions -benchtime 20000x -rounds 3 -goroutines 1
//	go test -run '^$' -bench Decisions -benchtime 40000x -rounds 3 -rate 10000 -only tiers_one_rule,tiers_three_rules
//	go test -run '^$' -bench MemoryPerKey -benchtime 1x
//
// Each benchmark starts its own redis-server on a free loopback port
// (internal/redistest) and stops it at the end.
package bench

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/fallbackview"
	"github.com/spillway-go/spillway/internal/genmd"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"
)

var (
	goroutines = flag.Int("goroutines", 64, "concurrent callers in BenchmarkRedisDecisions")
	numKeys    = flag.Int("keys", 10_000, "distinct keys in BenchmarkRedisDecisions")
	memKeys    = flag.Int("memkeys", 100_000, "keys written by BenchmarkRedisMemoryPerKey")
	pool       = flag.Int("pool", 64, "go-redis pool size")
	rounds     = flag.Int("rounds", 3, "rounds of BenchmarkRedisDecisions, each running every contender in turn")
	slice      = flag.Int("slice", 2000, "decisions per turn of a contender in BenchmarkRedisDecisions")
	only       = flag.String("only", "", "comma-separated contenders of BenchmarkRedisDecisions (default: all)")
	coalesce   = flag.Int("coalesce", ratelimit.DefaultCoalescing, "calls in flight before spillway coalesces (ratelimit.RedisSettings.Coalescing; 0: off)")
	md         = flag.String("md", "", "BenchmarkRedisDecisions: write every round's table and the medians as markdown to this file (relative to bench/, e.g. ../docs/figures/peers.md), with a header naming the command, date, commit and load average")
	rate       = flag.Float64("rate", 0, "BenchmarkRedisDecisions: decisions per second offered by all callers together (open loop; a decision started late counts from its scheduled start); 0: each caller starts its next decision when the last one ends (closed loop)")
)

// entity names the i-th key's entity, the same for every contender:
// "user:12345" for i = 12345.
func entity(i int) string { return "user:" + strconv.Itoa(i) }

// The policy every contender applies: GCRA, -limit per second, burst
// -limit (redis_rate.PerSecond(-limit)); 100 by default. Over 10k keys
// nothing is then denied at the rates of this machine: the benchmarks
// measure the check. With few -keys, a -limit high enough to admit
// everything makes hot keys that several requests of one call share.
var limit = flag.Int("limit", 100, "BenchmarkRedisDecisions: the policy's limit per second (and burst) of every contender")

// decider is one contender: it decides the i-th request.
type decider func(ctx context.Context, i int) (allowed bool, err error)

// rules returns the tiers config of the given dimensions, one rule per
// dimension at -limit per second: oneRule limits by user, threeRules by
// ip, user and api_key.
func rules(dims ...string) string {
	var sb strings.Builder
	sb.WriteString("limits:\n")
	for _, d := range dims {
		id := d
		if d == "api_key" {
			id = "key"
		}
		fmt.Fprintf(&sb, "  - id: %s\n    by: %s\n    bucket: %d/second\n", id, d, *limit)
	}
	return sb.String()
}

// requests are the requests of the tiers contenders, one per key, made
// before the run.
func requests(n int) []*spillway.Request {
	rs := make([]*spillway.Request, n)
	for i := range rs {
		rs[i] = &spillway.Request{Endpoint: "/api", Method: "GET", Dims: []spillway.Dimension{
			{Name: spillway.DimIP, Value: "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)},
			{Name: spillway.DimUser, Value: entity(i)},
			{Name: "api_key", Value: "key-" + strconv.Itoa(i)},
		}}
	}
	return rs
}

// contenders lists the contenders in the order they run.
var contenders = []string{
	"redis_rate", "spillway", "spillway_no_coalescing", "spillway_fallback",
	"tiers_one_rule", "tiers_three_rules", "redis_rate_x3",
}

// newContenders returns the contenders, and the fallback.Store of
// spillway_fallback (its Stats tell whether any decision was local).
func newContenders(b *testing.B, c *redis.Client) (map[string]decider, *fallback.Store) {
	p := ratelimit.Policy{Algorithm: ratelimit.GCRA, Limit: int64(*limit), Period: time.Second}
	limiter := func(s ratelimit.Store) *ratelimit.Limiter {
		l, err := ratelimit.New(s, p, ratelimit.Settings{}) // the default scope
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	allow := func(l *ratelimit.Limiter) decider {
		return func(ctx context.Context, i int) (bool, error) {
			d, err := l.Allow(ctx, entity(i), 1)
			return d.Allowed, err
		}
	}
	// Each store writes keys of its own ("spillwa0:…", "spillwa1:…", as
	// long as the default "spillway:"): a contender that wrote the same
	// keys a slice earlier would otherwise leave the next one keys that
	// have not expired yet, which cost Redis more than absent ones.
	space := 0
	// coalescing n: ≤ 0 turns coalescing off (-coalesce 0).
	coalescing := func(n int) int {
		if n <= 0 {
			return -1
		}
		return n
	}
	store := func(n ...int) *ratelimit.RedisStore {
		space++
		return mustRedisStore(c, ratelimit.RedisSettings{Coalescing: coalescing(append(n, *coalesce)[0]), Prefix: "spillwa" + strconv.Itoa(space%10) + ":"})
	}
	fb, err := fallback.NewStore(store(), fallback.Settings{})
	if err != nil {
		b.Fatal(err)
	}
	rs := requests(*numKeys)
	admit := func(yaml string) decider {
		cfg, err := tiers.Parse("bench.yaml", []byte(yaml))
		if err != nil {
			b.Fatal(err)
		}
		l, err := tiers.New(cfg, store(), tiers.Settings{})
		if err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context, i int) (bool, error) {
			d, done, err := l.Admit(ctx, rs[i])
			if done != nil {
				done(spillway.Success)
			}
			return d.Allowed, err
		}
	}
	rr := redis_rate.NewLimiter(c)
	rrLimit := redis_rate.PerSecond(*limit)
	return map[string]decider{
		"redis_rate": func(ctx context.Context, i int) (bool, error) {
			r, err := rr.Allow(ctx, entity(i), rrLimit)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		},
		"redis_rate_x3": func(ctx context.Context, i int) (bool, error) {
			ok := true
			for _, k := range []string{"ip:", "user-", "key:"} { // not redis_rate's keys
				r, err := rr.Allow(ctx, k+strconv.Itoa(i), rrLimit)
				if err != nil {
					return false, err
				}
				ok = ok && r.Allowed > 0
			}
			return ok, nil
		},
		"spillway":               allow(limiter(store())),
		"spillway_no_coalescing": allow(limiter(store(0))),
		// for -only: other numbers of calls in flight before coalescing
		"spillway_coalesce1": allow(limiter(store(1))),
		"spillway_coalesce2": allow(limiter(store(2))),
		"spillway_coalesce4": allow(limiter(store(4))),
		"spillway_coalesce8": allow(limiter(store(8))),
		"spillway_fallback":  allow(limiter(fb)),
		"tiers_one_rule":     admit(rules("user")),
		"tiers_three_rules":  admit(rules("ip", "user", "api_key")),
		// the windows, for -only: -limit per second
		"window_counter":              allow(window(b, store(), ratelimit.SlidingWindowCounter, 0, 0)),
		"window_buckets":              allow(window(b, store(), ratelimit.SlidingWindowBuckets, 0, ratelimit.Interpolated)),
		"window_buckets_conservative": allow(window(b, store(), ratelimit.SlidingWindowBuckets, 0, ratelimit.Conservative)),
		"window_buckets_50":           allow(window(b, store(), ratelimit.SlidingWindowBuckets, 50, ratelimit.Interpolated)),
		"window_log":                  allow(window(b, store(), ratelimit.SlidingWindowLog, 0, 0)),
	}, fb
}

// window returns a limiter of algorithm a (with its buckets and mode) at
// -limit per second, with the default scope.
func window(b *testing.B, s ratelimit.Store, a ratelimit.Algorithm, buckets int64, mode ratelimit.WindowMode) *ratelimit.Limiter {
	l, err := ratelimit.New(s, ratelimit.Policy{Algorithm: a, Limit: int64(*limit), Period: time.Second, Buckets: buckets, Mode: mode}, ratelimit.Settings{})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// result is one contender's run.
type result struct {
	n             int     // decisions
	dps, p50, p99 float64 // decisions/s, µs
	trim          float64 // mean µs of the decisions up to the p99: steadier than 1/dps on a busy host
	usec, calls   float64 // Redis script µs per decision, decisions per script call
	cpu           float64 // redis-server process CPU µs per decision
	allowed       float64 // the fraction allowed
}

// BenchmarkRedisDecisions: decisions per second and latency percentiles of
// -goroutines callers over -keys keys against one local redis-server, for
// go-redis/redis_rate v10 and spillway (plain, without coalescing, behind
// fallback.Store, and through tiers with one and three rules), side by
// side, then the ratios. b.N is the number of decisions per contender and
// round. Redis CPU per decision comes from INFO commandstats (CONFIG
// RESETSTAT before each slice): the usec of the script calls over the
// decisions (the commands a script runs are inside its usec); and from
// INFO cpu, the server process's user+sys CPU over the decisions, which
// adds reading, parsing and replying.
//
// The contenders take turns in slices of -slice decisions (all
// -goroutines callers on one contender, then the next; each slice begins
// one contender further along the list), so that a load
// that changes during the run — a shared machine — weighs on all of them
// alike. -rounds repeats the whole (use it rather than -count); each round
// prints its table and ratios, and the end the median of every ratio.
// -only runs a comma-separated subset of the contenders. -rate offers the
// decisions at a fixed rate instead (open loop): every contender then
// shows the latency of a check at that load rather than its capacity.
func BenchmarkRedisDecisions(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: *pool})
	b.Cleanup(func() { _ = c.Close() })
	cs, fb := newContenders(b, c)
	names := contenders
	if *only != "" {
		names = strings.Split(*only, ",")
	}
	ctx := context.Background()
	for _, name := range names {
		if cs[name] == nil {
			b.Fatalf("no contender %q", name)
		}
		for i := range 1000 { // warm up connections and scripts
			if _, err := cs[name](ctx, i%*numKeys); err != nil {
				b.Fatal(err)
			}
		}
	}
	if b.N == 1 {
		return // the probe run of -benchtime Nx: nothing to measure
	}
	var all []map[string]result
	load := genmd.LoadAvg()
	b.ResetTimer()
	for range *rounds {
		acc := map[string]*tally{}
		for _, name := range names {
			acc[name] = &tally{}
		}
		for k, done := 0, 0; done < b.N; k, done = k+1, done+*slice {
			n := min(*slice, b.N-done)
			// each slice starts with the next contender, so that none
			// always follows the same neighbour (its garbage, its keys)
			for j := range names {
				name := names[(k+j)%len(names)]
				runSlice(b, c, cs[name], done, n, acc[name])
			}
		}
		res := map[string]result{}
		for _, name := range names {
			res[name] = acc[name].result()
		}
		all = append(all, res)
		fmt.Print(table(names, res))
	}
	fmt.Print(medians(all))
	// A decision the fallback made locally (the budget ran out on a
	// loaded machine) would flatter its figure: say how many there were.
	degraded, overloaded := fallbackview.StoreDegraded(fb)
	local := fmt.Sprintf("%d degraded (%d overloaded)", degraded, overloaded)
	fmt.Printf("spillway_fallback: %s\n", local)
	if *md != "" {
		if err := genmd.Write(*md, benchCommand(), load, markdown(names, all, local)); err != nil {
			b.Fatalf("-md: %v", err)
		}
	}
	if r := all[len(all)-1]; r["spillway"].n > 0 && r["redis_rate"].n > 0 {
		b.ReportMetric(r["spillway"].dps/r["redis_rate"].dps, "spillway/redis_rate")
	}
}

// tally accumulates a contender's slices.
type tally struct {
	n, allowed   int
	elapsed      time.Duration
	lat          []time.Duration
	usec, scalls float64
	cpu          float64 // server process CPU, µs
}

func (t *tally) result() result {
	slices.Sort(t.lat)
	pct := func(p float64) float64 {
		return float64(t.lat[int(p*float64(len(t.lat)-1))].Nanoseconds()) / 1e3
	}
	p99 := t.lat[int(0.99*float64(len(t.lat)-1))]
	var sum time.Duration
	k := 0
	for _, l := range t.lat {
		if l <= p99 {
			sum += l
			k++
		}
	}
	return result{n: t.n, trim: float64(sum.Nanoseconds()) / 1e3 / float64(k), dps: float64(t.n) / t.elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99),
		usec: t.usec / float64(t.n), cpu: t.cpu / float64(t.n), calls: float64(t.n) / t.scalls, allowed: float64(t.allowed) / float64(t.n)}
}

// runSlice runs decisions from .. from+n-1 of one contender from
// -goroutines callers and adds them to t.
func runSlice(b *testing.B, c *redis.Client, decide decider, from, n int, t *tally) {
	ctx := context.Background()
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := serverCPU(b, c)
	lat := make([][]time.Duration, *goroutines)
	var next, allowed atomic.Int64
	next.Store(int64(from))
	end := int64(from + n)
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for g := range lat {
		lat[g] = make([]time.Duration, 0, n / *goroutines + 1)
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= end {
					return
				}
				t := time.Now()
				if *rate > 0 {
					// open loop: decision i starts at its scheduled
					// time. A caller that is early sleeps and times the
					// decision from when it wakes (a timer's lateness is
					// not the limiter's); one that is late counts the
					// backlog as latency.
					sched := start.Add(time.Duration(float64(i-int64(from)) / *rate * float64(time.Second)))
					if t.Before(sched) {
						time.Sleep(sched.Sub(t))
						t = time.Now()
					} else {
						t = sched
					}
				}
				ok, err := decide(ctx, int(i*7919)%*numKeys)
				lat[g] = append(lat[g], time.Since(t))
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if ok {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.elapsed += time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	for _, l := range lat {
		t.lat = append(t.lat, l...)
	}
	t.cpu += serverCPU(b, c) - cpu0
	usec, calls := commandStats(b, c)
	t.n += n
	t.allowed += int(allowed.Load())
	t.usec += usec
	t.scalls += calls
}

// commandStats sums, over INFO commandstats, the usec and the calls of the
// script commands (EVALSHA, EVAL). Commands a script runs are counted
// under their own names too and their time is already in the script's:
// only the scripts' usec is summed (every contender decides through
// scripts).
func commandStats(b *testing.B, c *redis.Client) (usec, scriptCalls float64) {
	st := redistest.ReadCommandStats(b, c)
	for _, name := range []string{"evalsha", "eval"} {
		usec += st[name].Usec
		scriptCalls += st[name].Calls
	}
	return usec, scriptCalls
}

// ratios are the comparisons the targets are about.
var ratios = []struct {
	name string
	f    func(res map[string]result) float64
}{
	{"spillway / redis_rate decisions/s", func(r map[string]result) float64 { return r["spillway"].dps / r["redis_rate"].dps }},
	{"spillway / redis_rate p99 (< 1: better)", func(r map[string]result) float64 { return r["spillway"].p99 / r["redis_rate"].p99 }},
	{"coalescing on / off decisions/s", func(r map[string]result) float64 { return r["spillway"].dps / r["spillway_no_coalescing"].dps }},
	{"coalescing on / off mean latency ≤ p99", func(r map[string]result) float64 { return r["spillway"].trim / r["spillway_no_coalescing"].trim }},
	{"fallback-wrapped / bare decisions/s", func(r map[string]result) float64 { return r["spillway_fallback"].dps / r["spillway"].dps }},
	{"tiers three rules / one rule wall time", func(r map[string]result) float64 { return r["tiers_one_rule"].dps / r["tiers_three_rules"].dps }},
	{"tiers three rules / one rule mean latency ≤ p99", func(r map[string]result) float64 { return r["tiers_three_rules"].trim / r["tiers_one_rule"].trim }},
	{"tiers three rules / one rule p50", func(r map[string]result) float64 { return r["tiers_three_rules"].p50 / r["tiers_one_rule"].p50 }},
	{"redis_rate ×3 / tiers three rules wall time", func(r map[string]result) float64 { return r["tiers_three_rules"].dps / r["redis_rate_x3"].dps }},
	{"window buckets / counter decisions/s", func(r map[string]result) float64 { return r["window_buckets"].dps / r["window_counter"].dps }},
	{"window buckets conservative / counter decisions/s", func(r map[string]result) float64 {
		return r["window_buckets_conservative"].dps / r["window_counter"].dps
	}},
	{"window buckets N=50 / counter decisions/s", func(r map[string]result) float64 { return r["window_buckets_50"].dps / r["window_counter"].dps }},
	{"window log / counter decisions/s", func(r map[string]result) float64 { return r["window_log"].dps / r["window_counter"].dps }},
}

// table formats one round.
func table(names []string, res map[string]result) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d goroutines, %d keys, %d decisions each", *goroutines, *numKeys, res[names[0]].n)
	if *rate > 0 {
		fmt.Fprintf(&sb, ", open loop at %.0f decisions/s", *rate)
	}
	sb.WriteString(":\n")
	fmt.Fprintf(&sb, "%-24s %12s %9s %9s %11s %13s %12s %9s %8s\n", "contender", "decisions/s", "p50 µs", "p99 µs", "mean≤p99 µs", "script µs/dec", "cpu µs/dec", "dec/call", "allowed")
	for _, name := range names {
		r := res[name]
		fmt.Fprintf(&sb, "%-24s %12.0f %9.0f %9.0f %11.1f %13.2f %12.2f %9.1f %8.3f\n", name, r.dps, r.p50, r.p99, r.trim, r.usec, r.cpu, r.calls, r.allowed)
	}
	for _, r := range ratios {
		if v := r.f(res); v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
			fmt.Fprintf(&sb, "%-44s %.2f×\n", r.name, v)
		}
	}
	return sb.String()
}

// markdown formats every round's table and the medians of the ratios as
// the body of a generated file (-md).
func markdown(names []string, all []map[string]result, fallbackLocal string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d goroutines, %d keys, pool %d, limit %d/second per key", *goroutines, *numKeys, *pool, *limit)
	if *rate > 0 {
		fmt.Fprintf(&sb, ", open loop at %.0f decisions/s", *rate)
	} else {
		sb.WriteString(", closed loop")
	}
	fmt.Fprintf(&sb, "; %d rounds. Latencies in µs; mean≤p99: the mean of the decisions at or under the p99; script µs/dec: Redis's time in the scripts per decision; cpu µs/dec: redis-server's CPU per decision.\n", len(all))
	for i, res := range all {
		fmt.Fprintf(&sb, "\nRound %d, %d decisions per contender:\n\n", i+1, res[names[0]].n)
		var rows [][]string
		for _, name := range names {
			r := res[name]
			rows = append(rows, []string{name, fmt.Sprintf("%.0f", r.dps), fmt.Sprintf("%.0f", r.p50), fmt.Sprintf("%.0f", r.p99),
				fmt.Sprintf("%.1f", r.trim), fmt.Sprintf("%.2f", r.usec), fmt.Sprintf("%.2f", r.cpu), fmt.Sprintf("%.1f", r.calls), fmt.Sprintf("%.3f", r.allowed)})
		}
		sb.WriteString(genmd.Table([]string{"contender", "decisions/s", "p50", "p99", "mean≤p99", "script µs/dec", "cpu µs/dec", "dec/call", "allowed"}, rows))
	}
	var rows [][]string
	for _, r := range ratios {
		var v []string
		var xs []float64
		for _, res := range all {
			if x := r.f(res); x > 0 && !math.IsInf(x, 0) && !math.IsNaN(x) {
				xs = append(xs, x)
				v = append(v, fmt.Sprintf("%.2f", x))
			}
		}
		if len(xs) == 0 {
			continue
		}
		sorted := slices.Sorted(slices.Values(xs))
		rows = append(rows, []string{r.name, fmt.Sprintf("%.2f×", sorted[len(sorted)/2]), strings.Join(v, " ")})
	}
	if len(rows) > 0 {
		sb.WriteString("\nMedians of the ratios over the rounds:\n\n")
		sb.WriteString(genmd.Table([]string{"ratio", "median", "by round"}, rows))
	}
	fmt.Fprintf(&sb, "\nspillway_fallback's local decisions: %s\n", fallbackLocal)
	return sb.String()
}

// benchCommand is the command line that ran the benchmark, as typed in
// bench/: the flags set, without the test binary's bookkeeping ones.
func benchCommand() string {
	parts := []string{"cd bench && go test"}
	flag.Visit(func(f *flag.Flag) {
		name := strings.TrimPrefix(f.Name, "test.")
		switch name {
		case "paniconexit0", "testlogfile", "timeout", "gocoverdir", "v":
			return
		}
		v := f.Value.String()
		if v == "" || strings.ContainsAny(v, " \t'\"$^*|") {
			v = "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
		}
		parts = append(parts, "-"+name, v)
	})
	return strings.Join(parts, " ")
}

// medians formats the median of every ratio over the rounds, with the
// rounds' values.
func medians(all []map[string]result) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nmedians over %d rounds:\n", len(all))
	for _, r := range ratios {
		var v []float64
		for _, res := range all {
			if x := r.f(res); x > 0 && !math.IsInf(x, 0) && !math.IsNaN(x) {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			continue
		}
		sorted := slices.Sorted(slices.Values(v))
		fmt.Fprintf(&sb, "%-44s %.2f× (", r.name, sorted[len(sorted)/2])
		for i, x := range v {
			if i > 0 {
				sb.WriteString(" ")
			}
			fmt.Fprintf(&sb, "%.2f", x)
		}
		sb.WriteString(")\n")
	}
	return sb.String()
}

// serverCPU is the Redis server's CPU time so far, in µs.
func serverCPU(b *testing.B, c *redis.Client) float64 {
	return float64(redistest.ServerCPU(b, c).Nanoseconds()) / 1e3
}

// fill calls allow(0) … allow(n-1) from -goroutines callers.
func fill(b *testing.B, n int, allow func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range *goroutines {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := allow(int(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// memWindow is the limiter of a window contender of
// BenchmarkRedisMemoryPerKey: 100 per minute.
func memWindow(b *testing.B, name string, s ratelimit.Store) (*ratelimit.Limiter, ratelimit.Policy) {
	p := ratelimit.Policy{Limit: 100, Period: time.Minute}
	switch name {
	case "window_counter":
		p.Algorithm = ratelimit.SlidingWindowCounter
	case "window_buckets":
		p.Algorithm = ratelimit.SlidingWindowBuckets
	case "window_buckets_60":
		p.Algorithm, p.Buckets = ratelimit.SlidingWindowBuckets, 60
	case "window_log":
		p.Algorithm = ratelimit.SlidingWindowLog
	}
	l, err := ratelimit.New(s, p, ratelimit.Settings{})
	if err != nil {
		b.Fatal(err)
	}
	return l, p
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
// used_memory delta over -memkeys keys like "user:12345" written by each
// contender on a fresh redis-server:
//
//   - spillway_default_scope: a ratelimit.Limiter with the default scope
//     (the policy's digest), key "spillway:<digest>;{user:12345}", through
//     Allow from -goroutines callers (coalesced), with Redis TIME: the
//     TAT kept compact (the key's expiry and a remainder in [0, 999], one
//     of Redis's shared integers);
//   - bare_set: SET "spillway:{user:12345}" <µs integer> PX, in pipelines
//     of 1000: one integer string with a TTL under a key of the same
//     allocation class (21 and 28 bytes both take a 32-byte jemalloc slot
//     with their sds header and terminator), with a value object of its own;
//   - bare_set_shared: the same key with a value in [0, 999] (a shared
//     integer, no value object) and PXAT: the floor of the compact
//     encoding under that key class;
//   - bare_set_12: SET "{user:12345}" <µs integer> PX, the 12-byte key
//     alone (a 16-byte slot);
//   - redis_rate: go-redis/redis_rate v10 ("rate:user:12345");
//   - window_counter, window_buckets (the default 10 sub-windows),
//     window_buckets_60, window_log: the windows at 100 per minute with the
//     default scope ("spillway:<digest>:{user:12345}:swc"), one admission
//     per key; window_*_busy: the state of a source at its limit, written
//     on a client clock: the counter 50 in each of two windows, the
//     bucketed windows an admission of 100/(N+1) units in each of their
//     N+1 sub-windows. -only picks names (default: all).
func BenchmarkRedisMemoryPerKey(b *testing.B) {
	names := []string{"spillway_default_scope", "bare_set", "bare_set_shared", "bare_set_12", "redis_rate",
		"window_counter", "window_buckets", "window_buckets_60", "window_log",
		"window_counter_busy", "window_buckets_busy"}
	if *only != "" {
		names = strings.Split(*only, ",")
	}
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				srv := redistest.Start(b)
				c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: *pool})
				ctx := context.Background()
				n := *memKeys
				before := usedMemory(b, c)
				// 1 per hour: no key expires during the run
				var allow func(i int) error
				switch name {
				case "spillway_default_scope":
					l, err := ratelimit.New(mustRedisStore(c), ratelimit.Policy{Algorithm: ratelimit.GCRA, Limit: 1, Period: time.Hour, Burst: 1000}, ratelimit.Settings{})
					if err != nil {
						b.Fatal(err)
					}
					allow = func(i int) error { _, err := l.Allow(ctx, entity(i), 1); return err }
				case "window_counter", "window_buckets", "window_buckets_60", "window_log":
					l, _ := memWindow(b, name, mustRedisStore(c))
					allow = func(i int) error { _, err := l.Allow(ctx, entity(i), 1); return err }
				case "window_counter_busy", "window_buckets_busy", "window_buckets_60_busy":
					clk := testclock.New(time.UnixMicro(time.Now().UnixMicro() / 60_000_000 * 60_000_000)) // a minute starts
					l, p := memWindow(b, strings.TrimSuffix(name, "_busy"), mustRedisStore(c, ratelimit.RedisSettings{Clock: clk.Now}))
					steps, cost := int64(2), int64(50) // the counter: two windows
					if p.Algorithm == ratelimit.SlidingWindowBuckets {
						steps = rateHooks.EffectiveBuckets(p) + 1
						cost = p.Limit / steps
					}
					step := p.Period.Microseconds() / (steps - 1)
					allow = func(i int) error {
						d, err := l.Allow(ctx, entity(i), cost)
						if err == nil && !d.Allowed {
							err = fmt.Errorf("%s: %s denied at its limit: %+v", name, entity(i), d)
						}
						return err
					}
					for range steps - 1 { // every sub-window but the last
						fill(b, n, allow)
						clk.Advance(time.Duration(step) * time.Microsecond)
					}
				case "redis_rate":
					rr := redis_rate.NewLimiter(c)
					lim := redis_rate.Limit{Rate: 1, Burst: 1000, Period: time.Hour}
					allow = func(i int) error { _, err := rr.Allow(ctx, entity(i), lim); return err }
				case "bare_set", "bare_set_shared", "bare_set_12":
					prefix := "spillway:"
					if name == "bare_set_12" {
						prefix = ""
					}
					now := time.Now().UnixMicro()
					for i := 0; i < n; i += 1000 {
						pipe := c.Pipeline()
						for j := i; j < min(i+1000, n); j++ {
							k := prefix + "{" + entity(j) + "}"
							if name == "bare_set_shared" {
								pipe.Do(ctx, "SET", k, j%1000, "PXAT", now/1000+3_600_000)
								continue
							}
							pipe.Set(ctx, k, now+3_600_000_000, time.Hour)
						}
						if _, err := pipe.Exec(ctx); err != nil {
							b.Fatal(err)
						}
					}
				}
				if allow != nil {
					fill(b, n, allow)
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
