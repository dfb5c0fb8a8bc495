package rlsload

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// Nop is the do-nothing rate limit service: it answers every call OK at
// once, with no status per descriptor. Served by the same gRPC server as
// the real ones, it measures what the machine, gRPC and the load generator
// leave for a decision.
type Nop struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

var okResponse = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

// ShouldRateLimit answers OK.
func (Nop) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return okResponse, nil
}

// Register registers Nop on s.
func Register(s *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(s, Nop{}) }
