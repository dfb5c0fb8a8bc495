package fallback

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/share"
	"github.com/spillway-go/spillway/ratelimit"
)

// State is the circuit breaker's state.
type State uint8

const (
	// Closed: calls go to the shared store.
	Closed State = iota
	// HalfOpen: after OpenTimeout, up to Probes calls go to the store; as
	// many consecutive successes close the breaker, one failure opens it.
	HalfOpen
	// Open: no call goes to the store; decisions are local.
	Open
)

var stateNames = [...]string{"closed", "half_open", "open"}

// String returns "closed", "half_open" or "open".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ErrOpen is the Cause of decisions made locally because the breaker did
// not let the call through (open, or half-open with its probes taken).
var ErrOpen = errors.New("fallback: circuit breaker open")

// DegradedEvent describes one decision made without the shared store.
type DegradedEvent struct {
	Name    string          // Settings.Name
	Scope   string          // the scope of the decision (the denied item's, else the first)
	Allowed bool            // the outcome
	Reason  spillway.Reason // why it was denied
	Cause   error           // ErrOpen, or the store's error (a budget overrun wraps context.DeadlineExceeded)
}

// ReconcileEvent reports one reconcile pass (see Store).
type ReconcileEvent struct {
	Name    string // Settings.Name
	Keys    int    // keys whose local consumption was carried to the store
	Charged int64  // total units charged to the store
	Pending int    // keys left for a later pass because the store failed again
	Err     error  // the failure that stopped the pass, if any
}

// Settings configures a Store. The zero value means the
// documented defaults; negative durations and sizes are errors unless said
// otherwise.
type Settings struct {
	// Name identifies this fallback in hooks (default "fallback").
	Name string

	// Budget is the time one store call may take (default 50ms). A call
	// that takes longer is abandoned (its context ends), counts as a
	// failure and is decided locally. Within a spillway.Chain a call also
	// ends with the request's budget, and a call
	// that finds that budget spent is not made: the decision is local at
	// once, with cause spillway.ErrBudgetSpent, and counts as nothing. It
	// holds whatever the Redis client's socket options: see NewHealth
	// (and NewStore, for a store that names its client) and MaxAbandoned.
	Budget time.Duration

	// Health is the breaker shared by every block on the same Redis
	// client (NewHealth). Set it whenever more than one block uses the
	// client, so that K failures seen by any of them stop all of them.
	// With Health set, Failures, OpenTimeout, Probes and OnStateChange
	// belong to its HealthSettings and must be left zero here. Nil gives
	// this Store a breaker of its own, built from those fields.
	Health *Health

	// Failures is K: the breaker opens after K consecutive failures
	// (default 5). Only without Health.
	Failures uint32

	// OpenTimeout is how long the breaker stays open before it probes
	// (default 1s; up to 1.2× that, jittered). It is also the RetryAfter
	// of fail-closed denials. Only without Health.
	OpenTimeout time.Duration

	// Probes is how many probes the half-open breaker sends in a row (a
	// PING on the store's client; without one, how many user calls it
	// lets through); as many consecutive successes close it (default 3).
	// Only without Health.
	Probes uint32

	// Share fixes the fraction of every policy's quota this Store admits
	// on its own while the store is unavailable: Limit and Burst are
	// scaled by it, rounded down, at least 1. Must be in (0, 1]. Default:
	// the share of the store's client, read at each local decision — its
	// share of the fleet it last saw alive (see HealthSettings.Share: a
	// lone server keeps its whole limit).
	Share float64

	// Fail is what happens while the store cannot answer: with
	// spillway.FailOpen (the default) the local share decides, with
	// spillway.FailClosed the request is denied with
	// spillway.ReasonFailClosed (a 503). A Store fails an item closed when
	// the item's own mode (ratelimit.Item.Fail, set per rule by tiers or
	// per limiter by ratelimit.Settings.FailMode) or this one says so.
	Fail spillway.FailMode

	// DenyCacheSize bounds the local cache of denials (default 65536
	// entries; negative disables it).
	DenyCacheSize int

	// LedgerSize bounds the keys whose local consumption is remembered
	// for reconcile (default 65536; negative disables reconcile).
	LedgerSize int

	// Local is the store that decides the local share (default a
	// ratelimit.MemoryStore with Clock and 65536 keys).
	Local ratelimit.Store

	// Clock is the time source of the deny cache, the reconcile ledger and
	// the default Local store (default time.Now). The breaker's timers use
	// real time.
	Clock func() time.Time

	// OnStateChange is called when the breaker changes state, with the
	// breaker's lock held: it must not call back into the Store.
	OnStateChange func(name string, from, to State)

	// OnDegraded is called after every decision made without the store.
	OnDegraded func(DegradedEvent)

	// OnReconcile is called after every reconcile pass.
	OnReconcile func(ReconcileEvent)
}

const (
	defaultBudget      = 50 * time.Millisecond
	defaultFailures    = 5
	defaultOpenTimeout = time.Second
	defaultProbes      = 3
	defaultCacheSize   = 1 << 16
	defaultLedgerSize  = 1 << 16
)

// withDefaults validates s and fills in the defaults.
func (s Settings) withDefaults() (Settings, error) {
	if s.Name == "" {
		s.Name = "fallback"
	}
	if s.Fail > spillway.FailClosed {
		return s, fmt.Errorf("fallback: unknown fail mode %d (want spillway.FailOpen or spillway.FailClosed)", uint8(s.Fail))
	}
	if s.Health != nil {
		switch {
		case s.Failures != 0:
			return s, errors.New("fallback: Failures is set together with Health: set it in the Health's HealthSettings")
		case s.OpenTimeout != 0:
			return s, errors.New("fallback: OpenTimeout is set together with Health: set it in the Health's HealthSettings")
		case s.Probes != 0:
			return s, errors.New("fallback: Probes is set together with Health: set it in the Health's HealthSettings")
		case s.OnStateChange != nil:
			return s, errors.New("fallback: OnStateChange is set together with Health: set it in the Health's HealthSettings")
		}
		s.Failures, s.OpenTimeout, s.Probes = s.Health.set.Failures, s.Health.set.OpenTimeout, s.Health.set.Probes
	}
	switch {
	case s.Budget < 0:
		return s, fmt.Errorf("fallback: budget %v must not be negative", s.Budget)
	case s.Budget == 0:
		s.Budget = defaultBudget
	}
	if s.Failures == 0 {
		s.Failures = defaultFailures
	}
	switch {
	case s.OpenTimeout < 0:
		return s, fmt.Errorf("fallback: open timeout %v must not be negative", s.OpenTimeout)
	case s.OpenTimeout == 0:
		s.OpenTimeout = defaultOpenTimeout
	}
	if s.Probes == 0 {
		s.Probes = defaultProbes
	}
	switch {
	case math.IsNaN(s.Share) || s.Share < 0 || s.Share > 1:
		return s, fmt.Errorf("fallback: share %v must be in (0, 1]", s.Share)
	}
	if s.DenyCacheSize == 0 {
		s.DenyCacheSize = defaultCacheSize
	}
	if s.LedgerSize == 0 {
		s.LedgerSize = defaultLedgerSize
	}
	if s.Clock == nil {
		s.Clock = time.Now
	}
	return s, nil
}

// health returns s.Health, or a breaker of its own built from s (after
// withDefaults): one that probes with a PING on client, when not nil
// (each within the Budget, at least 100ms), and counts on it honouring
// deadlines when it can be made to.
func (s Settings) health(client redis.UniversalClient) *Health {
	if s.Health != nil {
		return s.Health
	}
	hs := HealthSettings{Name: s.Name, Failures: s.Failures, OpenTimeout: s.OpenTimeout,
		Probes: s.Probes, OnStateChange: s.OnStateChange}
	if client != nil {
		hs.Probe = func(ctx context.Context) error { return client.Ping(ctx).Err() }
		hs.ProbeTimeout = max(s.Budget, defaultProbeTimeout)
	}
	hs, _ = hs.withDefaults() // valid: s was
	h := newHealth(hs)
	h.direct = client != nil && honourDeadlines(client)
	if client != nil {
		h.share = share.Of(client)
	}
	if client != nil && h.direct {
		// its connections time Redis's replies
		client.AddHook(wireHook{h})
		h.wired = h.watchWire(client)
	}
	return h
}

// sharePPM converts a share to parts per million, so scaling is exact
// integer arithmetic (0.29 × 100 is 29, not 28.999…).
func sharePPM(share float64) uint64 {
	ppm := uint64(math.Round(share * 1e6))
	return max(ppm, 1)
}

// scale returns floor(n × ppm / 10⁶), at least 1.
func scale(n int64, ppm uint64) int64 {
	if n <= 0 {
		return n
	}
	hi, lo := bits.Mul64(uint64(n), ppm)
	q, _ := bits.Div64(hi, lo, 1e6) // hi < 1e6 since ppm ≤ 1e6
	return max(int64(q), 1)
}

// scaleToShare returns p with its quota scaled to share (in (0, 1]): Limit
// and Burst (when set) rounded down, at least 1; Period and Algorithm
// unchanged. It is the policy the local share enforces. A share outside
// (0, 1] is treated as 1.
func scaleToShare(p ratelimit.Policy, share float64) ratelimit.Policy {
	if math.IsNaN(share) || share <= 0 || share > 1 {
		share = 1
	}
	return scalePolicy(p, sharePPM(share))
}

func scalePolicy(p ratelimit.Policy, ppm uint64) ratelimit.Policy {
	if ppm >= 1e6 {
		return p
	}
	q := p
	q.Limit = scale(p.Limit, ppm)
	if p.Burst != 0 {
		q.Burst = scale(p.Burst, ppm)
		switch p.Algorithm {
		case ratelimit.FixedWindow, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.SlidingWindowBuckets:
			q.Burst = q.Limit // windows accept Burst only as 0 or Limit
		}
	}
	// Rounding can push Burst × interval past the exact range of the
	// scripts' doubles; the local store enforces the same bound, so clamp.
	if q.Validate() != nil && p.Validate() == nil {
		switch q.Algorithm {
		case ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.LeakyBucket:
			q.Burst = max(ratelimit.MaxSpanMicros/rateHooks.EmissionInterval(q), 1)
		}
	}
	return q
}
