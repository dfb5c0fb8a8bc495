package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestSentinelFailover(t *testing.T) {
	s := StartSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := s.Master(ctx); err != nil || got != s.Primary.Addr {
		t.Fatalf("Master = %q, %v; want %s", got, err, s.Primary.Addr)
	}
	c := redis.NewFailoverClient(s.FailoverOptions())
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Wait for the write to reach the replica, so it survives the failover.
	if err := c.Do(ctx, "WAIT", 1, 2000).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Primary.Kill()
	addr, err := s.WaitFailover(ctx, s.Primary.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if addr != s.Replica.Addr {
		t.Fatalf("new primary %s; want the replica %s", addr, s.Replica.Addr)
	}
	t.Logf("failover took %v", time.Since(start))
	var v string
	for {
		v, err = c.Get(ctx, "k").Result()
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || v != "v" {
		t.Fatalf("GET through the failover client after promotion = %q, %v; want v", v, err)
	}
}
