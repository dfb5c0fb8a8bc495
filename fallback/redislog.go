package fallback

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisLogger passes go-redis's own log lines ("redis: connection pool:
// failed to dial after 5 attempts: …", one per failed dial and more) to a
// *slog.Logger the program controls, at most one line per message pattern
// per interval: during an outage go-redis would otherwise print a line
// for every dial it tries. A line that follows suppressed ones carries
// their number in the attribute "suppressed".
//
// go-redis has one logger per process; SetRedisLogger installs one. It is
// safe for concurrent use.
type redisLogger struct {
	log   *slog.Logger
	every time.Duration
	mu    sync.Mutex
	seen  map[string]*logPattern
}

type logPattern struct {
	last       time.Time
	suppressed int64
}

// DefaultRedisLogInterval is the interval of SetRedisLogger(l, 0): one
// line per message pattern every 10 s.
const DefaultRedisLogInterval = 10 * time.Second

// maxLogPatterns bounds the patterns remembered; go-redis has a few dozen.
const maxLogPatterns = 256

// SetRedisLogger makes go-redis's own log lines ("redis: connection pool:
// failed to dial after 5 attempts: …", one per failed dial and more) go
// to l (nil: slog.Default()) at Warn level, at most one line per message
// pattern (go-redis's format string) per every (0:
// DefaultRedisLogInterval; a negative every passes every line): during an
// outage go-redis would otherwise print a line for every dial it tries. A
// line that follows suppressed ones carries their number in the attribute
// "suppressed". go-redis has one logger per process (redis.SetLogger);
// call it once, before building clients. spillway never sets it by itself.
func SetRedisLogger(l *slog.Logger, every time.Duration) {
	redis.SetLogger(newRedisLogger(l, every))
}

func newRedisLogger(l *slog.Logger, every time.Duration) *redisLogger {
	if l == nil {
		l = slog.Default()
	}
	if every == 0 {
		every = DefaultRedisLogInterval
	}
	return &redisLogger{log: l, every: every, seen: make(map[string]*logPattern)}
}

// Printf implements go-redis's logger interface (redis.SetLogger).
func (r *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	var suppressed int64
	if r.every > 0 {
		now := time.Now()
		r.mu.Lock()
		p, ok := r.seen[format]
		if !ok {
			if len(r.seen) >= maxLogPatterns {
				clear(r.seen)
			}
			p = &logPattern{}
			r.seen[format] = p
		}
		if ok && now.Sub(p.last) < r.every {
			p.suppressed++
			r.mu.Unlock()
			return
		}
		p.last, suppressed, p.suppressed = now, p.suppressed, 0
		r.mu.Unlock()
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if suppressed > 0 {
		r.log.WarnContext(ctx, fmt.Sprintf(format, v...), "source", "go-redis", "suppressed", suppressed)
		return
	}
	r.log.WarnContext(ctx, fmt.Sprintf(format, v...), "source", "go-redis")
}
