// Command spillway-ratelimit is a drop-in for Envoy's rate limit service
// (envoyproxy/ratelimit): the same gRPC API, config files and environment
// variables, with spillway's decisions behind them. See docs/rls.md.
//
//	go install ./cmd/spillway-ratelimit   # from a clone of the repository
//	REDIS_SOCKET_TYPE=tcp REDIS_URL=localhost:6379 RUNTIME_ROOT=./examples/rls \
//	RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false spillway-ratelimit
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spillway-go/spillway/rls"
)

func main() {
	if os.Getenv("GOGC") == "" {
		// The live heap is small (configs, counters, connections), so the
		// default GOGC=100 collects every few MB of short-lived request
		// garbage; 400 trades a few MB more for far fewer collections.
		debug.SetGCPercent(400)
	}
	set, notices, err := rls.Env(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := rls.Run(ctx, set, notices); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
