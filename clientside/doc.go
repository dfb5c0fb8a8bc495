// Package clientside keeps a client from making an overloaded backend
// worse. It is pure logic with no transport: Client bundles it for one
// backend, and the HTTP client transport (httpx.Transport) and the gRPC
// client interceptors (grpcx.UnaryClientInterceptor) take a *Client.
//
//   - Throttle is Google SRE's adaptive throttling: the client counts the
//     requests it attempts and the ones the backend accepts over a sliding
//     window (default two minutes) and rejects new requests locally with
//     probability max(0, (requests − K·accepts) / (requests + 1)), K = 2 by
//     default, so a backend that rejects most work stops receiving it.
//   - RetryBudget caps retries at a fraction (default 10%) of requests:
//     every request deposits 0.1 token, every retry spends one.
//   - Backoff computes the wait before a retry: exponential with jitter, or
//     the server's Retry-After plus jitter (never earlier than asked).
//
// The shortest use, around one call:
//
//	th, _ := clientside.NewThrottle(clientside.ThrottleSettings{})
//	budget, _ := clientside.NewRetryBudget(clientside.RetryBudgetSettings{})
//	if !th.Allow() { return clientside.ErrThrottled } // rejected locally
//	budget.Deposit()
//	resp, err := call()
//	if !overloaded(resp, err) { th.Accepted() }
//	if retryable(resp, err) && budget.TryRetry() {
//		if wait, ok := (clientside.Backoff{}).Delay(1, retryAfter); ok {
//			time.Sleep(wait) // then call again
//		}
//	}
//
// Each constructor is configured by its own settings struct, whose zero
// value is the default (ThrottleSettings, RetryBudgetSettings), so a
// setting that does not apply to it does not compile; Backoff and Client
// are structs too.
//
// Throttle and RetryBudget are safe for concurrent use; Backoff is a value.
package clientside
