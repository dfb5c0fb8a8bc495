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

// probeLoop runs while the health is not closed: every OpenTimeout to
// 1.2 × OpenTimeout it takes the half-open breaker's Probes slots one after
// the other, each for one probe; as many successes close the health, a
// failure opens it again and the loop waits again. Only one loop runs per
// Health (probing).
func (h *Health) probeLoop() {
	for {
		wait := h.set.OpenTimeout + time.Duration(rand.Int64N(int64(h.set.OpenTimeout)/5+1))
		time.Sleep(wait)
		if !h.closed.Load() && !h.probeRound() {
			// the client is closed: nobody will use it again
			if h.gone != nil {
				h.gone()
			}
			return
		}
		if h.closed.Load() {
			h.probing.Store(false)
			// Opened again between the load and the store: the state
			// change found probing still true and started no loop.
			if h.closed.Load() || !h.probing.CompareAndSwap(false, true) {
				return
			}
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
