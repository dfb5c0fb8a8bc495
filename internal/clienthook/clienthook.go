// Package clienthook reaches the throttle of a clientside.Client from the
// adapters (grpcx's stream interceptor uses only the throttle) and lets
// tests put a recording throttle in its place. Package clientside sets the
// functions; it does not import clientside so that clientside can.
package clienthook

// Throttler is what a Client asks before sending: Allow counts a request
// and says whether to send it, Accepted records that the backend did the
// work. *clientside.Throttle implements it.
type Throttler interface {
	Allow() bool
	Accepted()
}

// Throttle returns the throttle of c, a *clientside.Client (nil c: none),
// or nil when it has none.
var Throttle func(c any) Throttler

// SetThrottle makes c, a *clientside.Client, use t instead of its Throttle
// field. For tests.
var SetThrottle func(c any, t Throttler)
