package fallback

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// probeKey marks the context of a probe of a Health: its hook lets it
// through (and does not count it: the probe loop reports it).
type probeKey struct{}

// probeLoop runs while the health is not closed: OpenTimeout to 1.2 ×
// OpenTimeout after the health opened, and then every OpenTimeout/4 (to
// 1.2 × that) while the probes fail, it takes the half-open breaker's
// Probes slots one after the other, each for one probe; as many successes
// close the health, a failure opens it again and the loop waits again.
// (Probes are cheap and off the request path: probing sooner after the
// first round brings the decisions back within a fraction of a second of
// the Redis answering again, a promoted replica included.) Only one loop
// runs per Health (probing).
func (h *Health) probeLoop() {
	retry := false
	for {
		base := h.set.OpenTimeout
		if retry {
			base = max(base/4, time.Millisecond)
		}
		wait := base + time.Duration(rand.Int64N(int64(base)/5+1))
		time.Sleep(wait)
		if !h.closed.Load() && !h.probeRound() {
			// the client is closed: nobody will use it again
			if h.gone != nil {
				h.gone()
			}
			return
		}
		retry = true
		if h.closed.Load() {
			h.probing.Store(false)
			// Opened again between the load and the store: the state
			// change found probing still true and started no loop.
			if h.closed.Load() || !h.probing.CompareAndSwap(false, true) {
				return
			}
			retry = false
		}
	}
}

// probeRound sends up to Probes probes while they succeed. It reports
// false when the client is closed.
func (h *Health) probeRound() bool {
	for range h.set.Probes {
		done, err := h.cb.Allow()
		if err != nil {
			return true // still open (the breaker's timer), or closed meanwhile
		}
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), probeKey{}, h), h.set.ProbeTimeout)
		err = h.probe(ctx)
		cancel()
		h.probes.Add(1)
		if healthy(err) {
			h.probeOK.Add(1)
			done(nil)
			continue
		}
		h.lastErr.Store(&errBox{err})
		done(err)
		return !errors.Is(err, redis.ErrClosed)
	}
	return true
}

// refusesDial reports whether a new connection must not be opened now:
// within OpenTimeout of the health's opening, unless ctx is a probe's.
// After it, dials go on (go-redis redials in the background, with contexts
// of its own, after failed dials; a probe needs those dials to succeed).
func (h *Health) refusesDial(ctx context.Context) bool {
	u := h.openUntil.Load()
	if u == 0 || time.Now().UnixNano() > u {
		return false
	}
	p, ok := ctx.Value(probeKey{}).(*Health)
	return !ok || p != h
}
