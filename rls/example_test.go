package rls_test

import (
	"context"
	"fmt"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/rls"
)

func ExampleService() {
	cfg, err := rls.Load([]rls.File{{Name: "example.yaml", Content: []byte(`
domain: example
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 2}
`)}}, rls.LoadOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// a MemoryStore for the example; the binary uses Redis behind a fallback
	svc := rls.NewService(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), rls.DefaultSettings(), nil)
	svc.SetConfig(cfg)
	req := &pb.RateLimitRequest{Domain: "example", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}
	for range 3 {
		resp, _ := svc.ShouldRateLimit(context.Background(), req)
		fmt.Println(resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	// Output:
	// OK 1
	// OK 0
	// OVER_LIMIT 0
}
