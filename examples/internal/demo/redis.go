package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/telemetry"
	"go.opentelemetry.io/otel/metric"
)

// Redis is the examples' connection to one Redis: the client, tuned so
// that a slow Redis costs a request one budget rather than seconds, and
// the one health every Redis-backed block of the chain shares.
type Redis struct {
	Client *redis.Client
	Health *fallback.Health
	close  []func()
}

// ConnectRedis connects to addr (failing when it does not answer a PING
// within 2 s), routes go-redis's own log lines through a rate-limited
// logger (one line per message pattern per 10 s), and publishes the shared
// health as the breaker gauge named "redis".
func ConnectRedis(ctx context.Context, addr string, budget time.Duration, mp metric.MeterProvider) (*Redis, error) {
	opt := &redis.Options{Addr: addr}
	if budget > fallback.ClientIOTimeout {
		opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = budget, budget, budget
	}
	fallback.TuneOptions(opt) // millisecond timeouts: a slow Redis costs a budget, not seconds
	r := &Redis{Client: redis.NewClient(opt)}
	r.close = append(r.close, func() { r.Client.Close() })
	pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := r.Client.Ping(pingCtx).Err(); err != nil {
		r.Close()
		return nil, fmt.Errorf("redis %s: %w", addr, err)
	}
	fallback.SetRedisLogger(nil, 0)
	var err error
	if r.Health, err = fallback.NewHealth(r.Client, fallback.HealthSettings{Name: "redis"}); err != nil {
		r.Close()
		return nil, err
	}
	stop, err := telemetry.ObserveBreaker("redis", r.Health.State, mp)
	if err != nil {
		r.Close()
		return nil, err
	}
	r.close = append(r.close, func() { stop() })
	return r, nil
}

// Settings returns the fallback settings of the block called name: the
// request's budget and the shared health.
func (r *Redis) Settings(name string, budget time.Duration) fallback.Settings {
	return fallback.Settings{Name: name, Budget: budget, Health: r.Health}
}

// Close stops the gauge and closes the client.
func (r *Redis) Close() {
	for i := len(r.close) - 1; i >= 0; i-- {
		r.close[i]()
	}
}
