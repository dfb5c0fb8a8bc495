package rls

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/spillway-go/spillway/ratelimit"
)

const opsConfig = `domain: ops
descriptors:
  - key: user
    value: alice
    rate_limit:
      unit: minute
      requests_per_unit: 3
`

// statsdListener collects statsd lines sent over UDP or TCP to one
// loopback port.
type statsdListener struct {
	addr  string
	mu    sync.Mutex
	lines []string
}

func (l *statsdListener) add(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if s != "" {
			l.lines = append(l.lines, s)
		}
	}
}

func (l *statsdListener) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func listenStatsd(t *testing.T, network string) *statsdListener {
	l := &statsdListener{}
	switch network {
	case "udp":
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { pc.Close() })
		l.addr = pc.LocalAddr().String()
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				l.add(buf[:n])
			}
		}()
	case "tcp":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		l.addr = ln.Addr().String()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					sc := bufio.NewScanner(c)
					for sc.Scan() {
						l.add(sc.Bytes())
					}
				}()
			}
		}()
	}
	return l
}

// sums adds up the values of the statsd lines by name (with the type and
// tags: "name|c", "name|ms|#k:v"); timers are counted.
func sums(lines []string) map[string]int {
	m := map[string]int{}
	for _, l := range lines {
		name, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		parts := strings.Split(rest, "|")
		key := name + "|" + strings.Join(parts[1:], "|")
		if parts[1] == "ms" {
			m[key]++
			continue
		}
		v, _ := strconv.Atoi(parts[0])
		m[key] += v
	}
	return m
}

// opsServer starts a server on the memory store with env (plus loopback
// ports, the config above) and returns a client and its stop function.
func opsServer(t *testing.T, vars map[string]string) (*server, pb.RateLimitServiceClient, context.CancelFunc, chan error) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "config"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config", "ops.yaml"), []byte(opsConfig), 0o644))
	m := map[string]string{"RUNTIME_ROOT": dir, "RUNTIME_WATCH_ROOT": "false", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
		"HOST": "127.0.0.1", "PORT": "0", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0", "STATS_FLUSH_INTERVAL": "50ms", "SPILLWAY_DRAIN": "1s"}
	for k, v := range vars {
		m[k] = v
	}
	set, _, err := Env(env(m))
	require.NoError(t, err)
	srv, err := newServer(set, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	require.NoError(t, srv.listen())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.serve(ctx, set.Drain) }()
	conn, err := grpc.NewClient(srv.gRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cancel(); conn.Close(); <-done })
	return srv, pb.NewRateLimitServiceClient(conn), cancel, done
}

func call(t *testing.T, c pb.RateLimitServiceClient, user string) pb.RateLimitResponse_Code {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "ops",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
	require.NoError(t, err)
	return resp.OverallCode
}

// TestStatsdByDefault: with USE_STATSD unset, five calls (three within
// the limit, two over it) reach a statsd on STATSD_HOST:STATSD_PORT
// under the reference's names, whether the statsd listens on TCP (the
// reference's protocol) or on UDP only (TCP refused at start).
func TestStatsdByDefault(t *testing.T) {
	for _, network := range []string{"tcp", "udp"} {
		t.Run(network, func(t *testing.T) {
			l := listenStatsd(t, network)
			host, port, _ := net.SplitHostPort(l.addr)
			_, c, _, _ := opsServer(t, map[string]string{"STATSD_HOST": host, "STATSD_PORT": port})
			for i := range 5 {
				want := pb.RateLimitResponse_OK
				if i >= 3 {
					want = pb.RateLimitResponse_OVER_LIMIT
				}
				require.Equal(t, want, call(t, c, "alice"))
			}
			want := map[string]int{
				"ratelimit.service.rate_limit.ops.user_alice.total_hits|c":   5,
				"ratelimit.service.rate_limit.ops.user_alice.within_limit|c": 3,
				"ratelimit.service.rate_limit.ops.user_alice.over_limit|c":   2,
				"ratelimit.service.config_load_success|c":                    1,
				"ratelimit_server.ShouldRateLimit.total_requests|c":          5,
				"ratelimit_server.ShouldRateLimit.response_time|ms":          5,
			}
			var got map[string]int
			require.Eventually(t, func() bool {
				got = sums(l.snapshot())
				for k, v := range want {
					if got[k] != v {
						return false
					}
				}
				return true
			}, 5*time.Second, 20*time.Millisecond, "statsd got %v", got)
			require.Equal(t, 1, got["ratelimit.service.rate_limit.ops.user_alice.near_limit|c"], "the third hit: over 0.8 of 3")
			require.NotContains(t, got, "ratelimit.service.rate_limit.ops.user_alice.shadow_mode|c", "a zero count is not sent")
			require.Contains(t, strings.Join(l.snapshot(), "\n"), "ratelimit.go.", "the Go runtime stats")
		})
	}
}

// TestStatsdTags: EXTRA_TAGS are serialized into plain statsd names as
// the reference's library does, and become tags with USE_DOG_STATSD.
func TestStatsdTags(t *testing.T) {
	t.Run("statsd", func(t *testing.T) {
		l := listenStatsd(t, "tcp")
		host, port, _ := net.SplitHostPort(l.addr)
		_, c, _, _ := opsServer(t, map[string]string{"STATSD_HOST": host, "STATSD_PORT": port, "EXTRA_TAGS": "env:prod,team:edge"})
		require.Equal(t, pb.RateLimitResponse_OK, call(t, c, "alice"))
		require.Eventually(t, func() bool {
			g := sums(l.snapshot())
			return g["ratelimit.service.rate_limit.ops.user_alice.total_hits.__env=prod.__team=edge|c"] == 1 &&
				g["ratelimit_server.ShouldRateLimit.total_requests.__env=prod.__team=edge|c"] == 1
		}, 5*time.Second, 20*time.Millisecond, "%v", l.snapshot())
	})
	t.Run("dogstatsd", func(t *testing.T) {
		l := listenStatsd(t, "udp")
		host, port, _ := net.SplitHostPort(l.addr)
		_, c, _, _ := opsServer(t, map[string]string{"STATSD_HOST": host, "STATSD_PORT": port, "USE_DOG_STATSD": "true",
			"USE_STATSD": "false", "EXTRA_TAGS": "env:prod,team:edge"})
		for range 4 {
			call(t, c, "alice")
		}
		require.Eventually(t, func() bool {
			g := sums(l.snapshot())
			return g["ratelimit.service.rate_limit.ops.user_alice.total_hits|c|#env:prod,team:edge"] == 4 &&
				g["ratelimit.service.rate_limit.ops.user_alice.over_limit|c|#env:prod,team:edge"] == 1 &&
				g["ratelimit_server.ShouldRateLimit.response_time|ms|#env:prod,team:edge"] == 4
		}, 5*time.Second, 20*time.Millisecond, "%v", l.snapshot())
	})
	t.Run("mogrifiers", func(t *testing.T) {
		l := listenStatsd(t, "udp")
		host, port, _ := net.SplitHostPort(l.addr)
		_, c, _, _ := opsServer(t, map[string]string{"STATSD_HOST": host, "STATSD_PORT": port, "USE_DOG_STATSD": "true",
			"USE_STATSD": "false", "EXTRA_TAGS": "env:prod", "USE_DOG_STATSD_MOGRIFIERS": "HITS,SERVER",
			"DOG_STATSD_MOGRIFIER_HITS_PATTERN":   `^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
			"DOG_STATSD_MOGRIFIER_HITS_NAME":      "ratelimit.service.rate_limit.$3",
			"DOG_STATSD_MOGRIFIER_HITS_TAGS":      "domain:$1,descriptor:$2",
			"DOG_STATSD_MOGRIFIER_SERVER_PATTERN": `^ratelimit_server\.(\w+)\.(\w+)$`,
			"DOG_STATSD_MOGRIFIER_SERVER_NAME":    "ratelimit_server.$2",
			"DOG_STATSD_MOGRIFIER_SERVER_TAGS":    "method:$1"})
		for range 4 {
			call(t, c, "alice")
		}
		require.Eventually(t, func() bool {
			g := sums(l.snapshot())
			return g["ratelimit.service.rate_limit.total_hits|c|#env:prod,descriptor:user_alice,domain:ops"] == 4 &&
				g["ratelimit.service.rate_limit.over_limit|c|#env:prod,descriptor:user_alice,domain:ops"] == 1 &&
				g["ratelimit_server.total_requests|c|#env:prod,method:ShouldRateLimit"] == 4
		}, 5*time.Second, 20*time.Millisecond, "%v", l.snapshot())
	})
}

// TestPrometheusEndpoint: the response-time histogram under the
// reference's name, and the Go and process collectors.
func TestPrometheusEndpoint(t *testing.T) {
	srv, c, _, _ := opsServer(t, map[string]string{"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0"})
	for range 4 {
		call(t, c, "bob")
	}
	var addr string
	for _, l := range srv.httpLis {
		addr = l.Addr().String() // the last one is Prometheus's
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	require.Contains(t, text, "# TYPE ratelimit_service_response_time_seconds histogram")
	require.Contains(t, text, `ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 4`)
	require.Contains(t, text, `ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"} 4`)
	require.Contains(t, text, "go_goroutines ")
	require.Contains(t, text, "process_start_time_seconds ")
	require.Contains(t, text, `ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 4`)
}

// TestDebugListener: /rlconfig prints the loaded config as the reference
// does, /stats the counters under their statsd names, / the index.
func TestDebugListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	_, c, _, _ := opsServer(t, map[string]string{"USE_STATSD": "false", "DEBUG_PORT": port})
	call(t, c, "alice")
	get := func(path string) string {
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, path)
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	require.Equal(t, "ops.user_alice: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false\n", get("/rlconfig"))
	stats := get("/stats")
	require.Contains(t, stats, "ratelimit.service.rate_limit.ops.user_alice.total_hits: 1\n")
	require.Contains(t, stats, "ratelimit_server.ShouldRateLimit.total_requests: 1\n")
	require.Contains(t, stats, "memstats: ")
	require.Contains(t, get("/"), "/rlconfig: print out the currently loaded configuration for debugging\n")
	require.Contains(t, get("/debug/pprof/"), "goroutine")
}

// TestJSONLogFields: LOG_FORMAT=json writes the reference's field names.
func TestJSONLogFields(t *testing.T) {
	var buf bytes.Buffer
	set, _, err := Env(env(map[string]string{"LOG_FORMAT": "json"}))
	require.NoError(t, err)
	newLogger(set, &buf).Warn("hello", "k", "v")
	var m map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &m))
	require.Equal(t, "hello", m["@message"])
	require.Equal(t, "warning", m["level"])
	require.Equal(t, "v", m["k"])
	_, err = time.Parse(time.RFC3339Nano, m["@timestamp"].(string))
	require.NoError(t, err)
	require.NotContains(t, m, "msg")
	require.NotContains(t, m, "time")

	buf.Reset()
	set.LogFormat = "text"
	newLogger(set, &buf).Error("boom")
	require.Regexp(t, regexp.MustCompile(`level=error msg=boom`), buf.String())
}

// TestHealthStaysDownWhileDraining: a config loaded during the shutdown
// (a directory reload, an xDS push) does not turn health back to SERVING.
func TestHealthStaysDownWhileDraining(t *testing.T) {
	srv := &server{health: health.NewServer(), stopped: make(chan struct{})}
	srv.setHealth(true)
	srv.stopping.Store(true)
	srv.setHealth(false)
	srv.setHealth(true)
	for _, name := range []string{HealthService, ""} {
		resp, err := srv.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		require.NoError(t, err)
		require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, resp.Status, name)
	}
	require.False(t, srv.healthy.Load())
}
