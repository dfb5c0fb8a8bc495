package sim

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// Recorder collects one run's time series in fixed-width buckets. Every
// method is safe for concurrent use and cheap (atomics; two short slices
// under a mutex for the latency percentiles).
type Recorder struct {
	// Debug, when not nil, counts what -debug prints (the database, the
	// clients and the servers add to it).
	Debug     *Debug
	start     time.Time
	width     time.Duration
	buckets   []bucket
	byLimiter sync.Map // Decision.Limiter of a denial → *atomic.Int64
}

type bucket struct {
	offered      atomic.Int64 // attempts sent (first tries and retries)
	logical      atomic.Int64 // new logical requests
	retries      atomic.Int64
	admitted     atomic.Int64 // allowed by the chain (or by fail-open)
	rejected     [16]atomic.Int64
	degraded     atomic.Int64
	storeErrors  atomic.Int64 // the chain returned an error (the middleware's fail mode decided)
	success      atomic.Int64 // attempts answered 200 within the client timeout: goodput
	exports      atomic.Int64 // export requests sent (not counted as offered)
	exportsOK    atomic.Int64 // export requests answered 200 within the client's timeout
	timeouts     atomic.Int64 // attempts the client gave up on
	backendOK    atomic.Int64
	backendFail  atomic.Int64
	backendMax   atomic.Int64
	critOK       atomic.Int64 // well-behaved Critical/CriticalPlus logical requests that succeeded
	critFail     atomic.Int64
	redisMaxUS   atomic.Int64
	redisFail    atomic.Int64
	breakersOpen atomic.Int64 // most breakers seen open at once

	// Database work (queries that carry their client's give-up time,
	// see WithGiveUp): time spent, and spent after the client gave up.
	busyUS, wastedUS atomic.Int64
	// Per tenant (Arrival.Tenant, 1-based; index 0 unused): attempts
	// answered 200 in time, answered 429, answered 503, and the sum of
	// the Retry-After of the 429s in ms.
	tOK, t429, t503, tRetryMS [MaxTenants + 1]atomic.Int64
	// The learned limits (-1 none): the largest of the live servers'
	// limits, lowest sample in the bucket (stored +1, 0: none), and the
	// live servers' pool slots summed, highest sample.
	limMaxLow, slotsHigh atomic.Int64

	mu         sync.Mutex
	backendLat []float32 // ms
	critLat    []float32 // ms, client-observed, Critical(+) successes
}

// NewRecorder returns a recorder of n buckets of width w starting now.
func NewRecorder(width time.Duration, n int) *Recorder {
	return &Recorder{start: time.Now(), width: width, buckets: make([]bucket, n)}
}

// Restart moves the origin to now (the moment the load starts).
func (r *Recorder) Restart() { r.start = time.Now() }

func (r *Recorder) b() *bucket { return r.at(time.Now()) }

// at returns the bucket of time t.
func (r *Recorder) at(t time.Time) *bucket {
	i := int(t.Sub(r.start) / r.width)
	if i < 0 {
		i = 0
	}
	if i >= len(r.buckets) {
		i = len(r.buckets) - 1
	}
	return &r.buckets[i]
}

func storeMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// Attempt counts one attempt sent; logical marks the first try of a
// logical request.
func (r *Recorder) Attempt(retry bool) {
	b := r.b()
	b.offered.Add(1)
	if retry {
		b.retries.Add(1)
	} else {
		b.logical.Add(1)
	}
}

// Decision counts what the chain decided for one attempt.
func (r *Recorder) Decision(d spillway.Decision, err error) {
	b := r.b()
	if err != nil {
		b.storeErrors.Add(1)
		return
	}
	if d.Degraded {
		b.degraded.Add(1)
	}
	if d.Allowed {
		b.admitted.Add(1)
		return
	}
	b.rejected[int(d.Reason)%len(b.rejected)].Add(1)
	name := d.Limiter
	if name == "" {
		name = "unnamed"
	}
	v, ok := r.byLimiter.Load(name)
	if !ok {
		v, _ = r.byLimiter.LoadOrStore(name, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
}

// RejectedByLimiter returns the denials per deciding block so far.
func (r *Recorder) RejectedByLimiter() map[string]int64 {
	out := map[string]int64{}
	r.byLimiter.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// FailOpen counts a request the middleware served although the chain
// failed (fail-open).
func (r *Recorder) FailOpen() { r.b().admitted.Add(1) }

// AttemptResult counts how an attempt ended at the client.
func (r *Recorder) AttemptResult(ok, timedOut bool) {
	b := r.b()
	if ok {
		b.success.Add(1)
	}
	if timedOut {
		b.timeouts.Add(1)
	}
}

// Export counts an export request and whether it was answered 200 in
// time; the export route's figures stay out of the database's.
func (r *Recorder) Export(ok bool) {
	b := r.b()
	b.exports.Add(1)
	if ok {
		b.exportsOK.Add(1)
	}
}

// Critical counts a well-behaved Critical or CriticalPlus logical request
// that ended (after its retries), with its client-observed latency.
func (r *Recorder) Critical(ok bool, lat time.Duration) {
	b := r.b()
	if !ok {
		b.critFail.Add(1)
		return
	}
	b.critOK.Add(1)
	b.mu.Lock()
	b.critLat = append(b.critLat, float32(lat.Seconds()*1000))
	b.mu.Unlock()
}

// BackendStart records that a query started with n in flight.
func (r *Recorder) BackendStart(n int64) { storeMax(&r.b().backendMax, n) }

// BackendDone records a finished query that started at start, in the
// bucket where it started: a query sent during the load counts, however
// late it ends.
func (r *Recorder) BackendDone(start time.Time, lat time.Duration, ok bool) {
	b := r.at(start)
	if ok {
		b.backendOK.Add(1)
	} else {
		b.backendFail.Add(1)
	}
	if lat > 0 {
		b.mu.Lock()
		b.backendLat = append(b.backendLat, float32(lat.Seconds()*1000))
		b.mu.Unlock()
	}
}

// MaxTenants is the most tenants a population may have.
const MaxTenants = 32

// BackendWork records the time the database spent on a query that started
// at start, and the part of it after the query's client gave up.
func (r *Recorder) BackendWork(start time.Time, busy, wasted time.Duration) {
	b := r.at(start)
	b.busyUS.Add(busy.Microseconds())
	if wasted > 0 {
		b.wastedUS.Add(wasted.Microseconds())
	}
}

// Tenant records how an attempt of tenant t (1-based) was answered.
func (r *Recorder) Tenant(t int, ok bool, status int, retryAfter time.Duration) {
	if t < 1 || t > MaxTenants {
		return
	}
	b := r.b()
	switch {
	case ok:
		b.tOK[t].Add(1)
	case status == 429:
		b.t429[t].Add(1)
		b.tRetryMS[t].Add(retryAfter.Milliseconds())
	case status == 503:
		b.t503[t].Add(1)
	}
}

// Learned records one sample of the live servers' learned limits: the
// largest of them and the sum of their pools' slots.
func (r *Recorder) Learned(maxLimit int, slots int64) {
	b := r.b()
	for {
		cur := b.limMaxLow.Load()
		if (cur != 0 && int64(maxLimit)+1 >= cur) || b.limMaxLow.CompareAndSwap(cur, int64(maxLimit)+1) {
			break
		}
	}
	storeMax(&b.slotsHigh, slots)
}

// RedisProbe records one PING through the fault proxy.
func (r *Recorder) RedisProbe(lat time.Duration, ok bool) {
	b := r.b()
	if !ok {
		b.redisFail.Add(1)
		return
	}
	storeMax(&b.redisMaxUS, lat.Microseconds())
}

// Breakers records how many servers' breakers are open now.
func (r *Recorder) Breakers(open int) { storeMax(&r.b().breakersOpen, int64(open)) }

// Series is the recorder's content as plain per-bucket values, the form the
// report, the plots and the verdict use.
type Series struct {
	BucketSec      float64              `json:"bucket_s"`
	T              []float64            `json:"t_s"`          // bucket start, seconds from the start of the load
	Offered        []float64            `json:"offered_rps"`  // attempts/s, retries included
	Logical        []float64            `json:"logical_rps"`  // new requests/s
	Admitted       []float64            `json:"admitted_rps"` // allowed by the chain (or fail-open)
	Goodput        []float64            `json:"goodput_rps"`  // 200 answers within the client timeout /s
	BackendConc    []float64            `json:"backend_concurrency"`
	BackendP99     []float64            `json:"backend_p99_ms"`
	RedisMS        []float64            `json:"redis_latency_ms"` // worst answered probe in the bucket
	RedisDown      []float64            `json:"redis_probe_failures"`
	BreakersOpen   []float64            `json:"breakers_open"`
	Degraded       []float64            `json:"degraded_rps"`
	StoreErrors    []float64            `json:"store_errors_rps"`
	Rejected       map[string][]float64 `json:"rejected_rps"`
	CriticalOK     []float64            `json:"critical_ok"`
	CriticalFail   []float64            `json:"critical_fail"`
	BackendBusyS   []float64            `json:"backend_busy_s,omitempty"`   // database time spent on queries started in the bucket
	BackendWastedS []float64            `json:"backend_wasted_s,omitempty"` // of it, after the client gave up
	TenantOK       [][]int64            `json:"tenant_ok,omitempty"`        // [bucket][tenant]: attempts answered 200 in time
	Tenant429      [][]int64            `json:"tenant_429,omitempty"`
	Tenant503      [][]int64            `json:"tenant_503,omitempty"`
	TenantRetryMS  [][]int64            `json:"tenant_retry_after_ms,omitempty"` // sum of the 429s' Retry-After
	LearnedMaxLow  []float64            `json:"learned_limit_max_low,omitempty"` // lowest (over samples) largest learned limit of the live servers; -1: none
	SlotsHigh      []float64            `json:"pool_slots_high,omitempty"`       // highest sum of the live servers' pool slots
	Exports        []float64            `json:"export_rps"`                      // export requests sent /s
	ExportsOK      []float64            `json:"export_ok_rps"`                   // export requests answered 200 /s
	backendLat     [][]float32
	critLat        [][]float32
	totalsRejected map[string]int64
}

// Snapshot turns the first n buckets into a Series.
func (r *Recorder) Snapshot(n int) *Series {
	n = min(n, len(r.buckets))
	w := r.width.Seconds()
	s := &Series{BucketSec: w, Rejected: map[string][]float64{}, totalsRejected: map[string]int64{}}
	for i := 0; i < n; i++ {
		b := &r.buckets[i]
		s.T = append(s.T, float64(i)*w)
		s.Offered = append(s.Offered, float64(b.offered.Load())/w)
		s.Logical = append(s.Logical, float64(b.logical.Load())/w)
		s.Admitted = append(s.Admitted, float64(b.admitted.Load())/w)
		s.Goodput = append(s.Goodput, float64(b.success.Load())/w)
		s.BackendConc = append(s.BackendConc, float64(b.backendMax.Load()))
		b.mu.Lock()
		bl := slices.Clone(b.backendLat)
		cl := slices.Clone(b.critLat)
		b.mu.Unlock()
		s.backendLat = append(s.backendLat, bl)
		s.critLat = append(s.critLat, cl)
		s.BackendP99 = append(s.BackendP99, Percentile(bl, 0.99))
		s.RedisMS = append(s.RedisMS, float64(b.redisMaxUS.Load())/1000)
		s.RedisDown = append(s.RedisDown, float64(b.redisFail.Load()))
		s.BreakersOpen = append(s.BreakersOpen, float64(b.breakersOpen.Load()))
		s.Degraded = append(s.Degraded, float64(b.degraded.Load())/w)
		s.StoreErrors = append(s.StoreErrors, float64(b.storeErrors.Load())/w)
		s.CriticalOK = append(s.CriticalOK, float64(b.critOK.Load()))
		s.CriticalFail = append(s.CriticalFail, float64(b.critFail.Load()))
		s.Exports = append(s.Exports, float64(b.exports.Load())/w)
		s.ExportsOK = append(s.ExportsOK, float64(b.exportsOK.Load())/w)
		s.BackendBusyS = append(s.BackendBusyS, float64(b.busyUS.Load())/1e6)
		s.BackendWastedS = append(s.BackendWastedS, float64(b.wastedUS.Load())/1e6)
		var ok, t4, t5, tr []int64
		for k := range b.tOK {
			ok = append(ok, b.tOK[k].Load())
			t4 = append(t4, b.t429[k].Load())
			t5 = append(t5, b.t503[k].Load())
			tr = append(tr, b.tRetryMS[k].Load())
		}
		s.TenantOK, s.Tenant429, s.Tenant503, s.TenantRetryMS = append(s.TenantOK, ok), append(s.Tenant429, t4), append(s.Tenant503, t5), append(s.TenantRetryMS, tr)
		s.LearnedMaxLow = append(s.LearnedMaxLow, float64(b.limMaxLow.Load()-1))
		s.SlotsHigh = append(s.SlotsHigh, float64(b.slotsHigh.Load()))
		for reason := range b.rejected {
			v := b.rejected[reason].Load()
			name := spillway.Reason(reason).String()
			if _, ok := s.Rejected[name]; !ok && v == 0 {
				continue
			}
			if _, ok := s.Rejected[name]; !ok {
				s.Rejected[name] = make([]float64, n)
			}
			s.Rejected[name][i] = float64(v) / w
			s.totalsRejected[name] += v
		}
	}
	return s
}

// Percentile returns the q-quantile of v (nearest rank), 0 for none.
func Percentile(v []float32, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := slices.Clone(v)
	slices.Sort(c)
	i := int(math.Ceil(q*float64(len(c)))) - 1
	i = max(0, min(i, len(c)-1))
	return float64(c[i])
}

// Window returns the bucket indexes [i, j) covering [from, to).
func (s *Series) Window(from, to time.Duration) (int, int) {
	w := s.BucketSec
	i := int(math.Ceil(from.Seconds()/w - 1e-9))
	j := int(math.Floor(to.Seconds()/w + 1e-9))
	i = max(0, min(i, len(s.T)))
	j = max(i, min(j, len(s.T)))
	return i, j
}

// Buckets returns how many buckets d spans, rounded up.
func (s *Series) Buckets(d time.Duration) int {
	return int(math.Ceil(d.Seconds()/s.BucketSec - 1e-9))
}

// Mean returns the mean of xs[i:j].
func Mean(xs []float64, i, j int) float64 {
	if j <= i {
		return 0
	}
	var t float64
	for _, x := range xs[i:j] {
		t += x
	}
	return t / float64(j-i)
}

// MaxOf returns the max of xs[i:j].
func MaxOf(xs []float64, i, j int) float64 {
	m := 0.0
	for _, x := range xs[i:j] {
		m = max(m, x)
	}
	return m
}

// BackendP99In returns the p99 of the backend latencies in buckets [i, j).
func (s *Series) BackendP99In(i, j int) float64 {
	var all []float32
	for _, l := range s.backendLat[i:j] {
		all = append(all, l...)
	}
	return Percentile(all, 0.99)
}

// CriticalP99In returns the p99 client latency of Critical successes in [i, j).
func (s *Series) CriticalP99In(i, j int) float64 {
	var all []float32
	for _, l := range s.critLat[i:j] {
		all = append(all, l...)
	}
	return Percentile(all, 0.99)
}

// Count returns the sum of xs[i:j] times the bucket width (a rate back into a count).
func (s *Series) Count(xs []float64, i, j int) int64 {
	var t float64
	for _, x := range xs[i:j] {
		t += x
	}
	return int64(math.Round(t * s.BucketSec))
}

// Latencies is the number of buckets with database latencies recorded.
func (s *Series) Latencies() int { return len(s.backendLat) }

// TotalsRejected returns the denials per reason over the whole series.
func (s *Series) TotalsRejected() map[string]int64 { return s.totalsRejected }
