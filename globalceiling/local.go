package globalceiling

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/share"
)

// localWindow counts what this server admitted on its own in the current
// window while Redis could not answer.
type localWindow struct {
	mu    sync.Mutex
	w     int64
	count int64
}

// degrade decides a request while Redis cannot answer (a failure, the
// budget spent, a stale sync, the client's health open): this server
// alone admits up to its share of each priority's threshold per window —
// share.Scale(threshold(p), the client's share), the whole ceiling on a
// lone server — marked Degraded.
func (c *Ceiling) degrade(p spillway.Priority, cost int64) spillway.Decision {
	now := c.o.clock()
	w, end := c.windowOf(now)
	if cost > c.threshold(p) {
		c.denied.Add(1)
		return spillway.Decision{Limiter: c.name, Limit: c.threshold(p), Reason: spillway.ReasonCostExceedsLimit, Degraded: true}
	}
	th := share.Scale(c.threshold(p), c.shares.Share())
	reset := max(end.Sub(now), time.Millisecond)
	c.lw.mu.Lock()
	if c.lw.w != w {
		c.lw.w, c.lw.count = w, 0
	}
	ok := c.lw.count+cost <= th
	if ok {
		c.lw.count += cost
	}
	total := c.lw.count
	c.lw.mu.Unlock()
	d := spillway.Decision{Allowed: ok, Limiter: c.name, Limit: th, Remaining: max(th-total, 0), ResetAfter: reset, Degraded: true}
	if !ok {
		d.Reason, d.RetryAfter = spillway.ReasonCeiling, reset
	}
	if ok {
		c.admitted.Add(1)
	} else {
		c.denied.Add(1)
	}
	return d
}

// canceled reports whether ctx ended by its caller's cancellation.
func canceled(ctx context.Context) bool { return errors.Is(ctx.Err(), context.Canceled) }
