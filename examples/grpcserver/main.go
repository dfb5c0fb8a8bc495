// Command grpcserver is a demo gRPC service behind the spillway chain:
// rate tiers from a YAML file, a per-IP concurrency limit and the worker
// load shedder (and, with -redis, the fleet shedder, with the Redis-backed
// blocks wrapped in the fallback). It serves demo.Greeter/Greet, a unary
// method defined by hand with a JSON codec (no protoc), and the standard
// grpc.health.v1.Health service, which is never limited.
//
//	go run ./examples/grpcserver                        # in-memory
//	go run ./examples/grpcserver -redis 127.0.0.1:6379
//	go run ./examples/grpcserver -otel none            # no telemetry output
//
// Identity: API key from the "x-api-key" metadata, user from "x-user-id",
// IP from the peer. Denials are ResourceExhausted (rate, concurrency) or
// Unavailable (shedding) with RetryInfo and QuotaFailure details.
//
// Telemetry (otel.go): an OpenTelemetry SDK with the stdout exporters prints,
// as one JSON line each (-otel-pretty indents them), every denied call's span
// with its spillway.decision event and, every 10 s (-otel-interval) when
// there was traffic, the spillway.decisions counter and the
// spillway.decision.duration histogram of that interval.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/spillway-go/spillway/tiers"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

//go:embed limits.yaml
var defaultLimits []byte

const (
	perIPConcurrency = 20
	workerCapacity   = 128
	fleetCapacity    = 512
)

// JSONCodec marshals messages as JSON. Clients select it with
// grpc.CallContentSubtype(JSONCodec{}.Name()).
type JSONCodec struct{}

// Marshal implements encoding.Codec.
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal implements encoding.Codec.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// Name implements encoding.Codec.
func (JSONCodec) Name() string { return "json" }

func init() { encoding.RegisterCodec(JSONCodec{}) }

// GreetRequest and GreetReply are the messages of demo.Greeter/Greet.
type GreetRequest struct {
	Name string `json:"name"`
}

// GreetReply is the answer of demo.Greeter/Greet.
type GreetReply struct {
	Message string `json:"message"`
}

// GreetMethod is the full method name of the demo call.
const GreetMethod = "/demo.Greeter/Greet"

type greeter interface {
	Greet(context.Context, *GreetRequest) (*GreetReply, error)
}

type greeterServer struct{}

func (greeterServer) Greet(_ context.Context, r *GreetRequest) (*GreetReply, error) {
	return &GreetReply{Message: "hello, " + r.Name}, nil
}

var greeterDesc = grpc.ServiceDesc{
	ServiceName: "demo.Greeter",
	HandlerType: (*greeter)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Greet",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(GreetRequest)
			if err := dec(in); err != nil {
				return nil, err
			}
			if icpt == nil {
				return srv.(greeter).Greet(ctx, in)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: GreetMethod}
			return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return srv.(greeter).Greet(ctx, req.(*GreetRequest))
			})
		},
	}},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "grpcserver:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, printing messages to out and telemetry to
// otelOut. ready, when set, receives the address it listens on.
func run(ctx context.Context, args []string, out, otelOut io.Writer, ready func(addr string)) (err error) {
	fs := flag.NewFlagSet("grpcserver", flag.ContinueOnError)
	fs.SetOutput(out)
	addr := fs.String("addr", "127.0.0.1:50051", "listen address")
	redisAddr := fs.String("redis", "", "Redis address (host:port); empty keeps every limit in memory")
	config := fs.String("config", "", "rate-limit rules (YAML); empty uses examples/grpcserver/limits.yaml, embedded")
	budget := fs.Duration("redis-budget", 50*time.Millisecond, "time one Redis call may take before the fallback decides locally")
	otelMode := fs.String("otel", "stdout", "telemetry exporter: stdout (denied calls' spans, metrics every -otel-interval) or none")
	otelInterval := fs.Duration("otel-interval", 10*time.Second, "how often metrics are exported")
	otelPretty := fs.Bool("otel-pretty", false, "indent the telemetry JSON instead of one line per document")
	if err := fs.Parse(args); err != nil {
		return err
	}
	otelp, err := setupOTel(*otelMode, otelOut, *otelInterval, *otelPretty)
	if err != nil {
		return err
	}
	defer func() {
		// Flush what is left: the spans and the last interval's metrics.
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = errors.Join(err, otelp.shutdown(c))
	}()
	tel := []telemetry.Option{telemetry.WithTracerProvider(otelp.tp), telemetry.WithMeterProvider(otelp.mp)}

	var cfg *tiers.Config
	if *config == "" {
		cfg, err = tiers.Parse("limits.yaml", defaultLimits)
	} else {
		cfg, err = tiers.ParseFile(*config)
	}
	if err != nil {
		return err
	}
	chain, describe, closeAll, err := build(ctx, cfg, *redisAddr, *budget, tel)
	if err != nil {
		return err
	}
	defer closeAll()

	opts := []grpcx.Option{
		grpcx.WithSkip(grpcx.SkipHealthChecks),
		grpcx.WithAPIKeyMetadata("x-api-key"),
		grpcx.WithUserMetadata("x-user-id"),
	}
	tracer := otelp.tp.Tracer("github.com/spillway-go/spillway/examples/grpcserver")
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(tracedUnary(tracer), grpcx.UnaryServerInterceptor(chain, opts...)),
		grpc.ChainStreamInterceptor(tracedStream(tracer), grpcx.StreamServerInterceptor(chain, opts...)),
	)
	srv.RegisterService(&greeterDesc, greeterServer{})
	healthpb.RegisterHealthServer(srv, health.NewServer())

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "spillway demo gRPC service listening on %s (%s)\n", ln.Addr(), describe)
	if ready != nil {
		ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	srv.GracefulStop()
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

func build(ctx context.Context, cfg *tiers.Config, redisAddr string, budget time.Duration, tel []telemetry.Option) (spillway.Limiter, string, func(), error) {
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
	worker, err := shedder.NewWorker(workerCapacity, shedder.WithName("worker"))
	if err != nil {
		return fail(err)
	}
	if redisAddr == "" {
		rate, err := tiers.New(cfg, ratelimit.NewMemoryStore(), tiers.WithName("tiers"))
		if err != nil {
			return fail(err)
		}
		conc, err := concurrency.New(concurrency.NewMemoryStore(), perIPConcurrency, concurrency.WithName("per_ip_concurrency"))
		if err != nil {
			return fail(err)
		}
		chain := telemetry.Instrument(spillway.Chain(rate, concurrency.PerKey(conc, spillway.DimIP), worker), "grpc", tel...)
		return chain, "store: memory; chain: tiers → per-IP concurrency → worker shedder (the fleet shedder needs -redis)", closeAll, nil
	}

	opt := &redis.Options{Addr: redisAddr}
	if budget > fallback.ClientIOTimeout {
		opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = budget, budget, budget
	}
	fallback.TuneOptions(opt)
	rdb := redis.NewClient(opt)
	closers = append(closers, func() { rdb.Close() })
	pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		return fail(fmt.Errorf("redis %s: %w", redisAddr, err))
	}
	// Rules marked "fail: closed" deny while Redis is out: their store
	// items say so, and the fallback store honours it.
	rateStore, err := fallback.NewStore(ratelimit.NewRedisStore(rdb), fallback.Settings{Name: "rate", Budget: budget})
	if err != nil {
		return fail(err)
	}
	rate, err := tiers.New(cfg, rateStore, tiers.WithName("tiers"))
	if err != nil {
		return fail(err)
	}
	cstore, err := concurrency.NewRedisStore(rdb)
	if err != nil {
		return fail(err)
	}
	cshared, err := concurrency.New(cstore, perIPConcurrency, concurrency.WithName("per_ip_concurrency"), concurrency.WithReleaseTimeout(budget))
	if err != nil {
		return fail(err)
	}
	clocal, err := concurrency.New(concurrency.NewMemoryStore(), perIPConcurrency/5, concurrency.WithName("per_ip_concurrency"))
	if err != nil {
		return fail(err)
	}
	conc, err := fallback.NewLimiter(concurrency.PerKey(cshared, spillway.DimIP), concurrency.PerKey(clocal, spillway.DimIP), fallback.Settings{Name: "concurrency", Budget: budget})
	if err != nil {
		return fail(err)
	}
	fleet, err := shedder.NewFleet(rdb, "demo-grpc", fleetCapacity, shedder.WithName("fleet"), shedder.WithTimeout(budget))
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		fleet.Close(c)
	})
	chain := telemetry.Instrument(spillway.Chain(rate, conc, fleet, worker), "grpc", tel...)
	return chain, "store: redis " + redisAddr + "; chain: tiers → per-IP concurrency → fleet shedder → worker shedder, Redis blocks behind the fallback", closeAll, nil
}
