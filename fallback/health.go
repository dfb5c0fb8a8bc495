package fallback

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/budget"
	"github.com/spillway-go/spillway/internal/share"
)

// Health is the one circuit breaker of one Redis: every block that uses
// the same Redis client shares it. K consecutive failures seen by any of
// them open it for all; while it is open nothing is sent to that Redis —
// no admission, no release, no background report, sync or reconcile — and
// every block decides locally at once. Whether the Redis is back is found
// by the health's own probe (a PING, see HealthSettings.Probe), off the
// request path: about every OpenTimeout (jittered), Probes probes in a row,
// and as many consecutive successes close it for all. No user request is
// ever a probe, so none waits on a Redis the health has found hung. (A
// Health with no probe — NewHealth(nil, …) without HealthSettings.Probe, or
// the breaker of its own of a Store given no Health that cannot
// reach a client — lets up to Probes user calls through after OpenTimeout
// instead.)
//
// Create one per client with NewHealth(client, …): it attaches itself to
// the client (a go-redis hook), so every command sent through that client
// is gated and counted, including those of blocks that know nothing about
// it (shedder.Fleet's reports, globalceiling's sync, concurrency releases).
// Pass it to every fallback Store on that client in
// Settings.Health so that their calls are counted once and their decisions
// follow it. On a Cluster client each node has a breaker of its own (see
// NewHealth).
//
// A Health is safe for concurrent use. Its Stats are the one place that
// shows the state shared by the blocks.
type Health struct {
	cb  *gobreaker.TwoStepCircuitBreaker[struct{}]
	set HealthSettings
	// openUntil (Unix ns, 0 when not open) lets allow refuse without
	// taking gobreaker's lock while the breaker is open: during an outage
	// every request would otherwise serialize on it.
	openUntil atomic.Int64
	// closed mirrors the breaker's closed state, and dirty says that a
	// failure may have left ConsecutiveFailures above 0: while closed,
	// allow lets calls through without gobreaker's lock, and a success
	// goes to gobreaker only when dirty (to reset the count). Failures
	// always go to gobreaker, so the count of consecutive failures and
	// the trip are gobreaker's as before.
	closed   atomic.Bool
	dirty    atomic.Bool
	since    atomic.Int64 // Unix ns of the last state change (creation at first)
	attached bool         // a hook on a client counts the calls it did not guard
	wired    bool         // the client's connections are dialed through the health's hook (wireConn)

	// A Cluster client's Health has a breaker per node (shards); each of
	// those has the client's Health as parent, its node's address, and
	// gone, run when go-redis closed the node's client.
	shards *shards
	parent *Health
	addr   string
	gone   func()

	successes, failures, rejected, opened atomic.Int64
	overloaded                            atomic.Int64
	failedAt                              atomic.Int64                          // Unix ns of the latest evidence against the Redis (failedLately)
	wire                                  [wireEvents]atomic.Pointer[wireEvent] // the latest reads that ran out of time (wireConn), a ring
	wireNext                              atomic.Uint64                         // the next slot of wire
	conns                                 sync.Map                              // *wireConn -> struct{}: the connections open (silentNow)
	budget                                atomic.Int64                          // the longest budget of the blocks on it (noteBudget)
	lastErr                               atomic.Pointer[errBox]

	// probe is the health's own check (nil: user calls probe, half-open).
	probe   func(ctx context.Context) error
	probing atomic.Bool // a probe loop runs
	probes  atomic.Int64
	probeOK atomic.Int64

	// direct: the Redis client behind this health honours context
	// deadlines (NewHealth made it so): calls are made on the caller's
	// goroutine. Otherwise they run detached (see detach).
	direct    bool
	abandoned atomic.Int64 // detached calls still running past their caller's deadline

	// share is the local share of the blocks on the client: the fleet
	// shedder on it records the servers it saw, HealthSettings.Share
	// overrides (see HealthSettings.Share).
	share *share.State
}

type errBox struct{ err error }

// HealthSettings configures a Health. The zero value means the documented
// defaults.
type HealthSettings struct {
	// Name identifies the Redis in hooks, Stats and metrics (default
	// "redis").
	Name string

	// Failures is K: the health opens after K consecutive failed calls,
	// whichever blocks made them (default 5).
	Failures uint32

	// OpenTimeout is how long the health stays open before it probes
	// (default 1s; up to 1.2× that, jittered; after a failed round of
	// probes, the next comes a quarter of it later). It is also the
	// RetryAfter of fail-closed denials of the blocks that share it.
	OpenTimeout time.Duration

	// Probes is how many probes the half-open health sends in a row (or,
	// without a probe, how many user calls it lets through); as many
	// consecutive successes close it (default 3).
	Probes uint32

	// OnStateChange is called when the health changes state, with the
	// breaker's lock held: it must not call back into the Health.
	OnStateChange func(name string, from, to State)

	// Probe is the health's own check of the Redis while it is open: run
	// off the request path, OpenTimeout to 1.2 × OpenTimeout after the
	// health opened (or after the last failed probe), Probes times in a
	// row; as many successes close the health. A nil error or an error
	// reply of the server's own (redis.Error, redis.Nil) is a success.
	// Default for NewHealth(client, …): a PING on the client, which the
	// health's hook lets through. With no client and no Probe, half-open
	// user calls are the probes.
	Probe func(ctx context.Context) error

	// ProbeTimeout bounds one probe (default 100ms).
	ProbeTimeout time.Duration

	// Share is the fraction of every fleet-wide limit this server enforces
	// on its own while Redis cannot answer, for every block on the client
	// (the rate limits of a Store, a concurrency limiter, the global
	// ceiling, the fleet shedder before its first refresh). Default: its
	// share of the fleet it last saw alive — 1/N for the N servers the
	// fleet shedder (shedder.NewFleet on the same client) counted at its
	// last refresh, so a lone server keeps its whole limit, never below
	// 0.05 (the floor: a fleet of more than 20 servers admits up to N/20
	// of a limit during an outage); 0.2 while no fleet shedder on the
	// client has counted (five servers assumed). Set it to fix the share
	// instead; must be in (0, 1].
	Share float64
}

const defaultProbeTimeout = 100 * time.Millisecond

func (s HealthSettings) withDefaults() (HealthSettings, error) {
	if s.Name == "" {
		s.Name = "redis"
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
	case s.ProbeTimeout < 0:
		return s, fmt.Errorf("fallback: probe timeout %v must not be negative", s.ProbeTimeout)
	case s.ProbeTimeout == 0:
		s.ProbeTimeout = defaultProbeTimeout
	}
	if math.IsNaN(s.Share) || s.Share < 0 || s.Share > 1 {
		return s, fmt.Errorf("fallback: HealthSettings.Share %v must be in (0, 1]", s.Share)
	}
	return s, nil
}

// healths maps a client to the Health attached to it, so that a second
// NewHealth on the same client is refused instead of silently splitting
// its health in two. A Health lives as long as the process (one small
// entry per client).
var healths sync.Map // redis.UniversalClient -> *Health

// NewHealth returns the Health of the Redis behind client and attaches it
// to the client: every command and pipeline sent through the client passes
// the breaker (refused with ErrOpen while open, counted as a success or a
// failure otherwise). A client gets one Health: a second call for the same
// client returns an error (keep the first). A nil client
// returns a Health attached to nothing, for stores that are not go-redis
// clients: only the Stores given it count their calls.
//
// NewHealth also makes the client honour context deadlines
// (ContextTimeoutEnabled, on a *redis.Client, a failover client, a
// *redis.ClusterClient and its nodes, a *redis.Ring and its shards), so
// that every call's deadline — a Store's budget, a
// concurrency release's timeout — ends it whatever the client's dial, read
// and write timeouts: a client built from bare redis.Options{Addr} needs
// nothing else (TuneOptions only shortens the backstops). Call it before
// the client carries traffic: it writes the client's options. A client of
// another type (a wrapper) cannot be changed: the Stores
// given this Health then run each call detached (on a goroutine of its
// own, returning at the budget; see docs/fallback.md).
//
// What counts: a reply (redis.Nil and error replies such as NOSCRIPT
// included) is a success — the server answered; a refused or reset
// connection, a failed dial, or no reply while Redis had the command —
// from the moment it was written, for at least half of the call's budget
// (the longest budget of the Stores given this Health, or the
// chain's when smaller; a caller's shorter deadline does not lower it) —
// is a failure; a call whose caller canceled its context is
// neither, and so is one that ran out of time in this process (waiting
// for a pooled connection, for the coalesced call in flight, for the CPU,
// or whose reply was in the socket when its time ran out): it is counted
// in HealthStats.Overloaded, never opens the breaker, and a Store refuses
// it rather than decide it locally. The health judges
// Redis, not the caller's wait: an overloaded process is not a sick Redis.
// The connections the client dials are timed for this (the hook wraps
// them); see docs/fallback.md, "Which waits count".
//
// Cluster: a ClusterClient's Health has a breaker per node (given to each
// node's client through OnNewNode): a primary's failure opens its node
// only, so its slots are decided locally while the others are still
// decided by Redis; while a node is open the client's slots are reloaded
// every OpenTimeout/4, so that the promoted replica takes them as soon as
// it serves. The client's Health itself never opens: its State sums up the
// nodes' (closed while all are, open when all are, else half-open) and
// HealthStats.Shards lists them. A Store's batch spanning a failed node
// and healthy ones decides its failed part locally and its healthy part
// on Redis, all or nothing. See docs/fallback.md, "Cluster: health per
// node".
func NewHealth(client redis.UniversalClient, s HealthSettings) (*Health, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	if client == nil {
		h := newHealth(s)
		h.share.SetOverride(s.Share)
		return h, nil
	}
	direct := honourDeadlines(client)
	if s.Probe == nil {
		s.Probe = func(ctx context.Context) error { return client.Ping(ctx).Err() }
	}
	h := newHealth(s)
	if _, dup := healths.LoadOrStore(client, h); dup {
		return nil, fmt.Errorf("fallback: NewHealth: the client already has a Health (%s); share it instead of creating a second", healthOf(client).set.Name)
	}
	h.attached = true
	h.direct = direct
	h.share = share.Of(client)
	h.share.SetOverride(s.Share)
	client.AddHook(hook{h})
	if c, ok := client.(*redis.ClusterClient); ok {
		h.watchShards(c)
		h.wired = direct
	} else {
		h.wired = direct && h.watchWire(client)
	}
	return h, nil
}

// healthOf returns the Health NewHealth attached to client, or nil.
func healthOf(client redis.UniversalClient) *Health {
	if client == nil {
		return nil
	}
	if h, ok := healths.Load(client); ok {
		return h.(*Health)
	}
	return nil
}

func newHealth(s HealthSettings) *Health {
	h := &Health{set: s, probe: s.Probe, share: share.Of(nil)}
	h.since.Store(time.Now().UnixNano())
	k := s.Failures
	st := gobreaker.Settings{
		Name:        s.Name,
		MaxRequests: s.Probes,
		Timeout:     s.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= k },
		IsExcluded:  func(err error) bool { return errors.Is(err, errExcluded) },
	}
	if s.Probe != nil {
		// the probe loop paces the first probes after an opening itself
		// (OpenTimeout); after a failed round it probes again sooner
		st.Timeout = max(s.OpenTimeout/4, time.Millisecond)
	}
	hookFn := s.OnStateChange
	st.OnStateChange = func(name string, from, to gobreaker.State) {
		now := time.Now()
		if to == gobreaker.StateOpen {
			h.openUntil.Store(now.Add(s.OpenTimeout).UnixNano())
			if from == gobreaker.StateClosed { // not a failed probe round
				h.opened.Add(1)
			}
		} else {
			h.openUntil.Store(0)
		}
		h.closed.Store(to == gobreaker.StateClosed)
		h.since.Store(now.UnixNano())
		if to == gobreaker.StateOpen && h.probe != nil && h.probing.CompareAndSwap(false, true) {
			go h.probeLoop()
		}
		if hookFn != nil {
			hookFn(name, stateOf(from), stateOf(to))
		}
	}
	h.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](st)
	h.closed.Store(true)
	return h
}

// State returns the breaker's state.
func (h *Health) State() State { return h.state() }

// HealthStats is a snapshot of a Health.
type HealthStats struct {
	Name                string
	State               State
	Since               time.Time // when State began (or the Health was created)
	ConsecutiveFailures uint32    // in the current closed or half-open period
	Successes           int64     // calls the Redis answered
	Failures            int64     // calls the Redis failed: no reply in time, refused, reset
	Overloaded          int64     // calls that ran out of time in this process (a queue, the pool, the CPU) before the Redis was slow: not counted as failures
	Rejected            int64     // calls refused without reaching the Redis (open, or half-open with its probes taken)
	Opened              int64     // times the health opened (from closed; a failed round of probes is not counted again)
	LastError           error     // the latest failure, nil before the first
	Probes              int64     // probes the health sent (its own, off the request path)
	ProbesOK            int64     // of which answered
	Abandoned           int64     // detached calls still running past their caller's deadline
	// Shards, on a Cluster client, has one entry per node (Name is
	// "name@address"): each node has a breaker of its own, and the
	// counters above sum theirs. State is then Closed while every node is
	// closed, Open when every node is open, else HalfOpen.
	Shards []HealthStats
}

// Stats returns a snapshot of the counters and the state.
func (h *Health) Stats() HealthStats {
	st := HealthStats{
		Name:                h.set.Name,
		State:               h.state(),
		Since:               time.Unix(0, h.since.Load()),
		ConsecutiveFailures: h.cb.Counts().ConsecutiveFailures,
		Successes:           h.successes.Load(),
		Failures:            h.failures.Load(),
		Overloaded:          h.overloaded.Load(),
		Rejected:            h.rejected.Load(),
		Opened:              h.opened.Load(),
		Probes:              h.probes.Load(),
		ProbesOK:            h.probeOK.Load(),
		Abandoned:           h.abandoned.Load(),
	}
	if b := h.lastErr.Load(); b != nil {
		st.LastError = b.err
	}
	if h.shards != nil {
		var last time.Time
		h.shards.each(func(c *Health) {
			cs := c.Stats()
			st.Shards = append(st.Shards, cs)
			st.ConsecutiveFailures = max(st.ConsecutiveFailures, cs.ConsecutiveFailures)
			st.Failures += cs.Failures
			st.Rejected += cs.Rejected
			st.Opened += cs.Opened
			st.Probes += cs.Probes
			st.ProbesOK += cs.ProbesOK
			st.Overloaded += cs.Overloaded
			if cs.LastError != nil && cs.Since.After(last) {
				st.LastError, last = cs.LastError, cs.Since
			}
		})
	}
	return st
}

// errExcluded is reported to the breaker for calls that say nothing about
// the store's health: the caller went away.
var errExcluded = errors.New("fallback: excluded")

func stateOf(s gobreaker.State) State {
	switch s {
	case gobreaker.StateOpen:
		return Open
	case gobreaker.StateHalfOpen:
		return HalfOpen
	}
	return Closed
}

func (h *Health) state() State {
	if h.shards != nil {
		return h.shards.state()
	}
	return stateOf(h.cb.State())
}

// allow is cb.Allow with a lock-free refusal while open and a lock-free
// admission while closed (a closed breaker admits every call): then it
// returns a nil done, and settle tells gobreaker what it needs to know.
// Pass what it returns to settle, never call it directly.
func (h *Health) allow() (func(error), error) {
	if h.closed.Load() {
		return nil, nil
	}
	if h.probe != nil {
		// Open or half-open: the probe loop alone tests the Redis.
		h.rejected.Add(1)
		return nil, ErrOpen
	}
	if u := h.openUntil.Load(); u != 0 && time.Now().UnixNano() <= u {
		h.rejected.Add(1)
		return nil, ErrOpen
	}
	done, err := h.cb.Allow()
	if err != nil {
		h.rejected.Add(1)
		return nil, ErrOpen
	}
	return done, nil
}

// settle reports the outcome of a call allow let through: err nil for a
// success, errExcluded for neither, any other error for a failure.
func (h *Health) settle(done func(error), err error) {
	if done != nil {
		done(err)
		return
	}
	// Let through while closed, without gobreaker: a success changes
	// nothing unless a failure may have left a count to reset; a failure
	// is counted (and may trip the breaker) as if it had been let through
	// now. A call that began closed and ends after the breaker left that
	// state says nothing gobreaker wants: it is dropped.
	switch {
	case err == nil:
		if !h.dirty.Load() {
			return
		}
		h.dirty.Store(false)
	case errors.Is(err, errExcluded):
		return
	default:
		h.dirty.Store(true)
		// stored again after: a success settled in between must not leave
		// this failure's count unreset by the next one
		defer h.dirty.Store(true)
	}
	if !h.closed.Load() {
		return
	}
	if d, e := h.cb.Allow(); e == nil {
		d(err)
	}
}

// healthy reports whether err says the Redis answered: no error, a nil
// reply, or an error reply of the server's own.
func healthy(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return true
	}
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// report tells the breaker how a call it allowed (done) ended; ctx is the
// caller's context, allowance the time the call was given in all (0:
// unknown). It reports false when the call ran out of time in this
// process (see blamesRedis): that is not counted against the Redis.
func (h *Health) report(ctx context.Context, done func(error), err error, start time.Time, allowance time.Duration) bool {
	switch {
	case healthy(err):
		h.successes.Add(1)
		h.settle(done, nil)
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up; that says nothing about the store.
		h.settle(done, errExcluded)
	case errors.Is(err, ErrOpen):
		// go-redis sent part of the call through the client's hooks again
		// (a retry on another connection) and the breaker refused it:
		// nothing was learned about the Redis.
		h.settle(done, errExcluded)
	default:
		switch h.blamesRedis(err, start, allowance) {
		case blameProcess:
			h.overloaded.Add(1)
			h.settle(done, errExcluded)
			return false
		case blameCounted:
			h.failedAt.Store(time.Now().UnixNano())
			// Redis's, but the evidence was counted already (one silence
			// shared by the calls coalesced into it, a dial error the pool
			// hands out again): one failure, not one per call.
			h.settle(done, errExcluded)
		default:
			if h.shards != nil {
				// A Cluster: the node's breaker counted it (shardHook).
				h.settle(done, errExcluded)
				break
			}
			h.failures.Add(1)
			h.lastErr.Store(&errBox{err})
			h.failedAt.Store(time.Now().UnixNano())
			h.settle(done, err)
		}
	}
	return true
}

// blame is who a failed call is held against.
type blame uint8

const (
	blameRedis   blame = iota // a failure of the Redis, counted now
	blameCounted              // the Redis's, on evidence already counted
	blameProcess              // this process's own wait: overload
)

// blamesRedis says whom a failed call counts against. Only what the
// Redis did counts: an error it caused (a refused or reset connection, a
// failed dial), or a reply that did not come while the Redis had the
// command — from the moment the command was written (wireConn: the reads
// of this Health's connections that ran out of time while the call ran,
// since go-redis's retry may have replaced the read's own error; or a
// command outstanding now, silentNow), for
// at least half of the call's budget (allowance; any time when unknown): a
// caller's shorter deadline proves nothing against Redis. Less proves
// nothing, like the slice of a budget the blocks before spent
// (guardScope.short). A call that ran out of time before its command was
// written (waiting for a pooled connection, for the coalesced call in
// flight, for the CPU) or whose reply was in the socket, unread, when its
// time ran out, was delayed by this process: it is not the Redis's
// failure. Each piece of evidence counts once (wireEvent.claim): the calls
// that share one silent script call, or the dial error the pool returns to
// every caller until it redials, are one failure; a dial error from before
// the call began is stale and counts for nothing.
func (h *Health) blamesRedis(err error, start time.Time, allowance time.Duration) blame {
	if !h.wired {
		// Not a go-redis client this health dials for (a store or limiter
		// of another kind): nothing tells the waits apart, every failure
		// counts.
		return blameRedis
	}
	var df *dialFailure
	if errors.As(err, &df) {
		switch {
		case df.ev.at < start.UnixNano():
			return blameCounted // the pool's memory of an earlier dial
		case timedOut(df.err) && df.took < allowance/2:
			return blameProcess
		}
		return df.ev.claim()
	}
	if errors.Is(err, errDetachedExpired) {
		return blameRedis // a client that ignores deadlines: nothing tells the waits apart
	}
	if !timedOut(err) {
		return blameRedis
	}
	// The reads that ran out of time while the call ran, on any of the
	// connections (another call's may be the one it waited behind).
	seen, counted := false, false
	for i := range h.wire {
		e := h.wire[i].Load()
		if e == nil || e.at < start.UnixNano() {
			continue
		}
		seen = true
		if e.broken || (!e.replied && e.silence >= allowance/2) {
			if e.claim() == blameRedis {
				return blameRedis
			}
			counted = true
		}
	}
	if counted {
		return blameCounted
	}
	var op *net.OpError
	// written on a connection this health did not dial, no reply in time
	if !seen && errors.As(err, &op) && op.Op == "read" {
		return blameRedis
	}
	// Not sent, or its read not yet timed out: it waited behind a command
	// that Redis has not answered for half a budget (a coalesced call in
	// flight on a paused Redis), or in this process.
	return h.silentNow(allowance / 2)
}

// timedOut reports whether err is a deadline or timeout of any kind.
func timedOut(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// failedLately reports whether the Redis failed (a call counted against
// it, a connection it broke or refused) within the last OpenTimeout.
func (h *Health) failedLately() bool {
	at := h.failedAt.Load()
	return at != 0 && time.Now().UnixNano()-at < int64(h.set.OpenTimeout)
}

// errOverloaded is the error of a call whose budget ran out in this
// process before Redis could answer (the coalescing queue, the pool, the
// CPU): the process is the bottleneck. A Store refuses such a call (Decide
// returns it, nothing decided) rather than decide it by the local share: an
// approximation would spend more of an overloaded CPU on a caller that is
// already late, and say nothing true about Redis. It matches
// spillway.ErrBudgetSpent, so a Reserve decides it locally as before.
// Within OpenTimeout of a Redis failure (failedLately) such a call is
// decided locally instead: its wait may have been the failover's.
var errOverloaded = fmt.Errorf("fallback: overloaded, the budget went in this process: %w", spillway.ErrBudgetSpent)

// finish reports the outcome err of a call the breaker allowed (done) and
// classifies it (a call cut short by the request's budget, sc.cutShort,
// is reported as neither success nor failure): nil on success, the caller's cancellation as a
// *canceledError (not counted), any other failure (the budget's deadline
// included) as itself.
func (h *Health) finish(ctx context.Context, done func(error), err error, sc guardScope) error {
	if err != nil && sc.cutShort() && !errors.Is(ctx.Err(), context.Canceled) {
		h.overloaded.Add(1)
		h.settle(done, errExcluded)
		return fmt.Errorf("%w: %w", spillway.ErrBudgetSpent, err)
	}
	if h.shards != nil && err != nil && !healthy(err) && !errors.Is(ctx.Err(), context.Canceled) && !errors.Is(err, ErrOpen) &&
		(sc.g == nil || !sc.g.shardFailed.Load()) {
		// A Cluster: no node's breaker counted a failure of this call
		// (shardHook), so its time went in this process — or in a
		// failover's redirections, which the nodes' breakers do not tell
		// apart: decided locally, not refused.
		h.overloaded.Add(1)
		h.settle(done, errExcluded)
		return fmt.Errorf("%w: %w", spillway.ErrBudgetSpent, err)
	}
	blamed := h.report(ctx, done, err, sc.start, sc.allowance)
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		return &canceledError{err: ctx.Err()}
	case !blamed && h.failedLately():
		// Redis failed a moment ago (a failover, a restart): the wait may
		// have been for it (a new master's address, a redial), which the
		// health cannot tell apart from this process's own; decided
		// locally, as a budget spent before the call is.
		return fmt.Errorf("%w: %w", spillway.ErrBudgetSpent, err)
	case !blamed:
		// spent in this process: overload (see errOverloaded)
		return fmt.Errorf("%w: %w", errOverloaded, err)
	}
	return err
}

// call runs f as one call of a wrapper (a Store given this
// Health), within own from now or the end of the request's budget
// (budget.Deadline), whichever is sooner: on the caller's
// goroutine when direct (the client honours the deadline), else detached
// (abandoned, if it runs past the deadline, to abandoned). It returns
// spillway.ErrBudgetSpent, with nothing taken from the breaker, when the
// budget is spent, ErrOpen when the breaker refuses, and f's error
// classified as finish does.
func (h *Health) call(ctx context.Context, own time.Duration, direct bool, f func(ctx context.Context) error, abandoned func(error)) error {
	deadline, ok := budget.Deadline(ctx, own)
	if !ok {
		return spillway.ErrBudgetSpent
	}
	done, err := h.allow()
	if err != nil {
		return err
	}
	sc := h.guard(ctx, deadline, own)
	if direct {
		err = f(sc.ctx)
	} else {
		err = h.detach(sc.ctx, deadline, f, abandoned)
	}
	sc.end()
	return h.finish(ctx, done, err, sc)
}

// bypass runs f within own unless the breaker is open, without reporting
// to the breaker: for reconcile, whose calls must neither take the
// half-open probe slots of real traffic nor reopen the breaker on a stale
// pooled connection (a failed pass is simply retried later).
func (h *Health) bypass(ctx context.Context, own time.Duration, f func(ctx context.Context) error) error {
	if h.state() == Open {
		return ErrOpen
	}
	deadline, _ := budget.Deadline(ctx, own)
	sc := h.guard(ctx, deadline, own)
	defer sc.end()
	return f(sc.ctx)
}

// guardCtx marks the calls a wrapper of h runs and accounts for itself, so
// that h's hook on the client lets them through without counting them a
// second time. It is active only while the wrapper's call runs: a Done
// that keeps the context (a concurrency release) is gated and counted by
// the hook like any other call.
type guardCtx struct {
	context.Context
	h      *Health
	active atomic.Bool
	// shardFailed: on a Cluster, a node's breaker counted a failure of a
	// command of this call (shardHook).
	shardFailed atomic.Bool
}

type guardKey struct{}

func (g *guardCtx) Value(key any) any {
	if key == (guardKey{}) {
		return g
	}
	return g.Context.Value(key)
}

// guardScope is one wrapper call's context; end it when the call returns.
type guardScope struct {
	ctx    context.Context
	g      *guardCtx
	cancel context.CancelFunc
	// short: the call was given less than half of its full allowance (its
	// own budget, or the request's whole budget when that is smaller)
	// because the blocks before it spent the rest. Running out of such a
	// slice proves nothing against the store, so it is not a failure.
	short    bool
	deadline time.Time
	// allowance is the time the call's budget gives it in all (0: no
	// deadline): what Redis's silence is judged against.
	allowance time.Duration
	start     time.Time
}

// cutShort reports whether the call of sc ran out of a slice of the
// budget too small to blame the store for.
func (sc *guardScope) cutShort() bool {
	return sc.short && !time.Now().Before(sc.deadline)
}

func (sc guardScope) end() {
	if sc.g != nil {
		sc.g.active.Store(false)
	}
	if sc.cancel != nil {
		sc.cancel()
	}
}

// guard returns ctx with the deadline (none when zero) and, when h is
// attached to a client, the mark that its hook lets through. own is the
// wrapper's own budget.
func (h *Health) guard(ctx context.Context, deadline time.Time, own time.Duration) guardScope {
	return h.guardWith(ctx, deadline, own, true)
}

// guardWith is guard; withDeadline false leaves the deadline out of the
// context, for a call that passes it to a store's DecideBy instead
// (no timer per call).
func (h *Health) guardWith(ctx context.Context, deadline time.Time, own time.Duration, withDeadline bool) guardScope {
	var total time.Duration
	if !deadline.IsZero() {
		total = budget.Total(ctx)
	}
	return h.guardAt(ctx, time.Now(), deadline, total, own, withDeadline)
}

// guardAt is guardWith at now, with total the request budget's length
// (budget.Total): for Store.Decide, which has read both already.
func (h *Health) guardAt(ctx context.Context, now, deadline time.Time, total, own time.Duration, withDeadline bool) guardScope {
	sc := guardScope{start: now}
	if !deadline.IsZero() {
		full := own
		if t := total; t > 0 && (full <= 0 || t < full) {
			full = t
		}
		sc.deadline = deadline
		left := deadline.Sub(now)
		sc.short = full > 0 && left < full/2
		// Redis is judged against the budget (its full allowance), not
		// against a caller's shorter deadline: a call whose caller gives
		// up sooner does not prove Redis slow.
		sc.allowance = max(left, full)
		// a context that ends no later needs no timer of its own
		if d, ok := ctx.Deadline(); withDeadline && (!ok || d.After(deadline)) {
			ctx, sc.cancel = context.WithDeadline(ctx, deadline)
		}
	}
	if h.attached {
		sc.g = &guardCtx{Context: ctx, h: h}
		sc.g.active.Store(true)
		ctx = sc.g
	}
	sc.ctx = ctx
	return sc
}

// accountedFor reports whether a wrapper of h (or h's probe) is running
// the call of ctx.
func (h *Health) accountedFor(ctx context.Context) bool {
	if g, ok := ctx.Value(guardKey{}).(*guardCtx); ok && g.h == h && g.active.Load() {
		return true
	}
	if h.closed.Load() {
		return false // no probe runs while closed
	}
	p, ok := ctx.Value(probeKey{}).(*Health)
	return ok && p == h
}

// hook gates and counts, on a go-redis client, the commands that no
// wrapper of its Health accounts for.
type hook struct{ h *Health }

// DialHook refuses to open connections while the health is open: go-redis
// redials in the background after failed dials, and a connection attempt
// to a sick Redis is traffic too.
// It also hands go-redis a wireConn, which tells the health how long the
// Redis took to answer (see blamesRedis).
func (k hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if k.h.refusesDial(ctx) {
			k.h.rejected.Add(1)
			return nil, ErrOpen
		}
		return k.h.dial(ctx, next, network, addr)
	}
}

// allowanceOf is what Redis's silence toward a call starting at start is
// judged against: the time until ctx's deadline, or the longest budget of
// the Stores on h when longer (a caller giving up sooner does
// not prove Redis slow); 0 without a deadline.
func (h *Health) allowanceOf(ctx context.Context, start time.Time) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(d.Sub(start), time.Duration(h.budget.Load()))
	}
	return 0
}

// noteBudget records a Store's budget (see allowanceOf).
func (h *Health) noteBudget(b time.Duration) {
	for {
		old := h.budget.Load()
		if int64(b) <= old || h.budget.CompareAndSwap(old, int64(b)) {
			return
		}
	}
}

func (k hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	if k.h.shards != nil {
		return next // a Cluster: each node's shardHook gates and counts
	}
	return func(ctx context.Context, cmd redis.Cmder) error {
		if k.h.accountedFor(ctx) {
			return next(ctx, cmd)
		}
		done, err := k.h.allow()
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		start := time.Now()
		err = next(ctx, cmd)
		k.h.report(ctx, done, err, start, k.h.allowanceOf(ctx, start))
		return err
	}
}

func (k hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	if k.h.shards != nil {
		return next
	}
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if k.h.accountedFor(ctx) {
			return next(ctx, cmds)
		}
		done, err := k.h.allow()
		if err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		start := time.Now()
		err = next(ctx, cmds)
		k.h.report(ctx, done, err, start, k.h.allowanceOf(ctx, start))
		return err
	}
}

// canceledError marks a call the caller canceled, or whose caller's
// deadline had passed when it came: it is returned, not decided locally.
type canceledError struct{ err error }

func (e *canceledError) Error() string {
	if errors.Is(e.err, context.DeadlineExceeded) {
		return "fallback: the caller's deadline had passed: " + e.err.Error()
	}
	return "fallback: caller canceled: " + e.err.Error()
}
func (e *canceledError) Unwrap() error { return e.err }
