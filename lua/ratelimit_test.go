package lua

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

// The rate-limit scripts open with their contract and load on a real
// server under the SHA go-redis computes (so EVALSHA finds them).
func TestRateLimitScripts(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for name, sc := range map[string]struct {
		src    string
		script *redis.Script
	}{
		"ratelimit_batch.lua":        {ratelimitBatchSrc, RateLimitBatch},
		"ratelimit_token_bucket.lua": {ratelimitTokenBucketSrc, RateLimitTokenBucket},
		"ratelimit_refund.lua":       {ratelimitRefundSrc, RateLimitRefund},
	} {
		if !strings.HasPrefix(sc.src, "-- "+name+":") {
			t.Errorf("%s does not open with its name and purpose", name)
		}
		head := sc.src[:strings.Index(sc.src, "\nlocal ")]
		for _, part := range []string{"KEYS[", "ARGV[", "Reply", "Writes"} {
			if !strings.Contains(head, part) {
				t.Errorf("%s: the opening contract does not mention %s", name, part)
			}
		}
		sha, err := sc.script.Load(ctx, c).Result()
		if err != nil {
			t.Fatalf("%s: SCRIPT LOAD: %v", name, err)
		}
		if sha != sc.script.Hash() {
			t.Errorf("%s: server SHA %s, go-redis %s", name, sha, sc.script.Hash())
		}
	}
}
