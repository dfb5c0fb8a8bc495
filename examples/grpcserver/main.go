// Command grpcserver is a demo gRPC service behind the spillway chain: rate
// tiers from a YAML file, a per-IP concurrency limit and the worker load
// shedder (and, with -redis, the fleet shedder, with the Redis-backed blocks
// wrapped in the fallback). It serves spillway.demo.v1.Greeter (defined in
// greeterpb/greeter.proto, generated code committed), the standard
// grpc.health.v1.Health service and server reflection, so grpcurl works
// without the .proto; health and reflection are never limited.
//
//	go -C examples run ./grpcserver                        # in-memory
//	go -C examples run ./grpcserver -redis 127.0.0.1:6379
//	go -C examples run ./grpcserver -h                     # flags, limits, metadata
//
// With grpcurl (go install github.com/fullstorydev/grpcurl/cmd/grpcurl@latest):
//
//	grpcurl -plaintext 127.0.0.1:50051 list
//	grpcurl -plaintext -H 'x-api-key: k1' -d '{"name":"ann"}' 127.0.0.1:50051 spillway.demo.v1.Greeter/Greet
//
// Identity: API key from the "x-api-key" metadata, user from "x-user-id",
// IP from the peer. Denials are ResourceExhausted (rate, concurrency) or
// Unavailable (shedding) with RetryInfo and QuotaFailure details.
// Prometheus metrics are served on http://127.0.0.1:9464/metrics
// (-metrics-addr); -otel stdout also prints denied calls' spans and the
// metrics as JSON.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/examples/grpcserver/greeterpb"
	"github.com/spillway-go/spillway/examples/internal/demo"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/tiers"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

//go:embed limits.yaml
var defaultLimits []byte

const (
	perIPConcurrency = 20
	workerCapacity   = 128
	fleetCapacity    = 512
)

type greeter struct {
	greeterpb.UnimplementedGreeterServer
}

func (greeter) Greet(ctx context.Context, r *greeterpb.GreetRequest) (*greeterpb.GreetReply, error) {
	demo.Work(ctx, time.Duration(r.GetWorkMs())*time.Millisecond)
	return &greeterpb.GreetReply{Message: "hello, " + r.GetName()}, nil
}

// chunkTokens is the most tokens one GenerateChunk carries.
const chunkTokens = 50

// Generate streams demo.Tokens(seed) tokens in chunks, reporting each
// chunk's tokens as it is made (spillway.ReportUsage: the interceptor put
// the call's Usage in the context). When the key's tokens are spent the
// report is refused: the chunk is not sent (it was made, so it is
// charged) and the stream ends with the denial, RESOURCE_EXHAUSTED.
func (greeter) Generate(r *greeterpb.GenerateRequest, ss grpc.ServerStreamingServer[greeterpb.GenerateChunk]) error {
	n := demo.Tokens(r.GetSeed())
	var total int64
	for total < n {
		chunk := min(chunkTokens, n-total)
		if err := spillway.ReportUsage(ss.Context(), chunk); err != nil {
			return grpcx.UsageStatus(err).Err()
		}
		total += chunk
		if err := ss.Send(&greeterpb.GenerateChunk{Tokens: uint32(chunk), Total: uint64(total)}); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stdout, nil)
	switch {
	case errors.Is(err, flag.ErrHelp):
		// -h: the usage is printed; asking for it is not an error.
	case err != nil:
		fmt.Fprintln(os.Stderr, "grpcserver:", err)
		os.Exit(1)
	}
}

const usage = `Usage: go -C examples run ./grpcserver [flags]

A demo gRPC service behind the spillway chain (rate tiers, per-IP
concurrency, worker shedder; with -redis also the fleet shedder).

Services:
  spillway.demo.v1.Greeter/Greet   {"name":"ann","work_ms":200}: works work_ms
                                   (at most 10000), answers "hello, ann"
  spillway.demo.v1.Greeter/Generate
                                   {"seed":7}: streams 50 to 500 tokens
                                   (drawn from seed) in chunks of up to 50
  grpc.health.v1.Health            never limited
  grpc.reflection.v1(alpha)        server reflection (grpcurl list), never limited

Limits (limits.yaml, -config replaces them):
  Greet per API key                1/second, burst 5
  every method per client IP       200/second, burst 100
  calls in flight per client IP    20 (-redis: 4 while Redis is out)
  Generate tokens per API key      2000 per minute (-tokens): 250 held
                                   when the call opens, each chunk charged
                                   as it is made; the stream ends
                                   RESOURCE_EXHAUSTED when they are spent

Identity metadata:
  x-api-key: KEY                   the API key
  x-user-id: USER                  the user
  (the client IP is the peer address)

Denials: RESOURCE_EXHAUSTED (rate, concurrency) or UNAVAILABLE (shedding),
with google.rpc.RetryInfo and QuotaFailure details.

Flags:
`

// run serves until ctx ends, printing messages to out and telemetry to
// otelOut. ready, when set, receives the address it listens on.
func run(ctx context.Context, args []string, out, otelOut io.Writer, ready func(addr string)) (err error) {
	fs := flag.NewFlagSet("grpcserver", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:50051", "listen address")
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9464", "where to serve Prometheus metrics (http://ADDR/metrics); empty: nowhere")
	redisAddr := fs.String("redis", "", "Redis address (host:port); empty keeps every limit in memory")
	config := fs.String("config", "", "rate-limit rules (YAML, see docs/tiers.md); empty uses examples/grpcserver/limits.yaml, embedded")
	budget := fs.Duration("redis-budget", 50*time.Millisecond, "time one Redis call may take before the fallback decides locally")
	tokens := fs.Int64("tokens", 0, "Generate tokens per minute per API key: the rate of the config's generate_tokens rule (0: as the config says, 2000 in the embedded one)")
	otelFlags := demo.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	tel, err := demo.Setup("spillway-grpcserver", otelFlags, *metricsAddr != "", otelOut)
	if err != nil {
		return err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = errors.Join(err, tel.Shutdown(c))
	}()

	var cfg *tiers.Config
	if *config == "" {
		cfg, err = tiers.Parse("limits.yaml", defaultLimits)
	} else {
		cfg, err = tiers.ParseFile(*config)
	}
	if err != nil {
		return err
	}
	if *tokens != 0 {
		if err := demo.SetRate(cfg, "generate_tokens", *tokens, time.Minute); err != nil {
			return fmt.Errorf("-tokens: %w", err)
		}
	}
	chain, describe, closeAll, err := build(ctx, cfg, *redisAddr, *budget, tel)
	if err != nil {
		return err
	}
	defer closeAll()

	set := grpcx.ServerSettings{
		Skip: grpcx.SkipMethods("/grpc.health.v1.Health/",
			"/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"),
		APIKeyMetadata: "x-api-key",
		UserMetadata:   "x-user-id",
		// Calls are metered: the generate_tokens rule (cost: response)
		// holds its estimate when Generate opens and charges the chunks
		// it reports.
		Usage: true,
	}
	tracer := tel.TracerProvider.Tracer("github.com/spillway-go/spillway/examples/grpcserver")
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(demo.TraceUnary(tracer), grpcx.UnaryServerInterceptor(chain, set)),
		grpc.ChainStreamInterceptor(demo.TraceStream(tracer), grpcx.StreamServerInterceptor(chain, set)),
	)
	greeterpb.RegisterGreeterServer(srv, greeter{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	if *metricsAddr != "" {
		mln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("-metrics-addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", tel.Metrics)
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		defer msrv.Close()
		go func() {
			if err := msrv.Serve(mln); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
		fmt.Fprintf(out, "metrics on http://%s/metrics\n", mln.Addr())
	}
	fmt.Fprintf(out, "spillway demo gRPC service listening on %s (%s)\n", ln.Addr(), describe)
	if ready != nil {
		ready(ln.Addr().String())
	}
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		srv.Stop()
		return err
	case <-ctx.Done():
	}
	srv.GracefulStop()
	return nil
}

func build(ctx context.Context, cfg *tiers.Config, redisAddr string, budget time.Duration, tel *demo.Telemetry) (spillway.Limiter, string, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) (spillway.Limiter, string, func(), error) {
		closeAll()
		return nil, "", nil, err
	}
	worker, err := shedder.NewWorker(workerCapacity, shedder.WorkerSettings{Name: "worker"})
	if err != nil {
		return fail(err)
	}
	if redisAddr == "" {
		store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{})
		rate, err := tiers.New(cfg, store, tiers.Settings{Name: "tiers", HoldObserver: telemetry.NewHoldMetrics("grpc", tel.MeterProvider)})
		if err != nil {
			return fail(err)
		}
		conc, err := concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), perIPConcurrency, concurrency.Settings{Name: "per_ip_concurrency"})
		if err != nil {
			return fail(err)
		}
		chain := telemetry.Instrument(spillway.Chain(rate, concurrency.PerKey(conc, spillway.DimIP), worker), "grpc", tel.Settings())
		return chain, "store: memory; chain: tiers → per-IP concurrency → worker shedder (the fleet shedder needs -redis)", closeAll, nil
	}

	// One health for the one Redis: K failures seen by any block (or by
	// the fleet's reports) stop every block from calling it; go-redis's
	// own dial errors are logged once per 10 s.
	conn, err := demo.ConnectRedis(ctx, redisAddr, budget, tel.MeterProvider)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, conn.Close)
	rdb := conn.Client
	settings := func(name string) fallback.Settings { return conn.Settings(name, budget) }

	// Rules marked "fail: closed" deny while Redis is out: their store
	// items say so, and the fallback store honours it.
	redisStore, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{})
	if err != nil {
		return fail(err)
	}
	rateStore, err := fallback.NewStore(redisStore, settings("rate"))
	if err != nil {
		return fail(err)
	}
	rate, err := tiers.New(cfg, rateStore, tiers.Settings{Name: "tiers", HoldObserver: telemetry.NewHoldMetrics("grpc", tel.MeterProvider)})
	if err != nil {
		return fail(err)
	}
	cstore, err := concurrency.NewRedisStore(rdb, concurrency.RedisSettings{})
	if err != nil {
		return fail(err)
	}
	cshared, err := concurrency.New(cstore, perIPConcurrency, concurrency.Settings{Name: "per_ip_concurrency", ReleaseTimeout: budget})
	if err != nil {
		return fail(err)
	}
	// While Redis is out the limiter decides by itself at this server's share.
	conc := concurrency.PerKey(cshared, spillway.DimIP)
	fleet, err := shedder.NewFleet(rdb, "demo-grpc", fleetCapacity, shedder.FleetSettings{Timeout: budget})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		fleet.Close(c)
	})
	// One budget per request: the whole admission waits on Redis for at
	// most -redis-budget, however many blocks call it.
	chain := telemetry.Instrument(spillway.ChainBudget(budget, rate, conc, fleet, worker), "grpc", tel.Settings())
	return chain, "store: redis " + redisAddr + "; chain: tiers → per-IP concurrency → fleet shedder → worker shedder, one budget per request, one health for the Redis", closeAll, nil
}
