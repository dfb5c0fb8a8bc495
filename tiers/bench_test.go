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
	benchCompare(b, mustRedisStore(srv.Client(b)))
}

// BenchmarkMemory is the same comparison on the memory store: the cost of
// matching and key building itself.
func BenchmarkMemory(b *testing.B) {
	benchCompare(b, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
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
	store := mustRedisStore(srv.Client(b))
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

const (
	// benchPlainTwo: a request count and a token count, both charged at
	// admission (the token count at the request's cost).
	benchPlainTwo = `
limits:
  - id: calls
    endpoint: /api/v1/*
    by: api_key
    bucket: 1000000/second
  - id: tokens
    endpoint: /api/v1/*
    by: api_key
    bucket: 60000000/minute, burst 500000
`
	// benchResponse: the same, the token count charged on the response.
	benchResponse = `
limits:
  - id: calls
    endpoint: /api/v1/*
    by: api_key
    bucket: 1000000/second
  - id: tokens
    endpoint: /api/v1/*
    by: api_key
    bucket: 60000000/minute, burst 500000
    cost: response
    estimate: 250
`
	benchCalls = "limits:\n  - id: calls\n    endpoint: /api/v1/*\n    by: api_key\n    bucket: 1000000/second\n"
)

// BenchmarkRedisResponseInterleaved compares, against one real
// redis-server, whole request lifecycles (Admit, report 200, done) in
// alternating rounds of 100: "plain" two rules charged at admission (one
// round trip, nothing to settle); "response" the token rule with cost:
// response, held in one Reserve with the request rule and settled when
// done runs (two round trips); "separate" what the examples did by hand
// before: a tiers check of the request rule, then Limiter.Reserve and
// Hold.Settle of the tokens (three round trips).
func BenchmarkRedisResponseInterleaved(b *testing.B) {
	srv := redistest.Start(b)
	store := mustRedisStore(srv.Client(b))
	plain := mustLimiter(b, benchPlainTwo, store)
	resp := mustLimiter(b, benchResponse, store)
	calls := mustLimiter(b, benchCalls, store)
	tokens, err := ratelimit.New(store, ratelimit.Policy{Limit: 1000000, Period: time.Second, Burst: 500000}, ratelimit.Settings{Scope: "bench-tokens"})
	if err != nil {
		b.Fatal(err)
	}
	rs := benchRequests()
	ctx := context.Background()
	lifecycle := [3]func(r *spillway.Request){
		func(r *spillway.Request) {
			if d, _, err := plain.Admit(ctx, r); err != nil || !d.Allowed {
				b.Fatalf("%+v %v", d, err)
			}
		},
		func(r *spillway.Request) {
			r.Usage = new(spillway.Usage)
			d, done, err := resp.Admit(ctx, r)
			if err != nil || !d.Allowed {
				b.Fatalf("%+v %v", d, err)
			}
			if err := r.Usage.Set(200); err != nil {
				b.Fatal(err)
			}
			done(spillway.Success)
			r.Usage = nil
		},
		func(r *spillway.Request) {
			if d, _, err := calls.Admit(ctx, r); err != nil || !d.Allowed {
				b.Fatalf("%+v %v", d, err)
			}
			k, _ := r.Get(spillway.DimAPIKey)
			h, err := tokens.Reserve(ctx, k, 250)
			if err != nil || !h.Decision().Allowed {
				b.Fatalf("%v", err)
			}
			if _, err := h.Settle(ctx, 200); err != nil {
				b.Fatal(err)
			}
		},
	}
	var spent [3]time.Duration
	const round = 100
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += round {
		for v, f := range lifecycle {
			start := time.Now()
			for j := i; j < i+round && j < b.N; j++ {
				f(rs[j&1023])
			}
			spent[v] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "plain-ns/req")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "response-ns/req")
	b.ReportMetric(float64(spent[2].Nanoseconds())/n, "separate-ns/req")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "response/plain")
	b.ReportMetric(float64(spent[2])/float64(spent[1]), "separate/response")
}

// BenchmarkMemoryResponse is one lifecycle on the memory store: a plain
// two-rule check against Admit, report and done with cost: response.
func BenchmarkMemoryResponse(b *testing.B) {
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{})
	plain := mustLimiter(b, benchPlainTwo, store)
	resp := mustLimiter(b, benchResponse, store)
	b.Run("plain", func(b *testing.B) { benchAdmit(b, plain) })
	b.Run("response", func(b *testing.B) {
		rs := benchRequests()
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r := rs[i&1023]
			r.Usage = new(spillway.Usage)
			d, done, err := resp.Admit(ctx, r)
			if err != nil || !d.Allowed {
				b.Fatalf("%+v %v", d, err)
			}
			_ = r.Usage.Set(200)
			done(spillway.Success)
			r.Usage = nil
		}
	})
}
