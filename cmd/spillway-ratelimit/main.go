// Command spillway-ratelimit is a drop-in for Envoy's rate limit service
// (envoyproxy/ratelimit): the same gRPC API, config files and environment
// variables, with spillway's decisions behind them. See docs/rls.md.
//
//	go install ./cmd/spillway-ratelimit   # from a clone of the repository
//	REDIS_SOCKET_TYPE=tcp REDIS_URL=localhost:6379 RUNTIME_ROOT=./examples/rls \
//	RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false spillway-ratelimit
//
// spillway-ratelimit check -config_dir DIR validates a config directory
// (as the reference's config check command does) and exits 1 if a file
// does not load. -version prints the version; -h the usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spillway-go/spillway/rls"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `spillway-ratelimit: Envoy's rate limit service (envoyproxy/ratelimit's API,
config files and environment variables) with spillway's decisions.

Usage:
  spillway-ratelimit                 serve, configured by the environment
                                     (REDIS_URL, RUNTIME_ROOT, GRPC_PORT, ...: docs/rls.md)
  spillway-ratelimit check -config_dir DIR [-merge_domain_configs]
                                     validate the config files in DIR; exit 1 if one does not load
  spillway-ratelimit -version        print the version
  spillway-ratelimit -h              print this help

SIGTERM or SIGINT: health turns NOT_SERVING, then the server drains within
SPILLWAY_DRAIN (25s); a second signal exits at once.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "check" {
		return check(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("spillway-ratelimit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() { fmt.Fprint(stdout, usage) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "spillway-ratelimit: unexpected argument %q (see -h)\n", fs.Arg(0))
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, "spillway-ratelimit", versionOf())
		return 0
	}
	if os.Getenv("GOGC") == "" {
		// The live heap is small (configs, counters, connections), so the
		// default GOGC=100 collects every few MB of short-lived request
		// garbage; 400 trades a few MB more for far fewer collections.
		debug.SetGCPercent(400)
	}
	set, notices, err := rls.Env(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		cancel() // the graceful shutdown
		s := <-sig
		fmt.Fprintf(stderr, "spillway-ratelimit: second signal (%v): exiting now\n", s)
		os.Exit(1)
	}()
	if err := rls.Run(ctx, set, notices); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// versionOf is the module version and the VCS revision the binary was
// built from, as far as the build recorded them.
func versionOf() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" {
		v += " " + rev + dirty
	}
	return v + " " + bi.GoVersion
}

// check validates a config directory as the reference's config check
// command does, with its messages: every file loaded together, exit 1 on
// the first error.
func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("spillway-ratelimit check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var dir string
	fs.StringVar(&dir, "config_dir", "", "path to directory containing rate limit configs")
	fs.StringVar(&dir, "config-dir", "", "the same as -config_dir")
	merge := fs.Bool("merge_domain_configs", false, "whether to merge configurations, referencing the same domain")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if dir == "" {
		fmt.Fprintln(stderr, "spillway-ratelimit check: -config_dir is required")
		return 2
	}
	fmt.Fprintf(stdout, "checking rate limit configs...\nloading config directory: %s\n", dir)
	files, err := rls.ReadDir(dir, false)
	if err != nil {
		fmt.Fprintf(stdout, "error opening directory %s: %s\n", dir, err)
		return 1
	}
	for _, f := range files {
		fmt.Fprintf(stdout, "opening config file: %s\n", f.Name)
	}
	if _, err := rls.Load(files, rls.LoadOptions{MergeDomains: *merge}); err != nil {
		fmt.Fprintf(stdout, "error loading rate limit configs: %s\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "all rate limit configs ok")
	return 0
}
