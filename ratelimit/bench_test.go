package ratelimit

// Benchmarks against golang.org/x/time/rate, side by side in one run:
//
//	go test -run '^$' -bench 'OneKey|10kKeys' -benchmem -benchtime=1s ./ratelimit
//
// OneKey: one key, one goroutine: the per-decision cost, clock read
// included on both sides (rate.Limiter.Allow reads time.Now too).
// 10kKeys: 10,000 keys, b.RunParallel: a MemoryStore against the usual
// hand-rolled alternative, a mutex-guarded map of rate.Limiters.

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

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
	who   int
	start time.Duration
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
	b.ResetTimer()
	return &cpuMeter{who: who, start: cpuTime(who)}
}

func (m *cpuMeter) stop(b *testing.B) {
	used := cpuTime(m.who) - m.start
	b.StopTimer()
	if m.who == rusageThread {
		runtime.UnlockOSThread()
	}
	b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
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
