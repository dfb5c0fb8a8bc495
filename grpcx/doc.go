// Package grpcx puts a spillway.Limiter in front of gRPC servers and gives
// gRPC clients interceptors that back off the way the server asks, in the
// style of go-grpc-middleware v2: UnaryServerInterceptor,
// StreamServerInterceptor, UnaryClientInterceptor and
// StreamClientInterceptor, with a selector (SkipMethods; the health
// service is "/grpc.health.v1.Health/") to leave methods alone. Each is configured one way, by
// a struct whose zero value is the default: ServerSettings for the server
// interceptors, a *clientside.Client and ClientSettings for the client
// ones; a setting that does not apply to one does not compile against it.
//
// The shortest use:
//
//	import "google.golang.org/grpc"
//
//	set := grpcx.ServerSettings{Skip: grpcx.SkipMethods("/grpc.health.v1.Health/")}
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpcx.UnaryServerInterceptor(chain, set)),
//		grpc.ChainStreamInterceptor(grpcx.StreamServerInterceptor(chain, set)),
//	)
//	conn, err := grpc.NewClient(addr, creds,
//		grpc.WithChainUnaryInterceptor(grpcx.UnaryClientInterceptor(clientside.NewClient(), grpcx.ClientSettings{})))
//
// # Server
//
// Each call (each stream, when it opens) becomes a spillway.Request: the
// Endpoint is the full method ("/pkg.Service/Method"), Method is empty,
// Priority comes from the classifier (ServerSettings.Priority; default Critical),
// lowered by the caller's spillway.PriorityMetadataKey metadata whatever
// the classifier (IgnoreReceivedPriority turns that off), and the
// identity dimensions are "ip" (the
// peer address, or x-forwarded-for from a trusted proxy: TrustedProxies),
// "user" (User or UserMetadata) and "api_key"
// (APIKeyMetadata). A denial answers codes.ResourceExhausted for rate
// and concurrency limits, codes.Unavailable for shedding, the ceiling and a
// failed-closed store, codes.InvalidArgument for a malformed request, with
// the details errdetails.ErrorInfo, QuotaFailure and RetryInfo (see
// DenialStatus). Calls a limit applied to carry x-ratelimit-limit,
// x-ratelimit-remaining and x-ratelimit-reset response headers (metadata).
// Done runs when the handler returns (Success, Dropped for Unavailable,
// DeadlineExceeded, ResourceExhausted and server faults, Ignored for
// Canceled and once the client's deadline has passed) and also when it
// panics (Ignored; the panic goes on).
//
// When the limiter returns an error (its store failed and no fallback
// decided; the library's Redis blocks decide locally instead, marked
// Degraded), ServerSettings.FailMode applies: spillway.FailOpen (the
// default) runs the handler unlimited, spillway.FailClosed answers
// codes.Unavailable; a *spillway.StoreError whose Fail is FailClosed is
// answered Unavailable either way. OnError sees every such error.
//
// # Client
//
// The client interceptors take a *clientside.Client, which holds the
// client side (adaptive throttle, retry budget, backoff, retries; one per
// backend): UnaryClientInterceptor retries denials that carry RetryInfo
// under the budget, with jitter, and throttles adaptively; both
// interceptors send the context's priority downstream.
//
// All interceptors are safe for concurrent use.
package grpcx
