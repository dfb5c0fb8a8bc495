package grpcx

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/spillway-go/spillway"
)

// ServerSettings configures UnaryServerInterceptor and
// StreamServerInterceptor; its zero value is the default.
type ServerSettings struct {
	// Skip selects calls that bypass the limiter; SkipMethods builds one
	// (SkipMethods("/grpc.health.v1.Health/") for the health service).
	Skip func(ctx context.Context, fullMethod string) bool

	// Priority is the classifier (default: every call is
	// spillway.Critical). Whatever the classifier, the priority named in
	// the caller's spillway.PriorityMetadataKey metadata lowers it (never
	// raises it, unless TrustPriorityMetadata: lowering is always safe),
	// unless IgnoreReceivedPriority. A
	// classifier returning an invalid priority gets the call answered
	// InvalidArgument.
	Priority func(ctx context.Context, fullMethod string) spillway.Priority

	// TrustPriorityMetadata lets the spillway.PriorityMetadataKey metadata
	// raise a call's priority too. Use it only behind an edge that strips
	// the key from outside traffic.
	TrustPriorityMetadata bool

	// IgnoreReceivedPriority ignores the spillway.PriorityMetadataKey
	// metadata a caller sends: the classifier (Priority) alone gives the
	// priority.
	IgnoreReceivedPriority bool

	// Cost says how many tokens a call costs (default 1).
	Cost func(ctx context.Context, fullMethod string) int64

	// APIKeyMetadata names the metadata key carrying the API key
	// ("api_key" dimension); it is lowercased. Default: none.
	APIKeyMetadata string

	// UserMetadata names the metadata key carrying the user ("user"
	// dimension); it is lowercased. Default: none.
	UserMetadata string

	// User returns the authenticated user from the call's context (where
	// an auth interceptor put it); it wins over UserMetadata when it
	// returns non-empty.
	User func(ctx context.Context) string

	// FailMode is what happens when the limiter returns an error (default
	// spillway.FailOpen: the handler runs). A *spillway.StoreError whose
	// Fail is spillway.FailClosed (a call that matched a tiers rule with
	// fail: closed, say) is denied whatever the mode.
	FailMode spillway.FailMode

	// OnError is called with every limiter error, for logging.
	OnError func(ctx context.Context, fullMethod string, err error)

	// Clock is the clock for the x-ratelimit-reset header (default
	// time.Now).
	Clock func() time.Time

	// NoPriorityContext stops the interceptors from storing the call's
	// priority in the handler's context (spillway.ContextWithPriority),
	// where the client interceptors find it to propagate downstream.
	NoPriorityContext bool

	// TrustedProxies lists the proxies whose x-forwarded-for metadata is
	// believed. The "ip" dimension is the peer address unless the peer is
	// in one of these prefixes; then it is the right-most x-forwarded-for
	// address that is not itself a trusted proxy (the left-most if all
	// are). The metadata from any other peer is ignored, so a client
	// cannot choose its own key. Default: none.
	TrustedProxies []netip.Prefix

	// Usage meters each call's actual cost: the interceptor puts a
	// spillway.Usage in Request.Usage and in the handler's context, where
	// the handler reports with spillway.ReportUsage (per message of a
	// server stream). The cost (Cost, EstimateMetadata) is then the
	// estimate, which a "cost: response" rule holds at admission and
	// settles to the reported total when the handler returns. When
	// ReportUsage returns an error the limit is spent: a streaming handler
	// stops and returns UsageStatus(err) (ResourceExhausted).
	Usage bool

	// EstimateMetadata takes the estimate from this incoming metadata key
	// (lowercased), a decimal integer in [0, MaxInt64]; a malformed value
	// is answered InvalidArgument with the reason. It implies Usage.
	EstimateMetadata string
}

// ClientSettings configures UnaryClientInterceptor and
// StreamClientInterceptor next to their *clientside.Client; its zero value
// is the default.
type ClientSettings struct {
	// Skip selects calls that bypass the retry and throttle logic.
	Skip func(ctx context.Context, fullMethod string) bool

	// Retryable restricts which methods are retried. By default every
	// method is retried when the server's denial carries RetryInfo: a
	// limiter denied the call before the handler ran, so a retry cannot
	// do the work twice.
	Retryable func(fullMethod string) bool

	// NoPriorityPropagation stops sending the context's priority
	// (spillway.ContextWithPriority) in the spillway.PriorityMetadataKey
	// metadata.
	NoPriorityPropagation bool
}

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

func newServerConfig(s ServerSettings) config {
	c := config{
		skip:          s.Skip,
		priority:      s.Priority,
		trustPriority: s.TrustPriorityMetadata,
		noReceived:    s.IgnoreReceivedPriority,
		cost:          s.Cost,
		meter:         s.Usage || s.EstimateMetadata != "",
		estimateMD:    strings.ToLower(s.EstimateMetadata),
		apiKeyMD:      strings.ToLower(s.APIKeyMetadata),
		userMD:        strings.ToLower(s.UserMetadata),
		user:          s.User,
		failMode:      s.FailMode,
		onError:       s.OnError,
		now:           s.Clock,
		trusted:       append([]netip.Prefix(nil), s.TrustedProxies...),
		noPropagate:   s.NoPriorityContext,
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

func newClientConfig(s ClientSettings) config {
	return config{skip: s.Skip, retryable: s.Retryable, noPropagate: s.NoPriorityPropagation, now: time.Now}
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
