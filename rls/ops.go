package rls

// The server's operational surface, as the reference has it: the statsd
// sink, the debug listener, the log format, Redis error and breaker logs.

import (
	"context"
	"errors"
	"expvar"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/DataDog/datadog-go/v5/statsd"
	gostats "github.com/lyft/gostats"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/spillway-go/spillway/fallback"
)

// newStatsd returns the statsd store the settings ask for, nil when stats
// go to no statsd: USE_STATSD (on by default, as in the reference) sends
// the reference's stats, under its names, to STATSD_HOST:STATSD_PORT
// every STATS_FLUSH_INTERVAL; USE_DOG_STATSD sends them in DogStatsD's
// format, EXTRA_TAGS as tags. It also gives st the response-time timer.
func newStatsd(s Settings, st *svcStats, log *slog.Logger) (gostats.Store, error) {
	if s.DisableStats || !(s.UseStatsd || s.UseDogStatsd) {
		return nil, nil
	}
	addr := net.JoinHostPort(s.StatsdHost, strconv.Itoa(s.StatsdPort))
	var sink gostats.Sink
	if s.UseDogStatsd {
		c, err := statsd.New(addr, statsd.WithoutClientSideAggregation(), statsd.WithoutTelemetry())
		if err != nil {
			return nil, fmt.Errorf("rls: USE_DOG_STATSD: %w", err)
		}
		sink = dogSink{c, s.mogrifiers}
		log.Info("rls: stats to DogStatsD", "addr", addr)
	} else {
		proto := s.StatsdProtocol
		if proto == "" {
			proto = statsdProtocol(addr)
		}
		sink = gostats.NewNetSink(gostats.WithStatsdHost(s.StatsdHost), gostats.WithStatsdPort(s.StatsdPort),
			gostats.WithStatsdProtocol(proto), gostats.WithLogger(&sinkLog{log: log}))
		log.Info("rls: stats to statsd", "addr", addr, "protocol", proto, "flush", s.StatsFlushInterval)
	}
	store := gostats.NewStore(sink, false)
	tags := s.ExtraTags
	root := store.ScopeWithTags("ratelimit", tags)
	svc := root.Scope("service")
	server := store.ScopeWithTags("ratelimit_server", tags)
	g := &statsdGen{st: st, rl: svc.Scope("rate_limit"), svc: svc, call: svc.Scope("call.should_rate_limit"), server: server}
	store.AddStatGenerator(g)
	store.AddStatGenerator(gostats.NewRuntimeStats(root.Scope("go")))
	st.respTimer = server.NewTimer("ShouldRateLimit.response_time")
	return store, nil
}

// statsdProtocol is the protocol of a statsd at addr when STATSD_PROTOCOL
// is unset: TCP, as the reference's default, unless a TCP connection is
// refused at start (a statsd or agent that listens on UDP only), then UDP.
func statsdProtocol(addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		_ = c.Close()
		return "tcp"
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "udp"
	}
	return "tcp"
}

// statsdGen copies the stats into the statsd store at each flush, under
// the reference's names (the store sends what changed since the last).
type statsdGen struct {
	st                    *svcStats
	rl, svc, call, server gostats.Scope
	mu                    sync.Mutex
	keys                  []*counters
}

func (g *statsdGen) GenerateStats() {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.st
	st.mu.RLock()
	g.keys = g.keys[:0]
	for _, c := range st.keys {
		g.keys = append(g.keys, c)
	}
	st.mu.RUnlock()
	set := func(sc gostats.Scope, name string, v uint64) {
		if v != 0 {
			sc.NewCounter(name).Set(v)
		}
	}
	for _, c := range g.keys {
		for _, f := range c.fields() {
			set(g.rl, c.key+"."+f.name, f.v.Load())
		}
	}
	st.notFound.Range(func(k, v any) bool {
		set(g.rl, sanitize(k.(string))+".domain_not_found", v.(*atomic.Uint64).Load())
		return true
	})
	set(g.call, "redis_error", st.RedisErrors.Load())
	set(g.call, "service_error", st.ServiceErrors.Load())
	set(g.svc, "config_load_success", st.ConfigLoadSuccess.Load())
	set(g.svc, "config_load_error", st.ConfigLoadError.Load())
	set(g.svc, "global_shadow_mode", st.GlobalShadowMode.Load())
	set(g.server, "ShouldRateLimit.total_requests", st.TotalRequests.Load())
}

// dogSink sends the store's stats in DogStatsD's format: the tags that
// gostats serializes into a name (name.__key=value) become tags, and the
// first of the mogrifiers that matches renames the stat and adds its tags.
type dogSink struct {
	c          *statsd.Client
	mogrifiers []mogrifier
}

var submatch = regexp.MustCompile(`\$\d+`)

// expand replaces $0, $1 … in p by m's submatches (kept when out of range).
func expand(p string, m []string) string {
	if !strings.Contains(p, "$") {
		return p
	}
	return submatch.ReplaceAllStringFunc(p, func(s string) string {
		if i, err := strconv.Atoi(s[1:]); err == nil && i < len(m) {
			return m[i]
		}
		return s
	})
}

func (d dogSink) mogrify(name string) (string, []string) {
	short, rest, ok := strings.Cut(name, ".__")
	var tags []string
	if ok {
		for _, kv := range strings.Split(rest, ".__") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				tags = append(tags, k+":"+v)
			}
		}
	}
	for _, mg := range d.mogrifiers {
		m := mg.re.FindStringSubmatch(short)
		if m == nil {
			continue
		}
		short = expand(mg.name, m)
		for _, t := range mg.tags {
			tags = append(tags, t[0]+":"+expand(t[1], m))
		}
		break
	}
	return short, tags
}

func (d dogSink) FlushCounter(name string, v uint64) {
	n, tags := d.mogrify(name)
	_ = d.c.Count(n, int64(v), tags, 1)
}

func (d dogSink) FlushGauge(name string, v uint64) {
	n, tags := d.mogrify(name)
	_ = d.c.Gauge(n, float64(v), tags, 1)
}

func (d dogSink) FlushTimer(name string, ms float64) {
	n, tags := d.mogrify(name)
	_ = d.c.Timing(n, time.Duration(ms*float64(time.Millisecond)), tags, 1)
}

func (d dogSink) Flush() { _ = d.c.Flush() }

// sinkLog logs the statsd sink's errors: the first, then at most one a
// minute (a statsd that is down would otherwise log every retry).
type sinkLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	last time.Time
}

func (l *sinkLog) Errorf(msg string, args ...any) { l.logf(msg, args...) }
func (l *sinkLog) Warnf(msg string, args ...any)  { l.logf(msg, args...) }

func (l *sinkLog) logf(msg string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.last) >= time.Minute {
		l.last = now
		l.log.Warn("rls: statsd: " + fmt.Sprintf(msg, args...))
	}
}

// logrusLevels are the level names of the reference's logger.
var logrusLevels = map[slog.Level]string{
	slog.LevelDebug: "debug", slog.LevelInfo: "info", slog.LevelWarn: "warning", slog.LevelError: "error",
}

// logAttrs renames a record's fields as the reference's logger has them:
// in JSON @timestamp (RFC 3339, nanoseconds) and @message; level as
// debug, info, warning, error in both formats.
func logAttrs(json bool) func(groups []string, a slog.Attr) slog.Attr {
	return func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) > 0 {
			return a
		}
		switch a.Key {
		case slog.LevelKey:
			if l, ok := a.Value.Any().(slog.Level); ok {
				if n, ok := logrusLevels[l]; ok {
					return slog.String(slog.LevelKey, n)
				}
			}
		case slog.TimeKey:
			if json {
				return slog.String("@timestamp", a.Value.Time().Format(time.RFC3339Nano))
			}
		case slog.MessageKey:
			if json {
				return slog.String("@message", a.Value.String())
			}
		}
		return a
	}
}

// redisErrors is a go-redis hook that logs the first Redis error of each
// kind (WRONGPASS, READONLY, a refused or reset connection, a timeout, a
// TLS failure …) with its cause, once, and keeps the last one for the
// breaker's log lines.
type redisErrors struct {
	log   *slog.Logger
	mu    sync.Mutex
	kinds map[string]bool
	last  atomic.Pointer[error]
}

func newRedisErrors(log *slog.Logger) *redisErrors {
	return &redisErrors{log: log, kinds: map[string]bool{}}
}

// kindOf names an error's kind: a Redis error reply by its first word, a
// network error by its cause.
func kindOf(err error) string {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		w, _, _ := strings.Cut(rerr.Error(), " ")
		return w
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case strings.Contains(err.Error(), "tls:") || strings.Contains(err.Error(), "x509:"):
		return "tls"
	}
	return fmt.Sprintf("%T", errors.Unwrap(err))
}

func (h *redisErrors) note(cmd string, err error) {
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.Is(err, fallback.ErrOpen), errors.Is(err, context.Canceled):
		return
	case cmd == "evalsha" && redis.HasErrorPrefix(err, "NOSCRIPT"):
		return // the script is sent again at once
	}
	h.last.Store(&err)
	k := kindOf(err)
	h.mu.Lock()
	first := !h.kinds[k] && len(h.kinds) < 64
	if first {
		h.kinds[k] = true
	}
	h.mu.Unlock()
	if first {
		h.log.Error("rls: redis error (the first of this kind; later ones are counted in redis_error, not logged)", "kind", k, "err", err)
	}
}

// lastErr is the latest error noted ("" before any).
func (h *redisErrors) lastErr() string {
	if p := h.last.Load(); p != nil {
		return (*p).Error()
	}
	return ""
}

func (h *redisErrors) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		h.note("dial", err)
		return c, err
	}
}

func (h *redisErrors) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			h.note(cmd.Name(), err)
		}
		return err
	}
}

func (h *redisErrors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if err := c.Err(); err != nil {
				h.note(c.Name(), err)
			}
		}
		return err
	}
}

// breakerLog logs the breaker's transitions on Redis with the last error.
func breakerLog(log *slog.Logger, errs *redisErrors) func(name string, from, to fallback.State) {
	return func(name string, from, to fallback.State) {
		switch to {
		case fallback.Open:
			log.Warn("rls: redis breaker open: calls are decided by the local share until Redis answers again",
				"redis", name, "from", from.String(), "cause", errs.lastErr())
		case fallback.Closed:
			log.Warn("rls: redis breaker closed: Redis decides again", "redis", name, "from", from.String())
		default:
			log.Info("rls: redis breaker "+to.String(), "redis", name, "from", from.String())
		}
	}
}

// debugMux is the debug listener's: /rlconfig (the loaded config, as the
// reference prints it), /stats (every counter under its statsd name, and
// the expvars), /debug/pprof/, and an index at /.
func (srv *server) debugMux() *http.ServeMux {
	m := http.NewServeMux()
	help := map[string]string{
		"/rlconfig":            "print out the currently loaded configuration for debugging",
		"/stats":               "print out stats",
		"/debug/pprof/":        "root of various pprof endpoints. hit for help.",
		"/debug/pprof/profile": "CPU profiling endpoint",
		"/debug/pprof/trace":   "trace endpoint",
	}
	m.HandleFunc("/rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		if c := srv.Service.config(); c != nil {
			_, _ = io.WriteString(w, c.dump())
		}
	})
	m.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		srv.Service.stats.writeStatsd(w)
		expvar.Do(func(kv expvar.KeyValue) { _, _ = fmt.Fprintf(w, "%s: %s\n", kv.Key, kv.Value) })
	})
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	m.HandleFunc("/debug/pprof/profile", pprof.Profile)
	m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	m.HandleFunc("/debug/pprof/trace", pprof.Trace)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		paths := make([]string, 0, len(help))
		for p := range help {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			_, _ = fmt.Fprintf(w, "%s: %s\n", p, help[p])
		}
	})
	return m
}

// dump is the config as the reference's /rlconfig prints it: a line per
// limit, "KEY: unit=MINUTE requests_per_unit=10, shadow_mode: false,
// quota_mode: false".
func (c *Config) dump() string {
	var b strings.Builder
	for _, r := range c.rules {
		if r.Unlimited || len(r.Limits) == 0 {
			fmt.Fprintf(&b, "%s: unit=UNKNOWN requests_per_unit=0, shadow_mode: %t, quota_mode: false\n", r.FullKey, r.Shadow)
			continue
		}
		for _, l := range r.Limits {
			fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: false\n",
				r.FullKey, l.Unit.String(), l.RequestsPerUnit, r.Shadow)
		}
	}
	return b.String()
}

// writeStatsd writes every counter as "name: value" under the reference's
// statsd names.
func (s *svcStats) writeStatsd(w io.Writer) {
	var lines []string
	add := func(name string, v uint64) { lines = append(lines, name+": "+strconv.FormatUint(v, 10)) }
	s.mu.RLock()
	for _, c := range s.keys {
		for _, f := range c.fields() {
			add("ratelimit.service.rate_limit."+c.key+"."+f.name, f.v.Load())
		}
	}
	s.mu.RUnlock()
	s.notFound.Range(func(k, v any) bool {
		add("ratelimit.service.rate_limit."+sanitize(k.(string))+".domain_not_found", v.(*atomic.Uint64).Load())
		return true
	})
	add("ratelimit.service.call.should_rate_limit.redis_error", s.RedisErrors.Load())
	add("ratelimit.service.call.should_rate_limit.service_error", s.ServiceErrors.Load())
	add("ratelimit.service.config_load_success", s.ConfigLoadSuccess.Load())
	add("ratelimit.service.config_load_error", s.ConfigLoadError.Load())
	add("ratelimit.service.global_shadow_mode", s.GlobalShadowMode.Load())
	add("ratelimit_server.ShouldRateLimit.total_requests", s.TotalRequests.Load())
	sort.Strings(lines)
	_, _ = io.WriteString(w, strings.Join(lines, "\n")+"\n")
}

// healthServer is the gRPC health service: grpc's, with Watch streams
// that end (UNAVAILABLE) when the shutdown drains, so that they do not
// hold it; they have seen NOT_SERVING by then.
type healthServer struct {
	*health.Server
	stop <-chan struct{}
}

type watchStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }

func (h healthServer) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := h.Server.Watch(req, healthWatch{watchStream{stream, ctx}, stream})
	select {
	case <-h.stop:
		return status.Error(codes.Unavailable, "the server is shutting down")
	default:
		return err
	}
}

// healthWatch is a Health_WatchServer whose context ends with the
// shutdown.
type healthWatch struct {
	watchStream
	inner healthpb.Health_WatchServer
}

func (w healthWatch) Send(m *healthpb.HealthCheckResponse) error { return w.inner.Send(m) }
