package shedder

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/share"
	"github.com/spillway-go/spillway/lua"

	"github.com/spillway-go/spillway/internal/block"
)

// Fleet is Stripe's fleet usage load shedder. The fleet as a whole can work
// on capacity units of cost at once; a fraction of that (the reserve,
// default 20%) is kept for Critical and CriticalPlus work, so Sheddable and
// SheddablePlus work is shed once fleet usage passes the rest, Critical
// work once it passes the whole capacity, and CriticalPlus work never (see
// FleetSettings.Thresholds to change any of these).
//
// Each server counts its own in-flight work per priority and, about every
// interval (default 100ms), reports it to Redis and reads back the fleet's
// sum in one script call (lua.Script("shedder_fleet")). Admit decides locally, with no
// Redis round trip, on the fleet sum from the last refresh and this
// server's measured share of it. Between refreshes a server may grow its
// own in-flight work by its share of the headroom the last refresh showed
// (threshold − fleet usage), rounded to whole units at random once per
// refresh so that the fleet does not stop short of the threshold; the
// share is its reported usage plus an even
// part, (own + capacity/n) / (fleet + capacity), so the shares of n
// servers that saw the same sum add up to one and a server that carries
// most of the traffic gets most of the headroom, instead of every server
// assuming the others change as it does. A server may always reuse what
// its own finished work freed. The bound this keeps: servers that
// refreshed on the same sum exceed a threshold together by less than one
// unit each (the rounding); with refreshes staggered by up to one
// interval, by at most the headroom handed out in that interval besides,
// which is nothing once usage has stood at the threshold for an interval.
// FleetSettings.Reservations removes that staleness below the lowest threshold: each
// server reserves its share of the headroom in Redis with its report and
// uses no more than its reservation and what the others' reports and
// reservations leave, so the grants never add up past it; what a server
// may still admit while its report is on its way (its carry) stays
// reserved until its next report. A server that
// crashes stops reporting, and its report stops counting after the TTL
// (default 2s), so nothing leaks.
//
// Pressure: a server that refused Critical or CriticalPlus work (in
// Admit, or in a Pool of this fleet whose slots the fleet's allowance
// set) while it held less than its even share of the capacity (capacity
// / live servers) says so with its next report; while another server's
// last report says so, Admit sheds Sheddable and SheddablePlus work that
// would take this server past its even share. A server that joined a
// full fleet thus gets room for its Critical work from the servers that
// hold more than theirs, instead of watching them refill the fleet with
// their least important work. One report without a refusal lifts it.
//
// When the last successful refresh is older than the stale limit (default
// 1s) — Redis down or slow — the Fleet decides on its own counts against
// its share of the capacity (its measured share at the last refresh, as
// above; the client's share — fallback.HealthSettings.Share, else 0.2 —
// if it never refreshed) and marks decisions
// Degraded. When Redis is back, the first refresh reports but its sum is
// not used (the other servers' reports may have expired meanwhile): the
// Fleet stays degraded until a later refresh sees as many servers as the
// last one before the outage, or for one TTL at most (a server that has
// not reported again by then would have expired anyway). Admit never
// returns an error.
//
// Allowed decisions carry Limit 0, so a chain's headers keep reporting the
// client's own quota; denials carry the priority's threshold and what is
// left below it. A request that costs more than its priority's threshold of
// the whole capacity could never be admitted and is denied with
// spillway.ReasonCostExceedsLimit and no RetryAfter.
//
// A Fleet is safe for concurrent use. Refreshes start from Admit when the
// estimate is older than the interval (in a goroutine, so Admit never
// waits); call Refresh before a server takes traffic (until its first
// refresh it decides on its share alone), and Close when it stops so its
// in-flight work stops counting at once. Its capacity follows a
// CapacityWatcher's readings, when one feeds it.
type Fleet struct {
	client   redis.UniversalClient
	capacity atomic.Int64                    // setCapacity may change it at run time
	thresh   [spillway.NumPriorities]float64 // fractions of capacity
	o        options
	keys     []string

	local      [spillway.NumPriorities]atomic.Int64 // this server's in-flight cost
	localTotal atomic.Int64
	view       atomic.Pointer[fleetView]
	servers    atomic.Int64 // live servers at the last refresh
	lastOK     atomic.Int64 // UnixNano of the last successful refresh, 0 never
	lastTry    atomic.Int64 // UnixNano of the last refresh started
	refreshing atomic.Bool
	// refused is set when this server refused Critical (or CriticalPlus)
	// work since its last report, by Admit or by a Pool of this fleet:
	// the report tells the fleet while this server is below its even
	// share (see Fleet, pressure).
	refused atomic.Bool
	shares  *share.State // the local share of the blocks on client

	mu sync.Mutex // serializes refreshes; held across the Redis call
	// rejoining is set by the first successful refresh after an outage
	// (the last success stale): its view is not used, because the other
	// servers' reports may have expired meanwhile and not yet been made
	// again. rejoinFrom is when (UnixNano) and rejoinServers how many
	// servers the last view before the outage had. Guarded by mu.
	rejoining     bool
	rejoinFrom    int64
	rejoinServers int64

	errMu   sync.Mutex // guards lastErr only, so Stats never waits on Redis
	lastErr error
}

// NewFleet returns the fleet shedder named name (every server of one fleet
// uses the same name, capacity and settings) on client. The name is its
// Redis keys' and its decisions' (Decision.Limiter). It fails when client
// is nil, name is empty, capacity is outside [1, MaxFleetCapacity] or a
// setting is out of range.
func NewFleet(client redis.UniversalClient, name string, capacity int64, s FleetSettings) (*Fleet, error) {
	if client == nil {
		return nil, fmt.Errorf("shedder: fleet redis client is nil")
	}
	if name == "" {
		return nil, fmt.Errorf("shedder: fleet name is empty")
	}
	if capacity <= 0 || capacity > MaxFleetCapacity {
		return nil, fmt.Errorf("shedder: fleet capacity %d must be in [1, %d] (MaxFleetCapacity)", capacity, MaxFleetCapacity)
	}
	o := fleetOptions(s, name)
	if err := o.validateCommon(); err != nil {
		return nil, err
	}
	if err := keys.ValidatePrefix(o.prefix); err != nil {
		return nil, fmt.Errorf("shedder: %w", err)
	}
	if o.interval <= 0 {
		return nil, fmt.Errorf("shedder: fleet interval %v must be positive", o.interval)
	}
	if o.ttl <= o.interval || o.ttl < time.Millisecond {
		return nil, fmt.Errorf("shedder: fleet ttl %v must exceed the interval %v", o.ttl, o.interval)
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("shedder: fleet timeout %v must be positive", o.timeout)
	}
	if o.staleAfter <= 0 {
		return nil, fmt.Errorf("shedder: fleet stale after %v must be positive", o.staleAfter)
	}
	th := o.thresholds
	if th == [4]float64{} {
		th = [4]float64{1 - o.reserve, 1 - o.reserve, 1, math.Inf(1)}
	}
	for p, v := range th {
		if !(v > 0) {
			return nil, fmt.Errorf("shedder: fleet threshold of %v is %v, want > 0", spillway.Priority(p), v)
		}
		if p > 0 && v < th[p-1] {
			return nil, fmt.Errorf("shedder: fleet threshold of %v (%v) is below that of %v (%v): thresholds must not decrease with priority", spillway.Priority(p), v, spillway.Priority(p-1), th[p-1])
		}
	}
	if o.serverID == "" {
		o.serverID = defaultServerID()
	}
	f := &Fleet{client: client, thresh: th, o: o, shares: share.Of(client)}
	f.capacity.Store(capacity)
	f.keys = []string{
		keys.Key(o.prefix, "fleet:reports", name),
		keys.Key(o.prefix, "fleet:expiry", name),
		keys.Key(o.prefix, "fleet:sums", name),
		keys.Key(o.prefix, "fleet:wants", name),
	}
	return f, nil
}

func defaultServerID() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])
}

// Admit decides r against the fleet's usage. It never returns an error and
// never waits on Redis. A malformed (or nil) request is denied with
// spillway.ReasonInvalid.
func (f *Fleet) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: f.o.name}, spillway.Noop, nil
	}
	now := f.o.now().UnixNano()
	// After the decision, so that a refresh it starts can report it.
	defer f.maybeRefresh(now)
	c, p := r.EffectiveCost(), r.Priority
	if full := f.fullLimit(p); c > full {
		// It could never be admitted, even by an idle fleet.
		return spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: f.o.name, Limit: full}, spillway.Noop, nil
	}
	limit, degraded := f.limitFor(p, now)
	if p < spillway.Critical && !degraded {
		if v := f.view.Load(); v != nil && v.pressure && f.localTotal.Load()+c > f.evenShare(v) {
			// Another server refused Critical work at its last report:
			// a server above its even share of the capacity admits no
			// lower priority until that one is served.
			return spillway.Decision{Reason: spillway.ReasonShed, Limiter: f.o.name, Limit: limit, RetryAfter: f.o.retryAfter}, spillway.Noop, nil
		}
	}
	// This server's own total stays ≤ limit (≤ MaxFleetCapacity): compared
	// before it is added, so hostile costs never wrap it.
	own := int64(-1)
	for {
		old := f.localTotal.Load()
		if c > limit-old {
			break
		}
		if n := old + c; f.localTotal.CompareAndSwap(old, n) {
			own = n
			break
		}
	}
	if own < 0 || !f.fits(own, limit, degraded) {
		if own >= 0 {
			f.localTotal.Add(-c)
		}
		f.noteRefused(p)
		rem := max(int64(math.Floor(float64(limit)-f.estimate(f.localTotal.Load(), degraded)+1e-9)), 0)
		if v := f.view.Load(); f.o.reserveHead && !degraded && v != nil {
			rem = max(0, min(rem, f.grant(v, limit)-(f.localTotal.Load()-v.sent)))
		}
		return spillway.Decision{
			Reason:     spillway.ReasonShed,
			Limiter:    f.o.name,
			Limit:      limit,
			Remaining:  rem,
			RetryAfter: f.o.retryAfter,
			Degraded:   degraded,
		}, spillway.Noop, nil
	}
	f.local[p].Add(c)
	return spillway.Decision{Allowed: true, Limiter: f.o.name, Degraded: degraded}, block.Once(func(spillway.Outcome) {
		f.local[p].Add(-c)
		f.localTotal.Add(-c)
	}), nil
}

// evenShare is this server's even part of the capacity at view v:
// capacity / live servers, rounded down.
func (f *Fleet) evenShare(v *fleetView) int64 {
	return f.capacity.Load() / max(v.servers, 1)
}

// noteRefused records that this server refused work of priority p (by
// Admit, or by a Pool of this fleet that found no slot for it): Critical
// and CriticalPlus refusals go with the next report.
func (f *Fleet) noteRefused(p spillway.Priority) {
	if p >= spillway.Critical && !f.refused.Load() {
		f.refused.Store(true)
	}
}

// maybeRefresh starts a background refresh when the last one started an
// interval ago or more and none is running.
func (f *Fleet) maybeRefresh(now int64) {
	if f.o.autoRefresh && now-f.lastTry.Load() >= int64(f.o.interval) && f.refreshing.CompareAndSwap(false, true) {
		f.lastTry.Store(now)
		go func() {
			defer f.refreshing.Store(false)
			_ = f.Refresh(context.Background())
		}()
	}
}

// limitFor returns the usage limit of priority p and whether this is
// degraded mode.
func (f *Fleet) limitFor(p spillway.Priority, now int64) (limit int64, degraded bool) {
	capacity := float64(f.capacity.Load())
	ok := f.lastOK.Load()
	degraded = ok == 0 || now-ok > int64(f.o.staleAfter)
	if degraded {
		// An explicit share of the client (fallback.HealthSettings.Share)
		// wins; else the measured share at the last refresh; else the
		// client's default.
		if v := f.view.Load(); v != nil && v.servers > 0 && !f.shares.Fixed() {
			capacity *= f.share(v)
		} else {
			capacity *= f.shares.Share()
		}
	}
	return f.threshold(p, capacity), degraded
}

// fullLimit is p's limit with the whole fleet's capacity.
func (f *Fleet) fullLimit(p spillway.Priority) int64 {
	return f.threshold(p, float64(f.capacity.Load()))
}

// setCapacity changes the fleet's capacity from now on: what the shared
// resource can take has changed (it lost a replica, a neighbour took its
// CPU, or it reports more room again). Decisions and allowance use the new
// capacity at once; the next refresh reserves headroom under it. Work
// already admitted is not revoked: after a fall the fleet admits nothing
// of a priority until its usage is under the new threshold. Every server
// of a fleet should set the same capacity; while they differ, each
// decides with its own. It returns an error, and changes nothing, for a
// capacity outside [1, MaxFleetCapacity].
func (f *Fleet) setCapacity(capacity int64) error {
	if capacity <= 0 || capacity > MaxFleetCapacity {
		return fmt.Errorf("shedder: fleet capacity %d must be in [1, %d] (MaxFleetCapacity)", capacity, MaxFleetCapacity)
	}
	f.capacity.Store(capacity)
	return nil
}

// MaxFleetCapacity is the largest capacity NewFleet accepts and the most
// one server may have in flight at any priority (2^46 units). Reports and
// sums cross the fleet script as Lua numbers, which print integers exactly
// only below 10^14 and hold them exactly only up to 2^53: with this bound
// a server's report stays exact, and so do the sums of up to 128 servers
// at that bound; a hostile cost can never push them past it.
const MaxFleetCapacity = 1 << 46

func (f *Fleet) threshold(p spillway.Priority, capacity float64) int64 {
	t := f.thresh[p]
	if math.IsInf(t, 1) || t*capacity >= MaxFleetCapacity {
		return MaxFleetCapacity
	}
	return int64(math.Floor(t*capacity + 1e-9))
}

// Refresh reports this server's in-flight work to Redis and reads the
// fleet's, within the time budget (FleetSettings.Timeout). An error leaves
// the last estimate in place until it goes stale (FleetStats.LastError
// has it too).
func (f *Fleet) Refresh(ctx context.Context) error {
	return f.report(ctx, f.o.ttl)
}

// Close removes this server's report, so its in-flight work stops counting
// now rather than after the TTL. Admit keeps working, degraded, until a
// refresh reports again: Refresh, or the refresh Admit starts by itself.
func (f *Fleet) Close(ctx context.Context) error {
	return f.report(ctx, 0)
}

// run refreshes every interval until ctx is done, then removes this
// server's report (Close) and returns ctx.Err(). Refresh errors do not stop
// it; LastError reports the latest. (For tests without auto refresh.)
func (f *Fleet) run(ctx context.Context) error {
	t := time.NewTicker(f.o.interval)
	defer t.Stop()
	for {
		_ = f.Refresh(ctx)
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.o.timeout)
			_ = f.Close(cctx)
			cancel()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (f *Fleet) report(ctx context.Context, ttl time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	started := f.o.now()
	f.lastTry.Store(started.UnixNano())
	var sent [spillway.NumPriorities]int64
	var total int64
	args := make([]any, 0, 12)
	args = append(args, f.o.serverID)
	for p := range sent {
		sent[p] = max(f.local[p].Load(), 0)
		total += sent[p]
		args = append(args, sent[p])
	}
	args = append(args, ttl.Milliseconds())
	if f.o.serverClock {
		args = append(args, started.UnixMilli())
	} else {
		args = append(args, "")
	}
	round := f.o.rand()
	if f.o.reserveHead {
		var carry int64
		if ttl > 0 {
			carry = f.carry(started.UnixNano(), sent)
		}
		args = append(args, f.reserveTarget(), f.capacity.Load(), strconv.FormatFloat(round, 'f', -1, 64), carry)
	} else {
		args = append(args, 0, f.capacity.Load(), "0", 0) // no reservation
	}
	// A refusal is reported while this server holds less than its even
	// share of the capacity: below it, the others hold what it lacks.
	refused := f.refused.Swap(false)
	want := refused
	if v := f.view.Load(); want && v != nil {
		want = total < f.evenShare(v)
	}
	if want {
		args = append(args, "1")
	} else {
		args = append(args, "0")
	}
	ctx, cancel := context.WithTimeout(ctx, f.o.timeout)
	defer cancel()
	res, err := lua.Script("shedder_fleet").Run(ctx, f.client, f.keys, args...).Int64Slice()
	if err == nil && len(res) != 8 {
		err = fmt.Errorf("reply has %d values, want 8", len(res))
	}
	if err != nil {
		if refused {
			f.refused.Store(true) // for the next report
		}
		err = fmt.Errorf("shedder: fleet refresh: %w", err)
		f.setLastErr(err)
		return err
	}
	if prev := f.lastOK.Load(); ttl > 0 && prev != 0 && started.UnixNano()-prev > int64(f.o.staleAfter) && !f.rejoining {
		// Back after an outage: this report is made, but the sum may
		// miss servers whose reports expired while Redis was away, and
		// would show this one a nearly empty fleet. Stay degraded (on
		// the last view's share) until the fleet has as many servers as
		// before the outage, or for one TTL at most: a server that has
		// not reported again by then would have expired anyway.
		f.rejoining, f.rejoinFrom, f.rejoinServers = true, started.UnixNano(), f.servers.Load()
		f.setLastErr(nil)
		return nil
	}
	if f.rejoining && ttl > 0 && res[4] < f.rejoinServers && started.UnixNano()-f.rejoinFrom < int64(f.o.ttl) {
		// Some servers of the fleet before the outage have not reported
		// again yet (their refresh was waiting out its timeout, say):
		// with their work missing from the sum, this server and the
		// others back already would share headroom that is in use.
		f.setLastErr(nil)
		return nil
	}
	f.rejoining = false
	v := &fleetView{sent: total, servers: res[4], round: round, others: res[5], reserved: res[6], pressure: res[7] == 1}
	for p := range sent {
		v.byPrio[p] = res[p]
		v.sum += res[p]
	}
	f.setLastErr(nil)
	f.view.Store(v)
	f.servers.Store(res[4])
	if ttl > 0 {
		// The other blocks on this client size their local share by the
		// servers seen alive (a lone server keeps its whole limit).
		f.shares.SetServers(res[4])
		f.lastOK.Store(started.UnixNano())
	} else {
		f.lastOK.Store(0)
	}
	return nil
}

// fleetView is what the last successful refresh saw.
type fleetView struct {
	sum     int64 // the fleet's in-flight cost, this server's report included
	sent    int64 // this server's report
	servers int64
	byPrio  [spillway.NumPriorities]int64 // the fleet's in-flight cost per priority
	round   float64                       // uniform in [0, 1): rounds this interval's grant
	// With Reservations: the other live servers' reservations and
	// this server's own, made with this report.
	others, reserved int64
	// pressure: another server refused Critical work at its last report
	pressure bool
}

// carry is how far this server may still grow beyond sent (the report
// being made), below the reservation threshold, before the reply lands:
// what its current grant leaves it (its degraded share of the threshold
// when degraded). The script keeps that much reserved until the next
// report, so work admitted under the old reservation while this report
// is on its way is never missing from both the reports and the
// reservations, where another server could be granted it. The grant
// itself comes from the new reservation only, so a carry lasts one
// interval. With reservations only.
func (f *Fleet) carry(now int64, sent [spillway.NumPriorities]int64) int64 {
	var total int64
	for _, c := range sent {
		total += c
	}
	p, ok := f.reservePriority()
	if !ok {
		return 0
	}
	// What Admit lets this server hold now at the threshold reservations
	// are made up to.
	limit, degraded := f.limitFor(p, now)
	if v := f.view.Load(); !degraded && v != nil {
		limit = v.sent + f.grant(v, limit)
	}
	return max(0, limit-total)
}

// reserveTarget is the threshold up to which a server reserves headroom
// (FleetSettings.Reservations): the lowest finite one, where Sheddable work is shed
// by default; 0 if none is finite.
func (f *Fleet) reserveTarget() int64 {
	if p, ok := f.reservePriority(); ok {
		return f.threshold(p, float64(f.capacity.Load()))
	}
	return 0
}

// reservePriority is the priority whose threshold reserveTarget is: the
// lowest with a finite threshold; false if none has one.
func (f *Fleet) reservePriority() (spillway.Priority, bool) {
	for p := range f.thresh {
		if f.threshold(spillway.Priority(p), float64(f.capacity.Load())) < MaxFleetCapacity {
			return spillway.Priority(p), true
		}
	}
	return 0, false
}

// grant returns how far this server may grow its in-flight cost beyond
// its last report before work whose limit is limit is shed.
//
// With Reservations: its reservation, less what the fleet's reports
// and the other servers' reservations leave below the reservation's
// threshold; above that threshold (the band kept for higher priorities)
// its share of what the band has left, rounded at random once per refresh.
// Otherwise: its share of the headroom, rounded the same way.
func (f *Fleet) grant(v *fleetView, limit int64) int64 {
	if limit >= MaxFleetCapacity {
		return MaxFleetCapacity
	}
	if !f.o.reserveHead {
		return int64(math.Floor(f.share(v)*float64(limit-v.sum) + v.round))
	}
	low := f.reserveTarget()
	g := max(0, min(v.reserved, min(limit, low)-v.sum-v.others))
	if limit > low {
		g += max(0, int64(math.Floor(f.share(v)*float64(limit-max(low, v.sum+v.others))+v.round)))
	}
	return g
}

func (f *Fleet) setLastErr(err error) {
	f.errMu.Lock()
	f.lastErr = err
	f.errMu.Unlock()
}

// fits reports whether this server's in-flight cost own keeps the fleet
// within limit. Degraded (or before the first refresh), own is compared
// with limit, already this server's share. Otherwise own may exceed the
// last report by the server's share of the headroom, rounded to a whole
// unit at random once per refresh (floor(share·headroom + r), r uniform
// in [0, 1)): rounded down, three servers that each had 0.9 of a unit
// would leave 2.7 units idle for good; rounded at random, the fleet
// reaches the threshold on average and exceeds it by less than one unit
// per server at worst.
func (f *Fleet) fits(own, limit int64, degraded bool) bool {
	v := f.view.Load()
	if degraded || v == nil {
		return own <= limit
	}
	return own-v.sent <= f.grant(v, limit)
}

// allowance returns the in-flight cost this server may hold now, its
// work in flight included, before work of priority p is shed: its last
// report plus its share of the headroom (see Fleet), or its share of the
// threshold when degraded. A Pool follows it, so that work waits for a
// slot of the fleet's capacity rather than being turned away while a slot
// comes free.
// For CriticalPlus, which is never shed by default, it is a very large
// number.
func (f *Fleet) allowance(p spillway.Priority) int64 {
	if p < 0 || int(p) >= spillway.NumPriorities {
		return 0
	}
	limit, degraded := f.limitFor(p, f.o.now().UnixNano())
	v := f.view.Load()
	if degraded || v == nil || limit >= MaxFleetCapacity {
		return limit
	}
	return max(0, v.sent+f.grant(v, limit))
}

// share returns this server's share of the fleet at view v: its reported
// usage plus an even part of the capacity, over the fleet's usage plus the
// capacity. The shares of servers that saw the same sum add up to one; an
// idle fleet splits evenly, a busy one by measured usage (half and half at
// full use), so a server that joins still gets a part.
func (f *Fleet) share(v *fleetView) float64 {
	n := float64(max(v.servers, 1))
	c := float64(f.capacity.Load())
	return (float64(max(v.sent, 0)) + c/n) / (float64(max(v.sum, 0)) + c)
}

// estimate returns the fleet usage as this server sees it given its own
// in-flight cost own: the fleet at the last refresh plus this server's
// change since, divided by its share. A server that has used its share
// of the headroom (threshold − fleet) sees the fleet at the threshold.
// Degraded, or before the first refresh, it is own alone.
func (f *Fleet) estimate(own int64, degraded bool) float64 {
	v := f.view.Load()
	if degraded || v == nil {
		return float64(own)
	}
	if f.o.reserveHead {
		// The others' reservations count as used: they may be by now.
		return max(float64(v.sum+v.others+own-v.sent), float64(own), 0)
	}
	return max(float64(v.sum)+float64(own-v.sent)/f.share(v), float64(own), 0)
}

// FleetStats is a snapshot of a Fleet's view.
type FleetStats struct {
	// Capacity is the fleet's capacity now (NewFleet's, or the last a
	// CapacityWatcher set).
	Capacity int64
	// Fleet is the fleet's in-flight cost per priority at the last
	// successful refresh (this server's report included).
	Fleet [spillway.NumPriorities]int64
	// Local is this server's in-flight cost per priority now.
	Local [spillway.NumPriorities]int64
	// Usage is the estimate Admit uses, rounded up: the fleet at the last
	// refresh plus this server's change since divided by its share (with
	// Reservations: plus this server's change and the other servers'
	// reservations; only this server's own work when Degraded).
	Usage int64
	// Share is this server's share of the fleet at the last refresh (see
	// Fleet), 0 before the first.
	Share float64
	// Servers is the number of live servers at the last refresh.
	Servers int64
	// Degraded reports that the estimate is stale and decisions use local
	// counts.
	Degraded bool
	// Pressure reports that at the last refresh another server, below
	// its even share of the capacity, had refused Critical work since
	// its own last report: this one admits no Sheddable or SheddablePlus
	// work past its even share until a refresh no longer shows it.
	Pressure bool
	// LastError is the error of the latest refresh, nil if it succeeded.
	LastError error
}

// Stats returns a snapshot of the Fleet's view.
func (f *Fleet) Stats() FleetStats {
	var s FleetStats
	if v := f.view.Load(); v != nil {
		s.Fleet = v.byPrio
	}
	f.errMu.Lock()
	s.LastError = f.lastErr
	f.errMu.Unlock()
	for p := range s.Local {
		s.Local[p] = f.local[p].Load()
	}
	_, degraded := f.limitFor(spillway.Critical, f.o.now().UnixNano())
	s.Usage = int64(math.Ceil(f.estimate(f.localTotal.Load(), degraded) - 1e-9))
	if v := f.view.Load(); v != nil {
		s.Share = f.share(v)
		s.Pressure = v.pressure && !degraded
	}
	s.Servers = f.servers.Load()
	s.Capacity = f.capacity.Load()
	s.Degraded = degraded
	return s
}
