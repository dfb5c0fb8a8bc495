package rls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	gostats "github.com/lyft/gostats"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/fallbackview"
	"github.com/spillway-go/spillway/ratelimit"
)

// HealthService is the name the gRPC health service reports, as the
// reference does (the empty name reports the same).
const HealthService = "ratelimit"

// Logger returns the logger LOG_LEVEL and LOG_FORMAT ask for, writing to w.
func newLogger(s Settings, w io.Writer) *slog.Logger {
	var level slog.Level
	switch strings.ToLower(s.LogLevel) {
	case "debug", "trace":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error", "fatal", "panic":
		level = slog.LevelError
	default:
		level = slog.LevelWarn
	}
	json := strings.EqualFold(s.LogFormat, "json")
	o := &slog.HandlerOptions{Level: level, ReplaceAttr: logAttrs(json)}
	if json {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

// newRedisClient builds the go-redis client REDIS_TYPE, REDIS_URL,
// REDIS_SOCKET_TYPE, REDIS_AUTH, REDIS_SENTINEL_AUTH, REDIS_POOL_SIZE and
// REDIS_TLS* describe, tuned so that a call's budget holds
// (fallback.TuneOptions).
func newRedisClient(s Settings) (redis.UniversalClient, error) {
	user, pass := "", s.RedisAuth
	if u, p, ok := strings.Cut(s.RedisAuth, ":"); ok {
		user, pass = u, p
	}
	urls := strings.Split(s.RedisURL, ",")
	rediss := strings.HasPrefix(s.RedisURL, "rediss://")
	tc, err := redisTLS(s, rediss)
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(s.RedisType) {
	case "single":
		var o *redis.Options
		if rediss || strings.HasPrefix(s.RedisURL, "redis://") || strings.HasPrefix(s.RedisURL, "unix://") {
			var err error
			if o, err = redis.ParseURL(s.RedisURL); err != nil {
				return nil, fmt.Errorf("rls: REDIS_URL: %w", err)
			}
		} else {
			o = &redis.Options{Network: strings.ToLower(s.RedisSocketType), Addr: s.RedisURL}
		}
		if s.RedisAuth != "" {
			o.Username, o.Password = user, pass
		}
		o.PoolSize = s.RedisPoolSize
		fallback.TuneOptions(o)
		if tc != nil {
			if o.TLSConfig != nil && o.TLSConfig.ServerName != "" { // rediss://host: its name
				tc.ServerName = o.TLSConfig.ServerName
			}
			o.TLSConfig, o.Dialer = nil, tlsDialer(tc, o.DialTimeout)
		}
		return redis.NewClient(o), nil
	case "cluster":
		o := &redis.UniversalOptions{Addrs: urls, Username: user, Password: pass, PoolSize: s.RedisPoolSize, IsClusterMode: true}
		fallback.TuneOptions(o)
		if tc != nil {
			o.Dialer = tlsDialer(tc, o.DialTimeout)
		}
		return redis.NewUniversalClient(o), nil
	case "sentinel":
		if len(urls) < 2 {
			return nil, errors.New("rls: REDIS_URL: expected master name and a list of urls for the sentinels, in the format: <redis master name>,<sentinel1>,...,<sentineln>")
		}
		o := &redis.FailoverOptions{MasterName: urls[0], SentinelAddrs: urls[1:], Username: user, Password: pass,
			SentinelPassword: s.RedisSentinelAuth, PoolSize: s.RedisPoolSize}
		fallback.TuneOptions(o)
		if tc != nil {
			o.Dialer = tlsDialer(tc, o.DialTimeout)
		}
		return redis.NewFailoverClient(o), nil
	}
	return nil, fmt.Errorf("rls: REDIS_TYPE: %q is not single, cluster or sentinel", s.RedisType)
}

// newStore wraps a Redis client in the store the service decides with: a
// RedisStore (one script call per request, coalesced under load) behind a
// fallback.Store (SPILLWAY_BUDGET per call, one breaker for this Redis,
// then the local share SPILLWAY_LOCAL_SHARE of every limit).
func newStore(client redis.UniversalClient, s Settings) (*fallback.Store, error) {
	prefix := "spillway:"
	if s.CacheKeyPrefix != "" {
		prefix = s.CacheKeyPrefix
	}
	h, _ := fallbackview.HealthOf(client).(*fallback.Health)
	if h == nil {
		var err error
		if h, err = fallback.NewHealth(client, fallback.HealthSettings{Name: "redis"}); err != nil {
			return nil, err
		}
	}
	fs := fallback.Settings{Name: "rls", Budget: s.Budget, Health: h, Share: s.LocalShare, DenyCacheSize: -1}
	if s.FailClosed {
		fs.Fail = spillway.FailClosed
	}
	if s.LocalCacheSizeInBytes > 0 {
		// the reference keeps over-limit keys in a local cache of this many
		// bytes; the deny cache keeps whole denials, about 100 bytes each
		fs.DenyCacheSize = max(s.LocalCacheSizeInBytes/100, 1)
	}
	rs, err := ratelimit.NewRedisStore(client, ratelimit.RedisSettings{Prefix: prefix, Coalescing: coalescing(s.Coalesce)})
	if err != nil {
		return nil, err
	}
	var inner ratelimit.Store = rs
	if s.ReferenceKeys {
		inner = &refStore{next: inner, client: client, prefix: s.CacheKeyPrefix, now: time.Now}
	}
	if fs.DenyCacheSize > 0 {
		inner = seenStore{inner.(boundedStore)}
	}
	return fallback.NewStore(inner, fs)
}

// server is the whole service: gRPC (RateLimitService, health,
// reflection), HTTP (/healthcheck, /json) and the Prometheus endpoint.
type server struct {
	Settings Settings
	Service  *Service
	reloader *reloader
	Log      *slog.Logger

	health   *health.Server
	healthy  atomic.Bool // what /healthcheck answers
	stopping atomic.Bool // the shutdown began: health stays NOT_SERVING
	stopped  chan struct{}
	statsd   gostats.Store // nil: no statsd
	xds      *xdsClient    // CONFIG_TYPE=GRPC_XDS_SOTW: the config's source instead of the directory
	grpc     *grpc.Server
	grpcLis  net.Listener
	httpSrvs []*http.Server
	httpLis  []net.Listener
}

// newServer builds a server deciding with store. It loads the config
// directory once: a config that does not load is an error unless
// FORCE_START_WITHOUT_INITIAL_CONFIG is set.
func newServer(s Settings, store ratelimit.Store, log *slog.Logger) (*server, error) {
	stats := newStats()
	if fs, ok := store.(*fallback.Store); ok {
		h := fallbackview.StoreHealth(fs).(*fallback.Health)
		stats.health = func() (string, int64, int64) {
			st := h.Stats()
			return h.State().String(), st.Opened, st.Failures
		}
		stats.shards = func() map[string]bool {
			var m map[string]bool
			for _, sh := range h.Stats().Shards {
				if m == nil {
					m = map[string]bool{}
				}
				m[sh.Name] = sh.State != fallback.Closed
			}
			return m
		}
		stats.local = func() (int64, int64) {
			degraded, overloaded := fallbackview.StoreDegraded(fs)
			return overloaded, degraded - overloaded
		}
	}
	stats.millis = s.ResponseTimeMillis
	if log == nil {
		log = slog.Default()
	}
	sd, err := newStatsd(s, stats, log)
	if err != nil {
		return nil, err
	}
	svc := newService(store, s, stats, log)
	svc.seen = s.LocalCacheSizeInBytes > 0
	srv := &server{Settings: s, Service: svc, Log: log, health: health.NewServer(), stopped: make(chan struct{}), statsd: sd}
	srv.reloader = newReloader(svc, s.ConfigDir(), s.RuntimeIgnoreDotFiles, LoadOptions{MergeDomains: s.MergeDomains}, log)
	srv.reloader.onLoad = func(c *Config, err error) {
		if err == nil && s.HealthyWithConfig {
			srv.setHealth(len(c.domains) > 0)
		}
	}
	srv.setHealth(!s.HealthyWithConfig)
	if s.ConfigType == "GRPC_XDS_SOTW" {
		// the config comes from the management server, once serving
		if _, err := xdsDialOptions(s); err != nil {
			return nil, err
		}
		srv.xds = &xdsClient{set: s, svc: svc, log: log, opts: LoadOptions{MergeDomains: s.MergeDomains}, onLoad: srv.reloader.onLoad}
		return srv, nil
	}
	if err := srv.reloader.Load(); err != nil && !s.ForceStart {
		return nil, err
	}
	return srv, nil
}

func (srv *server) setHealth(ok bool) {
	ok = ok && !srv.stopping.Load() // a config loaded while draining does not turn it back
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	srv.healthy.Store(ok)
	srv.health.SetServingStatus(HealthService, st)
	srv.health.SetServingStatus("", st)
}

// Listen opens the listeners (so that a caller knows the ports before
// Serve).
func (srv *server) listen() error {
	s := srv.Settings
	var err error
	if s.GrpcUDS != "" {
		srv.grpcLis, err = net.Listen("unix", s.GrpcUDS)
	} else {
		srv.grpcLis, err = net.Listen("tcp", net.JoinHostPort(s.GrpcHost, strconv.Itoa(s.GrpcPort)))
	}
	if err != nil {
		return fmt.Errorf("rls: gRPC listener: %w", err)
	}
	opts := serverOptions(s)
	creds, err := grpcCreds(s, srv.Log)
	if err != nil {
		srv.grpcLis.Close()
		return err
	}
	if creds != nil {
		opts = append(opts, creds)
	}
	srv.grpc = grpc.NewServer(opts...)
	pb.RegisterRateLimitServiceServer(srv.grpc, srv.Service)
	healthpb.RegisterHealthServer(srv.grpc, healthServer{srv.health, srv.stopped})
	reflection.Register(srv.grpc)

	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if srv.healthy.Load() {
			_, _ = w.Write([]byte("OK"))
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
	})
	mux.HandleFunc("/json", srv.serveJSON)
	if err := srv.listenHTTP(net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), mux); err != nil {
		return err
	}
	if s.DebugPort != 0 {
		if err := srv.listenHTTP(net.JoinHostPort(s.DebugHost, strconv.Itoa(s.DebugPort)), srv.debugMux()); err != nil {
			return err
		}
	}
	if s.UsePrometheus && !s.DisableStats {
		pm := http.NewServeMux()
		pm.Handle(s.PrometheusPath, srv.Service.stats.Handler())
		if err := srv.listenHTTP(s.PrometheusAddr, pm); err != nil {
			return err
		}
	}
	return nil
}

func (srv *server) listenHTTP(addr string, h http.Handler) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("rls: HTTP listener %s: %w", addr, err)
	}
	srv.httpLis = append(srv.httpLis, l)
	srv.httpSrvs = append(srv.httpSrvs, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second})
	return nil
}

// serverOptions are the gRPC server's options: GRPC_MAX_CONNECTION_AGE and
// its grace, and a pool of worker goroutines, one per call the door lets
// in (SPILLWAY_MAX_IN_FLIGHT, 256 when it is off, at most 1024). gRPC
// runs a call on a new goroutine when every worker is busy, and a short
// call like this one then pays for a new goroutine's stack growth (with a
// worker per CPU, most calls did: rlsbench -profile shows it as
// runtime.copystack).
func serverOptions(s Settings) []grpc.ServerOption {
	workers := s.MaxInFlight
	if workers <= 0 {
		workers = 256
	}
	workers = min(workers, 1024)
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge: s.GrpcMaxConnectionAge, MaxConnectionAgeGrace: s.GrpcMaxConnectionAgeGrace}),
		grpc.NumStreamWorkers(uint32(workers)),
	}
}

// GRPCAddr is the gRPC listener's address (after Listen).
func (srv *server) gRPCAddr() net.Addr { return srv.grpcLis.Addr() }

// serveJSON is the reference's /json endpoint: a RateLimitRequest in
// protojson, the response in protojson; 429 when over the limit.
func (srv *server) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	resp, err := srv.Service.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

// Serve serves until ctx ends, then shuts down within drain in all:
// health turns NOT_SERVING at once (Check, Watch and /healthcheck say so)
// while calls are still answered, for a fifth of drain (at most 5s) so
// that probers see it; then health Watch streams end, the listeners
// close and calls in flight finish; whatever is left at drain is cut.
func (srv *server) serve(ctx context.Context, drain time.Duration) error {
	errc := make(chan error, 1+len(srv.httpSrvs))
	go func() { errc <- srv.grpc.Serve(srv.grpcLis) }()
	for i, h := range srv.httpSrvs {
		go func() {
			if err := h.Serve(srv.httpLis[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if srv.xds != nil {
		go srv.xds.run(rctx)
	} else {
		go srv.reloader.Run(rctx, srv.Settings.ReloadInterval)
	}
	var statsDone chan struct{}
	if srv.statsd != nil {
		statsDone = make(chan struct{})
		go func() {
			defer close(statsDone)
			t := time.NewTicker(srv.Settings.StatsFlushInterval)
			defer t.Stop()
			srv.statsd.StartContext(rctx, t) // flushes once more when rctx ends
		}()
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	start := time.Now()
	srv.stopping.Store(true)
	srv.setHealth(false)
	delay := min(drain/5, 5*time.Second)
	srv.Log.Warn("rls: shutting down: health is NOT_SERVING; calls are answered until the listeners close",
		"listeners_close_in", delay, "drain", drain)
	if err == nil {
		time.Sleep(delay)
	}
	close(srv.stopped) // ends health Watch streams
	dctx, dcancel := context.WithDeadline(context.Background(), start.Add(drain))
	defer dcancel()
	var wg sync.WaitGroup
	wg.Add(1 + len(srv.httpSrvs))
	go func() {
		defer wg.Done()
		done := make(chan struct{})
		go func() { srv.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-dctx.Done():
			srv.grpc.Stop()
		}
	}()
	for _, h := range srv.httpSrvs {
		go func() {
			defer wg.Done()
			if h.Shutdown(dctx) != nil {
				_ = h.Close()
			}
		}()
	}
	wg.Wait()
	cancel()
	if statsDone != nil {
		<-statsDone
	}
	srv.Log.Warn("rls: stopped", "took", time.Since(start).Round(time.Millisecond))
	return err
}

// Run is the binary: it reports the unsupported variables that are set,
// builds the Redis client, the store and the server, and serves until ctx
// ends (SIGTERM), shutting down within SPILLWAY_DRAIN.
func Run(ctx context.Context, s Settings, notices []string) error {
	log := newLogger(s, os.Stderr)
	for _, n := range notices {
		log.Warn("rls: " + n)
	}
	// go-redis's own lines in the same format, one per pattern per 10s
	fallback.SetRedisLogger(log, 0)
	client, err := newRedisClient(s)
	if err != nil {
		return err
	}
	defer client.Close()
	// one breaker per Redis (per node on a Cluster): its changes are logged
	// with the node that failed and when it came back
	errs := newRedisErrors(log)
	client.AddHook(errs)
	if _, err := fallback.NewHealth(client, fallback.HealthSettings{Name: "redis", OnStateChange: breakerLog(log, errs)}); err != nil {
		return err
	}
	store, err := newStore(client, s)
	if err != nil {
		return err
	}
	srv, err := newServer(s, store, log)
	if err != nil {
		return err
	}
	if err := srv.listen(); err != nil {
		return err
	}
	log.Warn("rls: serving", "grpc", srv.gRPCAddr().String(), "http", net.JoinHostPort(s.Host, strconv.Itoa(s.Port)),
		"config", s.ConfigDir(), "redis", s.RedisType)
	return srv.serve(ctx, s.Drain)
}

// coalescing is SPILLWAY_COALESCE as ratelimit.RedisSettings.Coalescing:
// 0 (or less) turns coalescing off.
func coalescing(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}
