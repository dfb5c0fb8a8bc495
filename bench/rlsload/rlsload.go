// Package rlsload is a gRPC load generator for Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), and a
// do-nothing server of the same API that answers OK at once: the ceiling of
// a machine with this generator. cmd/rlsbench runs it against spillway's
// server and the reference, envoyproxy/ratelimit.
package rlsload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Config is one run of the generator.
type Config struct {
	Target      string        // host:port of the gRPC server
	Conns       int           // gRPC connections, the callers spread over them (default 4)
	Callers     int           // concurrent callers (default 64)
	Keys        int           // distinct keys per descriptor key (default 10,000)
	Descriptors int           // descriptors per call: 1 (user) or 3 (user, ip, api_key) (default 1)
	Domain      string        // the request's domain (default "bench")
	Warmup      time.Duration // calls before the measured window, not counted
	Duration    time.Duration // the measured window: calls started in it are counted (default 10s)
	Rate        float64       // calls/s offered by all callers together (open loop); 0: closed loop
	CallTimeout time.Duration // each call's deadline (default 35s)
	Seed        uint64        // seeds the callers' key choices
	// Slow, when positive, makes the result list the calls slower than it
	// (Result.Slow), with when they started.
	Slow time.Duration
}

func (c *Config) defaults() error {
	if c.Target == "" {
		return errors.New("rlsload: Config.Target is empty")
	}
	if c.Conns <= 0 {
		c.Conns = 4
	}
	if c.Callers <= 0 {
		c.Callers = 64
	}
	if c.Keys <= 0 {
		c.Keys = 10_000
	}
	if c.Descriptors == 0 {
		c.Descriptors = 1
	}
	if c.Descriptors != 1 && c.Descriptors != 3 {
		return fmt.Errorf("rlsload: Config.Descriptors is %d; it is 1 or 3", c.Descriptors)
	}
	if c.Domain == "" {
		c.Domain = "bench"
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 35 * time.Second
	}
	if c.Rate < 0 {
		return fmt.Errorf("rlsload: Config.Rate is %v; it is 0 (closed loop) or positive", c.Rate)
	}
	return nil
}

// Result is what one run measured: the calls started in the measured
// window, each counted once it ended (answered, failed or timed out).
type Result struct {
	Calls     int // calls started in the window
	OK        int // answered with overall_code OK
	OverLimit int // answered with overall_code OVER_LIMIT
	Errors    int // failed (gRPC error, deadline exceeded, or an answer of another code)
	Expired   int // of Errors, the calls their own deadline (CallTimeout) ended; the others were refused before it
	// FirstError is the first error seen, for the report.
	FirstError string
	Window     time.Duration // the measured window
	// Latencies of the calls started in the window, sorted. In open loop a
	// call's latency counts from its scheduled start, so a call started late
	// because every caller was busy counts its wait.
	Latencies []time.Duration
	// First is the slowest of the callers' first calls in the window.
	First time.Duration
	// Slow are the calls slower than Config.Slow, by start.
	Slow []Call
}

// Call is one call: when it started after the window began, and how long
// it took.
type Call struct {
	Start, Latency time.Duration
}

// PerSecond is the calls per second of the window.
func (r *Result) PerSecond() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Calls) / r.Window.Seconds()
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of the latencies (nearest
// rank), 0 without calls.
func (r *Result) Quantile(q float64) time.Duration {
	n := len(r.Latencies)
	if n == 0 {
		return 0
	}
	i := int(q*float64(n)+0.999999999) - 1
	i = min(max(i, 0), n-1)
	return r.Latencies[i]
}

// Max is the slowest call, 0 without calls.
func (r *Result) Max() time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	return r.Latencies[len(r.Latencies)-1]
}

// Over counts the calls slower than d.
func (r *Result) Over(d time.Duration) int {
	i, _ := slices.BinarySearch(r.Latencies, d+1)
	return len(r.Latencies) - i
}

// Requests builds the requests of a run, one per key: request i asks for
// user=user:i, and with three descriptors also ip=<an address> and
// api_key=key:<j>, whose indices are other permutations of i so that the
// three keys of a call are not always the same triple's neighbours.
func Requests(domain string, keys, descriptors int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		ds := []*ratelimitv3.RateLimitDescriptor{descriptor("user", "user:"+strconv.Itoa(i))}
		if descriptors == 3 {
			ip := (i*7919 + 13) % keys
			ak := (i*104729 + 7) % keys
			ds = append(ds,
				descriptor("ip", fmt.Sprintf("10.%d.%d.%d", ip>>16&255, ip>>8&255, ip&255)),
				descriptor("api_key", "key:"+strconv.Itoa(ak)))
		}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: 1}
	}
	return reqs
}

func descriptor(key, value string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

// Run runs the generator once. It returns an error only when it could not
// connect; failed calls are counted in the result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	clients := make([]rlsv3.RateLimitServiceClient, cfg.Conns)
	for i := range clients {
		cc, err := grpc.NewClient(cfg.Target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("rlsload: %s: %w", cfg.Target, err)
		}
		defer cc.Close()
		cc.Connect()
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	reqs := Requests(cfg.Domain, cfg.Keys, cfg.Descriptors)

	start := time.Now()
	from := start.Add(cfg.Warmup)
	until := from.Add(cfg.Duration)
	var interval time.Duration // each caller's, in open loop
	if cfg.Rate > 0 {
		interval = time.Duration(float64(cfg.Callers) / cfg.Rate * float64(time.Second))
	}

	type tally struct {
		lat            []time.Duration
		slow           []Call
		ok, over, errs int
		expired        int
		firstErr       string
		first          time.Duration
		seenFirst      bool
		_              [64]byte // keep the callers' counters on their own cache lines
	}
	tallies := make([]tally, cfg.Callers)
	var wg sync.WaitGroup
	var stopped atomic.Bool
	for c := range cfg.Callers {
		wg.Go(func() {
			t := &tallies[c]
			t.lat = make([]time.Duration, 0, 1<<12)
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(c)))
			client := clients[c%cfg.Conns]
			next := start.Add(time.Duration(c) * interval / time.Duration(cfg.Callers))
			for !stopped.Load() {
				begin := time.Now()
				if interval > 0 {
					if d := next.Sub(begin); d > 0 {
						time.Sleep(d)
					}
					begin = next
					next = next.Add(interval)
				}
				if !begin.Before(until) {
					return
				}
				callCtx, cancel := context.WithTimeout(ctx, cfg.CallTimeout)
				resp, err := client.ShouldRateLimit(callCtx, reqs[rng.IntN(len(reqs))])
				expired := err != nil && callCtx.Err() != nil
				cancel()
				lat := time.Since(begin)
				if ctx.Err() != nil {
					stopped.Store(true)
					return
				}
				if begin.Before(from) {
					continue
				}
				t.lat = append(t.lat, lat)
				if cfg.Slow > 0 && lat > cfg.Slow {
					t.slow = append(t.slow, Call{Start: begin.Sub(from), Latency: lat})
				}
				if !t.seenFirst {
					t.seenFirst, t.first = true, lat
				}
				switch {
				case err != nil:
					t.errs++
					if expired {
						t.expired++
					}
					if t.firstErr == "" {
						t.firstErr = err.Error()
					}
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					t.ok++
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
					t.over++
				default:
					t.errs++
					if t.firstErr == "" {
						t.firstErr = "overall_code " + resp.GetOverallCode().String()
					}
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	r := &Result{Window: cfg.Duration}
	for i := range tallies {
		t := &tallies[i]
		r.Latencies = append(r.Latencies, t.lat...)
		r.Slow = append(r.Slow, t.slow...)
		r.OK += t.ok
		r.OverLimit += t.over
		r.Errors += t.errs
		r.Expired += t.expired
		if r.FirstError == "" {
			r.FirstError = t.firstErr
		}
		r.First = max(r.First, t.first)
	}
	r.Calls = len(r.Latencies)
	slices.Sort(r.Latencies)
	slices.SortFunc(r.Slow, func(a, b Call) int { return cmp.Compare(a.Start, b.Start) })
	return r, nil
}
