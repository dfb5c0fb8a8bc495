// Package cchook lets tests outside package concurrency read what a
// concurrency.Limiter keeps to itself: package concurrency sets the hooks
// in its init.
package cchook

// PendingReleases returns the releases a *concurrency.Limiter keeps for a
// retry and those it gave up (older than the TTL, or the list was full).
var PendingReleases func(l any) (pending, dropped int64)
