// Command rlsnop is a do-nothing Envoy rate limit service: every
// ShouldRateLimit call is answered OK at once. It listens where the
// reference server would, from the same environment variables: gRPC on
// GRPC_HOST:GRPC_PORT (default 0.0.0.0:8081) and HTTP /healthcheck on
// HOST:PORT (default 0.0.0.0:8080); with DEBUG_PORT set, net/http/pprof on
// DEBUG_HOST:DEBUG_PORT as the reference serves it; with
// RLSNOP_STREAM_WORKERS=n, n gRPC stream workers (grpc.NumStreamWorkers)
// instead of a goroutine per call. cmd/rlsbench runs it beside the real
// servers as the ceiling of the machine.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // the profiling endpoints on http.DefaultServeMux, served on DEBUG_PORT
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/spillway-go/spillway/bench/rlsload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rlsnop:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func run() error {
	grpcAddr := net.JoinHostPort(env("GRPC_HOST", "0.0.0.0"), env("GRPC_PORT", "8081"))
	httpAddr := net.JoinHostPort(env("HOST", "0.0.0.0"), env("PORT", "8080"))
	gl, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	var opts []grpc.ServerOption
	if w, err := strconv.Atoi(os.Getenv("RLSNOP_STREAM_WORKERS")); err == nil && w > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(w)))
	}
	gs := grpc.NewServer(opts...)
	rlsload.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("OK")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	if port := os.Getenv("DEBUG_PORT"); port != "" {
		debug := &http.Server{Addr: net.JoinHostPort(env("DEBUG_HOST", "0.0.0.0"), port), ReadHeaderTimeout: 5 * time.Second}
		go func() { fmt.Fprintln(os.Stderr, "rlsnop: debug listener:", debug.ListenAndServe()) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	errs := make(chan error, 2)
	go func() { errs <- gs.Serve(gl) }()
	go func() { errs <- srv.Serve(hl) }()
	select {
	case err = <-errs:
	case <-ctx.Done():
	}
	gs.Stop()
	_ = srv.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
