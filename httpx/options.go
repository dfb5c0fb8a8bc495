package httpx

import (
	"net/http"
	"net/netip"
	"time"

	"github.com/spillway-go/spillway"
)

// Settings configures Middleware; its zero value is the default. It is
// the package's one way to configure the middleware: a field that does not
// exist for it (a Transport's, say) does not compile. The client side,
// Transport, is a struct too.
type Settings struct {
	// Endpoint derives the Request's Endpoint. The default is the path of
	// the Go 1.22+ ServeMux pattern (r.Pattern "POST /api/v1/items/{id}"
	// gives "/api/v1/items/{id}", see PatternPath; the method is
	// Request.Method), which the mux sets only when it routes, so it is
	// there when Middleware wraps each route's handler (mux.Handle("POST
	// /login", mw(h))). When Middleware wraps the whole mux, use
	// EndpointFromMux(mux). With no pattern the default falls back to the
	// URL path, which is unbounded if rules key by endpoint: prefer a
	// pattern.
	Endpoint func(*http.Request) string

	// Priority is the classifier that gives a request its priority
	// (default: every request is spillway.Critical). The shedder package's
	// HTTP classifier fits here. A classifier returning an invalid priority
	// gets the request answered 400. Whatever the classifier, a lower
	// priority that the caller sent in the spillway.PriorityHeader header
	// still applies (lowering is always safe),
	// unless IgnoreReceivedPriority.
	Priority func(*http.Request) spillway.Priority

	// IgnoreReceivedPriority ignores the spillway.PriorityHeader header a
	// caller sends: the classifier (Priority) alone gives the priority.
	IgnoreReceivedPriority bool

	// Cost says how many tokens a request costs (default 1). A negative
	// cost is a malformed request and is answered 400.
	Cost func(*http.Request) int64

	// User returns the authenticated user of r (from its context,
	// typically, where an authentication middleware put it); "" means
	// anonymous and sets no "user" dimension.
	User func(*http.Request) string

	// APIKeyHeader names the header that carries the API key (for example
	// "X-API-Key"); its value becomes the "api_key" dimension. Default:
	// none.
	APIKeyHeader string

	// TrustedProxies lists the proxies whose forwarding header is
	// believed. The client IP is the peer address (RemoteAddr) unless the
	// peer is in one of these prefixes; then it is the right-most address
	// of the forwarding header that is not itself a trusted proxy (the
	// left-most if all are). A forwarding header from any other peer is
	// ignored, so a client cannot choose its own key. Default: none.
	TrustedProxies []netip.Prefix

	// ForwardedHeader is the forwarding header read from trusted proxies:
	// "X-Forwarded-For" (the default) or "Forwarded" (RFC 7239, its for=
	// parameters). Only one is read: a proxy that appends to one header
	// passes the other through from the client unchecked.
	ForwardedHeader string

	// Skip is a filter: requests for which it returns true bypass the
	// limiter entirely (health checks, metrics scrapes).
	Skip func(*http.Request) bool

	// FailMode is what happens when the limiter returns an error (default
	// spillway.FailOpen: the handler runs). A *spillway.StoreError whose
	// Fail is spillway.FailClosed (a request that matched a tiers rule with
	// fail: closed, say) is answered 503 whatever the mode.
	FailMode spillway.FailMode

	// OnError is called with every limiter error, for logging; the
	// request then follows the fail mode.
	OnError func(*http.Request, error)

	// IETFHeaders adds the IETF draft RateLimit and RateLimit-Policy
	// headers (draft-ietf-httpapi-ratelimit-headers: `RateLimit:
	// "name";r=R;t=T` and `RateLimit-Policy: "name";q=Q;w=W`, w= for
	// decisions that carry a spillway.Decision.Window, in seconds rounded
	// up) next to the X-RateLimit-* ones.
	IETFHeaders bool

	// NoXRateLimitHeaders drops the X-RateLimit-Limit/-Remaining/-Reset
	// headers (sent by default).
	NoXRateLimitHeaders bool

	// Clock is the clock used for X-RateLimit-Reset (default time.Now).
	Clock func() time.Time

	// Denied replaces the application/problem+json body of denied
	// requests. Middleware has already set Retry-After and the rate-limit
	// headers when it is called; it must write the status (Status(d) is
	// the default choice) and a body.
	Denied func(w http.ResponseWriter, r *http.Request, d spillway.Decision)

	// ProblemTypeBase is the base URI of the problem "type" member; the
	// reason is appended ("https://example.com/problems/" +
	// "rate_limited"). Default: the type is "about:blank", as RFC 9457
	// suggests when the status says it all.
	ProblemTypeBase string

	// NoPriorityContext stops Middleware from storing the request's
	// priority in its context (spillway.ContextWithPriority), where
	// Transport finds it to propagate downstream. Storing it costs one
	// request copy.
	NoPriorityContext bool

	// Usage meters each request's actual cost: the middleware puts a
	// spillway.Usage in Request.Usage and in the handler's context, where
	// the handler reports with spillway.ReportUsage (per chunk of a
	// streaming response: when it returns an error the limit is spent and
	// the handler should stop). Request.Cost (Cost, EstimateHeader) is then
	// the estimate, which a "cost: response" rule holds at admission and
	// settles to the reported total when the handler returns; nothing
	// reported, the estimate stands.
	Usage bool

	// EstimateHeader takes the estimate (Request.Cost) from this request
	// header, a decimal integer in [0, MaxInt64]; a missing header leaves
	// Cost (or 1). A malformed value is answered 400 with the reason, and a
	// value above what a limit can ever admit is denied by that limit. It
	// implies Usage.
	EstimateHeader string

	// UsageHeader reads the actual cost from the response header (or
	// trailer) the handler sets, when the handler returns and before the
	// admission settles; it implies Usage. The value is a decimal integer
	// in [0, MaxInt64]; a malformed one leaves what was reported (or the
	// estimate) and goes to OnError, since the response is already
	// written. The header is sent to the client as the handler set it.
	UsageHeader string

	// DeadlineHeader reads, from this request header (usually
	// spillway.TimeoutHeader, "Spillway-Timeout"), how long the client
	// will wait for the answer, in whole milliseconds
	// (spillway.ParseTimeout), and gives the request's context that
	// deadline (or keeps an earlier one it has) before admission: blocks
	// that queue refuse at once a request whose expected wait is longer
	// than the time it has left, and drop, before any work, one whose
	// deadline passed while it waited; the handler and the calls it makes
	// see the deadline too. Admitted work whose deadline from the header
	// passes ends Ignored, not Dropped: the client gave up, which says how
	// long it would wait, not how loaded the server is (a learned limit
	// does not cut on it). A missing header leaves the context as it is; a
	// malformed value is answered 400 with the reason. Default: none read.
	DeadlineHeader string
}

type config struct {
	endpoint    func(*http.Request) string
	priority    func(*http.Request) spillway.Priority
	cost        func(*http.Request) int64
	user        func(*http.Request) string
	apiKey      string // header name; empty: none
	trusted     []netip.Prefix
	fwdHeader   string
	skip        func(*http.Request) bool
	failMode    spillway.FailMode
	onError     func(*http.Request, error)
	ietf        bool
	legacy      bool
	now         func() time.Time
	denied      func(http.ResponseWriter, *http.Request, spillway.Decision)
	problemURI  string
	noPropagate bool
	noReceived  bool
	meter       bool
	estHeader   string // header carrying the estimate; empty: none
	usageHeader string // response header or trailer carrying the actual cost
	dlHeader    string // header carrying the client's timeout; empty: none
}

func newConfig(s Settings) config {
	c := config{
		endpoint:    s.Endpoint,
		priority:    s.Priority,
		cost:        s.Cost,
		user:        s.User,
		trusted:     append([]netip.Prefix(nil), s.TrustedProxies...),
		fwdHeader:   "X-Forwarded-For",
		skip:        s.Skip,
		failMode:    s.FailMode,
		onError:     s.OnError,
		ietf:        s.IETFHeaders,
		legacy:      !s.NoXRateLimitHeaders,
		now:         s.Clock,
		denied:      s.Denied,
		problemURI:  s.ProblemTypeBase,
		noPropagate: s.NoPriorityContext,
		noReceived:  s.IgnoreReceivedPriority,
		meter:       s.Usage || s.EstimateHeader != "" || s.UsageHeader != "",
	}
	if c.priority == nil {
		c.priority = func(*http.Request) spillway.Priority { return spillway.Critical }
	}
	if c.now == nil {
		c.now = time.Now
	}
	if s.ForwardedHeader != "" {
		c.fwdHeader = http.CanonicalHeaderKey(s.ForwardedHeader)
	}
	if s.APIKeyHeader != "" {
		c.apiKey = http.CanonicalHeaderKey(s.APIKeyHeader)
	}
	if s.EstimateHeader != "" {
		c.estHeader = http.CanonicalHeaderKey(s.EstimateHeader)
	}
	if s.UsageHeader != "" {
		c.usageHeader = http.CanonicalHeaderKey(s.UsageHeader)
	}
	if s.DeadlineHeader != "" {
		c.dlHeader = http.CanonicalHeaderKey(s.DeadlineHeader)
	}
	return c
}

// EndpointFromMux returns an endpoint func that asks mux which pattern would
// serve r (its PatternPath), for a Middleware wrapped around the whole mux.
// A request that no pattern matches gets the endpoint "" (rules for every
// endpoint still apply).
func EndpointFromMux(mux *http.ServeMux) func(*http.Request) string {
	return func(r *http.Request) string {
		if r.Pattern != "" {
			return PatternPath(r.Pattern)
		}
		_, p := mux.Handler(r)
		return PatternPath(p)
	}
}
