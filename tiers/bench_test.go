package tiers

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

// The rates are high enough that nothing is denied: the benchmarks measure
// the check, not the denial path.
const (
	benchOne = `
limits:
  - id: ip
    endpoint: /api/v1/*
    by: ip
    bucket: 1000000/second
`
	benchThree = `
limits:
  - id: ip
    endpoint: /api/v1/*
    by: ip
    bucket: 1000000/second
  - id: user
    endpoint: /api/v1/login
    by: user
    bucket: 1000000/second
  - id: key
    endpoint: /api/v1/*
    by: api_key
    bucket: 1000000/second, burst 500000
`
	benchUser = "limits:\n  - id: user\n    by: user\n    bucket: 1000000/second\n"
	benchKey  = "limits:\n  - id: key\n    by: api_key\n    bucket: 1000000/second, burst 500000\n"
)

// benchRequests are 1024 distinct clients, reused so the loop does not
// allocate requests.
func benchRequests() []*spillway.Request {
	rs := make([]*spillway.Request, 1024)
	for i := range rs {
		n := strconv.Itoa(i)
		rs[i] = req("POST", "/api/v1/login", "ip", "10.0."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256), "user", "user-"+n, "api_key", "key-"+n)
	}
	return rs
}

func benchAdmit(b *testing.B, ls ...*Limiter) {
	rs := benchRequests()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := rs[i&1023]
		for _, l := range ls {
			d, _, err := l.Admit(ctx, r)
			if err != nil || !d.Allowed {
				b.Fatalf("%+v %v", d, err)
			}
		}
	}
}

// BenchmarkRedis compares, against one real redis-server on loopback, a
// single-rule check, a three-tier check (one Decide, one round trip) and
// three single-rule checks in a row (three round trips).
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	benchCompare(b, ratelimit.NewRedisStore(srv.Client(b)))
}

// BenchmarkMemory is the same comparison on the memory store: the cost of
// matching and key building itself.
func BenchmarkMemory(b *testing.B) {
	benchCompare(b, ratelimit.NewMemoryStore())
}

// benchCompare runs the single-rule, three-tier and three-sequential
// checks over store as sub-benchmarks.
func benchCompare(b *testing.B, store ratelimit.Store) {
	one := mustLimiter(b, benchOne, store)
	three := mustLimiter(b, benchThree, store)
	user := mustLimiter(b, benchUser, store)
	key := mustLimiter(b, benchKey, store)
	b.Run("single", func(b *testing.B) { benchAdmit(b, one) })
	b.Run("three-tier", func(b *testing.B) { benchAdmit(b, three) })
	b.Run("three-sequential", func(b *testing.B) { benchAdmit(b, one, user, key) })
}

// BenchmarkRedisInterleaved runs the three variants in alternating rounds
// of 100 checks, so that a load that changes during the run (a shared
// machine) weighs on all three alike, and reports the wall time per check
// of each and the ratios to the single-rule check.
func BenchmarkRedisInterleaved(b *testing.B) {
	srv := redistest.Start(b)
	store := ratelimit.NewRedisStore(srv.Client(b))
	one := mustLimiter(b, benchOne, store)
	three := mustLimiter(b, benchThree, store)
	user := mustLimiter(b, benchUser, store)
	key := mustLimiter(b, benchKey, store)
	variants := [][]*Limiter{{one}, {three}, {one, user, key}}
	var spent [3]time.Duration
	rs := benchRequests()
	ctx := context.Background()
	const round = 100
	b.ResetTimer()
	for i := 0; i < b.N; i += round {
		for v, ls := range variants {
			start := time.Now()
			for j := i; j < i+round && j < b.N; j++ {
				r := rs[j&1023]
				for _, l := range ls {
					if d, _, err := l.Admit(ctx, r); err != nil || !d.Allowed {
						b.Fatalf("%+v %v", d, err)
					}
				}
			}
			spent[v] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "single-ns/check")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "three-tier-ns/check")
	b.ReportMetric(float64(spent[2].Nanoseconds())/n, "three-seq-ns/check")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "three-tier/single")
	b.ReportMetric(float64(spent[2])/float64(spent[0]), "three-seq/single")
}
