package rls

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spillway-go/spillway/ratelimit"
)

// A call whose deadline has passed when it comes is answered at once,
// undecided (nothing charged), as SPILLWAY_LATE_ANSWER says, and counted.
func TestLateCallIsRefusedUndecided(t *testing.T) {
	cfg, err := load(t, `
domain: late
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 2}
`)
	if err != nil {
		t.Fatal(err)
	}
	req := &pb.RateLimitRequest{Domain: "late", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	for _, tc := range []struct {
		answer string
		code   codes.Code
		want   pb.RateLimitResponse_Code
	}{
		{"error", codes.DeadlineExceeded, 0},
		{"ok", codes.OK, pb.RateLimitResponse_OK},
		{"over_limit", codes.OK, pb.RateLimitResponse_OVER_LIMIT},
	} {
		set := DefaultSettings()
		if set.LateAnswer != "error" {
			t.Fatalf("default SPILLWAY_LATE_ANSWER %q, want error", set.LateAnswer)
		}
		set.LateAnswer = tc.answer
		svc := NewService(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), set, nil)
		svc.SetConfig(cfg)
		for range 3 {
			resp, err := svc.ShouldRateLimit(expired, req)
			if status.Code(err) != tc.code || resp.GetOverallCode() != tc.want {
				t.Fatalf("%s: late call answered %v, %v; want %v, %v", tc.answer, resp.GetOverallCode(), err, tc.code, tc.want)
			}
		}
		if got := svc.stats.Late.Load(); got != 3 {
			t.Fatalf("%s: %d late calls counted, want 3", tc.answer, got)
		}
		// nothing was charged: a call in time finds the whole limit
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("%s: call in time after the late ones: %v %v; want OK with 1 left", tc.answer, resp, err)
		}
	}
}
