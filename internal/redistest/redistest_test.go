package redistest

import (
	"context"
	"testing"
)

func TestStartPingRestart(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := c.Get(ctx, "k").Val(); got != "v" {
		t.Fatalf("get = %q, want v", got)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	n, err := c.Exists(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("after restart exists = %d, want 0 (empty memory)", n)
	}
}
