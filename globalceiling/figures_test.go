package globalceiling

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

// BenchmarkModes measures each mode's accuracy and write cost on a real
// redis-server: three servers, each with 8 goroutines that admit and then
// pause 10 ms (about 2.4k offered per second in all) against a ceiling of
// 1000 per 1 s window, K = 8, sync every 100 ms, for four full windows.
// Run it once:
//
//	go test -run '^$' -bench Modes -benchtime 1x ./globalceiling/
//
// Metrics: max_per_window and mean_per_window (admitted in a full window;
// the ceiling is 1000), writes/admit, writes/request (admitted or not),
// roundtrips/admit, offered/s.
func BenchmarkModes(b *testing.B) {
	for _, mode := range []Mode{Exact, Cached, LocalAggregation} {
		b.Run(mode.String(), func(b *testing.B) {
			srv := redistest.Start(b)
			const limit, servers, workers = 1000, 3, 8
			var cs []*Ceiling
			for i := 0; i < servers; i++ {
				rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16})
				b.Cleanup(func() { rdb.Close() })
				c, err := New(rdb, "bench-db", limit, time.Second, Settings{Mode: mode})
				if err != nil {
					b.Fatal(err)
				}
				cs = append(cs, c)
			}
			// Start at a window boundary; measure windows 1..4.
			first, end := cs[0].windowOf(time.Now())
			time.Sleep(time.Until(end))
			first++
			stop := time.Now().Add(5*time.Second + 50*time.Millisecond)
			var mu sync.Mutex
			per := map[int64]int64{}
			var offered atomic.Int64
			var wg sync.WaitGroup
			ctx := context.Background()
			b.ResetTimer()
			for _, c := range cs {
				for g := 0; g < workers; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(stop) {
							now := time.Now()
							d, _, err := c.Admit(ctx, critical())
							offered.Add(1)
							if err == nil && d.Allowed {
								w, _ := c.windowOf(now)
								mu.Lock()
								per[w]++
								mu.Unlock()
							}
							time.Sleep(10 * time.Millisecond)
						}
					}()
				}
			}
			wg.Wait()
			b.StopTimer()
			var st stats
			for _, c := range cs {
				c.Close()
				s := c.stats()
				st.Admitted += s.Admitted
				st.Writes += s.Writes
				st.RoundTrips += s.RoundTrips
			}
			var maxW, sum int64
			for w := first + 1; w <= first+4; w++ {
				maxW = max(maxW, per[w])
				sum += per[w]
			}
			b.ReportMetric(float64(maxW), "max_per_window")
			b.ReportMetric(float64(sum)/4, "mean_per_window")
			b.ReportMetric(float64(st.Writes)/float64(st.Admitted), "writes/admit")
			b.ReportMetric(float64(st.RoundTrips)/float64(st.Admitted), "roundtrips/admit")
			b.ReportMetric(float64(st.Writes)/float64(offered.Load()), "writes/request")
			b.ReportMetric(float64(offered.Load())/5, "offered/s")
		})
	}
}

// BenchmarkAdmit: the cost of one admission in each mode on a loopback
// redis-server, under the ceiling (every admission allowed), in parallel.
//
//	go test -run '^$' -bench Admit -benchtime 20000x ./globalceiling/
func BenchmarkAdmit(b *testing.B) {
	for _, mode := range []Mode{Exact, Cached, LocalAggregation} {
		b.Run(mode.String(), func(b *testing.B) {
			srv := redistest.Start(b)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			b.Cleanup(func() { rdb.Close() })
			c, err := New(rdb, "bench-db", 1<<40, time.Minute, Settings{Mode: mode})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := critical()
				for pb.Next() {
					if d, _, err := c.Admit(ctx, r); err != nil || !d.Allowed {
						b.Fatal(d, err)
					}
				}
			})
		})
	}
}
