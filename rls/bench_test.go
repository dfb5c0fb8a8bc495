package rls

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

const benchConfig = `
domain: bench
descriptors:
  - key: k1
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: k2
    rate_limit: {unit: minute, requests_per_unit: 1000000}
  - key: k3
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`

type nopService struct {
	pb.UnimplementedRateLimitServiceServer
}

func (nopService) ShouldRateLimit(_ context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	}
	return resp, nil
}

func serve(b *testing.B, svc pb.RateLimitServiceServer, opts ...grpc.ServerOption) pb.RateLimitServiceClient {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	g := grpc.NewServer(opts...)
	pb.RegisterRateLimitServiceServer(g, svc)
	go g.Serve(l)
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

func requests(n, descriptors int) []*pb.RateLimitRequest {
	reqs := make([]*pb.RateLimitRequest, n)
	for i := range reqs {
		r := &pb.RateLimitRequest{Domain: "bench"}
		for d := 1; d <= descriptors; d++ {
			r.Descriptors = append(r.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
				{Key: "k" + strconv.Itoa(d), Value: "user-" + strconv.Itoa(i)}}})
		}
		reqs[i] = r
	}
	return reqs
}

// BenchmarkGRPC: 64 callers over loopback gRPC, 10k keys, one and three
// descriptors, the do-nothing server beside the service over Redis.
func BenchmarkGRPC(b *testing.B) {
	rs := redistest.Start(b)
	set := DefaultSettings()
	set.RedisSocketType, set.RedisURL = "tcp", rs.Addr
	if n, err := strconv.Atoi(os.Getenv("RLS_BENCH_COALESCE")); err == nil {
		set.Coalesce = n
	}
	if d, err := time.ParseDuration(os.Getenv("RLS_BENCH_BUDGET")); err == nil {
		set.Budget = d
	}
	client, err := newRedisClient(set)
	require.NoError(b, err)
	store, err := newStore(client, set)
	require.NoError(b, err)
	cfg, err := Load([]File{{Name: "bench.yaml", Content: []byte(benchConfig)}}, LoadOptions{})
	require.NoError(b, err)
	svc := NewService(store, set, slog.New(slog.NewTextHandler(io.Discard, nil)))
	svc.SetConfig(cfg)
	mem := NewService(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), set, nil)
	mem.SetConfig(cfg)
	for _, n := range []int{1, 3} {
		reqs := requests(10000, n)
		for _, c := range []struct {
			name string
			svc  pb.RateLimitServiceServer
		}{{"noop", nopService{}}, {"memory", mem}, {"redis", svc}} {
			var opts []grpc.ServerOption
			if os.Getenv("RLS_BENCH_OPTIONS") != "" {
				opts = serverOptions(set) // the binary's options, for every server alike
			}
			cl := serve(b, c.svc, opts...)
			b.Run(c.name+"/descriptors="+strconv.Itoa(n), func(b *testing.B) {
				b.SetParallelism(32) // 64 callers on 2 CPUs
				b.ReportAllocs()
				start, cpu0, rcpu0 := time.Now(), cpuTime(), redistest.ServerCPU(b, rs.Client(b))
				b.RunParallel(func(pb *testing.PB) {
					r := rand.New(rand.NewPCG(rand.Uint64(), 1))
					for pb.Next() {
						if _, err := cl.ShouldRateLimit(context.Background(), reqs[r.IntN(len(reqs))]); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
				b.ReportMetric(float64((redistest.ServerCPU(b, rs.Client(b))-rcpu0).Microseconds())/float64(b.N), "redis-cpu-µs/op")
				if c.name == "redis" {
					for name, st := range redistest.ReadCommandStats(b, rs.Client(b)) {
						if st.Calls > 0 {
							b.Logf("%s: %.0f calls, %.1f µs/call, %.2f calls/op", name, st.Calls, st.Usec/st.Calls, st.Calls/float64(b.N))
						}
					}
					rs.Client(b).ConfigResetStat(context.Background())
				}
				if s, ok := c.svc.(*Service); ok {
					b.ReportMetric(float64(s.stats.Degraded.Swap(0))/float64(b.N*n), "degraded/op")
				}
			})
		}
	}
}

// BenchmarkService: the service alone (no gRPC) over the memory store, to
// see its own cost and allocations.
func BenchmarkService(b *testing.B) {
	cfg, err := Load([]File{{Name: "bench.yaml", Content: []byte(benchConfig)}}, LoadOptions{})
	require.NoError(b, err)
	svc := NewService(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), DefaultSettings(), nil)
	svc.SetConfig(cfg)
	for _, n := range []int{1, 3} {
		reqs := requests(10000, n)
		b.Run("descriptors="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// cpuTime is this process's user+system CPU time: the callers' and the
// server's, since both run here.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkServiceRedis: the service in-process (no gRPC) over the store
// the binary builds (newStore: coalescing, breaker) on a real
// redis-server, 64 callers, 10k keys, one and three descriptors, budget
// 1 s (every decision on Redis). It reports what a call costs whatever
// the machine's load: this process's CPU µs per call (the callers' loop
// is nearly free), Redis's CPU µs per call, the script's µs per call
// from INFO commandstats, and allocations.
//
//	go test -run '^$' -bench ServiceRedis -benchtime 20000x -count 5 ./rls/
func BenchmarkServiceRedis(b *testing.B) {
	rs := redistest.Start(b)
	set := DefaultSettings()
	set.RedisSocketType, set.RedisURL = "tcp", rs.Addr
	set.Budget = time.Second
	client, err := newRedisClient(set)
	require.NoError(b, err)
	store, err := newStore(client, set)
	require.NoError(b, err)
	cfg, err := Load([]File{{Name: "bench.yaml", Content: []byte(benchConfig)}}, LoadOptions{})
	require.NoError(b, err)
	svc := NewService(store, set, slog.New(slog.NewTextHandler(io.Discard, nil)))
	svc.SetConfig(cfg)
	rc := rs.Client(b)
	for _, n := range []int{1, 3} {
		reqs := requests(10000, n)
		b.Run("descriptors="+strconv.Itoa(n), func(b *testing.B) {
			b.SetParallelism(32) // 64 callers on 2 CPUs
			b.ReportAllocs()
			require.NoError(b, rc.ConfigResetStat(context.Background()).Err())
			cpu0, rcpu0 := cpuTime(), redistest.ServerCPU(b, rs.Client(b))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(rand.Uint64(), 1))
				for pb.Next() {
					resp, err := svc.ShouldRateLimit(context.Background(), reqs[r.IntN(len(reqs))])
					if err != nil || resp.OverallCode != pbOK {
						b.Errorf("%v %v", resp, err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64((redistest.ServerCPU(b, rs.Client(b))-rcpu0).Microseconds())/float64(b.N), "redis-cpu-µs/op")
			var script, calls float64
			for name, st := range redistest.ReadCommandStats(b, rc) {
				if name == "evalsha" || name == "eval" {
					script += st.Usec
					calls += st.Calls
				}
			}
			b.ReportMetric(script/float64(b.N), "script-µs/op")
			b.ReportMetric(calls/float64(b.N), "scripts/op")
			if d := svc.stats.Degraded.Swap(0); d > 0 {
				b.Errorf("%d descriptors degraded", d)
			}
		})
	}
}

const pbOK = pb.RateLimitResponse_OK
