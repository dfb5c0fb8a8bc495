package ratelimit

// Benchmarks against golang.org/x/time/rate, side by side in one run:
//
//	go test -run '^$' -bench 'OneKey|10kKeys' -benchmem -benchtime=1s ./ratelimit
//
// OneKey: one key, one goroutine: the per-decision cost, clock read
// included on both sides (rate.Limiter.Allow reads time.Now too).
// 10kKeys: 10,000 keys, b.RunParallel: a MemoryStore against the usual
// hand-rolled alternative, a mutex-guarded map of rate.Limiters.
//
// -md FILE writes what they measured as a markdown table:
//
//	cd ratelimit && go test -run '^$' -bench 'OneKey|10kKeys' -benchmem -count 5 -md ../docs/figures/ratelimit-memory.md

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/spillway-go/spillway/internal/genmd"
)

var memoryMD = flag.String("md", "", "BenchmarkOneKey, BenchmarkOneKeyFixedClock and Benchmark10kKeys: write their wall and CPU ns/op, every run of -count, as markdown to this file (relative to ratelimit/, e.g. ../docs/figures/ratelimit-memory.md), with a header naming the command, date, commit and load average")

func TestMain(m *testing.M) {
	flag.Parse()
	load := genmd.LoadAvg()
	code := m.Run()
	if *memoryMD != "" && code == 0 {
		if len(benchRuns.ord) == 0 {
			fmt.Fprintln(os.Stderr, "-md: no benchmark ran (give -bench 'OneKey|10kKeys'); nothing written")
			os.Exit(1)
		}
		if err := genmd.Write(*memoryMD, genmd.TestCommand("cd ratelimit && go test", false), load, memoryMarkdown()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func BenchmarkOneKey(b *testing.B) {
	ctx := context.Background()
	for _, a := range []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindowCounter, SlidingWindowLog} {
		b.Run("memory/"+a.String(), func(b *testing.B) {
			// A limit that never runs out, as in the x/time/rate case: both
			// measure the allowed path.
			l, err := New(NewMemoryStore(MemorySettings{}), benchPolicy(a), Settings{})
			if a == SlidingWindowLog { // one entry per unit: keep the log short
				l, err = New(NewMemoryStore(MemorySettings{}), Policy{Algorithm: a, Limit: 1000, Period: time.Millisecond}, Settings{})
			}
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			m := startCPU(b, rusageThread)
			for i := 0; i < b.N; i++ {
				if _, err := l.Allow(ctx, "key", 1); err != nil {
					b.Fatal(err)
				}
			}
			m.stop(b)
		})
	}
	b.Run("x_time_rate", func(b *testing.B) {
		l := rate.NewLimiter(rate.Limit(1<<40), 1<<30)
		b.ReportAllocs()
		m := startCPU(b, rusageThread)
		for i := 0; i < b.N; i++ {
			l.AllowN(time.Now(), 1)
		}
		m.stop(b)
	})
	// For context: x/time/rate keyed like a store, one goroutine.
	b.Run("x_time_rate_mutex_map", func(b *testing.B) {
		var mu sync.Mutex
		lim := map[string]*rate.Limiter{"key": rate.NewLimiter(rate.Limit(1<<40), 1<<30)}
		b.ReportAllocs()
		m := startCPU(b, rusageThread)
		for i := 0; i < b.N; i++ {
			mu.Lock()
			l := lim["key"]
			mu.Unlock()
			l.AllowN(time.Now(), 1)
		}
		m.stop(b)
	})
}

// BenchmarkOneKeyFixedClock is BenchmarkOneKey with the clock taken out on
// both sides (a constant time, cost 0 so nothing runs out): what the
// decision itself costs.
func BenchmarkOneKeyFixedClock(b *testing.B) {
	t := time.Now()
	ctx := context.Background()
	b.Run("memory", func(b *testing.B) {
		l, err := New(NewMemoryStore(MemorySettings{Clock: func() time.Time { return t }}), benchPolicy(TokenBucket), Settings{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		m := startCPU(b, rusageThread)
		for i := 0; i < b.N; i++ {
			l.Allow(ctx, "key", 0)
		}
		m.stop(b)
	})
	b.Run("x_time_rate", func(b *testing.B) {
		l := rate.NewLimiter(rate.Limit(1<<40), 1<<30)
		b.ReportAllocs()
		m := startCPU(b, rusageThread)
		for i := 0; i < b.N; i++ {
			l.AllowN(t, 0)
		}
		m.stop(b)
	})
}

const benchKeys = 10_000

// cpuMeter reports CPU time per operation (metric "cpu-ns/op") next to the
// wall time: on a shared, loaded machine wall time includes the time other
// processes held the cores, CPU time does not. who is RUSAGE_THREAD for a
// single goroutine locked to its thread, RUSAGE_SELF for parallel runs.
type cpuMeter struct {
	who     int
	start   time.Duration
	mallocs uint64
}

func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU(b *testing.B, who int) *cpuMeter {
	b.Helper()
	if who == rusageThread {
		runtime.LockOSThread()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ResetTimer()
	return &cpuMeter{who: who, start: cpuTime(who), mallocs: ms.Mallocs}
}

func (m *cpuMeter) stop(b *testing.B) {
	used := cpuTime(m.who) - m.start
	b.StopTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if m.who == rusageThread {
		runtime.UnlockOSThread()
	}
	cpu := float64(used.Nanoseconds()) / float64(b.N)
	b.ReportMetric(cpu, "cpu-ns/op")
	benchRuns.record(b.Name(), benchRun{n: b.N, wall: float64(b.Elapsed().Nanoseconds()) / float64(b.N), cpu: cpu,
		allocs: float64(ms.Mallocs-m.mallocs) / float64(b.N)})
}

// benchRun is one reported run of a benchmark: the last call of its ramp.
type benchRun struct {
	n         int
	wall, cpu float64 // ns/op
	allocs    float64 // per op
}

// runs holds every benchmark's reported runs, in order. The testing
// package calls a benchmark with a rising b.N until the run is long
// enough and reports the last call; a call whose b.N is not above the one
// before starts the next run of -count.
type runs struct {
	mu  sync.Mutex
	by  map[string][]benchRun
	ord []string
}

var benchRuns = runs{by: map[string][]benchRun{}}

func (r *runs) record(name string, run benchRun) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := r.by[name]
	if len(rs) == 0 {
		r.ord = append(r.ord, name)
	}
	if len(rs) == 0 || run.n <= rs[len(rs)-1].n {
		rs = append(rs, benchRun{})
	}
	rs[len(rs)-1] = run
	r.by[name] = rs
}

// memoryMarkdown is the -md table: per benchmark, the median wall ns/op
// (bold), every run's, the median CPU ns/op and the most allocations per
// op of any run.
func memoryMarkdown() string {
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Wall ns/op, the median (bold) and every run's, the median CPU time per operation (getrusage: the thread's for one goroutine, the process's for `b.RunParallel` at GOMAXPROCS %d), which a loaded machine inflates less, and allocations per operation (the most of any run). One key, one goroutine: `BenchmarkOneKey` (the clock read included on both sides), `BenchmarkOneKeyFixedClock` (a constant time). 10,000 keys in parallel: `Benchmark10kKeys`, the memory store against a mutex-guarded map of `x/time/rate` limiters.\n\n", runtime.GOMAXPROCS(0))
	rows := [][]string{}
	for _, name := range benchRuns.ord {
		rs := benchRuns.by[name]
		walls, cpus := make([]float64, len(rs)), make([]float64, len(rs))
		allocs := 0.0
		for i, r := range rs {
			walls[i], cpus[i] = r.wall, r.cpu
			allocs = max(allocs, r.allocs)
		}
		w := median(walls)
		all := []string{}
		for _, x := range walls {
			all = append(all, fmt.Sprintf("%.0f", x))
		}
		rows = append(rows, []string{"`" + name + "`", fmt.Sprintf("**%.0f** (%s)", w, strings.Join(all, ", ")), fmt.Sprintf("%.0f", median(cpus)), fmt.Sprintf("%.0f", allocs)})
	}
	sb.WriteString(genmd.Table([]string{"benchmark", "wall ns/op: median (every run)", "CPU ns/op (median)", "allocs/op"}, rows))
	// The targets' ratios, run by run: the memory store's decisions per
	// second over its rival's (wall time).
	for _, p := range [][3]string{
		{"one key", "BenchmarkOneKey/memory/token_bucket", "BenchmarkOneKey/x_time_rate"},
		{"10,000 keys in parallel", "Benchmark10kKeys/memory", "Benchmark10kKeys/x_time_rate_mutex_map"},
	} {
		mine, theirs := benchRuns.by[p[1]], benchRuns.by[p[2]]
		if len(mine) == 0 || len(mine) != len(theirs) {
			continue
		}
		var by []string
		for i := range mine {
			by = append(by, fmt.Sprintf("%.2f", theirs[i].wall/mine[i].wall))
		}
		fmt.Fprintf(&sb, "\n%s: `%s` ÷ `%s` wall ns/op, run i of one over run i of the other (a benchmark's runs follow each other, the two benchmarks' are not interleaved): %s×.\n", p[0], p[2], p[1], strings.Join(by, " "))
	}
	return sb.String()
}

const rusageThread = 1 // RUSAGE_THREAD (Linux)

// benchPolicy admits far more than a benchmark asks for (2^26 per 2^26 µs,
// burst 2^26), so both sides measure the allowed path.
func benchPolicy(a Algorithm) Policy {
	return Policy{Algorithm: a, Limit: 1 << 26, Period: 1 << 26 * time.Microsecond}
}

func benchKeyNames() []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	return keys
}

func Benchmark10kKeys(b *testing.B) {
	ctx := context.Background()
	keys := benchKeyNames()
	b.Run("memory", func(b *testing.B) {
		l, err := New(NewMemoryStore(MemorySettings{}), benchPolicy(TokenBucket), Settings{})
		if err != nil {
			b.Fatal(err)
		}
		var seq atomic.Uint64
		b.ReportAllocs()
		m := startCPU(b, syscall.RUSAGE_SELF)
		b.RunParallel(func(pb *testing.PB) {
			i := seq.Add(7919) * 104729
			for pb.Next() {
				i++
				if _, err := l.Allow(ctx, keys[i%benchKeys], 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
		m.stop(b)
	})
	b.Run("x_time_rate_mutex_map", func(b *testing.B) {
		var (
			mu  sync.Mutex
			lim = make(map[string]*rate.Limiter)
		)
		allow := func(key string) bool {
			mu.Lock()
			l, ok := lim[key]
			if !ok {
				l = rate.NewLimiter(rate.Limit(1<<40), 1<<30)
				lim[key] = l
			}
			mu.Unlock()
			return l.Allow()
		}
		var seq atomic.Uint64
		b.ReportAllocs()
		m := startCPU(b, syscall.RUSAGE_SELF)
		b.RunParallel(func(pb *testing.PB) {
			i := seq.Add(7919) * 104729
			for pb.Next() {
				i++
				allow(keys[i%benchKeys])
			}
		})
		m.stop(b)
	})
}

// BenchmarkMemoryPerKey reports the heap held per key (metric "B/key")
// after 100,000 distinct keys of 16 bytes each, per algorithm (the log
// holds one entry per admitted unit: one here; the bucketed window its
// default 10 sub-windows, 11 counts).
//
//	go test -run '^$' -bench MemoryPerKey -benchtime=1x ./ratelimit
func BenchmarkMemoryPerKey(b *testing.B) {
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%011d", i) // 16 bytes
	}
	ctx := context.Background()
	for _, a := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowCounter, SlidingWindowLog, SlidingWindowBuckets} {
		b.Run(a.String(), func(b *testing.B) {
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				st := NewMemoryStore(MemorySettings{})
				l, err := New(st, Policy{Algorithm: a, Limit: 10, Period: time.Minute}, Settings{})
				if err != nil {
					b.Fatal(err)
				}
				for _, k := range keys {
					l.Allow(ctx, k, 1)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if st.keyCount() != n {
					b.Fatalf("Len = %d", st.keyCount())
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/key")
				runtime.KeepAlive(st)
			}
		})
	}
}
