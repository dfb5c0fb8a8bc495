package rls

import (
	"bufio"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
)

// counters are the reference's per-limit stats, under its names
// (ratelimit.service.rate_limit.KEY.total_hits and so on).
type counters struct {
	key                                                  string // the sanitized stats key: domain.key_value...
	totalHits, overLimit, nearLimit, withinLimit, shadow atomic.Uint64
	overLimitLocalCache                                  atomic.Uint64
}

// maxStatsKeys bounds the per-key stats: detailed_metric and value_to_metric
// make a key per request value, which an attacker chooses. Past the bound
// such hits are counted under the rule's own key.
const maxStatsKeys = 10000

// svcStats holds every counter the server exports. It is safe for concurrent
// use.
type svcStats struct {
	mu   sync.RWMutex
	keys map[string]*counters

	notFound                                  sync.Map // domain → *atomic.Uint64
	ConfigLoadSuccess, ConfigLoadError        atomic.Uint64
	RedisErrors, ServiceErrors, TotalRequests atomic.Uint64
	Degraded                                  atomic.Uint64 // descriptors answered by the local share
	Late                                      atomic.Uint64 // calls refused at once, undecided: their deadline had passed (SPILLWAY_LATE_ANSWER)
	Shed                                      atomic.Uint64 // calls refused at once, undecided: the server could not serve them by their deadline (SPILLWAY_MAX_IN_FLIGHT) or their budget went in this process
	GlobalShadowMode                          atomic.Uint64 // calls over the limit answered OK because of SHADOW_MODE
	health                                    func() (state string, opened, failures int64)
	local                                     func() (overloaded, redis int64) // store calls decided locally: time spent in this process, Redis failed
	shards                                    func() map[string]bool           // on a Cluster: each node's breaker, true when not closed

	// response time: a histogram on the Prometheus endpoint (with the Go
	// and process collectors) and, with statsd on, the reference's timer
	reg       *prometheus.Registry
	respTime  prometheus.Observer
	millis    bool // PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS
	respTimer gostats.Timer
}

// newStats returns empty stats.
func newStats() *svcStats {
	s := &svcStats{keys: map[string]*counters{}, reg: prometheus.NewRegistry()}
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ratelimit_service_response_time_seconds",
		Help:    "Time to answer a ShouldRateLimit call.",
		Buckets: prometheus.DefBuckets,
	}, []string{"grpc_method"})
	s.respTime = h.WithLabelValues("ShouldRateLimit")
	s.reg.MustRegister(h, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return s
}

// observe records a call that started at start.
func (s *svcStats) observe(start time.Time) {
	d := time.Since(start)
	if s.millis {
		s.respTime.Observe(float64(d) / float64(time.Millisecond))
	} else {
		s.respTime.Observe(d.Seconds())
	}
	if s.respTimer != nil {
		// the reference's unit: whole milliseconds
		s.respTimer.AddValue(float64(d.Milliseconds()))
	}
}

var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// sanitize is the reference's stat name cleaning: ':' and '|' become '_',
// and the dots of an IPv4 address too.
func sanitize(s string) string {
	if strings.ContainsAny(s, ":|") {
		s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
	}
	if strings.Count(s, ".") >= 3 {
		s = ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
	}
	return s
}

// get returns the counters of key, creating them (up to maxStatsKeys
// unless force; nil past it).
func (s *svcStats) get(key string, force bool) *counters {
	key = sanitize(key)
	s.mu.RLock()
	c := s.keys[key]
	s.mu.RUnlock()
	if c != nil {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c = s.keys[key]; c == nil {
		if !force && len(s.keys) >= maxStatsKeys {
			return nil
		}
		c = &counters{key: key}
		s.keys[key] = c
	}
	return c
}

func (s *svcStats) domainNotFound(domain string) {
	v, ok := s.notFound.Load(domain)
	if !ok {
		v, _ = s.notFound.LoadOrStore(domain, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
}

// Counter returns the value of a per-limit counter by the reference's
// statsd name without the "ratelimit.service.rate_limit." prefix, e.g.
// Counter("apis.generic_key_foo", "over_limit"); 0 when unknown.
func (s *svcStats) Counter(key, name string) uint64 {
	s.mu.RLock()
	c := s.keys[sanitize(key)]
	s.mu.RUnlock()
	if c == nil {
		return 0
	}
	for _, f := range c.fields() {
		if f.name == name {
			return f.v.Load()
		}
	}
	return 0
}

type field struct {
	name string
	v    *atomic.Uint64
}

func (c *counters) fields() []field {
	return []field{{"total_hits", &c.totalHits}, {"over_limit", &c.overLimit}, {"near_limit", &c.nearLimit},
		{"within_limit", &c.withinLimit}, {"shadow_mode", &c.shadow}, {"over_limit_with_local_cache", &c.overLimitLocalCache}}
}

// labels maps a stats key the way the reference's Prometheus mapping (its
// statsd exporter mapper) does: the first component is the domain, the
// next one key1, a third one key2; deeper components are dropped, so
// their counts add up under key2.
func labels(key string) (domain, key1, key2 string) {
	parts := strings.SplitN(key, ".", 4)
	domain = parts[0]
	if len(parts) > 1 {
		key1 = parts[1]
	}
	if len(parts) > 2 {
		key2 = parts[2]
	}
	return
}

type labelSet struct{ domain, key1, key2 string }

// WritePrometheus writes every counter in the Prometheus text format, under
// the names the reference's Prometheus endpoint has.
func (s *svcStats) WritePrometheus(w io.Writer) error {
	bw := bufio.NewWriter(w)
	s.mu.RLock()
	sums := map[string]map[labelSet]uint64{}
	for _, c := range s.keys {
		d, k1, k2 := labels(c.key)
		ls := labelSet{d, k1, k2}
		for _, f := range c.fields() {
			m := sums[f.name]
			if m == nil {
				m = map[labelSet]uint64{}
				sums[f.name] = m
			}
			m[ls] += f.v.Load()
		}
	}
	s.mu.RUnlock()
	for _, name := range []string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode", "over_limit_with_local_cache"} {
		m := sums[name]
		metric := "ratelimit_service_rate_limit_" + name
		bw.WriteString("# TYPE " + metric + " counter\n")
		ls := make([]labelSet, 0, len(m))
		for l := range m {
			ls = append(ls, l)
		}
		sort.Slice(ls, func(i, j int) bool {
			a, b := ls[i], ls[j]
			if a.domain != b.domain {
				return a.domain < b.domain
			}
			if a.key1 != b.key1 {
				return a.key1 < b.key1
			}
			return a.key2 < b.key2
		})
		for _, l := range ls {
			bw.WriteString(metric + `{domain="` + escapeLabel(l.domain) + `",key1="` + escapeLabel(l.key1) + `"`)
			if l.key2 != "" {
				bw.WriteString(`,key2="` + escapeLabel(l.key2) + `"`)
			}
			bw.WriteString("} " + strconv.FormatUint(m[l], 10) + "\n")
		}
	}
	var nf []string
	s.notFound.Range(func(k, _ any) bool { nf = append(nf, k.(string)); return true })
	sort.Strings(nf)
	bw.WriteString("# TYPE ratelimit_service_rate_limit_domain_not_found counter\n")
	for _, d := range nf {
		v, _ := s.notFound.Load(d)
		bw.WriteString(`ratelimit_service_rate_limit_domain_not_found{domain="` + escapeLabel(d) + `"} ` +
			strconv.FormatUint(v.(*atomic.Uint64).Load(), 10) + "\n")
	}
	counter := func(name, help string, v uint64) {
		bw.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + strconv.FormatUint(v, 10) + "\n")
	}
	counter("ratelimit_service_config_load_success", "Config loads that succeeded.", s.ConfigLoadSuccess.Load())
	counter("ratelimit_service_config_load_error", "Config loads that failed (the last good config stays).", s.ConfigLoadError.Load())
	bw.WriteString("# TYPE ratelimit_service_should_rate_limit_error counter\n")
	bw.WriteString(`ratelimit_service_should_rate_limit_error{err_type="redis_error"} ` + strconv.FormatUint(s.RedisErrors.Load(), 10) + "\n")
	bw.WriteString(`ratelimit_service_should_rate_limit_error{err_type="service_error"} ` + strconv.FormatUint(s.ServiceErrors.Load(), 10) + "\n")
	bw.WriteString("# TYPE ratelimit_service_total_requests counter\n")
	bw.WriteString(`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} ` + strconv.FormatUint(s.TotalRequests.Load(), 10) + "\n")
	counter("ratelimit_service_global_shadow_mode", "Calls over the limit answered OK because of SHADOW_MODE.", s.GlobalShadowMode.Load())
	counter("spillway_rls_degraded_total", "Descriptors decided by the local share while Redis could not answer.", s.Degraded.Load())
	counter("spillway_rls_late_total", "Calls refused at once, undecided, because their deadline had passed (SPILLWAY_LATE_ANSWER).", s.Late.Load())
	counter("spillway_rls_shed_total", "Calls refused at once, undecided, because the server could not serve them by their deadline (SPILLWAY_MAX_IN_FLIGHT, or their budget spent in this process).", s.Shed.Load())
	if s.local != nil {
		overloaded, redis := s.local()
		bw.WriteString("# HELP spillway_rls_local_calls_total Store calls decided by the local share, by cause: redis (Redis failed or the breaker was open) or overload (the time went in this process: queues, the pool, the CPU).\n# TYPE spillway_rls_local_calls_total counter\n")
		bw.WriteString(`spillway_rls_local_calls_total{cause="redis"} ` + strconv.FormatInt(redis, 10) + "\n")
		bw.WriteString(`spillway_rls_local_calls_total{cause="overload"} ` + strconv.FormatInt(overloaded, 10) + "\n")
	}
	if s.health != nil {
		state, opened, failures := s.health()
		bw.WriteString("# HELP spillway_rls_redis_breaker_state The breaker on Redis: 1 for the current state.\n# TYPE spillway_rls_redis_breaker_state gauge\n")
		for _, st := range []string{"closed", "half_open", "open"} {
			v := "0"
			if st == state {
				v = "1"
			}
			bw.WriteString(`spillway_rls_redis_breaker_state{state="` + st + `"} ` + v + "\n")
		}
		counter("spillway_rls_redis_breaker_opened_total", "Times the breaker on Redis opened.", uint64(opened))
		counter("spillway_rls_redis_failures_total", "Redis calls that failed (timeout, refused, reset).", uint64(failures))
	}
	if s.shards != nil {
		if m := s.shards(); len(m) > 0 {
			names := make([]string, 0, len(m))
			for n := range m {
				names = append(names, n)
			}
			sort.Strings(names)
			bw.WriteString("# HELP spillway_rls_redis_node_open On a Redis Cluster, each node's breaker: 1 while its slots are decided locally.\n# TYPE spillway_rls_redis_node_open gauge\n")
			for _, n := range names {
				v := "0"
				if m[n] {
					v = "1"
				}
				bw.WriteString(`spillway_rls_redis_node_open{node="` + escapeLabel(n) + `"} ` + v + "\n")
			}
		}
	}
	mfs, err := s.reg.Gather()
	if err != nil {
		return err
	}
	enc := expfmt.NewEncoder(bw, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	return bw.Flush()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// Handler serves WritePrometheus.
func (s *svcStats) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = s.WritePrometheus(w)
	})
}
