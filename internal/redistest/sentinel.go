package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the test sentinels monitor.
const SentinelMaster = "spillway"

// Sentinel is a primary, a replica and three sentinels on loopback, tuned so
// that a failover takes a few seconds: the primary is considered down after
// DownAfter without answers, and a failover attempt times out after
// FailoverTimeout.
type Sentinel struct {
	Primary   *Server   // the primary at start; after a failover, see Master
	Replica   *Server   // its replica at start
	Sentinels []*Server // three sentinels, quorum 2

	DownAfter       time.Duration
	FailoverTimeout time.Duration
}

// StartSentinel starts the primary, the replica and three sentinels, waits
// until the replica is in sync and every sentinel knows the replica and the
// two other sentinels (so a failover can start as soon as the primary dies),
// and stops everything when the test ends.
func StartSentinel(t TB) *Sentinel {
	t.Helper()
	s, err := StartSentinelServers(t.TempDir())
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartSentinelServers is StartSentinel without a test: the caller must call
// Stop.
func StartSentinelServers(dir string) (s *Sentinel, err error) {
	s = &Sentinel{DownAfter: 400 * time.Millisecond, FailoverTimeout: 2 * time.Second}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if s.Primary, err = StartServer(dir); err != nil {
		return nil, err
	}
	if s.Replica, err = StartServer(dir, "--replicaof", "127.0.0.1", strconv.Itoa(s.Primary.Port)); err != nil {
		return nil, err
	}
	for i := 0; i < 3; i++ {
		sn, err := startSentinel(dir, s.Primary.Port, s.DownAfter, s.FailoverTimeout)
		if err != nil {
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, sn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitStable(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func startSentinel(dir string, primaryPort int, downAfter, failoverTimeout time.Duration) (*Server, error) {
	bin, err := ServerBinary()
	if err != nil {
		return nil, err
	}
	return startOnFreePort(bin, dir, "sentinel", func(port int, sdir string) ([]string, error) {
		conf := filepath.Join(sdir, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, port, sdir, filepath.Join(sdir, "redis.log"),
			SentinelMaster, primaryPort,
			SentinelMaster, downAfter.Milliseconds(),
			SentinelMaster, failoverTimeout.Milliseconds(),
			SentinelMaster)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, err
		}
		return []string{conf, "--sentinel"}, nil
	})
}

// waitStable waits until the replica's link is up and every sentinel sees
// one replica and two other sentinels.
func (s *Sentinel) waitStable(ctx context.Context) error {
	ready := func() (bool, string) {
		info, err := s.Replica.Do(ctx, "INFO", "replication")
		if err != nil {
			return false, err.Error()
		}
		if str, _ := info.(string); !strings.Contains(str, "master_link_status:up") {
			return false, "replica link not up"
		}
		for _, sn := range s.Sentinels {
			reps, err := sn.Do(ctx, "SENTINEL", "REPLICAS", SentinelMaster)
			if err != nil {
				return false, err.Error()
			}
			if l, _ := reps.([]any); len(l) != 1 {
				return false, fmt.Sprintf("sentinel %s sees %d replicas", sn.Addr, len(l))
			}
			sns, err := sn.Do(ctx, "SENTINEL", "SENTINELS", SentinelMaster)
			if err != nil {
				return false, err.Error()
			}
			if l, _ := sns.([]any); len(l) != 2 {
				return false, fmt.Sprintf("sentinel %s sees %d other sentinels", sn.Addr, len(l))
			}
		}
		return true, ""
	}
	for {
		ok, why := ready()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: sentinel setup not stable: %s", why)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Addrs returns the sentinels' addresses, for redis.FailoverOptions.
func (s *Sentinel) Addrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		addrs[i] = sn.Addr
	}
	return addrs
}

// FailoverOptions returns options for redis.NewFailoverClient that reach
// the monitored primary through the sentinels.
func (s *Sentinel) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: s.Addrs()}
}

// Master asks the sentinels for the current primary's address. It returns
// the first answer; during a failover sentinels may briefly disagree.
func (s *Sentinel) Master(ctx context.Context) (string, error) {
	var lastErr error
	for _, sn := range s.Sentinels {
		res, err := sn.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster)
		if err != nil {
			lastErr = err
			continue
		}
		l, ok := res.([]any)
		if !ok || len(l) != 2 {
			lastErr = fmt.Errorf("redistest: unexpected sentinel reply %v", res)
			continue
		}
		host, _ := l[0].(string)
		port, _ := l[1].(string)
		return host + ":" + port, nil
	}
	return "", fmt.Errorf("redistest: no sentinel answered: %w", lastErr)
}

// WaitFailover waits until a majority of the sentinels name a primary other
// than old, and that server answers as a master.
func (s *Sentinel) WaitFailover(ctx context.Context, old string) (string, error) {
	for {
		votes := map[string]int{}
		for _, sn := range s.Sentinels {
			res, err := sn.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster)
			if l, ok := res.([]any); err == nil && ok && len(l) == 2 {
				host, _ := l[0].(string)
				port, _ := l[1].(string)
				votes[host+":"+port]++
			}
		}
		for addr, n := range votes {
			if addr != old && n >= 2 {
				c := redis.NewClient(&redis.Options{Addr: addr})
				role, err := c.Do(ctx, "ROLE").Slice()
				c.Close()
				if err == nil && len(role) > 0 && role[0] == "master" {
					return addr, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("redistest: no failover away from %s: %w", old, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop stops every process. It is safe to call twice.
func (s *Sentinel) Stop() {
	for _, sn := range s.Sentinels {
		sn.Stop()
	}
	if s.Replica != nil {
		s.Replica.Stop()
	}
	if s.Primary != nil {
		s.Primary.Stop()
	}
}
