package sim

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/redistest"
)

// Redis conditions a phase can put the fault proxy in.
const (
	RedisHealthy = "healthy"
	RedisSlow    = "slow" // latency past the full chain's time budget
	RedisDown    = "down" // the proxy stalls every byte: a hung Redis
)

// slowLatency is added each way in the "slow" phase: a 2·slowLatency round
// trip, well past the full chain's budget and a heavy load on a naive
// client's connection pool.
const slowLatency = 300 * time.Millisecond

// RedisEnv is the Redis the fleet talks to, always through the fault proxy.
type RedisEnv struct {
	Kind string // what it is, for the report
	// Direct connects the fleet to Redis itself instead of through the
	// proxy (-no-proxy), to tell the proxy's effects from Redis's; the
	// Redis phases then do nothing.
	Direct bool
	own    bool // started by the harness: it may be flushed
	target string
	proxy  *faultproxy.Proxy
	srv    *redistest.Server
	mini   *miniredis.Miniredis
}

// StartRedis starts the Redis for a run: the one at addr when given,
// else a redis-server on a free loopback port, else (redis-server not
// installed) an embedded in-process miniredis.
func StartRedis(addr, dir string) (*RedisEnv, error) {
	e := &RedisEnv{}
	switch {
	case addr != "":
		e.Kind = "existing Redis at " + addr + " (-redis)"
		e.target = addr
	default:
		if _, err := redistest.ServerBinary(); err == nil {
			srv, err := redistest.StartServer(dir)
			if err != nil {
				return nil, fmt.Errorf("loadtest: %w", err)
			}
			e.srv, e.own, e.target = srv, true, srv.Addr
			e.Kind = "redis-server " + redisVersion() + " started by the harness on " + srv.Addr
		} else {
			m, err := miniredis.Run()
			if err != nil {
				return nil, fmt.Errorf("loadtest: embedded redis: %w", err)
			}
			e.mini, e.own, e.target = m, true, m.Addr()
			e.Kind = "embedded in-process Redis (miniredis; redis-server is not installed) on " + m.Addr()
		}
	}
	p, err := faultproxy.NewProxy(e.target)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	e.proxy = p
	c := redis.NewClient(&redis.Options{Addr: e.target, DialTimeout: 2 * time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		e.Close()
		return nil, fmt.Errorf("loadtest: redis at %s: %w", e.target, err)
	}
	return e, nil
}

func redisVersion() string {
	bin, err := redistest.ServerBinary()
	if err != nil {
		return ""
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return ""
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return ""
}

// Addr is the address the fleet dials: the fault proxy.
func (e *RedisEnv) Addr() string {
	if e.Direct {
		return e.target
	}
	return e.proxy.Addr()
}

// Set puts Redis into a condition.
func (e *RedisEnv) Set(cond string) {
	switch cond {
	case RedisSlow:
		_ = e.proxy.SetMode(faultproxy.Pass)
		e.proxy.SetLatency(slowLatency, slowLatency)
	case RedisDown:
		e.proxy.SetLatency(0, 0)
		_ = e.proxy.SetMode(faultproxy.Stall)
	default:
		e.proxy.SetLatency(0, 0)
		_ = e.proxy.SetMode(faultproxy.Pass)
	}
}

// Flush empties a Redis the harness started (between configurations); an
// existing Redis (-redis) is never flushed: every configuration uses its
// own key prefix instead.
func (e *RedisEnv) Flush() {
	if !e.own {
		return
	}
	if e.mini != nil {
		e.mini.FlushAll()
		return
	}
	c := redis.NewClient(&redis.Options{Addr: e.target})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = c.FlushAll(ctx).Err()
}

// Close stops the proxy and what the harness started.
func (e *RedisEnv) Close() {
	if e.proxy != nil {
		_ = e.proxy.Close()
	}
	if e.srv != nil {
		e.srv.Stop()
	}
	if e.mini != nil {
		e.mini.Close()
	}
}

// Probe PINGs Redis through the proxy every interval until ctx ends and
// records the latency of the answered ones and the failures (no answer
// within a second: Redis hung, not slow).
func (e *RedisEnv) Probe(ctx context.Context, rec *Recorder, every time.Duration) {
	const timeout = time.Second
	c := redis.NewClient(&redis.Options{
		Addr: e.Addr(), DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
		PoolSize: 1, MaxRetries: -1, ContextTimeoutEnabled: true,
	})
	defer c.Close()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		start := time.Now()
		err := c.Ping(pctx).Err()
		cancel()
		if ctx.Err() != nil {
			return
		}
		rec.RedisProbe(time.Since(start), err == nil)
	}
}
