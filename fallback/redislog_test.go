package fallback_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway/fallback"
)

func TestRedisLoggerRateLimitsPerPattern(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		l := fallback.NewRedisLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		})), time.Second)
		ctx := context.Background()
		const dial = "redis: connection pool: failed to dial after %d attempts: %v"
		for i := 0; i < 100; i++ {
			l.Printf(ctx, dial, 5, "connection refused")
		}
		l.Printf(ctx, "sentinel: %s", "other pattern")
		time.Sleep(time.Second)
		l.Printf(ctx, dial, 5, "connection refused")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		want := []string{
			`level=WARN msg="redis: connection pool: failed to dial after 5 attempts: connection refused" source=go-redis`,
			`level=WARN msg="sentinel: other pattern" source=go-redis`,
			`level=WARN msg="redis: connection pool: failed to dial after 5 attempts: connection refused" source=go-redis suppressed=99`,
		}
		if len(lines) != len(want) {
			t.Fatalf("%d lines:\n%s\nwant %d", len(lines), buf.String(), len(want))
		}
		for i := range want {
			if lines[i] != want[i] {
				t.Fatalf("line %d = %s\nwant %s", i, lines[i], want[i])
			}
		}
	})
}
