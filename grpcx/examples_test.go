package grpcx_test

import (
	"fmt"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/ratelimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func ExampleUnaryServerInterceptor() {
	lim, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Limit: 100, Period: time.Second}, ratelimit.Settings{})
	if err != nil {
		panic(err)
	}
	chain := spillway.Chain(ratelimit.PerKey(lim, spillway.DimAPIKey))
	set := grpcx.ServerSettings{APIKeyMetadata: "x-api-key", Skip: grpcx.SkipMethods("/grpc.health.v1.Health/")}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpcx.UnaryServerInterceptor(chain, set)),
		grpc.ChainStreamInterceptor(grpcx.StreamServerInterceptor(chain, set)),
	)
	defer srv.Stop()
	// register services, then srv.Serve(listener)
}

func ExampleUnaryClientInterceptor() {
	c := clientside.NewClient() // one per backend: throttle, retry budget, retries
	conn, err := grpc.NewClient("127.0.0.1:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(c, grpcx.ClientSettings{})),
		grpc.WithChainStreamInterceptor(grpcx.StreamClientInterceptor(c, grpcx.ClientSettings{})),
	)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
}

func ExampleDenialStatus() {
	st := grpcx.DenialStatus(spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "per_key", Limit: 100, RetryAfter: 1500 * time.Millisecond})
	fmt.Println(st.Code(), st.Message())
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			fmt.Println("ErrorInfo", d.GetDomain(), d.GetReason())
		case *errdetails.QuotaFailure:
			fmt.Println("QuotaFailure", d.GetViolations()[0].GetSubject())
		case *errdetails.RetryInfo:
			fmt.Println("RetryInfo", d.GetRetryDelay().AsDuration())
		}
	}
	// Output:
	// ResourceExhausted spillway: rate_limited by "per_key"
	// ErrorInfo spillway RATE_LIMITED
	// QuotaFailure per_key
	// RetryInfo 1.5s
}
