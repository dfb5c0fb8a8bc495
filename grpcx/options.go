package grpcx

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/spillway-go/spillway"
)

// Option configures the interceptors. Server options are ignored by the
// client interceptors and the other way round, as documented on each.
type Option func(*config)

type config struct {
	// server
	skip          func(ctx context.Context, fullMethod string) bool
	priority      func(ctx context.Context, fullMethod string) spillway.Priority
	trustPriority bool
	noReceived    bool
	cost          func(ctx context.Context, fullMethod string) int64
	meter         bool
	estimateMD    string
	apiKeyMD      string
	userMD        string
	user          func(ctx context.Context) string
	failMode      spillway.FailMode
	onError       func(ctx context.Context, fullMethod string, err error)
	now           func() time.Time
	trusted       []netip.Prefix

	// client
	retryable   func(fullMethod string) bool
	noPropagate bool
}

func newConfig(opts []Option) config {
	c := config{now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// WithSkip sets a selector: calls for which skip returns true bypass the
// limiter (server) or the retry and throttle logic (client). SkipMethods and
// SkipHealthChecks build common ones.
func WithSkip(skip func(ctx context.Context, fullMethod string) bool) Option {
	return func(c *config) { c.skip = skip }
}

// SkipMethods returns a selector matching the given full method names
// ("/pkg.Service/Method") and services ("/pkg.Service/", with the slash).
func SkipMethods(methods ...string) func(ctx context.Context, fullMethod string) bool {
	return func(_ context.Context, m string) bool {
		for _, s := range methods {
			if m == s || (strings.HasSuffix(s, "/") && strings.HasPrefix(m, s)) {
				return true
			}
		}
		return false
	}
}

// SkipHealthChecks is a selector matching the standard gRPC health service.
var SkipHealthChecks = SkipMethods("/grpc.health.v1.Health/")

// WithPriority sets the server's classifier (default: every call is
// spillway.Critical). Whatever the classifier, the priority named in the
// caller's spillway.PriorityMetadataKey metadata lowers it (never raises
// it, unless WithTrustPriorityMetadata; see spillway.ReceivedPriority),
// unless WithoutReceivedPriority. A classifier returning an invalid
// priority gets the call answered InvalidArgument. Server only.
func WithPriority(classify func(ctx context.Context, fullMethod string) spillway.Priority) Option {
	return func(c *config) { c.priority = classify }
}

// WithTrustPriorityMetadata lets the spillway.PriorityMetadataKey metadata
// raise a call's priority too. Use it only behind an edge that strips the key from
// outside traffic. Server only.
func WithTrustPriorityMetadata() Option {
	return func(c *config) { c.trustPriority = true }
}

// WithoutReceivedPriority ignores the spillway.PriorityMetadataKey
// metadata a caller sends: the classifier (WithPriority) alone gives the
// priority. By default a caller's lower priority wins over the
// classifier's. Server only.
func WithoutReceivedPriority() Option {
	return func(c *config) { c.noReceived = true }
}

// WithCost sets how many tokens a call costs (default 1). Server only.
func WithCost(f func(ctx context.Context, fullMethod string) int64) Option {
	return func(c *config) { c.cost = f }
}

// WithAPIKeyMetadata names the metadata key carrying the API key ("api_key"
// dimension). Keys are lowercased. Default: none. Server only.
func WithAPIKeyMetadata(key string) Option {
	return func(c *config) { c.apiKeyMD = strings.ToLower(key) }
}

// WithUserMetadata names the metadata key carrying the user ("user"
// dimension). Default: none. Server only.
func WithUserMetadata(key string) Option {
	return func(c *config) { c.userMD = strings.ToLower(key) }
}

// WithUser sets a func returning the authenticated user from the call's
// context (where an auth interceptor put it); it wins over
// WithUserMetadata when it returns non-empty. Server only.
func WithUser(f func(ctx context.Context) string) Option {
	return func(c *config) { c.user = f }
}

// WithFailMode sets what happens when the limiter returns an error
// (default spillway.FailOpen: the handler runs). A *spillway.StoreError
// whose Fail is spillway.FailClosed (a call that matched a tiers rule with
// fail: closed, say) is denied whatever the mode. Server only.
func WithFailMode(m spillway.FailMode) Option {
	return func(c *config) { c.failMode = m }
}

// WithErrorHandler sets a func called with every limiter error, for
// logging. Server only.
func WithErrorHandler(f func(ctx context.Context, fullMethod string, err error)) Option {
	return func(c *config) { c.onError = f }
}

// WithClock sets the clock for the x-ratelimit-reset header (default
// time.Now). Server only.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// WithRetryable restricts which methods the client retries. By default
// every method is retried when the server's denial carries RetryInfo: a
// limiter denied the call before the handler ran, so a retry cannot do the
// work twice. Client only.
func WithRetryable(f func(fullMethod string) bool) Option {
	return func(c *config) { c.retryable = f }
}

// WithoutPriorityPropagation stops the client from sending the context's
// priority (spillway.ContextWithPriority) in the
// spillway.PriorityMetadataKey metadata, and
// the server from storing the call's priority in the handler's context.
func WithoutPriorityPropagation() Option {
	return func(c *config) { c.noPropagate = true }
}

// WithTrustedProxies lists the proxies whose x-forwarded-for metadata is
// believed. The "ip" dimension is the peer address unless the peer is in
// one of these prefixes; then it is the right-most x-forwarded-for address
// that is not itself a trusted proxy (the left-most if all are). The
// metadata from any other peer is ignored, so a client cannot choose its
// own key. Default: none. Server only.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return func(c *config) { c.trusted = append(c.trusted[:0:0], prefixes...) }
}

// WithUsage (server) meters each call's actual cost: the interceptor puts
// a spillway.Usage in Request.Usage and in the handler's context, where the
// handler reports with spillway.ReportUsage (per message of a server
// stream). The cost (WithCost, WithEstimateMetadata) is then the estimate,
// which a "cost: response" rule holds at admission and settles to the
// reported total when the handler returns. When ReportUsage returns an
// error the limit is spent: a streaming handler stops and returns
// UsageStatus(err) (ResourceExhausted).
func WithUsage() Option {
	return func(c *config) { c.meter = true }
}

// WithEstimateMetadata (server) takes the estimate from the incoming
// metadata key (lowercase), a decimal integer in [0, MaxInt64]; a
// malformed value is answered InvalidArgument with the reason. It implies
// WithUsage.
func WithEstimateMetadata(key string) Option {
	return func(c *config) { c.estimateMD, c.meter = strings.ToLower(key), true }
}
