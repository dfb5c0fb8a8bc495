// Command rlsprof is cmd/spillway-ratelimit with net/http/pprof served on
// DEBUG_HOST:DEBUG_PORT (default 127.0.0.1:6070), for CPU profiles under
// load: rlsbench -profile builds it instead of the plain binary. The server
// is the same rls.Run with the same settings.
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // the profiling endpoints on http.DefaultServeMux
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spillway-go/spillway/rls"
)

func main() {
	host, port := os.Getenv("DEBUG_HOST"), os.Getenv("DEBUG_PORT")
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "6070"
	}
	debug := &http.Server{Addr: net.JoinHostPort(host, port), ReadHeaderTimeout: 5 * time.Second}
	go func() { fmt.Fprintln(os.Stderr, "rlsprof:", debug.ListenAndServe()) }()

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
