// Package block holds what the building blocks and adapters share and a
// user of the toolkit does not call: a Done that runs once, the fail mode
// an Admit error asks for, and the rule for a priority received from a
// caller.
package block

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/spillway-go/spillway"
)

// Once wraps done so that only its first call has an effect. Blocks use it
// to make their Done idempotent. A nil done gives spillway.Noop.
func Once(done spillway.Done) spillway.Done {
	if done == nil {
		return spillway.Noop
	}
	var called atomic.Bool
	return func(o spillway.Outcome) {
		if called.Swap(true) {
			return
		}
		done(o)
	}
}

// FailModeOf returns the fail mode an Admit error asks for: FailClosed when
// it is (or wraps) a *spillway.StoreError whose Fail is FailClosed, else
// def (the caller's default for errors that say nothing).
func FailModeOf(err error, def spillway.FailMode) spillway.FailMode {
	var se *spillway.StoreError
	if errors.As(err, &se) && se.Fail == spillway.FailClosed {
		return spillway.FailClosed
	}
	return def
}

// ReceivedPriority applies a priority received from a caller (the value of
// a spillway.PriorityHeader header or a spillway.PriorityMetadataKey
// metadata entry) to def, the priority the server gives the request
// itself: the received one wins when it is lower — lowering one's own
// priority is always safe — or at any level when trust is set, which only
// a service behind an edge that strips the header from outside traffic
// should do (otherwise any client could claim CriticalPlus). An empty or
// unknown value leaves def.
func ReceivedPriority(def spillway.Priority, value string, trust bool) spillway.Priority {
	if p, err := spillway.ParsePriority(value); err == nil && (p < def || trust) {
		return p
	}
	return def
}

// LimiterFunc adapts a function to the spillway.Limiter interface, for
// tests and the harness.
type LimiterFunc func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error)

// Admit calls f.
func (f LimiterFunc) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	return f(ctx, r)
}
