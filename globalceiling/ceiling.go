package globalceiling

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/budget"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/share"
	"github.com/spillway-go/spillway/lua"
)

// Mode is how a Ceiling reads the total of its shards.
type Mode uint8

const (
	// Exact charges one random shard and reads the other K-1 in the same
	// pipeline (one round trip, K commands); a denied admission takes its
	// charge back (a second round trip, on the denial path only). On a
	// single node the admitted total never exceeds the ceiling.
	Exact Mode = iota
	// Cached decides on a total read every SyncInterval plus this
	// server's own admissions since, and charges one random shard per
	// admission (one round trip, one command). Other servers' admissions
	// since the last read are invisible: see the package doc for the bound.
	Cached
	// LocalAggregation decides locally, like Cached, but does not write
	// per admission: every SyncInterval it flushes its count to one random
	// shard and reads the total in one pipeline. Far fewer writes, a
	// looser bound.
	LocalAggregation
)

var modeNames = [...]string{"exact", "cached", "local_aggregation"}

// String returns the snake_case name of m.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ErrStale is wrapped by the error of an admission in Cached or
// LocalAggregation mode when the last successful sync with Redis is older
// than the stale bound (Settings.StaleAfter): the local view can no longer
// be trusted and the caller should degrade (a Guard falls back to its local
// bucket).
var ErrStale = errors.New("globalceiling: shared total is stale")

// Settings configures a Ceiling (New). The zero value is the default: an
// Exact ceiling of 8 shards under the prefix "spillway:", with a reserve
// of 0.1 for Critical work.
type Settings struct {
	// Mode is Exact (the default), Cached or LocalAggregation.
	Mode Mode
	// Shards is K, the number of shard keys (default 8, at most 1024).
	// Each shard has its own hash tag, so on a Cluster the shards spread
	// over slots and nodes; more shards spread writes wider and make Exact
	// reads wider.
	Shards int
	// SyncInterval is how often Cached reads the total and
	// LocalAggregation flushes and reads it (default 100 ms). Exact does
	// not sync.
	SyncInterval time.Duration
	// StaleAfter is how old the last successful sync may be before Cached
	// and LocalAggregation admissions fail with ErrStale (default 5 ×
	// SyncInterval).
	StaleAfter time.Duration
	// Reserve is the fraction of the ceiling kept for Critical and
	// CriticalPlus work (default 0.1; below 1): Sheddable and
	// SheddablePlus requests are denied once the total reaches
	// (1 − Reserve) × limit; Critical and CriticalPlus may use the whole
	// limit. A negative Reserve keeps none.
	Reserve float64
	// Prefix is the prefix of every key (default "spillway:"); it must
	// not contain '{' or '}'.
	Prefix string
	// Clock places admissions in windows (default time.Now). Windows are
	// aligned to the Unix epoch, so servers with synchronized clocks agree
	// on them; see the package doc on skew.
	Clock func() time.Time
	// OnSyncError is called with the error of a failed background sync
	// (default: ignored; admissions report ErrStale once it lasts).
	OnSyncError func(error)

	// For tests: the shard picker (default math/rand/v2.IntN) and no
	// background goroutine (the test calls Sync).
	intn       func(n int) int
	manualSync bool
}

type options struct {
	mode        Mode
	shards      int
	sync        time.Duration
	background  bool
	staleAfter  time.Duration
	reserve     float64
	prefix      string
	clock       func() time.Time
	intn        func(n int) int
	onSyncError func(error)
}

// stats counts what a Ceiling did. Writes are commands that change Redis
// (charges, refunds, flushes); Reads are shard reads.
type stats struct {
	Admitted   int64 // admissions allowed (requests, not cost)
	Denied     int64 // admissions denied
	Writes     int64
	Reads      int64
	RoundTrips int64 // pipelines and single commands sent
}

// Ceiling is a fleet-wide ceiling on the traffic to one shared resource: at
// most Limit cost units per Window, counted in K shard keys. It implements
// spillway.Limiter. Create it with New and, unless the mode is Exact (no
// background sync), stop it with Close.
type Ceiling struct {
	client   redis.UniversalClient
	name     string
	limit    int64
	window   time.Duration
	o        options
	entities []string // per shard: the hash tag entity
	charge   string   // script SHA
	ttlMS    int64
	wkeys    atomic.Pointer[windowKeys] // the shard keys of the latest window asked for

	// syncSem lets one Sync run at a time, from its snapshot of the
	// local counts to applying what it read: a read that started earlier
	// is never applied after one that started later, and each local count
	// is subtracted once.
	syncSem chan struct{}

	mu      sync.Mutex
	cur     winState // the window now being admitted
	prev    winState // LocalAggregation: the last window's unflushed count
	synced  time.Time
	syncErr error

	admitted, denied, writes, reads, roundTrips atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	shares *share.State // the client's local share (see degrade)
	lw     localWindow
}

type winState struct {
	w       int64 // window index
	total   int64 // the shared total at the last read (all servers)
	local   int64 // this server's admissions not known to be in total: since that read started (Cached), or not yet flushed (LocalAggregation)
	acked   int64 // Cached: the part of local whose charge has landed in Redis
	inFlush int64 // LocalAggregation: part of local being flushed now
}

// New returns a ceiling named name (the resource: "orders-db") that admits
// at most limit cost units per window across every server that shares the
// Redis behind client. It fails with an error naming the field when an
// argument or a Settings field is out of range.
func New(client redis.UniversalClient, name string, limit int64, window time.Duration, s Settings) (*Ceiling, error) {
	o := options{mode: s.Mode, shards: s.Shards, sync: s.SyncInterval, background: !s.manualSync,
		staleAfter: s.StaleAfter, reserve: s.Reserve, prefix: s.Prefix, clock: s.Clock,
		intn: s.intn, onSyncError: s.OnSyncError}
	if o.shards == 0 {
		o.shards = 8
	}
	if o.sync == 0 {
		o.sync = 100 * time.Millisecond
	}
	switch {
	case o.reserve == 0:
		o.reserve = 0.1
	case o.reserve < 0:
		o.reserve = 0
	}
	if o.prefix == "" {
		o.prefix = "spillway:"
	}
	if o.clock == nil {
		o.clock = time.Now
	}
	if o.intn == nil {
		o.intn = rand.IntN
	}
	if o.staleAfter == 0 {
		o.staleAfter = 5 * o.sync
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("globalceiling: New: client is nil")
	case name == "":
		return nil, fmt.Errorf("globalceiling: New: name is empty")
	case limit < 1:
		return nil, fmt.Errorf("globalceiling: New: limit %d must be at least 1", limit)
	case window < time.Millisecond:
		return nil, fmt.Errorf("globalceiling: New: window %v must be at least 1ms", window)
	case o.mode > LocalAggregation:
		return nil, fmt.Errorf("globalceiling: New: unknown mode %d", o.mode)
	case o.shards < 1 || o.shards > 1024:
		return nil, fmt.Errorf("globalceiling: New: shards %d must be in [1, 1024]", o.shards)
	case o.sync <= 0:
		return nil, fmt.Errorf("globalceiling: New: sync interval %v must be positive", o.sync)
	case o.staleAfter < 0:
		return nil, fmt.Errorf("globalceiling: New: stale after %v is negative", o.staleAfter)
	case !(o.reserve >= 0 && o.reserve < 1):
		return nil, fmt.Errorf("globalceiling: New: reserve %v must be in [0, 1)", o.reserve)
	}
	if err := keys.ValidatePrefix(o.prefix); err != nil {
		return nil, fmt.Errorf("globalceiling: New: %w", err)
	}
	c := &Ceiling{client: client, name: name, limit: limit, window: window, o: o,
		charge: lua.Script("ceiling_charge").Hash(), synced: o.clock(), syncSem: make(chan struct{}, 1),
		shares: share.Of(client)}
	for j := 0; j < o.shards; j++ {
		c.entities = append(c.entities, name+":"+strconv.Itoa(j))
	}
	// A window's counters must outlive it by the longest a reader or a
	// late flush can lag: a few sync intervals, and at least a second.
	c.ttlMS = (window + max(3*o.sync, time.Second)).Milliseconds()
	if o.background && o.mode != Exact {
		c.stop, c.done = make(chan struct{}), make(chan struct{})
		go c.loop()
	}
	return c, nil
}

// key returns the Redis key of shard j in window w (w is the Unix time
// divided by the window length).
func (c *Ceiling) key(w int64, j int) string {
	return keys.Key(c.o.prefix, "ceil:"+strconv.FormatInt(w, 10), c.entities[j])
}

// windowKeys are the shard keys of one window.
type windowKeys struct {
	w    int64
	keys []string // keys[j] == key(w, j); never modified
}

// keysOf returns the shard keys of window w, built once per window rather
// than on every admission.
func (c *Ceiling) keysOf(w int64) []string {
	if k := c.wkeys.Load(); k != nil && k.w == w {
		return k.keys
	}
	k := &windowKeys{w: w, keys: make([]string, c.o.shards)}
	for j := range k.keys {
		k.keys[j] = c.key(w, j)
	}
	c.wkeys.Store(k)
	return k.keys
}

// threshold returns the total up to which priority p is admitted.
func (c *Ceiling) threshold(p spillway.Priority) int64 {
	if p >= spillway.Critical || c.o.reserve == 0 {
		return c.limit
	}
	return c.limit - int64(float64(c.limit)*c.o.reserve+0.5)
}

// stats returns the counters so far.
func (c *Ceiling) stats() stats {
	return stats{Admitted: c.admitted.Load(), Denied: c.denied.Load(), Writes: c.writes.Load(),
		Reads: c.reads.Load(), RoundTrips: c.roundTrips.Load()}
}

func (c *Ceiling) windowOf(t time.Time) (w int64, end time.Time) {
	ns := t.UnixNano()
	w = ns / int64(c.window)
	if ns < 0 && ns%int64(c.window) != 0 {
		w--
	}
	return w, time.Unix(0, (w+1)*int64(c.window))
}

// Admit admits r when the total of this window plus r's cost stays within
// the threshold of r's priority (Settings.Reserve).
//
// Allowed: Limit is the threshold, Remaining what is left under it,
// ResetAfter the time until the window ends; done does nothing (the
// ceiling counts admissions, not work in flight) but may be called.
// Denied: Reason is spillway.ReasonCeiling (answer 503), RetryAfter and
// ResetAfter the time until the window ends. A malformed request is
// denied with spillway.ReasonInvalid.
//
// The ceiling falls back by itself: in Exact and Cached modes the Redis
// calls of an admission end with the request's budget (a Chain
// starts one), and when Redis cannot answer — a failure, the budget
// already spent (no call is made), the client's health open
// (fallback.NewHealth), or in Cached and LocalAggregation modes a shared
// total older than Settings.StaleAfter — the request is decided by this server
// alone at its share of each threshold per window (the share of the
// client's fleet it last saw alive, see fallback.HealthSettings.Share: the
// whole ceiling on a lone server), marked Degraded. err != nil only when
// the caller canceled (a *spillway.StoreError wrapping context.Canceled).
func (c *Ceiling) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: c.name}, spillway.Noop, nil
	}
	d, err := c.admitN(ctx, r.Priority, r.EffectiveCost())
	if err != nil {
		if canceled(ctx) {
			return spillway.Decision{}, spillway.Noop, &spillway.StoreError{Limiter: c.name, Err: err}
		}
		return c.degrade(r.Priority, r.EffectiveCost()), spillway.Noop, nil
	}
	return d, spillway.Noop, nil
}

// admitN is Admit for a priority and a cost (>= 1) without a Request,
// without the fallback: err != nil when Redis failed, the budget was
// spent (spillway.ErrBudgetSpent) or, in Cached and LocalAggregation
// modes, the shared total is stale (ErrStale); nothing was charged then.
//
// A cost above threshold(p), which no window can ever admit, is denied
// with spillway.ReasonCostExceedsLimit and RetryAfter 0 before anything is
// charged (Remaining reports what is left; in Exact mode that costs one
// read-only round trip). Every cost from 1 to math.MaxInt64 is accepted:
// totals never wrap.
func (c *Ceiling) admitN(ctx context.Context, p spillway.Priority, cost int64) (spillway.Decision, error) {
	if cost < 1 {
		return spillway.Decision{}, fmt.Errorf("globalceiling: cost %d must be at least 1", cost)
	}
	if !p.Valid() {
		return spillway.Decision{}, fmt.Errorf("globalceiling: unknown priority %d", int8(p))
	}
	if c.o.mode != LocalAggregation {
		// Exact and Cached call Redis in the admission: within what is
		// left of the request's budget (budget.With), and not at
		// all when it is spent.
		deadline, ok := budget.Deadline(ctx, 0)
		if !ok {
			return spillway.Decision{}, fmt.Errorf("globalceiling: %s: %w", c.name, spillway.ErrBudgetSpent)
		}
		if !deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
	}
	now := c.o.clock()
	var d spillway.Decision
	var err error
	switch {
	case cost > c.threshold(p):
		d, err = c.tooCostly(ctx, now, p)
	case c.o.mode == Exact:
		d, err = c.admitExact(ctx, now, p, cost)
	default:
		d, err = c.admitLocal(ctx, now, p, cost)
	}
	if err != nil {
		return spillway.Decision{}, err
	}
	if d.Allowed {
		c.admitted.Add(1)
	} else {
		c.denied.Add(1)
	}
	return d, nil
}

func (c *Ceiling) decision(allowed bool, p spillway.Priority, total int64, end, now time.Time) spillway.Decision {
	th := c.threshold(p)
	reset := max(end.Sub(now), time.Millisecond)
	d := spillway.Decision{Allowed: allowed, Limiter: c.name, Limit: th, Remaining: max(th-total, 0), ResetAfter: reset}
	if !allowed {
		d.Reason = spillway.ReasonCeiling
		d.RetryAfter = reset
	}
	return d
}

// tooCostly denies a cost above threshold(p) without charging: it reads
// the total (Exact) or takes this server's view of it (Cached,
// LocalAggregation) only to report Remaining.
func (c *Ceiling) tooCostly(ctx context.Context, now time.Time, p spillway.Priority) (spillway.Decision, error) {
	w, end := c.windowOf(now)
	var seen int64
	if c.o.mode == Exact {
		ks := c.keysOf(w)
		pipe := c.client.Pipeline()
		gets := make([]*redis.StringCmd, len(ks))
		for j, k := range ks {
			gets[j] = pipe.Get(ctx, k)
		}
		_, _ = pipe.Exec(ctx)
		c.roundTrips.Add(1)
		var err error
		if seen, err = c.sumShards(gets); err != nil {
			return spillway.Decision{}, err
		}
	} else {
		c.mu.Lock()
		if c.cur.w == w {
			seen = satAdd(c.cur.total, c.cur.local)
		} else if c.cur.w > w {
			seen = satAdd(c.cur.total, c.cur.local)
			_, end = c.windowOf(time.Unix(0, c.cur.w*int64(c.window)))
		}
		c.mu.Unlock()
	}
	d := c.decision(false, p, seen, end, now)
	d.Reason, d.RetryAfter = spillway.ReasonCostExceedsLimit, 0
	return d, nil
}

// satAdd returns a + b for a, b ≥ 0, saturated at math.MaxInt64 instead of
// wrapping.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

func (c *Ceiling) admitExact(ctx context.Context, now time.Time, p spillway.Priority, cost int64) (spillway.Decision, error) {
	w, end := c.windowOf(now)
	i := c.o.intn(c.o.shards)
	total, err := c.chargeAndRead(ctx, w, i, cost)
	if err != nil {
		return spillway.Decision{}, err
	}
	if total <= c.threshold(p) {
		return c.decision(true, p, total, end, now), nil
	}
	// Denied: take the charge back. Admissions that read while it stood
	// may have been denied too (undershoot), never admitted beyond.
	c.writes.Add(1)
	c.roundTrips.Add(1)
	if err := lua.Script("ceiling_refund").Run(ctx, c.client, []string{c.key(w, i)}, cost).Err(); err != nil {
		return spillway.Decision{}, fmt.Errorf("globalceiling: refund: %w", err)
	}
	return c.decision(false, p, max(total-cost, 0), end, now), nil
}

// errNoScript says the server lost the charge script (a restart, SCRIPT
// FLUSH): load it and send the pipeline again.
var errNoScript = errors.New("globalceiling: NOSCRIPT")

// withScript runs f, and once more after loading the charge script when f
// reports errNoScript.
func (c *Ceiling) withScript(ctx context.Context, f func() error) error {
	err := f()
	if errors.Is(err, errNoScript) {
		if lerr := lua.Script("ceiling_charge").Load(ctx, c.client).Err(); lerr != nil {
			return fmt.Errorf("globalceiling: load script: %w", lerr)
		}
		err = f()
	}
	return err
}

func (c *Ceiling) chargeErr(what string, err error) error {
	if strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return errNoScript
	}
	return fmt.Errorf("globalceiling: %s: %w", what, err)
}

// sumShards adds up the replies of shard reads; a missing key is 0.
func (c *Ceiling) sumShards(gets []*redis.StringCmd) (int64, error) {
	var total int64
	for _, g := range gets {
		if g == nil {
			continue
		}
		c.reads.Add(1)
		n, err := g.Int64()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return 0, fmt.Errorf("globalceiling: read shard: %w", err)
		case n > 0: // a negative shard (a refund raced its window's expiry) adds nothing: erring on the safe side
			total = satAdd(total, n)
		}
	}
	return total, nil
}

// chargeAndRead adds cost to shard i of window w and reads the other
// shards in one pipeline; it returns the total. On a single node the charge
// runs before the reads, so the total includes it and every charge that
// landed before it.
func (c *Ceiling) chargeAndRead(ctx context.Context, w int64, i int, cost int64) (total int64, err error) {
	err = c.withScript(ctx, func() error {
		ks := c.keysOf(w)
		pipe := c.client.Pipeline()
		charge := pipe.EvalSha(ctx, c.charge, []string{ks[i]}, cost, c.ttlMS)
		gets := make([]*redis.StringCmd, c.o.shards)
		for j := range gets {
			if j != i {
				gets[j] = pipe.Get(ctx, ks[j])
			}
		}
		_, _ = pipe.Exec(ctx)
		c.roundTrips.Add(1)
		n, err := charge.Int64()
		if err != nil {
			return c.chargeErr("charge", err)
		}
		c.writes.Add(1)
		// A failed read leaves the charge standing: the admission is
		// reported as an error (nothing admitted) and the charge expires
		// with the window, erring on the safe side.
		rest, err := c.sumShards(gets)
		total = satAdd(max(n, 0), rest)
		return err
	})
	return total, err
}

// roll moves the state to window w, keeping the last window's unflushed
// count in prev (LocalAggregation). Called with c.mu held.
func (c *Ceiling) roll(w int64) {
	if c.cur.w == w {
		return
	}
	if w < c.cur.w {
		return // the clock went back: keep counting in the newer window
	}
	if c.o.mode == LocalAggregation {
		// What is being flushed now lands in its window; the rest waits
		// for the next sync.
		if rest := c.cur.local - c.cur.inFlush; rest > 0 {
			c.addPrev(c.cur.w, rest)
		}
	}
	c.cur = winState{w: w}
}

func (c *Ceiling) admitLocal(ctx context.Context, now time.Time, p spillway.Priority, cost int64) (spillway.Decision, error) {
	w, end := c.windowOf(now)
	c.mu.Lock()
	if c.o.background && c.o.staleAfter > 0 && now.Sub(c.synced) > c.o.staleAfter {
		err, synced := c.syncErr, c.synced
		c.mu.Unlock()
		if err == nil {
			err = errors.New("no successful sync yet")
		}
		return spillway.Decision{}, fmt.Errorf("%w: last successful sync %v ago: %w", ErrStale, now.Sub(synced).Round(time.Millisecond), err)
	}
	c.roll(w)
	if c.cur.w != w {
		// The clock went back into an older window: decide it in the
		// newer one, whose end is later.
		_, end = c.windowOf(time.Unix(0, c.cur.w*int64(c.window)))
	}
	// seen ≥ 0 and cost ≤ threshold(p): compared without forming seen + cost,
	// which could wrap.
	seen := satAdd(c.cur.total, c.cur.local)
	if th := c.threshold(p); seen > th || cost > th-seen {
		c.mu.Unlock()
		return c.decision(false, p, seen, end, now), nil
	}
	c.cur.local += cost // ≤ threshold(p) − total: no overflow
	seen += cost
	cw := c.cur.w
	c.mu.Unlock()
	if c.o.mode == Cached {
		i := c.o.intn(c.o.shards)
		c.writes.Add(1)
		c.roundTrips.Add(1)
		err := lua.Script("ceiling_charge").Run(ctx, c.client, []string{c.keysOf(cw)[i]}, cost, c.ttlMS).Err()
		c.mu.Lock()
		if c.cur.w == cw {
			if err != nil {
				c.cur.local -= cost
			} else {
				// Landed: a sync whose read is sent from now on sees it.
				c.cur.acked += cost
			}
		}
		c.mu.Unlock()
		if err != nil {
			return spillway.Decision{}, fmt.Errorf("globalceiling: charge: %w", err)
		}
	}
	return c.decision(true, p, seen, end, now), nil
}

// Sync reads the shared total now (Cached), or flushes this server's count
// and reads the total (LocalAggregation), in one pipeline. The background
// loop calls it every SyncInterval. In Exact mode it does nothing.
//
// Any number of goroutines may call Sync, with the background loop
// running: syncs run one at a time (a caller waits for the one in
// progress, or until ctx ends), so a newer total is never overwritten by
// an older read and each local count is subtracted once.
func (c *Ceiling) Sync(ctx context.Context) error {
	if c.o.mode == Exact {
		return nil
	}
	select {
	case c.syncSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("globalceiling: sync: %w", ctx.Err())
	}
	defer func() { <-c.syncSem }()
	now := c.o.clock()
	w, _ := c.windowOf(now)
	c.mu.Lock()
	c.roll(w)
	cw := c.cur.w
	var flushPrev, flushCur int64
	prevW := c.prev.w
	// Cached: only charges that have landed are surely in the total read
	// below; one still in flight stays in local until a later sync.
	startAcked := c.cur.acked
	if c.o.mode == LocalAggregation {
		flushPrev, c.prev.local = c.prev.local, 0
		flushCur = c.cur.local - c.cur.inFlush
		c.cur.inFlush += flushCur
	}
	c.mu.Unlock()

	prevDone, curDone, total, err := c.syncRound(ctx, cw, prevW, flushPrev, flushCur)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.o.mode == LocalAggregation {
		// A flush that failed is counted again next time; one that
		// landed is never sent twice, even when the reads failed.
		if !prevDone && flushPrev > 0 {
			c.addPrev(prevW, flushPrev)
		}
		switch {
		case c.cur.w == cw:
			c.cur.inFlush -= flushCur
			if curDone {
				c.cur.local -= flushCur
			}
		case !curDone && flushCur > 0:
			c.addPrev(cw, flushCur)
		}
	}
	if err != nil {
		c.syncErr = err
		return err
	}
	if c.cur.w == cw {
		c.cur.total = total
		if c.o.mode == Cached {
			// Charges that landed before the read was sent are in the
			// total now; later ones may not be.
			c.cur.local -= startAcked
			c.cur.acked -= startAcked
		}
	}
	c.synced, c.syncErr = now, nil
	return nil
}

// addPrev keeps an unflushed count of window w for the next sync. Called
// with c.mu held. An older window's count is dropped: that window is over.
func (c *Ceiling) addPrev(w, n int64) {
	switch {
	case c.prev.w == w:
		c.prev.local += n
	case w > c.prev.w || c.prev.local == 0:
		c.prev = winState{w: w, local: n}
	}
}

// syncRound flushes (LocalAggregation) and reads every shard of window cw
// in one pipeline. prevDone and curDone report which flushes landed.
func (c *Ceiling) syncRound(ctx context.Context, cw, prevW int64, flushPrev, flushCur int64) (prevDone, curDone bool, total int64, err error) {
	err = c.withScript(ctx, func() error {
		pipe := c.client.Pipeline()
		var prevCmd, curCmd *redis.Cmd
		if flushPrev > 0 && !prevDone { // a retry after NOSCRIPT sends only what did not land
			prevCmd = pipe.EvalSha(ctx, c.charge, []string{c.key(prevW, c.o.intn(c.o.shards))}, flushPrev, c.ttlMS)
		}
		if flushCur > 0 && !curDone {
			curCmd = pipe.EvalSha(ctx, c.charge, []string{c.key(cw, c.o.intn(c.o.shards))}, flushCur, c.ttlMS)
		}
		ks := c.keysOf(cw)
		gets := make([]*redis.StringCmd, c.o.shards)
		for j := range gets {
			gets[j] = pipe.Get(ctx, ks[j])
		}
		_, _ = pipe.Exec(ctx)
		c.roundTrips.Add(1)
		var flushErr error
		for _, f := range []struct {
			cmd  *redis.Cmd
			done *bool
		}{{prevCmd, &prevDone}, {curCmd, &curDone}} {
			if f.cmd == nil || *f.done {
				continue
			}
			if err := f.cmd.Err(); err != nil {
				flushErr = c.chargeErr("flush", err)
				continue
			}
			*f.done = true
			c.writes.Add(1)
		}
		if flushErr != nil {
			return flushErr
		}
		var err error
		total, err = c.sumShards(gets)
		return err
	})
	return prevDone, curDone, total, err
}

func (c *Ceiling) loop() {
	defer close(c.done)
	t := time.NewTicker(c.o.sync)
	defer t.Stop()
	sync := func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.o.sync*2)
		defer cancel()
		if err := c.Sync(ctx); err != nil && c.o.onSyncError != nil {
			c.o.onSyncError(err)
		}
	}
	sync() // learn the total at once, not one interval after starting
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			sync()
		}
	}
}

// Close stops the background sync and, in LocalAggregation mode, flushes
// what this server counted, so the fleet's total stays right after it
// leaves. It is safe to call twice.
func (c *Ceiling) Close() error {
	var err error
	c.closeOnce.Do(func() {
		if c.stop != nil {
			close(c.stop)
			<-c.done
		}
		if c.o.mode == LocalAggregation {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			err = c.Sync(ctx)
		}
	})
	return err
}
