package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxAbandoned bounds, per Health, the detached calls that may still run
// past their caller's deadline (see detach): while as many run, a further
// call that would be detached is not made; it is decided locally at once
// (cause ErrAbandoned).
const MaxAbandoned = 64

// ErrAbandoned is the cause of decisions made locally, without a call,
// because MaxAbandoned detached calls of the same Health were still
// running past their deadlines: the store is not answering.
var ErrAbandoned = errors.New("fallback: too many calls still running past their budget")

// errDetachedExpired is a detached call that ran past its deadline: the
// client ignores deadlines, so nothing tells the wait for the Redis apart
// from the wait before it, and it counts against the Redis.
var errDetachedExpired = fmt.Errorf("fallback: detached call ran past its budget: %w", context.DeadlineExceeded)

// honourDeadlines makes client honour context deadlines for socket I/O
// (go-redis ignores them unless ContextTimeoutEnabled) and reports whether
// it could: false for a client type it does not know (a wrapper).
func honourDeadlines(client redis.UniversalClient) bool {
	// Written only when false: a tuned client's options are left untouched.
	enable := func(c *redis.Client) {
		if o := c.Options(); !o.ContextTimeoutEnabled {
			o.ContextTimeoutEnabled = true
		}
	}
	switch c := client.(type) {
	case *redis.Client: // NewClient and NewFailoverClient
		enable(c)
	case *redis.ClusterClient:
		// The nodes copy the option when they are created: the ones to
		// come through OnNewNode, the cluster's own calls through its
		// options. Nodes are created at the first command.
		if o := c.Options(); !o.ContextTimeoutEnabled {
			o.ContextTimeoutEnabled = true
		}
		c.OnNewNode(enable)
	case *redis.Ring:
		if o := c.Options(); !o.ContextTimeoutEnabled {
			o.ContextTimeoutEnabled = true
		}
		c.OnNewNode(enable)
		// The shards exist already (NewRing makes them): no command is sent.
		_ = c.ForEachShard(context.Background(), func(_ context.Context, s *redis.Client) error {
			enable(s)
			return nil
		})
	default:
		return false
	}
	return true
}

// detachedCall is one call run on a goroutine of its own.
type detachedCall struct {
	state atomic.Int32 // 0 running, 1 returned to its caller, 2 abandoned by it
	err   error
	done  chan struct{}
}

const (
	callRunning int32 = iota
	callReturned
	callAbandoned
)

// detach runs f on a goroutine of its own and waits for it until deadline
// (none when zero) or ctx's end, whichever comes first; then it returns
// context.DeadlineExceeded (or ctx's error) while f goes on, abandoned:
// it runs to its end (the client's own timeouts end it) and then
// abandoned(err) is called on its goroutine (nil: nothing), to give back
// what it took. At most MaxAbandoned calls of h are abandoned at a time;
// while as many are, detach returns ErrAbandoned without calling f.
//
// This is how a budget holds over a client that ignores context
// deadlines: the caller returns at the deadline whatever the socket does.
func (h *Health) detach(ctx context.Context, deadline time.Time, f func(ctx context.Context) error, abandoned func(err error)) error {
	if h.abandoned.Load() >= MaxAbandoned {
		return ErrAbandoned
	}
	c := &detachedCall{done: make(chan struct{})}
	go func() {
		c.err = f(ctx)
		if !c.state.CompareAndSwap(callRunning, callReturned) {
			if abandoned != nil {
				abandoned(c.err)
			}
			h.abandoned.Add(-1)
		}
		close(c.done)
	}()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	var cause error
	select {
	case <-c.done:
		return c.err
	case <-expired:
		cause = errDetachedExpired
	case <-ctx.Done():
		cause = ctx.Err()
	}
	if !c.state.CompareAndSwap(callRunning, callAbandoned) {
		<-c.done // it returned just now
		return c.err
	}
	h.abandoned.Add(1)
	return cause
}
