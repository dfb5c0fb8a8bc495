package main_test

// The binary's operational surface: statsd by default, shutdown, flags,
// the check command, Redis error logs.

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/spillway-go/spillway/internal/redistest"
)

const opsYAML = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"

// TestStatsdDefault: USE_STATSD unset, a statsd on UDP at STATSD_HOST:
// STATSD_PORT receives the reference's stat names for a run of calls.
func TestStatsdDefault(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	var mu sync.Mutex
	got := map[string]int{}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			for _, l := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				name, rest, _ := strings.Cut(l, ":")
				v, typ, _ := strings.Cut(rest, "|")
				if typ == "ms" {
					got[name]++
				} else {
					n, _ := strconv.Atoi(v)
					got[name] += n
				}
			}
			mu.Unlock()
		}
	}()
	_, p, _ := net.SplitHostPort(pc.LocalAddr().String())
	s := start(t, singleBackend(t), map[string]string{"d.yaml": opsYAML}, "STATSD_HOST=127.0.0.1", "STATSD_PORT="+p, "STATS_FLUSH_INTERVAL=100ms")
	for range 5 {
		s.call("d", 0, desc("k=v"))
	}
	want := map[string]int{
		"ratelimit.service.rate_limit.d.k.total_hits":     5,
		"ratelimit.service.rate_limit.d.k.within_limit":   3,
		"ratelimit.service.rate_limit.d.k.over_limit":     2,
		"ratelimit_server.ShouldRateLimit.total_requests": 5,
		"ratelimit_server.ShouldRateLimit.response_time":  5,
		"ratelimit.service.config_load_success":           1,
	}
	redistest.WaitFor(t, "the stats", 20*time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}

// TestShutdownUnderLoad: on SIGTERM a prober sees NOT_SERVING (on a
// health Watch and on Check) while calls are still answered; then the
// Watch stream ends, connections drop, and the process exits 0 within
// SPILLWAY_DRAIN.
func TestShutdownUnderLoad(t *testing.T) {
	s := start(t, singleBackend(t), map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"},
		"SPILLWAY_DRAIN=3s")
	ctx := context.Background()
	// the prober: its own connection, a Watch stream
	pconn, err := grpc.NewClient(s.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer pconn.Close()
	hc := healthpb.NewHealthClient(pconn)
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	require.NoError(t, err)
	m, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, m.Status)

	var notServing, watchEnded, firstFail atomic.Int64 // Unix ns
	var okAfterNotServing atomic.Int64
	go func() {
		for {
			m, err := watch.Recv()
			if err != nil {
				watchEnded.Store(time.Now().UnixNano())
				return
			}
			if m.Status == healthpb.HealthCheckResponse_NOT_SERVING {
				notServing.CompareAndSwap(0, time.Now().UnixNano())
			}
		}
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := s.rls.ShouldRateLimit(cctx, &pbRequest)
				cancel()
				if err != nil {
					firstFail.CompareAndSwap(0, time.Now().UnixNano())
					return
				}
				if notServing.Load() != 0 {
					okAfterNotServing.Add(1)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	sent := time.Now()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	// Check says NOT_SERVING too, while the listener is open
	redistest.WaitFor(t, "Check to answer NOT_SERVING", 10*time.Millisecond, func() bool {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		return err == nil && r.Status == healthpb.HealthCheckResponse_NOT_SERVING
	})
	select {
	case <-s.exited:
	case <-time.After(3*time.Second + 2*time.Second):
		t.Fatalf("no exit within the 3s drain (+2s):\n%s", s.log())
	}
	took := time.Since(sent)
	close(stop)
	wg.Wait()
	require.Equal(t, 0, s.exitCode, s.log())
	require.NotZero(t, notServing.Load(), "the prober saw NOT_SERVING")
	require.NotZero(t, watchEnded.Load(), "the Watch stream ended")
	require.NotZero(t, firstFail.Load(), "the connections dropped")
	require.Less(t, notServing.Load(), firstFail.Load(), "NOT_SERVING before the connections dropped")
	require.Positive(t, okAfterNotServing.Load(), "calls were answered after NOT_SERVING")
	require.Less(t, took, 3*time.Second+time.Second, "within the drain")
	t.Logf("NOT_SERVING after %v, first failed call after %v, exit after %v, %d calls answered in between",
		time.Duration(notServing.Load()-sent.UnixNano()), time.Duration(firstFail.Load()-sent.UnixNano()), took, okAfterNotServing.Load())
}

// TestSecondSignal: a second SIGTERM during the drain exits at once.
func TestSecondSignal(t *testing.T) {
	s := start(t, singleBackend(t), map[string]string{"d.yaml": opsYAML}, "SPILLWAY_DRAIN=25s")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	redistest.WaitFor(t, "the shutdown to begin", 10*time.Millisecond, func() bool { return strings.Contains(s.log(), "shutting down") })
	sent := time.Now()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.exited:
	case <-time.After(2 * time.Second):
		t.Fatalf("no exit within 2s of the second signal:\n%s", s.log())
	}
	require.Less(t, time.Since(sent), time.Second)
	require.Equal(t, 1, s.exitCode)
	redistest.WaitFor(t, "the log line", 10*time.Millisecond, func() bool { return strings.Contains(s.log(), "second signal") })
}

// TestFlags: -h and -version print and exit 0 without serving; an
// unknown flag exits 2.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"-h"}, 0, "Usage:"},
		{[]string{"--help"}, 0, "Usage:"},
		{[]string{"-version"}, 0, "spillway-ratelimit "},
		{[]string{"-nope"}, 2, "flag provided but not defined"},
		{[]string{"serve"}, 2, `unexpected argument "serve"`},
	} {
		cmd := exec.Command(binary, c.args...)
		cmd.Env = []string{"GRPC_PORT=1", "PORT=1"} // would fail if it served
		out, _ := cmd.CombinedOutput()
		require.Equal(t, c.code, cmd.ProcessState.ExitCode(), "%v: %s", c.args, out)
		require.Contains(t, string(out), c.out, c.args)
	}
}

// TestCheckCommand: check validates a directory with the reference's
// messages.
func TestCheckCommand(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(opsYAML), 0o644))
	out, err := exec.Command(binary, "check", "-config_dir", dir).CombinedOutput()
	require.NoError(t, err, string(out))
	require.Equal(t, "checking rate limit configs...\nloading config directory: "+dir+"\nopening config file: "+
		filepath.Join(dir, "a.yaml")+"\nall rate limit configs ok\n", string(out))

	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("domain: d\ndescriptors:\n  - key: k2\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"), 0o644))
	cmd := exec.Command(binary, "check", "-config-dir", dir)
	out, _ = cmd.CombinedOutput()
	require.Equal(t, 1, cmd.ProcessState.ExitCode(), string(out))
	require.Contains(t, string(out), "error loading rate limit configs: ")
	require.Contains(t, string(out), "duplicate domain 'd'")

	out, _ = exec.Command(binary, "check", "-config_dir", dir, "-merge_domain_configs").CombinedOutput()
	require.Contains(t, string(out), "all rate limit configs ok", string(out))

	cmd = exec.Command(binary, "check", "-config_dir", filepath.Join(dir, "none"))
	out, _ = cmd.CombinedOutput()
	require.Equal(t, 1, cmd.ProcessState.ExitCode())
	require.Contains(t, string(out), "error opening directory")
}

// TestRedisErrorLoggedOnce: a wrong password is logged once, with
// Redis's own reply, however many calls fail; each failed call counts in
// redis_error.
func TestRedisErrorLoggedOnce(t *testing.T) {
	rs := redistest.Start(t)
	require.NoError(t, rs.Client(t).ConfigSet(context.Background(), "requirepass", "right").Err())
	b := backend{"single", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=" + rs.Addr, "REDIS_AUTH=wrong"}, nil}
	s := start(t, b, map[string]string{"d.yaml": opsYAML})
	for range 5 {
		_, _ = s.rls.ShouldRateLimit(context.Background(), &pbRequest)
	}
	require.EqualValues(t, 5, s.metric(`ratelimit_service_should_rate_limit_error{err_type="redis_error"}`))
	require.Equal(t, 1, strings.Count(s.log(), "kind=WRONGPASS"), s.log())
}

var pbRequest = pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k=v")}}

// TestJSONLogs: with LOG_FORMAT=json every line the server writes is
// JSON with the reference's field names, go-redis's own lines and the
// Redis error and breaker lines included (here Redis is not there).
func TestJSONLogs(t *testing.T) {
	b := backend{"none", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=127.0.0.1:" + port(t)}, nil}
	s := start(t, b, map[string]string{"d.yaml": opsYAML}, "LOG_FORMAT=json", "LOG_LEVEL=info", "SPILLWAY_BUDGET=50ms")
	for range 10 {
		s.call("d", 0, desc("k=v")) // the local share answers
	}
	redistest.WaitFor(t, "the breaker's line", 20*time.Millisecond, func() bool { return strings.Contains(s.log(), "redis breaker open") })
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	<-s.exited
	lines := strings.Split(strings.TrimSpace(s.log()), "\n")
	require.Greater(t, len(lines), 3)
	for _, l := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		require.Contains(t, m, "@timestamp", l)
		require.Contains(t, m, "@message", l)
		require.Contains(t, []any{"debug", "info", "warning", "error"}, m["level"], l)
	}
	require.Contains(t, s.log(), `"kind":"connection refused"`)
}
