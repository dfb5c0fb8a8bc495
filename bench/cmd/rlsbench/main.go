// Command rlsbench measures Envoy rate limit services side by side:
// spillway's (cmd/spillway-ratelimit, built from this checkout), the
// reference envoyproxy/ratelimit (built from the Go module proxy at the
// version bench/go.mod pins, its own main package unchanged) and a
// do-nothing server of the same API (cmd/rlsnop: the ceiling of the machine
// with this load generator). Run from bench/:
//
//	go run ./cmd/rlsbench -rounds 3
//
// It starts one redis-server on a free loopback port, writes one config
// (domain "bench"; descriptors user, ip and api_key, each -limit per
// second), starts the three servers with the same environment variables
// (the reference's: REDIS_URL, RUNTIME_ROOT, GRPC_PORT …) and then, round
// after round, for one and for three descriptors per call, runs the same
// gRPC load (rlsload: -callers callers over -conns connections, -keys keys,
// a -duration window after -warmup) against each server in turn, the order
// rotating each round, Redis flushed before each turn. Last comes the
// outage test: for spillway and for the reference, Redis is stopped
// (SIGSTOP) while the callers keep calling for -outage-window, every call
// with a deadline of -call-timeout; then Redis is resumed (SIGCONT).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-go/spillway/bench/rlsload"
	"github.com/spillway-go/spillway/internal/genmd"
	"github.com/spillway-go/spillway/internal/redistest"
)

// reference is the reference server's main package; bench/go.mod pins its
// module version (a tool directive).
const reference = "github.com/envoyproxy/ratelimit/src/service_cmd"

var (
	rounds       = flag.Int("rounds", 3, "rounds; each runs every server once for each descriptor count")
	duration     = flag.Duration("duration", 10*time.Second, "measured window of each turn")
	warmup       = flag.Duration("warmup", 2*time.Second, "calls before each measured window, not counted")
	callers      = flag.Int("callers", 64, "concurrent callers")
	conns        = flag.Int("conns", 4, "gRPC connections the callers share")
	keys         = flag.Int("keys", 10_000, "distinct values of each descriptor key")
	descs        = flag.String("descriptors", "1,3", "descriptor counts per call to measure (1: user; 3: user, ip, api_key)")
	rate         = flag.Float64("rate", 0, "calls/s offered by all callers together (open loop); 0: closed loop")
	limit        = flag.Int("limit", 100, "requests_per_unit (unit: second) of every descriptor; at 10k keys nothing is denied")
	only         = flag.String("only", "nothing,spillway,reference", "servers to run, of nothing, spillway, reference")
	pool         = flag.Int("pool", 0, "REDIS_POOL_SIZE for both servers; 0 leaves each server's default (10 for both)")
	outage       = flag.Bool("outage", true, "run the outage test (Redis stopped with SIGSTOP) at the end")
	outageWindow = flag.Duration("outage-window", 5*time.Second, "how long callers keep calling while Redis is stopped")
	callTimeout  = flag.Duration("call-timeout", 35*time.Second, "each call's deadline")
	budget       = flag.Duration("budget", 50*time.Millisecond, "spillway's budget (SPILLWAY_BUDGET); the outage target is budget + 20 ms")
	profile      = flag.String("profile", "", "write CPU profiles of the servers' middle half of each window of the first round to PREFIX-<server>-<descriptors>.pprof (each server serves /debug/pprof on DEBUG_PORT)")
	spillwaySrc  = flag.String("spillway-src", "..", "the checkout of spillway whose cmd/spillway-ratelimit is measured (to compare two versions)")
	baseSrc      = flag.String("base-src", "", "another checkout of spillway (e.g. the main branch) whose cmd/spillway-ratelimit is measured in the same run as server \"base\", with spillway's environment: an A/B of two versions under the same load")
	refEnv       = flag.String("reference-env", "", "extra environment of the reference, comma-separated (e.g. REDIS_PIPELINE_WINDOW=150us,REDIS_PIPELINE_LIMIT=8)")
	spillwayEnv  = flag.String("spillway-env", "", "extra environment of spillway's server, comma-separated (e.g. SPILLWAY_BUDGET=1s)")
	nothingEnv   = flag.String("nothing-env", "", "extra environment of the do-nothing server, comma-separated (it runs with RLSNOP_STREAM_WORKERS=256,GOGC=400, the gRPC and GC settings of spillway's binary; e.g. RLSNOP_STREAM_WORKERS=0 for grpc's default)")
	overload     = flag.Bool("overload", false, "instead of the rounds: for each server and descriptor count, its closed-loop capacity, then open loop at 3/4 and 1.5 times it with 20 ms deadlines (calls answered in time, deadline exceeded, refused at once, descriptors decided locally, breaker openings); -md writes that table")
	profileMD    = flag.String("profile-md", "", "with -profile: write a markdown table of the spillway server's own functions by CPU per call (before and after, with -base-src) to this file (relative to bench/, e.g. ../docs/figures/rls-profile.md)")
	md           = flag.String("md", "", "write the summary and the outage test as markdown to this file (relative to bench/, e.g. ../docs/figures/rls-bench.md), with a header naming the command, date, commit and load average")
	keep         = flag.Bool("keep", false, "keep the temporary directory (binaries, config, logs)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *profileMD != "" && *profile == "" {
		return errors.New("-profile-md needs -profile")
	}
	names, err := servers(*only)
	if err != nil {
		return err
	}
	if *baseSrc != "" && slices.Contains(names, "spillway") {
		names = append(names, "base")
	}
	counts, err := descriptorCounts(*descs)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "rlsbench-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Printf("# files in %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}

	bins, err := build(ctx, tmp, names)
	if err != nil {
		return err
	}
	runtimeRoot := filepath.Join(tmp, "runtime")
	cfgDir := filepath.Join(runtimeRoot, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(config(*limit)), 0o644); err != nil {
		return err
	}

	rdb, err := redistest.StartServer(tmp)
	if err != nil {
		return err
	}
	defer rdb.Stop()

	redisPid, err := pidOf(ctx, rdb)
	if err != nil {
		return err
	}
	srvs := map[string]*server{}
	for _, name := range names {
		s, err := start(ctx, name, bins[name], tmp, rdb.Addr, runtimeRoot)
		if err != nil {
			return err
		}
		defer s.stop()
		srvs[name] = s
	}

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	printf := func(format string, args ...any) {
		fmt.Fprintf(out, format, args...)
		_ = out.Flush()
	}
	printf("# rlsbench %s: %d callers over %d connections, %d keys, %v window after %v warm-up, %s, limit %d/second per descriptor, redis-server %s\n",
		time.Now().UTC().Format(time.RFC3339), *callers, *conns, *keys, *duration, *warmup, loop(), *limit, rdb.Addr)
	printf("# reference: %s\n", referenceVersion())
	startLoad := loadavg()
	printf("# load average at start: %s\n", startLoad)
	if *overload {
		rows, err := overloadTest(ctx, printf, names, counts, srvs, rdb, redisPid)
		if err != nil {
			return err
		}
		if *md != "" {
			body := fmt.Sprintf("Closed-loop capacity (calls answered OK or OVER_LIMIT per second, %d callers over %d connections, deadline %v), then open loop at ¾ and 1.5× of it, each call's deadline %v; %d keys, %v window after %v warm-up, limit %d/second per descriptor; reference %s. *Refused*: answered before the deadline with an error (spillway: `SPILLWAY_LATE_ANSWER`); *local*: descriptors decided by the local share; *opened*: breaker openings; Redis µs: its CPU per call; *CPU cores*: CPU seconds per second of the turn of the server, redis-server and the load generator, which share this machine's %d cores. The do-nothing server (*nothing*, no Redis) is the control: what this machine, gRPC and the load generator allow under the same load.\n\n",
				*callers, *conns, *callTimeout, overloadDeadline, *keys, *duration, *warmup, *limit, referenceVersion(), runtime.NumCPU())
			body += genmd.Table(overloadHeader, rows)
			if err := genmd.Write(*md, commandLine(), startLoad, body); err != nil {
				return fmt.Errorf("-md: %w", err)
			}
			printf("# wrote %s\n", *md)
		}
		printf("# load average at end: %s\n", loadavg())
		return nil
	}

	printf("# cpu µs/call: CPU time (user+sys) per call of the server, redis-server and this load generator over the turn (warm-up included, and what the server did after it until it and Redis were idle)\n")
	printf("# degraded: descriptors spillway decided by its local share (Redis not answering within the budget), from its Prometheus endpoint\n")
	printf("%-5s %-3s %-10s %10s %9s %9s %9s %9s %8s %6s %6s %8s %24s  %s\n",
		"round", "dsc", "server", "calls/s", "p50", "p99", "p99.9", "max", "ok", "over", "errors", "degraded", "cpu µs/call srv/rds/gen", "loadavg")

	results := map[key][]*rlsload.Result{}
	cpus := map[key][]usPerCall{}
	for r := range *rounds {
		for _, n := range counts {
			order := rotate(names, r)
			for _, name := range order {
				if err := flush(ctx, rdb); err != nil {
					return err
				}
				la := loadavg()
				prof := (<-chan error)(nil)
				if *profile != "" && r == 0 {
					prof = takeProfile(srvs[name].debugAddr, *warmup+*duration/4, *duration/2, fmt.Sprintf("%s-%s-%d.pprof", *profile, name, n))
				}
				cpu0 := cpuTimes(srvs[name].cmd.Process.Pid, redisPid)
				deg0 := srvs[name].degraded()
				res, err := rlsload.Run(ctx, rlsload.Config{
					Target: srvs[name].grpcAddr, Conns: *conns, Callers: *callers, Keys: *keys, Descriptors: n,
					Warmup: *warmup, Duration: *duration, Rate: *rate, CallTimeout: *callTimeout, Seed: uint64(r),
				})
				if err != nil {
					return err
				}
				// work the turn left behind (spillway's reconciliation of
				// degraded decisions) ends before the CPU is read and the
				// next turn starts
				settle(ctx, srvs[name].cmd.Process.Pid, redisPid)
				cpu := "-"
				if res.Calls > 0 {
					u := cpuTimes(srvs[name].cmd.Process.Pid, redisPid).usPer(cpu0, res.Calls, *duration+*warmup, *duration)
					cpus[key{name, n}] = append(cpus[key{name, n}], u)
					cpu = u.String()
				}
				if prof != nil {
					if err := <-prof; err != nil {
						printf("# profile: %v\n", err)
					}
				}
				deg := since(deg0, srvs[name].degraded())
				results[key{name, n}] = append(results[key{name, n}], res)
				printf("%-5d %-3d %-10s %10.0f %9s %9s %9s %9s %8d %6d %6d %8s %24s  %s\n",
					r+1, n, name, res.PerSecond(), ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Quantile(0.999)), ms(res.Max()),
					res.OK, res.OverLimit, res.Errors, count(deg), cpu, la)
				if res.FirstError != "" {
					printf("#   first error: %s\n", res.FirstError)
				}
				if cs, err := commands(ctx, rdb, res.Calls, *duration+*warmup, *duration); err != nil {
					return err
				} else if cs != "" {
					printf("#   redis: %s\n", cs)
				}
				if err := srvs[name].alive(); err != nil {
					return err
				}
			}
		}
	}
	printf("\n")
	summary(printf, names, counts, results)
	if *profileMD != "" && *profile != "" {
		body, err := profileMarkdown(counts, results)
		if err != nil {
			return err
		}
		if err := genmd.Write(*profileMD, commandLine(), startLoad, body); err != nil {
			return fmt.Errorf("-profile-md: %w", err)
		}
		printf("# wrote %s\n", *profileMD)
	}

	var outageRows [][]string
	if *outage {
		printf("\n# outage: Redis stopped (SIGSTOP) while %d callers call for %v, one descriptor, each call's deadline %v; target: every call answered within budget %v + 20 ms\n",
			*callers, *outageWindow, *callTimeout, *budget)
		printf("# (the do-nothing server, which never calls Redis, is the control: its latencies are this machine's queueing under the same load)\n")
		printf("%-10s %7s %6s %6s %6s %8s %9s %9s %9s %9s %9s  %s\n",
			"server", "calls", "ok", "over", "errors", "degraded", ">bound", "first", "p50", "p99", "max", "after SIGCONT")
		for _, name := range names {
			row, err := outageTest(ctx, printf, srvs[name], rdb, redisPid)
			if err != nil {
				return err
			}
			outageRows = append(outageRows, row)
		}
	}
	if *md != "" {
		body := markdown(names, counts, results, cpus, outageRows)
		if err := genmd.Write(*md, commandLine(), startLoad, body); err != nil {
			return fmt.Errorf("-md: %w", err)
		}
		printf("# wrote %s\n", *md)
	}
	printf("# load average at end: %s\n", loadavg())
	return nil
}

type key struct {
	server string
	descs  int
}

func servers(list string) ([]string, error) {
	var names []string
	for n := range strings.SplitSeq(list, ",") {
		n = strings.TrimSpace(n)
		switch n {
		case "nothing", "spillway", "reference":
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		case "":
		default:
			return nil, fmt.Errorf("-only: unknown server %q (nothing, spillway, reference)", n)
		}
	}
	if len(names) == 0 {
		return nil, errors.New("-only names no server")
	}
	return names, nil
}

func descriptorCounts(list string) ([]int, error) {
	var counts []int
	for s := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || (n != 1 && n != 3) {
			return nil, fmt.Errorf("-descriptors: %q is not 1 or 3", s)
		}
		counts = append(counts, n)
	}
	return counts, nil
}

func loop() string {
	if *rate > 0 {
		return fmt.Sprintf("open loop at %.0f calls/s", *rate)
	}
	return "closed loop"
}

// rotate returns names rotated left by r, so that each server goes first
// in turn.
func rotate(names []string, r int) []string {
	r %= len(names)
	return append(slices.Clone(names[r:]), names[:r]...)
}

// config is the reference's config file that every server reads.
func config(limit int) string {
	var sb strings.Builder
	sb.WriteString("domain: bench\ndescriptors:\n")
	for _, k := range []string{"user", "ip", "api_key"} {
		fmt.Fprintf(&sb, "  - key: %s\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", k, limit)
	}
	return sb.String()
}

// build builds the servers' binaries into dir.
func build(ctx context.Context, dir string, names []string) (map[string]string, error) {
	bins := map[string]string{}
	for _, name := range names {
		bin := filepath.Join(dir, name)
		var args []string
		switch name {
		case "nothing":
			args = []string{"build", "-o", bin, "./cmd/rlsnop"}
		case "reference":
			args = []string{"build", "-o", bin, reference}
		case "spillway", "base":
			// From the command's directory: a module of its own (built
			// alone with GOWORK=off, or through the checkout's go.work),
			// or, in older checkouts, a package of the root module.
			src := *spillwaySrc
			if name == "base" {
				src = *baseSrc
			}
			args = []string{"build", "-C", filepath.Join(src, "cmd", "spillway-ratelimit"), "-o", bin, "."}
		}
		fmt.Fprintf(os.Stderr, "rlsbench: go %s\n", strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, "go", args...)
		if name != "spillway" && name != "base" {
			// the bench module alone: in the checkout's workspace the
			// modules' requirements meet, and the reference's otelgrpc
			// would be raised past the version its source builds with
			cmd.Env = append(os.Environ(), "GOWORK=off")
		}
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("building %s (run rlsbench from bench/): %w", name, err)
		}
		bins[name] = bin
	}
	return bins, nil
}

// referenceVersion is the reference's module version in the build list.
func referenceVersion() string {
	cmd := exec.Command("go", "list", "-m", "github.com/envoyproxy/ratelimit")
	cmd.Env = append(os.Environ(), "GOWORK=off") // as build builds it
	out, err := cmd.Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}

// server is one running server process.
type server struct {
	name                          string
	grpcAddr, httpAddr, debugAddr string
	promAddr                      string // spillway's Prometheus endpoint, for its degraded count
	cmd                           *exec.Cmd
	log                           string
	exited                        chan struct{}
	err                           error
}

func freeAddr() (string, error) {
	p, err := redistest.FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// start starts a server with the reference's environment variables and
// waits until GET /healthcheck answers 200.
func start(ctx context.Context, name, bin, dir, redisAddr, runtimeRoot string) (*server, error) {
	s := &server{name: name, log: filepath.Join(dir, name+".log"), exited: make(chan struct{})}
	addrs := make([]string, 4)
	for i := range addrs {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	s.grpcAddr, s.httpAddr, s.debugAddr = addrs[0], addrs[1], addrs[2]
	hostPort := func(a string) (string, string) { h, p, _ := net.SplitHostPort(a); return h, p }
	gh, gp := hostPort(s.grpcAddr)
	hh, hp := hostPort(s.httpAddr)
	dh, dp := hostPort(s.debugAddr)
	env := []string{
		"GRPC_HOST=" + gh, "GRPC_PORT=" + gp, "HOST=" + hh, "PORT=" + hp, "DEBUG_HOST=" + dh, "DEBUG_PORT=" + dp,
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + runtimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "LOG_LEVEL=warn",
	}
	if *pool > 0 {
		env = append(env, "REDIS_POOL_SIZE="+strconv.Itoa(*pool))
	}
	switch name {
	case "spillway", "base":
		s.promAddr = addrs[3]
		env = append(env, "SPILLWAY_BUDGET="+budget.String(), "USE_PROMETHEUS=true", "PROMETHEUS_ADDR="+s.promAddr)
		env = append(env, extraEnv(*spillwayEnv)...)
	case "reference":
		env = append(env, extraEnv(*refEnv)...)
	case "nothing":
		// spillway's binary's gRPC workers and GC setting: the control
		// differs from it by the decision alone
		env = append(env, "RLSNOP_STREAM_WORKERS=256", "GOGC=400")
		env = append(env, extraEnv(*nothingEnv)...)
	}
	logf, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(bin)
	s.cmd.Env = append(os.Environ(), env...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.exited) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := s.alive(); err != nil {
			return nil, err
		}
		resp, err := http.Get("http://" + s.httpAddr + "/healthcheck")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("%s: /healthcheck not 200 after 60s:\n%s", name, tail(s.log))
		}
		select {
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// degraded reads spillway's count of descriptors decided by the local
// share from its Prometheus endpoint; -1 for the other servers or when it
// cannot.
func (s *server) degraded() int64 { return s.metric("spillway_rls_degraded_total") }

// metric reads one of spillway's counters (a metric without labels) from
// its Prometheus endpoint; -1 for the other servers or when it cannot.
func (s *server) metric(name string) int64 {
	if s.promAddr == "" {
		return -1
	}
	resp, err := http.Get("http://" + s.promAddr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// handlerTimes reads spillway's response-time histogram (the time its
// handler took): the calls counted at most 5, 10 and 25 ms, and in all;
// nil for the other servers or when it cannot.
func (s *server) handlerTimes() []int64 {
	var out []int64
	for _, le := range []string{"0.005", "0.01", "0.025", "+Inf"} {
		n := s.metric(`ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="` + le + `"}`)
		if n < 0 {
			return nil
		}
		out = append(out, n)
	}
	return out
}

// slowByStart counts slow calls by their start: the first 100 ms, the
// rest of the first second, then each second.
func slowByStart(calls []rlsload.Call) string {
	type bucket struct {
		name string
		end  time.Duration
		n    int
		max  time.Duration
	}
	bs := []*bucket{{name: "0–0.1s", end: 100 * time.Millisecond}, {name: "0.1–1s", end: time.Second}}
	for _, c := range calls {
		for c.Start >= bs[len(bs)-1].end {
			last := bs[len(bs)-1].end
			bs = append(bs, &bucket{name: fmt.Sprintf("%g–%gs", last.Seconds(), last.Seconds()+1), end: last + time.Second})
		}
		for _, b := range bs {
			if c.Start < b.end {
				b.n++
				b.max = max(b.max, c.Latency)
				break
			}
		}
	}
	var parts []string
	for _, b := range bs {
		if b.n > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d (max %s)", b.name, b.n, ms(b.max)))
		}
	}
	return strings.Join(parts, ", ")
}

// since is b - a of two counts, -1 when either is unknown.
func since(a, b int64) int64 {
	if a < 0 || b < 0 {
		return -1
	}
	return b - a
}

// count formats a count that is negative when unknown.
func count(n int64) string {
	if n < 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

// extraEnv splits a comma-separated list of NAME=value.
func extraEnv(list string) []string {
	var env []string
	for kv := range strings.SplitSeq(list, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			env = append(env, kv)
		}
	}
	return env
}

// alive reports an error when the process has exited.
func (s *server) alive() error {
	select {
	case <-s.exited:
		return fmt.Errorf("%s exited (%v):\n%s", s.name, s.err, tail(s.log))
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to 10 s, then kills.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// flush empties Redis and resets its command statistics.
func flush(ctx context.Context, rdb *redistest.Server) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := rdb.Do(ctx, "FLUSHALL"); err != nil {
		return err
	}
	_, err := rdb.Do(ctx, "CONFIG", "RESETSTAT")
	return err
}

// commands summarizes INFO commandstats since the last flush: each
// command's count per call of the turn (the window's calls scaled to the
// whole turn) and its µs per command in Redis.
func commands(ctx context.Context, rdb *redistest.Server, calls int, turn, window time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := rdb.Do(ctx, "INFO", "commandstats")
	if err != nil {
		return "", err
	}
	stats := redistest.CommandStats(fmt.Sprint(info))
	n := float64(calls) * float64(turn) / float64(window)
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(stats)) {
		st := stats[name]
		if calls == 0 || st.Calls == 0 || strings.HasPrefix(name, "info") || strings.HasPrefix(name, "config") {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.3f/call %.1fµs", name, st.Calls/n, st.Usec/st.Calls))
	}
	return strings.Join(parts, ", "), nil
}

// pidOf reads the redis-server's process id from INFO server.
func pidOf(ctx context.Context, rdb *redistest.Server) (int, error) {
	info, err := rdb.Do(ctx, "INFO", "server")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(fmt.Sprint(info)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// loadavg is the first three fields of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// takeProfile fetches a CPU profile of seconds from the debug listener
// after a delay, into path.
func takeProfile(debugAddr string, delay, length time.Duration, path string) <-chan error {
	done := make(chan error, 1)
	go func() {
		time.Sleep(delay)
		secs := max(1, int(length.Seconds()))
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", debugAddr, secs))
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			done <- fmt.Errorf("profile: %s", resp.Status)
			return
		}
		f, err := os.Create(path)
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	return done
}

// settle waits until the server and redis-server are idle (together at
// most one 10 ms clock tick of CPU in 300 ms), at most 10 s.
func settle(ctx context.Context, srvPid, redisPid int) {
	for range 33 {
		c0 := procCPU(srvPid) + procCPU(redisPid)
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
		if procCPU(srvPid)+procCPU(redisPid)-c0 <= 10*time.Millisecond {
			return
		}
	}
}

// cpu is the CPU time (user + system) used so far by the server, the
// redis-server and this process.
type cpu struct{ srv, rds, gen time.Duration }

func cpuTimes(srvPid, redisPid int) cpu {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	gen := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpu{srv: procCPU(srvPid), rds: procCPU(redisPid), gen: gen}
}

// usPerCall is the CPU time per call of the server, redis-server and this
// load generator over one turn, in µs.
type usPerCall struct{ srv, rds, gen float64 }

// usPer is the CPU time used since c0 per call, the calls of the measured
// window scaled to the whole turn (warm-up and window).
func (c cpu) usPer(c0 cpu, calls int, turn, window time.Duration) usPerCall {
	n := float64(calls) * float64(turn) / float64(window)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 / n }
	return usPerCall{us(c.srv - c0.srv), us(c.rds - c0.rds), us(c.gen - c0.gen)}
}

// String is u as rlsbench prints it: server/redis/generator µs.
func (u usPerCall) String() string { return fmt.Sprintf("%.0f/%.0f/%.0f", u.srv, u.rds, u.gen) }

// procCPU reads utime + stime of a process from /proc (clock ticks of
// 10 ms), 0 when it cannot.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// summary prints each server's range over the rounds, and spillway's ratios
// to the others round by round.
func summary(printf func(string, ...any), names []string, counts []int, results map[key][]*rlsload.Result) {
	printf("# summary over %d rounds (min–max)\n", *rounds)
	for _, n := range counts {
		for _, name := range names {
			rs := results[key{name, n}]
			if len(rs) == 0 {
				continue
			}
			lo, hi := minMax(rs, func(r *rlsload.Result) float64 { return r.PerSecond() })
			plo, phi := minMax(rs, func(r *rlsload.Result) float64 { return float64(r.Quantile(0.99)) / 1e6 })
			printf("%d descriptor(s) %-10s %6.0f–%-6.0f calls/s  p99 %.2f–%.2f ms\n", n, name, lo, hi, plo, phi)
		}
		sp := results[key{"spillway", n}]
		for _, other := range []string{"nothing", "reference", "base"} {
			os := results[key{other, n}]
			if len(sp) == 0 || len(os) == 0 {
				continue
			}
			var ratios, p99s []string
			for i := range min(len(sp), len(os)) {
				ratios = append(ratios, fmt.Sprintf("%.2f", sp[i].PerSecond()/os[i].PerSecond()))
				p99s = append(p99s, fmt.Sprintf("%.2f", float64(sp[i].Quantile(0.99))/float64(os[i].Quantile(0.99))))
			}
			printf("%d descriptor(s) spillway/%-9s calls/s by round: %s; p99 by round: %s\n", n, other, strings.Join(ratios, " "), strings.Join(p99s, " "))
		}
	}
}

func minMax(rs []*rlsload.Result, f func(*rlsload.Result) float64) (lo, hi float64) {
	for i, r := range rs {
		v := f(r)
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}

// outageTest warms the server's connections with Redis up, stops Redis
// (SIGSTOP), keeps the callers calling for -outage-window, waits for every
// call started to end (each within -call-timeout), resumes Redis and checks
// that the server answers again.
func outageTest(ctx context.Context, printf func(string, ...any), s *server, rdb *redistest.Server, redisPid int) ([]string, error) {
	if err := flush(ctx, rdb); err != nil {
		return nil, err
	}
	settle(ctx, s.cmd.Process.Pid, redisPid)
	cfg := rlsload.Config{Target: s.grpcAddr, Conns: *conns, Callers: *callers, Keys: *keys, Descriptors: 1, CallTimeout: *callTimeout, Seed: 99}
	warm := cfg
	warm.Duration = time.Second
	if _, err := rlsload.Run(ctx, warm); err != nil {
		return nil, err
	}
	if err := rdb.Pause(); err != nil {
		return nil, err
	}
	down := cfg
	down.Duration = *outageWindow
	bound := *budget + 20*time.Millisecond
	down.Slow = bound
	deg0 := s.degraded()
	res, err := rlsload.Run(ctx, down)
	deg := since(deg0, s.degraded())
	if rerr := rdb.Resume(); err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	// After SIGCONT: how long until a call is answered OK again (up to 60 s).
	after := "no OK answer within 60s"
	t0 := time.Now()
	for time.Since(t0) < 60*time.Second {
		probe := cfg
		probe.Callers, probe.Conns, probe.Duration = 4, 1, 500*time.Millisecond
		pr, err := rlsload.Run(ctx, probe)
		if err != nil {
			return nil, err
		}
		if pr.Calls > 0 && pr.Errors == 0 {
			after = fmt.Sprintf("all OK within %.1fs", time.Since(t0).Seconds())
			break
		}
	}
	printf("%-10s %7d %6d %6d %6d %8s %9d %9s %9s %9s %9s  %s\n",
		s.name, res.Calls, res.OK, res.OverLimit, res.Errors, count(deg), res.Over(bound),
		ms(res.First), ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Max()), after)
	if res.FirstError != "" {
		printf("#   first error: %s\n", res.FirstError)
	}
	if len(res.Slow) > 0 {
		printf("#   calls over %v by when they started (after SIGSTOP): %s\n", bound, slowByStart(res.Slow))
	}
	row := []string{s.name, strconv.Itoa(res.Calls), strconv.Itoa(res.OK), strconv.Itoa(res.OverLimit), strconv.Itoa(res.Errors), count(deg),
		strconv.Itoa(res.Over(bound)), ms(res.First), ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Max()), after}
	return row, s.alive()
}

// markdown is the body of the generated file -md writes: the settings, the
// summary over the rounds and the outage test.
func markdown(names []string, counts []int, results map[key][]*rlsload.Result, cpus map[key][]usPerCall, outageRows [][]string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d callers over %d connections, %d keys, %v window after %v warm-up, %s, limit %d/second per descriptor; reference %s; %d rounds, min–max over the rounds.\n\n",
		*callers, *conns, *keys, *duration, *warmup, loop(), *limit, referenceVersion(), *rounds)
	var rows [][]string
	for _, n := range counts {
		for _, name := range names {
			rs := results[key{name, n}]
			if len(rs) == 0 {
				continue
			}
			lo, hi := minMax(rs, func(r *rlsload.Result) float64 { return r.PerSecond() })
			plo, phi := minMax(rs, func(r *rlsload.Result) float64 { return float64(r.Quantile(0.99)) / 1e6 })
			ratio, p99 := "", ""
			if sp, ref := results[key{"spillway", n}], results[key{"reference", n}]; name == "spillway" && len(ref) > 0 {
				var rs, ps []string
				for i := range min(len(sp), len(ref)) {
					rs = append(rs, fmt.Sprintf("%.2f", sp[i].PerSecond()/ref[i].PerSecond()))
					ps = append(ps, fmt.Sprintf("%.2f", float64(sp[i].Quantile(0.99))/float64(ref[i].Quantile(0.99))))
				}
				ratio, p99 = strings.Join(rs, " "), strings.Join(ps, " ")
			}
			var us, vs []string
			for i, c := range cpus[key{name, n}] {
				us = append(us, c.String())
				// spillway's criteria: its server's CPU ÷ the do-nothing
				// server's, its Redis CPU ÷ the reference's
				if nc, rc := cpus[key{"nothing", n}], cpus[key{"reference", n}]; name == "spillway" && i < len(nc) && i < len(rc) {
					vs = append(vs, fmt.Sprintf("%.2f/%.2f", c.srv/nc[i].srv, c.rds/rc[i].rds))
				}
			}
			rows = append(rows, []string{strconv.Itoa(n), name, fmt.Sprintf("%.0f–%.0f", lo, hi), fmt.Sprintf("%.2f–%.2f", plo, phi), ratio, p99,
				strings.Join(us, " "), strings.Join(vs, " ")})
		}
	}
	sb.WriteString("CPU µs per call: server / redis-server / load generator, over each turn (warm-up included), by round; CPU ratios: spillway's server ÷ the do-nothing server's / spillway's Redis ÷ the reference's, by round.\n\n")
	sb.WriteString(genmd.Table([]string{"descriptors", "server", "calls/s", "p99 ms", "spillway/reference calls/s by round", "spillway/reference p99 by round",
		"CPU µs per call by round", "CPU ratios by round"}, rows))
	if len(outageRows) > 0 {
		fmt.Fprintf(&sb, "\nOutage: Redis stopped (SIGSTOP) while the callers call for %v, one descriptor; bound: budget %v + 20 ms; latencies in ms.\n\n", *outageWindow, *budget)
		sb.WriteString(genmd.Table([]string{"server", "calls", "ok", "over", "errors", "degraded", ">bound", "first", "p50", "p99", "max", "after SIGCONT"}, outageRows))
	}
	return sb.String()
}

// commandLine is the command that ran rlsbench, as typed in bench/.
func commandLine() string {
	parts := []string{"cd bench && go run ./cmd/rlsbench"}
	for _, a := range os.Args[1:] {
		if a == "" || strings.ContainsAny(a, " \t'\"$") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// overloadDeadline is each call's deadline in the open-loop turns of
// -overload: Envoy's default timeout for its rate limit service.
const overloadDeadline = 20 * time.Millisecond

var overloadHeader = []string{"round", "descriptors", "server", "capacity calls/s", "offered calls/s", "calls", "answered in time", "in time/s ÷ capacity", "deadline exceeded", "refused", "local", "opened", "Redis µs/call", "CPU cores: server/Redis/generator"}

// overloadTest is -overload: for each round, descriptor count and server,
// the server's closed-loop capacity, then open loop at ¾ and 1.5× of it
// with overloadDeadline per call. It prints and returns the rows.
func overloadTest(ctx context.Context, printf func(string, ...any), names []string, counts []int, srvs map[string]*server, rdb *redistest.Server, redisPid int) ([][]string, error) {
	printf("# overload: closed-loop capacity, then open loop at 3/4 and 1.5x of it, each call's deadline %v\n", overloadDeadline)
	printf("# refused: answered with an error before the call's deadline; local: descriptors decided by the local share; opened: breaker openings (spillway's metrics); cores: CPU seconds per second of the turn of the server, redis-server and this load generator\n")
	printf("%-5s %-3s %-10s %9s %9s %8s %8s %6s %8s %8s %8s %6s %8s %14s\n",
		"round", "dsc", "server", "capacity", "offered", "calls", "in time", "ratio", "expired", "refused", "local", "opened", "rds µs", "cores s/r/g")
	var rows [][]string
	for r := range *rounds {
		for _, n := range counts {
			for _, name := range rotate(names, r) {
				s := srvs[name]
				if err := flush(ctx, rdb); err != nil {
					return nil, err
				}
				capRes, err := rlsload.Run(ctx, rlsload.Config{
					Target: s.grpcAddr, Conns: *conns, Callers: *callers, Keys: *keys, Descriptors: n,
					Warmup: *warmup, Duration: *duration, CallTimeout: *callTimeout, Seed: uint64(r),
				})
				if err != nil {
					return nil, err
				}
				// decided calls only: a call the server refused at once is no
				// part of what it can serve
				capacity := float64(capRes.OK+capRes.OverLimit) / capRes.Window.Seconds()
				settle(ctx, s.cmd.Process.Pid, redisPid)
				for _, f := range []float64{0.75, 1.5} {
					if err := flush(ctx, rdb); err != nil {
						return nil, err
					}
					deg0, open0 := s.degraded(), s.metric("spillway_rls_redis_breaker_opened_total")
					h0 := s.handlerTimes()
					seen0, late0, shed0 := s.metric(`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`), s.metric("spillway_rls_late_total"), s.metric("spillway_rls_shed_total")
					cpu0, t0 := cpuTimes(s.cmd.Process.Pid, redisPid), time.Now()
					res, err := rlsload.Run(ctx, rlsload.Config{
						Target: s.grpcAddr, Conns: *conns, Callers: *callers, Keys: *keys, Descriptors: n,
						Warmup: *warmup, Duration: *duration, Rate: f * capacity, CallTimeout: overloadDeadline, Seed: uint64(r),
					})
					if err != nil {
						return nil, err
					}
					settle(ctx, s.cmd.Process.Pid, redisPid)
					cpu, wall := cpuTimes(s.cmd.Process.Pid, redisPid), time.Since(t0).Seconds()
					cores := func(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()/wall) }
					rds := "-"
					if res.Calls > 0 {
						rds = fmt.Sprintf("%.1f", cpu.usPer(cpu0, res.Calls, *duration+*warmup, *duration).rds)
					}
					inTime := res.OK + res.OverLimit
					ratio := "-"
					if capacity > 0 {
						ratio = fmt.Sprintf("%.2f", float64(inTime)/res.Window.Seconds()/capacity)
					}
					row := []string{strconv.Itoa(r + 1), strconv.Itoa(n), name, fmt.Sprintf("%.0f", capacity), fmt.Sprintf("%.0f", f*capacity),
						strconv.Itoa(res.Calls), strconv.Itoa(inTime), ratio, strconv.Itoa(res.Expired), strconv.Itoa(res.Errors - res.Expired),
						count(since(deg0, s.degraded())), count(since(open0, s.metric("spillway_rls_redis_breaker_opened_total"))), rds,
						cores(cpu.srv-cpu0.srv) + "/" + cores(cpu.rds-cpu0.rds) + "/" + cores(cpu.gen-cpu0.gen)}
					rows = append(rows, row)
					printf("%-5s %-3s %-10s %9s %9s %8s %8s %6s %8s %8s %8s %6s %8s %14s\n", toAny(row)...)
					if res.FirstError != "" {
						printf("#   first error: %s\n", res.FirstError)
					}
					if h1 := s.handlerTimes(); h0 != nil && h1 != nil {
						all := h1[3] - h0[3]
						printf("#   handler: %d calls, over 5 ms %d, over 10 ms %d, over 25 ms %d; client latency p50 %s p99 %s p99.9 %s\n",
							all, all-(h1[0]-h0[0]), all-(h1[1]-h0[1]), all-(h1[2]-h0[2]), ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Quantile(0.999)))
						printf("#   server: %d calls seen, %d refused as late (deadline passed on arrival or while decided), %d shed (could not be served by the deadline)\n",
							s.metric(`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`)-seen0, s.metric("spillway_rls_late_total")-late0, s.metric("spillway_rls_shed_total")-shed0)
					}
					if err := s.alive(); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	return rows, nil
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
