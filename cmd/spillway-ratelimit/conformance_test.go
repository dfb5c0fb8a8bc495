package main_test

// The conformance suite: the reference server's documented behaviours,
// run against this package's binary, built in TestMain, over gRPC, on a
// real redis-server and on a 3×3 Redis Cluster. Where spillway answers
// differently on purpose (a denied request charges nothing), the test
// says so and asserts spillway's answer.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/spillway-go/spillway/internal/redistest"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rls-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "spillway-ratelimit")
	// The package under test, from its directory: with the go.work of a
	// clone, or on its own module (GOWORK=off), alike.
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building the binary: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// backend is a Redis to run the suite on: the env vars that point the
// server at it, and a client to look at it.
type backend struct {
	name   string
	env    []string
	client redis.UniversalClient
}

func singleBackend(t *testing.T) backend {
	rs := redistest.Start(t)
	return backend{"single", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=" + rs.Addr}, rs.Client(t)}
}

func clusterBackend(t *testing.T) backend {
	c := redistest.StartCluster(t)
	return backend{"cluster", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=cluster", "REDIS_URL=" + strings.Join(c.Addrs(), ",")}, c.Client(t)}
}

// keyCount is the number of keys in the whole Redis.
func (b backend) keyCount(t *testing.T) int64 {
	ctx := context.Background()
	if cc, ok := b.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var n int64
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			k, err := c.DBSize(ctx).Result()
			mu.Lock()
			n += k
			mu.Unlock()
			return err
		}))
		return n
	}
	n, err := b.client.DBSize(ctx).Result()
	require.NoError(t, err)
	return n
}

// server is one running binary.
type server struct {
	t        *testing.T
	cmd      *exec.Cmd
	dir      string // RUNTIME_ROOT
	http     string // HOST:PORT
	prom     string // PROMETHEUS_ADDR
	conn     *grpc.ClientConn
	rls      pb.RateLimitServiceClient
	mu       sync.Mutex
	stderr   strings.Builder
	exited   chan struct{}
	exitCode int
}

func port(t *testing.T) string {
	p, err := redistest.FreePort()
	require.NoError(t, err)
	return strconv.Itoa(p)
}

// start writes the config files into RUNTIME_ROOT/ratelimit/config and
// starts the binary on b with extra env vars, waiting for /healthcheck.
func start(t *testing.T, b backend, files map[string]string, extra ...string) *server {
	t.Helper()
	s := &server{t: t, dir: t.TempDir(), exited: make(chan struct{})}
	cfg := filepath.Join(s.dir, "ratelimit", "config")
	require.NoError(t, os.MkdirAll(cfg, 0o755))
	for name, content := range files {
		s.write(name, content)
	}
	grpcPort, httpPort, promPort := port(t), port(t), port(t)
	s.http, s.prom = "127.0.0.1:"+httpPort, "127.0.0.1:"+promPort
	s.cmd = exec.Command(binary)
	s.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"),
		"RUNTIME_ROOT=" + s.dir, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort, "HOST=127.0.0.1", "PORT=" + httpPort,
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + s.prom, "LOG_LEVEL=info",
		"SPILLWAY_RELOAD_INTERVAL=100ms", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(t),
		// a budget no loaded test machine (-race, a busy CI) overruns: the
		// exact answers below are Redis's, not the local share's
		"SPILLWAY_BUDGET=5s"}, b.env...)
	s.cmd.Env = append(s.cmd.Env, extra...)
	stderr, err := s.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, s.cmd.Start())
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.stderr.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
		}
	}()
	go func() {
		err := s.cmd.Wait()
		s.exitCode = s.cmd.ProcessState.ExitCode()
		_ = err
		close(s.exited)
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			t.Logf("server log:\n%s", s.log())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + s.http + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("server exited (%d):\n%s", s.exitCode, s.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not healthy within 10s:\n%s", s.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.conn, err = grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { s.conn.Close() })
	s.rls = pb.NewRateLimitServiceClient(s.conn)
	return s
}

func (s *server) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// write replaces a config file atomically (write, then rename).
func (s *server) write(name, content string) {
	cfg := filepath.Join(s.dir, "ratelimit", "config")
	tmp := filepath.Join(s.dir, ".tmp-"+name)
	require.NoError(s.t, os.WriteFile(tmp, []byte(content), 0o644))
	require.NoError(s.t, os.Rename(tmp, filepath.Join(cfg, name)))
}

// desc builds a descriptor from "key=value" pairs ("key" alone: empty value).
func desc(pairs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func (s *server) call(domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := s.rls.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	require.NoError(s.t, err)
	require.Len(s.t, resp.Statuses, len(ds))
	return resp
}

// metric returns one line's value from the Prometheus endpoint, -1 when
// the line is not there.
func (s *server) metric(line string) int64 {
	s.t.Helper()
	resp, err := http.Get("http://" + s.prom + "/metrics")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(line) + ` (\d+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return v
}

type want struct {
	code      pb.RateLimitResponse_Code
	limit     uint32 // 0: no current_limit
	unit      pb.RateLimitResponse_RateLimit_Unit
	remaining uint32
}

func ok(limit uint32, unit pb.RateLimitResponse_RateLimit_Unit, remaining uint32) want {
	return want{pb.RateLimitResponse_OK, limit, unit, remaining}
}

func over(limit uint32, unit pb.RateLimitResponse_RateLimit_Unit) want {
	return want{pb.RateLimitResponse_OVER_LIMIT, limit, unit, 0}
}

var noLimit = want{code: pb.RateLimitResponse_OK}

func check(t *testing.T, resp *pb.RateLimitResponse, overall pb.RateLimitResponse_Code, ws ...want) {
	t.Helper()
	require.Equal(t, overall.String(), resp.OverallCode.String(), "overall_code")
	for i, w := range ws {
		st := resp.Statuses[i]
		require.Equal(t, w.code.String(), st.Code.String(), "status %d code", i)
		require.Equal(t, w.remaining, st.LimitRemaining, "status %d limit_remaining", i)
		if w.limit == 0 {
			require.Nil(t, st.CurrentLimit, "status %d current_limit", i)
			continue
		}
		require.NotNil(t, st.CurrentLimit, "status %d current_limit", i)
		require.Equal(t, w.limit, st.CurrentLimit.RequestsPerUnit, "status %d requests_per_unit", i)
		require.Equal(t, w.unit.String(), st.CurrentLimit.Unit.String(), "status %d unit", i)
		// duration_until_reset: the end of the unit's window, in whole
		// seconds, as the reference computes it (±1 s for the call's time)
		sec := map[pb.RateLimitResponse_RateLimit_Unit]int64{pb.RateLimitResponse_RateLimit_SECOND: 1,
			pb.RateLimitResponse_RateLimit_MINUTE: 60, pb.RateLimitResponse_RateLimit_HOUR: 3600,
			pb.RateLimitResponse_RateLimit_DAY: 86400}[w.unit]
		if sec > 0 {
			got := st.DurationUntilReset.AsDuration()
			require.Zero(t, got%time.Second, "status %d duration_until_reset %v in whole seconds", i, got)
			exp := sec - time.Now().Unix()%sec
			require.True(t, int64(got/time.Second) >= exp-1 && int64(got/time.Second) <= exp+1 || int64(got/time.Second) == sec,
				"status %d duration_until_reset %v, want about %ds", i, got, exp)
		}
	}
}

const (
	OK   = pb.RateLimitResponse_OK
	OVER = pb.RateLimitResponse_OVER_LIMIT
	SEC  = pb.RateLimitResponse_RateLimit_SECOND
	HOUR = pb.RateLimitResponse_RateLimit_HOUR
	DAY  = pb.RateLimitResponse_RateLimit_DAY
)

const suiteConfig = `
domain: conf
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: a
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: path
    value: foo*
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: foobar
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: health
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: old
    rate_limit: {unit: hour, requests_per_unit: 1, name: old_limit}
  - key: new
    rate_limit:
      unit: hour
      requests_per_unit: 5
      replaces: [{name: old_limit}]
  - key: hits
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: near
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: near2
    rate_limit: {unit: day, requests_per_unit: 10}
`

// TestConformance runs every behaviour on a single redis-server and on a
// 3×3 Cluster.
func TestConformance(t *testing.T) {
	for _, mk := range []func(*testing.T) backend{singleBackend, clusterBackend} {
		b := mk(t)
		t.Run(b.name, func(t *testing.T) {
			s := start(t, b, map[string]string{"conf.yaml": suiteConfig})
			t.Run("counting per unit", func(t *testing.T) {
				for _, r := range []want{ok(3, HOUR, 2), ok(3, HOUR, 1), ok(3, HOUR, 0), over(3, HOUR), over(3, HOUR)} {
					check(t, s.call("conf", 0, desc("remote_address=10.0.0.1")), r.code, r)
				}
				// another value has a counter of its own
				check(t, s.call("conf", 0, desc("remote_address=10.0.0.2")), OK, ok(3, HOUR, 2))
			})
			t.Run("counting per second", func(t *testing.T) {
				// start just after a second begins, so the three calls share it
				time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
				check(t, s.call("conf", 0, desc("per_second=x")), OK, ok(2, SEC, 1))
				check(t, s.call("conf", 0, desc("per_second=x")), OK, ok(2, SEC, 0))
				check(t, s.call("conf", 0, desc("per_second=x")), OVER, over(2, SEC))
				time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
				check(t, s.call("conf", 0, desc("per_second=x")), OK, ok(2, SEC, 1))
			})
			t.Run("two descriptors, one over", func(t *testing.T) {
				check(t, s.call("conf", 0, desc("a=1"), desc("b=1")), OK, ok(1, DAY, 0), ok(10, DAY, 9))
				// a is over: the request is denied, and b is not charged
				// (the reference would charge b and answer 8 here)
				check(t, s.call("conf", 0, desc("a=1"), desc("b=1")), OVER, over(1, DAY), ok(10, DAY, 9))
				check(t, s.call("conf", 0, desc("b=1")), OK, ok(10, DAY, 8))
			})
			t.Run("wildcard", func(t *testing.T) {
				check(t, s.call("conf", 0, desc("path=foo1")), OK, ok(1, HOUR, 0))
				check(t, s.call("conf", 0, desc("path=foo1")), OVER, over(1, HOUR))
				// each value matching foo* counts on its own, as the reference does
				check(t, s.call("conf", 0, desc("path=foo2")), OK, ok(1, HOUR, 0))
				// an exact value wins over the wildcard
				check(t, s.call("conf", 0, desc("path=foobar")), OK, ok(5, HOUR, 4))
				// no match, no default: no limit
				check(t, s.call("conf", 0, desc("path=bar")), OK, noLimit)
			})
			t.Run("nested keys", func(t *testing.T) {
				check(t, s.call("conf", 0, desc("plan=free", "user=u1")), OK, ok(2, HOUR, 1))
				check(t, s.call("conf", 0, desc("plan=free", "user=u1")), OK, ok(2, HOUR, 0))
				check(t, s.call("conf", 0, desc("plan=free", "user=u1")), OVER, over(2, HOUR))
				check(t, s.call("conf", 0, desc("plan=free", "user=u2")), OK, ok(2, HOUR, 1))
				// the parent alone has no rate_limit; a deeper request than the tree matches nothing
				check(t, s.call("conf", 0, desc("plan=free")), OK, noLimit)
				check(t, s.call("conf", 0, desc("plan=free", "user=u1", "extra=1")), OK, noLimit)
				check(t, s.call("conf", 0, desc("plan=paid", "user=u1")), OK, noLimit)
			})
			t.Run("unlimited", func(t *testing.T) {
				before := b.keyCount(t)
				for range 3 {
					resp := s.call("conf", 0, desc("health=x"))
					check(t, resp, OK, want{code: OK, remaining: math.MaxUint32})
				}
				require.Equal(t, before, b.keyCount(t), "unlimited writes nothing to Redis")
			})
			t.Run("shadow mode", func(t *testing.T) {
				check(t, s.call("conf", 0, desc("shadow=x")), OK, ok(1, HOUR, 0))
				check(t, s.call("conf", 0, desc("shadow=x")), OK, ok(1, HOUR, 0))
				check(t, s.call("conf", 0, desc("shadow=x")), OK, ok(1, HOUR, 0))
				require.EqualValues(t, 3, s.metric(`ratelimit_service_rate_limit_total_hits{domain="conf",key1="shadow"}`))
				require.EqualValues(t, 2, s.metric(`ratelimit_service_rate_limit_over_limit{domain="conf",key1="shadow"}`))
				require.EqualValues(t, 2, s.metric(`ratelimit_service_rate_limit_shadow_mode{domain="conf",key1="shadow"}`))
				// a shadow descriptor over its limit does not stop another from being charged
				check(t, s.call("conf", 0, desc("shadow=x"), desc("b=shadowed")), OK, ok(1, HOUR, 0), ok(10, DAY, 9))
			})
			t.Run("replaces", func(t *testing.T) {
				for _, rem := range []uint32{4, 3, 2} {
					check(t, s.call("conf", 0, desc("old=1"), desc("new=1")), OK, noLimit, ok(5, HOUR, rem))
				}
				// alone, old is limited
				check(t, s.call("conf", 0, desc("old=1")), OK, ok(1, HOUR, 0))
				check(t, s.call("conf", 0, desc("old=1")), OVER, over(1, HOUR))
			})
			t.Run("hits_addend", func(t *testing.T) {
				check(t, s.call("conf", 3, desc("hits=1")), OK, ok(10, DAY, 7))
				// a descriptor's hits_addend 0 peeks
				peek := desc("hits=1")
				peek.HitsAddend = wrapperspb.UInt64(0)
				check(t, s.call("conf", 0, peek), OK, ok(10, DAY, 7))
				check(t, s.call("conf", 0, peek), OK, ok(10, DAY, 7))
				// a descriptor's hits_addend wins over the request's
				five := desc("hits=1")
				five.HitsAddend = wrapperspb.UInt64(5)
				check(t, s.call("conf", 1, five), OK, ok(10, DAY, 2))
				// more than is left: over, and nothing charged (the reference charges it)
				check(t, s.call("conf", 3, desc("hits=1")), OVER, over(10, DAY))
				check(t, s.call("conf", 0, peek), OK, ok(10, DAY, 2))
				check(t, s.call("conf", 2, desc("hits=1")), OK, ok(10, DAY, 0))
			})
			t.Run("near and over limit stats", func(t *testing.T) {
				// limit 10, NEAR_LIMIT_RATIO 0.8: the near threshold is 8
				for i := 1; i <= 12; i++ {
					s.call("conf", 0, desc("near=x"))
				}
				m := func(name string) int64 {
					return s.metric(`ratelimit_service_rate_limit_` + name + `{domain="conf",key1="near"}`)
				}
				require.EqualValues(t, 12, m("total_hits"))
				require.EqualValues(t, 10, m("within_limit"))
				require.EqualValues(t, 2, m("near_limit"))
				require.EqualValues(t, 2, m("over_limit"))
				// with hits_addend a call splits across the thresholds as in the reference
				s.call("conf", 9, desc("near2=x")) // 0 → 9: one hit past 8 is near
				s.call("conf", 5, desc("near2=x")) // 9 → 14: over by 4, one near (9 → 10)
				m2 := func(name string) int64 {
					return s.metric(`ratelimit_service_rate_limit_` + name + `{domain="conf",key1="near2"}`)
				}
				require.EqualValues(t, 14, m2("total_hits"))
				require.EqualValues(t, 9, m2("within_limit"))
				require.EqualValues(t, 2, m2("near_limit"))
				require.EqualValues(t, 4, m2("over_limit"))
			})
			t.Run("no call decided locally", func(t *testing.T) {
				require.EqualValues(t, 0, s.metric("spillway_rls_degraded_total"))
			})
			t.Run("health", func(t *testing.T) {
				hc := healthpb.NewHealthClient(s.conn)
				for _, svc := range []string{"ratelimit", ""} {
					r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
					require.NoError(t, err)
					require.Equal(t, healthpb.HealthCheckResponse_SERVING, r.Status)
				}
				resp, err := http.Get("http://" + s.http + "/healthcheck")
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.Equal(t, 200, resp.StatusCode)
				require.Equal(t, "OK", string(body))
			})
		})
	}
}

func TestHotReload(t *testing.T) {
	b := singleBackend(t)
	s := start(t, b, map[string]string{"a.yaml": "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n"})
	check(t, s.call("reload", 0, desc("k=v")), OK, ok(1, DAY, 0))
	check(t, s.call("reload", 0, desc("k=v")), OVER, over(1, DAY))
	require.EqualValues(t, 1, s.metric("ratelimit_service_config_load_success"))

	// a new limit applies; the same unit keeps the count (1 used)
	s.write("a.yaml", "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n")
	redistest.WaitFor(t, "the new config", 20*time.Millisecond, func() bool {
		return s.metric("ratelimit_service_config_load_success") == 2
	})
	check(t, s.call("reload", 0, desc("k=v")), OK, ok(5, DAY, 3))

	// a bad file: the last good config stays, the error names file and line
	s.write("a.yaml", "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	redistest.WaitFor(t, "the load error", 20*time.Millisecond, func() bool {
		return s.metric("ratelimit_service_config_load_error") == 1
	})
	check(t, s.call("reload", 0, desc("k=v")), OK, ok(5, DAY, 2))
	require.Contains(t, s.log(), "a.yaml:4: invalid rate limit unit 'fortnight'")

	// a second domain in a second file
	s.write("b.yaml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n")
	s.write("a.yaml", "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n")
	redistest.WaitFor(t, "both files", 20*time.Millisecond, func() bool {
		return s.metric("ratelimit_service_config_load_success") == 3
	})
	check(t, s.call("other", 0, desc("k=v")), OK, ok(7, HOUR, 6))
	check(t, s.call("reload", 0, desc("k=v")), OK, ok(5, DAY, 1))
	require.EqualValues(t, 1, s.metric("ratelimit_service_config_load_error"))
}

func TestStartupAndShutdown(t *testing.T) {
	b := singleBackend(t)
	s := start(t, b, map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n"},
		"USE_STATSD=false", "REDIS_TLS=false", "REDIS_TIMEOUT=1s")
	// a set variable the server does not support is reported; one set to
	// what it does anyway is not
	require.Contains(t, s.log(), "REDIS_TIMEOUT is set but not supported")
	require.NotContains(t, s.log(), "REDIS_TLS")

	// an unknown domain: no limit, counted
	check(t, s.call("nope", 0, desc("k=v")), OK, noLimit)
	require.EqualValues(t, 1, s.metric(`ratelimit_service_rate_limit_domain_not_found{domain="nope"}`))

	// malformed requests are errors with the reference's reasons
	_, err := s.rls.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("k=v")}})
	require.ErrorContains(t, err, "rate limit domain must not be empty")
	_, err = s.rls.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d"})
	require.ErrorContains(t, err, "rate limit descriptor list must not be empty")

	// /json answers like the gRPC API, 429 when over
	post := func() (int, string) {
		resp, err := http.Post("http://"+s.http+"/json", "application/json",
			strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"json"}]}]}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := post()
	require.Equal(t, 200, code)
	require.Contains(t, body, `"overallCode":"OK"`)
	code, body = post()
	require.Equal(t, 429, code)
	require.Contains(t, body, `"overallCode":"OVER_LIMIT"`)

	// SIGTERM: a graceful stop, exit 0
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.exited:
		require.Equal(t, 0, s.exitCode, s.log())
	case <-time.After(10 * time.Second):
		t.Fatal("no exit within 10s of SIGTERM")
	}
}

func TestBadStartup(t *testing.T) {
	b := singleBackend(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ratelimit", "config")
	require.NoError(t, os.MkdirAll(cfg, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(cfg, "bad.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limt: {}\n"), 0o644))
	cmd := exec.Command(binary)
	cmd.Env = append([]string{"RUNTIME_ROOT=" + dir, "RUNTIME_SUBDIRECTORY=ratelimit", "GRPC_PORT=" + port(t), "PORT=" + port(t)}, b.env...)
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "bad.yaml:4: config error, unknown key 'rate_limt'")

	cmd = exec.Command(binary)
	cmd.Env = append([]string{"REDIS_TYPE=ring"}, b.env[:1]...)
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "REDIS_TYPE")
}

func TestHeaders(t *testing.T) {
	b := singleBackend(t)
	s := start(t, b, map[string]string{"h.yaml": `
domain: h
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 10, name: per-a}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 3}
`}, "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	resp := s.call("h", 0, desc("a=1"), desc("b=1"))
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	// the reference's three headers: the descriptor closest to its limit
	require.Equal(t, "3", h["RateLimit-Limit"])
	require.Equal(t, "2", h["RateLimit-Remaining"])
	reset, err := strconv.Atoi(h["RateLimit-Reset"])
	require.NoError(t, err)
	require.True(t, reset >= 1 && reset <= 60, "RateLimit-Reset %d", reset)
	// and the IETF draft's, for every descriptor
	require.Equal(t, `"per-a";q=10;w=3600, "h.b";q=3;w=60`, h["RateLimit-Policy"])
	require.Regexp(t, `^"per-a";r=9;t=\d+, "h.b";r=2;t=\d+$`, h["RateLimit"])
}

// TestRedisDown: with the Redis process stopped (SIGSTOP, a hung Redis)
// every call is still answered, by the breaker's local share: 20% of each
// limit per server (here 2 of 10), marked in the degraded counter. The
// reference's calls wait out REDIS_TIMEOUT (10s) instead.
func TestRedisDown(t *testing.T) {
	rs := redistest.Start(t)
	b := backend{"single", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=" + rs.Addr}, rs.Client(t)}
	s := start(t, b, map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 10}\n"},
		"SPILLWAY_BUDGET=300ms") // later in env: wins over the suite's
	check(t, s.call("d", 0, desc("k=up")), OK, ok(10, DAY, 9))

	require.NoError(t, rs.Pause())
	defer func() { _ = rs.Resume() }()
	for i, w := range []want{ok(10, DAY, 1), ok(10, DAY, 0), over(10, DAY), over(10, DAY), over(10, DAY), over(10, DAY), over(10, DAY)} {
		resp := s.call("d", 0, desc("k=down")) // call's deadline: 5s; none may hang
		require.Equal(t, w.code.String(), resp.Statuses[0].Code.String(), "call %d", i)
		require.Equal(t, w.remaining, resp.Statuses[0].LimitRemaining, "call %d", i)
	}
	require.EqualValues(t, 7, s.metric("spillway_rls_degraded_total"))
	require.EqualValues(t, 1, s.metric(`spillway_rls_redis_breaker_state{state="open"}`))
	require.EqualValues(t, 1, s.metric("spillway_rls_redis_breaker_opened_total"))
	// calls Redis did not decide are redis_error, as the reference counts
	// its failed calls; the breaker's opening is logged with its cause,
	// and the first timeout once
	require.EqualValues(t, 7, s.metric(`ratelimit_service_should_rate_limit_error{err_type="redis_error"}`))
	require.Regexp(t, `redis breaker open: .* cause=".+"`, s.log())
	require.Equal(t, 1, strings.Count(s.log(), "kind=timeout"), s.log())

	// back: Redis decides again, with what it had
	require.NoError(t, rs.Resume())
	redistest.WaitFor(t, "the breaker to close", 50*time.Millisecond, func() bool {
		s.call("d", 0, desc("k=probe"))
		return s.metric(`spillway_rls_redis_breaker_state{state="closed"}`) == 1
	})
	check(t, s.call("d", 0, desc("k=up")), OK, ok(10, DAY, 8))
	require.Contains(t, s.log(), "redis breaker closed")
}

// TestLocalCache: LOCAL_CACHE_SIZE_IN_BYTES keeps denials locally, as the
// reference's local cache does: a key Redis denied is denied again until
// its window ends without a Redis call, and counted in
// over_limit_with_local_cache as well as over_limit.
func TestLocalCache(t *testing.T) {
	b := singleBackend(t)
	s := start(t, b, map[string]string{"c.yaml": "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n"},
		"LOCAL_CACHE_SIZE_IN_BYTES=1000000")
	scripts := func() float64 {
		var n float64
		for name, st := range redistest.ReadCommandStats(t, b.client) {
			if name == "evalsha" || name == "eval" {
				n += st.Calls
			}
		}
		return n
	}
	check(t, s.call("c", 0, desc("k=v")), OK, ok(1, DAY, 0))
	check(t, s.call("c", 0, desc("k=v")), OVER, over(1, DAY)) // Redis denies; the denial is cached
	before := scripts()
	check(t, s.call("c", 0, desc("k=v")), OVER, over(1, DAY))
	check(t, s.call("c", 2, desc("k=v")), OVER, over(1, DAY))
	require.Equal(t, before, scripts(), "the cached denials made no Redis call")
	m := func(name string) int64 {
		return s.metric(`ratelimit_service_rate_limit_` + name + `{domain="c",key1="k"}`)
	}
	require.EqualValues(t, 5, m("total_hits"))
	require.EqualValues(t, 4, m("over_limit"))
	require.EqualValues(t, 3, m("over_limit_with_local_cache"))
}

// TestSymlinkSwap: RUNTIME_ROOT is a symlink swapped atomically to a new
// directory (the deployment RUNTIME_WATCH_ROOT=true is for, and how
// Kubernetes updates a ConfigMap volume): the new files apply.
func TestSymlinkSwap(t *testing.T) {
	b := singleBackend(t)
	base := t.TempDir()
	version := func(name, limit string) string {
		dir := filepath.Join(base, name, "ratelimit", "config")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "s.yaml"),
			[]byte("domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: "+limit+"}\n"), 0o644))
		return filepath.Join(base, name)
	}
	current := filepath.Join(base, "current")
	require.NoError(t, os.Symlink(version("v1", "1"), current))
	s := start(t, b, nil, "RUNTIME_ROOT="+current, "RUNTIME_WATCH_ROOT=true")
	check(t, s.call("s", 0, desc("k=v")), OK, ok(1, HOUR, 0))

	tmp := filepath.Join(base, "current.tmp")
	require.NoError(t, os.Symlink(version("v2", "4"), tmp))
	require.NoError(t, os.Rename(tmp, current))
	redistest.WaitFor(t, "the new version", 20*time.Millisecond, func() bool {
		return s.metric("ratelimit_service_config_load_success") == 2
	})
	check(t, s.call("s", 0, desc("k=v")), OK, ok(4, HOUR, 2))
}

// TestSentinel: REDIS_TYPE=sentinel with REDIS_URL=<master name>,<sentinel>,…
func TestSentinel(t *testing.T) {
	sn := redistest.StartSentinel(t)
	b := backend{"sentinel", []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=sentinel",
		"REDIS_URL=" + redistest.SentinelMaster + "," + strings.Join(sn.Addrs(), ",")}, redis.NewFailoverClient(sn.FailoverOptions())}
	t.Cleanup(func() { _ = b.client.Close() })
	s := start(t, b, map[string]string{"s.yaml": "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"})
	check(t, s.call("s", 0, desc("k=v")), OK, ok(2, HOUR, 1))
	check(t, s.call("s", 0, desc("k=v")), OK, ok(2, HOUR, 0))
	check(t, s.call("s", 0, desc("k=v")), OVER, over(2, HOUR))
	require.EqualValues(t, 1, b.keyCount(t), "the count lives in the primary")
}

// TestGlobalShadowMode: SHADOW_MODE=true answers every call OK overall;
// the statuses still say which descriptor is over, as the reference's do.
func TestGlobalShadowMode(t *testing.T) {
	b := singleBackend(t)
	s := start(t, b, map[string]string{"g.yaml": "domain: g\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 5}\n"},
		"SHADOW_MODE=true")
	check(t, s.call("g", 0, desc("a=1"), desc("b=1")), OK, ok(1, DAY, 0), ok(5, DAY, 4))
	check(t, s.call("g", 0, desc("a=1"), desc("b=1")), OK, over(1, DAY), ok(5, DAY, 3))
	require.EqualValues(t, 1, s.metric("ratelimit_service_global_shadow_mode"))
	require.EqualValues(t, 1, s.metric(`ratelimit_service_rate_limit_over_limit{domain="g",key1="a"}`))
	require.EqualValues(t, 0, s.metric(`ratelimit_service_rate_limit_shadow_mode{domain="g",key1="a"}`))
}

// TestGRPCUnixSocket: GRPC_UDS serves the API on a unix socket.
func TestGRPCUnixSocket(t *testing.T) {
	b := singleBackend(t)
	sock := filepath.Join(t.TempDir(), "rls.sock")
	s := start(t, b, map[string]string{"u.yaml": "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n"},
		"GRPC_UDS="+sock)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	s.rls = pb.NewRateLimitServiceClient(conn)
	check(t, s.call("u", 0, desc("k=v")), OK, ok(1, DAY, 0))
	check(t, s.call("u", 0, desc("k=v")), OVER, over(1, DAY))
}

// TestReferenceYAML: a file in the reference's format that leans on what
// its YAML library resolves (anchors, aliases, merge keys) and on keys it
// accepts and ignores at other levels (name on a descriptor) loads and
// decides as the reference does; a reload to a file the reference refuses
// keeps the last good config and logs the file and line.
func TestReferenceYAML(t *testing.T) {
	b := singleBackend(t)
	s := start(t, b, map[string]string{"r.yaml": `
domain: ref
descriptors:
  - key: api
    name: the API, per client
    rate_limit: &twoPerHour {unit: hour, requests_per_unit: 2}
  - key: admin
    rate_limit: *twoPerHour
  - &tenant
    key: tenant
    descriptors:
      - key: user
        rate_limit: {<<: *twoPerHour, requests_per_unit: 1}
  - <<: *tenant
    key: org
`})
	check(t, s.call("ref", 0, desc("api=a")), OK, ok(2, HOUR, 1))
	check(t, s.call("ref", 0, desc("admin=a")), OK, ok(2, HOUR, 1))
	check(t, s.call("ref", 0, desc("admin=a")), OK, ok(2, HOUR, 0))
	check(t, s.call("ref", 0, desc("admin=a")), OVER, over(2, HOUR))
	check(t, s.call("ref", 0, desc("tenant=t", "user=u")), OK, ok(1, HOUR, 0))
	check(t, s.call("ref", 0, desc("tenant=t", "user=u")), OVER, over(1, HOUR))
	check(t, s.call("ref", 0, desc("org=o", "user=u")), OK, ok(1, HOUR, 0))

	s.write("r.yaml", "domain: ref\ndescriptors:\n  - key: api\n    rate_limit: {unit: hour, requests_per_unit: 1.5}\n")
	redistest.WaitFor(t, "the load error", 20*time.Millisecond, func() bool {
		return s.metric("ratelimit_service_config_load_error") == 1
	})
	require.Contains(t, s.log(), `r.yaml:4: requests_per_unit: \"1.5\" is not a string, an integer or a boolean`)
	check(t, s.call("ref", 0, desc("api=a")), OK, ok(2, HOUR, 0))
}
