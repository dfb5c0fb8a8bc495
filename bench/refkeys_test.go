package bench

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/spillway-go/spillway/internal/redistest"
)

// rolloutServer is one rate limit server process of TestRollingSwap.
type rolloutServer struct {
	name string
	rls  pb.RateLimitServiceClient
	log  string
}

func freePort(t *testing.T) string {
	p, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

// startRollout builds pkg (from dir, GOWORK=off for the reference as
// rlsbench builds it) and runs it on redisAddr with root's configs.
func startRollout(t *testing.T, name, dir, pkg string, gowork bool, redisAddr, root string, extra ...string) *rolloutServer {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Dir = dir
	if !gowork {
		build.Env = append(os.Environ(), "GOWORK=off")
	}
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, out)
	}
	grpcPort, httpPort, debugPort := freePort(t), freePort(t), freePort(t)
	s := &rolloutServer{name: name, log: filepath.Join(t.TempDir(), name+".log")}
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort, "HOST=127.0.0.1", "PORT=" + httpPort,
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + debugPort,
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "LOG_LEVEL=warn", "CACHE_KEY_PREFIX=rl:"}, extra...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://127.0.0.1:" + httpPort + "/healthcheck")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.log)
			t.Fatalf("%s not healthy within 60s:\n%s", name, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.rls = pb.NewRateLimitServiceClient(conn)
	return s
}

// TestRollingSwap: the reference server (pinned in this module) and
// spillway's with SPILLWAY_KEY_FORMAT=reference, on one redis-server,
// called in turn for the same descriptors, together admit exactly each
// limit per window: they share the reference's counters (its key names,
// CACHE_KEY_PREFIX, its integer counts), and spillway's layout is not
// written at all.
func TestRollingSwap(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the reference server")
	}
	rs := redistest.Start(t)
	client := rs.Client(t)
	root := t.TempDir()
	cfg := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := `domain: rollout
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 3}
`
	if err := os.WriteFile(filepath.Join(cfg, "rollout.yaml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ref := startRollout(t, "reference", ".", "github.com/envoyproxy/ratelimit/src/service_cmd", false, rs.Addr, root)
	spw := startRollout(t, "spillway", "../cmd/spillway-ratelimit", ".", true, rs.Addr, root,
		"SPILLWAY_KEY_FORMAT=reference", "SPILLWAY_BUDGET=5s")

	call := func(s *rolloutServer, pairs ...string) *pb.RateLimitResponse_DescriptorStatus {
		t.Helper()
		d := &rlv3.RateLimitDescriptor{}
		for i := 0; i < len(pairs); i += 2 {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: pairs[i], Value: pairs[i+1]})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := s.rls.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "rollout", Descriptors: []*rlv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		return resp.Statuses[0]
	}
	for _, tc := range []struct {
		pairs []string
		limit int
		unit  int64 // seconds
		key   string
	}{
		{[]string{"user", "alice"}, 5, 3600, "rl:rollout_user_alice_"},
		{[]string{"plan", "free", "user", "bob"}, 3, 86400, "rl:rollout_plan_free_user_bob_"},
	} {
		start := time.Now().Unix() / tc.unit * tc.unit
		admitted, refDenied := 0, 0
		for i := range 4 * tc.limit {
			s := ref
			if i%2 == 1 {
				s = spw
			}
			st := call(s, tc.pairs...)
			switch st.Code {
			case pb.RateLimitResponse_OK:
				admitted++
				if want := uint32(tc.limit - admitted); st.LimitRemaining != want {
					t.Fatalf("call %d (%s): limit_remaining %d, want %d", i, s.name, st.LimitRemaining, want)
				}
			case pb.RateLimitResponse_OVER_LIMIT:
				if admitted != tc.limit {
					t.Fatalf("call %d (%s): over the limit after %d admitted of %d", i, s.name, admitted, tc.limit)
				}
				if s == ref {
					refDenied++
				}
			default:
				t.Fatalf("call %d (%s): %v", i, s.name, st.Code)
			}
		}
		if time.Now().Unix()/tc.unit*tc.unit != start {
			t.Skip("a window boundary passed during the test")
		}
		if admitted != tc.limit {
			t.Fatalf("%v: admitted %d, want exactly %d", tc.pairs, admitted, tc.limit)
		}
		// the one counter: the reference's key, its count (the reference
		// charges the calls it denies; spillway does not)
		key := tc.key + strconv.FormatInt(start, 10)
		n, err := client.Get(context.Background(), key).Int()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		if n != tc.limit+refDenied {
			t.Fatalf("%s = %d, want %d (%d admitted + %d denied by the reference)", key, n, tc.limit+refDenied, tc.limit, refDenied)
		}
		ttl, err := client.TTL(context.Background(), key).Result()
		// one unit from the last write; the reference adds up to
		// EXPIRATION_JITTER_MAX_SECONDS (300) to its writes
		if err != nil || ttl <= 0 || ttl > time.Duration(tc.unit+300)*time.Second {
			t.Fatalf("TTL %s = %v (%v), want within one unit and the reference's jitter", key, ttl, err)
		}
	}
	keys, err := client.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("keys %v: want only the reference's two", keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "rl:rollout_") {
			t.Fatalf("key %q is not the reference's", k)
		}
	}
}
