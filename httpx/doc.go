// Package httpx puts a spillway.Limiter in front of net/http handlers and
// gives HTTP clients a RoundTripper that backs off the way the server asks.
//
// The shortest use:
//
//	mw := httpx.Middleware(chain, httpx.Settings{APIKeyHeader: "X-API-Key"})
//	mux.Handle("GET /api/v1/search", mw(searchHandler))
//
// # What the middleware does
//
// For each request it builds a spillway.Request: the Endpoint is the Go
// 1.22+ ServeMux pattern's path ("/api/v1/search"; see Settings.Endpoint and
// EndpointFromMux when wrapping a whole mux), Method the HTTP method,
// Priority from the classifier (Settings.Priority; default Critical), lowered
// by the caller's spillway.PriorityHeader header whatever the classifier
// (Settings.IgnoreReceivedPriority turns that off), and the identity dimensions
// "ip" (the peer address, or the forwarding header when the peer is a
// trusted proxy: see Settings.TrustedProxies and ClientIP), "user" (Settings.User)
// and "api_key" (Settings.APIKeyHeader).
//
// Then it asks the limiter and answers:
//
//   - allowed: the handler runs; afterwards Done reports Success, Dropped
//     for a 5xx or an expired deadline the server set, Ignored when the
//     client went away, its own deadline (Settings.DeadlineHeader) passed, or
//     the handler panicked (the panic continues after the release);
//   - rate or concurrency limit: 429 Too Many Requests;
//   - shedding, global ceiling, store failed closed: 503 Service Unavailable;
//   - malformed request (invalid priority, negative cost): 400 Bad Request.
//
// Denials carry Retry-After in delta seconds, rounded up and at least 1
// (none when retrying can never succeed) and an application/problem+json
// body (Problem). Every response a limit applied to, allowed or denied,
// carries X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset
// (Unix epoch seconds, rounded up) when the decision has a Limit; the IETF
// RateLimit and RateLimit-Policy headers are a setting (Settings.IETFHeaders).
// When the limiter returns an error (its store failed and no fallback
// decided), the fail mode applies: spillway.FailOpen serves the request
// (default), spillway.FailClosed answers 503; a *spillway.StoreError that
// asks for FailClosed is answered 503 either way.
//
// Each constructor has one way to be configured, a struct: Settings for
// Middleware (its zero value is the default), the Transport's own fields
// and its *clientside.Client for the client side. A setting that does not
// apply to one does not compile against it.
//
// Middleware and Transport are safe for concurrent use.
package httpx
