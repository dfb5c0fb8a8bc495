package rls

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Settings is the server's configuration, read from the reference
// server's environment variables (Env) plus a few SPILLWAY_* ones. The zero
// value is not useful; use Env or DefaultSettings.
type Settings struct {
	Host, GrpcHost string // HOST, GRPC_HOST
	Port, GrpcPort int    // PORT (HTTP: /healthcheck, /json), GRPC_PORT
	GrpcUDS        string // GRPC_UDS: a unix socket instead of GRPC_HOST:GRPC_PORT
	DebugHost      string // DEBUG_HOST
	DebugPort      int    // DEBUG_PORT: /debug/pprof/ when set (0: no debug listener)

	GrpcMaxConnectionAge, GrpcMaxConnectionAgeGrace time.Duration

	LogLevel, LogFormat string // LOG_LEVEL (debug, info, warn, error), LOG_FORMAT (text, json)

	RuntimeRoot, RuntimeSubdirectory, RuntimeAppDirectory string
	RuntimeWatchRoot, RuntimeIgnoreDotFiles               bool
	ForceStart                                            bool // FORCE_START_WITHOUT_INITIAL_CONFIG
	MergeDomains                                          bool // MERGE_DOMAIN_CONFIG
	HealthyWithConfig                                     bool // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED

	RedisSocketType, RedisType, RedisURL string
	RedisAuth, RedisSentinelAuth         string
	RedisPoolSize                        int

	CacheKeyPrefix        string
	NearLimitRatio        float32
	LocalCacheSizeInBytes int
	GlobalShadowMode      bool // SHADOW_MODE

	HeadersEnabled                            bool // LIMIT_RESPONSE_HEADERS_ENABLED
	HeaderLimit, HeaderRemaining, HeaderReset string
	UsePrometheus                             bool
	PrometheusAddr, PrometheusPath            string

	// spillway's own
	Budget         time.Duration // SPILLWAY_BUDGET: the most a call waits on Redis (default 50ms)
	LocalShare     float64       // SPILLWAY_LOCAL_SHARE: the share of each limit enforced locally while Redis is down (0.2)
	FailClosed     bool          // SPILLWAY_FAIL_MODE=closed: deny while Redis is down instead of the local share
	ReloadInterval time.Duration // SPILLWAY_RELOAD_INTERVAL: how often the config directory is checked (1s)
	Coalesce       int           // SPILLWAY_COALESCE: Redis script calls in flight before further calls are coalesced (ratelimit.WithCoalescing)
	IETFHeaders    bool          // SPILLWAY_IETF_HEADERS: RateLimit and RateLimit-Policy for every descriptor (default true with LIMIT_RESPONSE_HEADERS_ENABLED)
	// SPILLWAY_LATE_ANSWER: what a call whose gRPC deadline has passed
	// before it is decided answers, at once, without deciding it: "error"
	// (default: DEADLINE_EXCEEDED, which Envoy reads through its
	// failure_mode_deny), "ok" (allowed) or "over_limit" (denied).
	LateAnswer string
}

// ConfigDir is where the config files are read: RUNTIME_ROOT,
// RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY joined.
func (s *Settings) ConfigDir() string {
	parts := []string{s.RuntimeRoot}
	if s.RuntimeSubdirectory != "" {
		parts = append(parts, s.RuntimeSubdirectory)
	}
	parts = append(parts, s.RuntimeAppDirectory)
	return strings.Join(parts, "/")
}

// variable is one environment variable: its default and how it is read.
type variable struct {
	name, def string
	set       func(s *Settings, v string) error
}

func str(f func(*Settings) *string) func(*Settings, string) error {
	return func(s *Settings, v string) error { *f(s) = v; return nil }
}

func integer(f func(*Settings) *int) func(*Settings, string) error {
	return func(s *Settings, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("expected an integer, got %q", v)
		}
		*f(s) = n
		return nil
	}
}

func boolean(f func(*Settings) *bool) func(*Settings, string) error {
	return func(s *Settings, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("expected true or false, got %q", v)
		}
		*f(s) = b
		return nil
	}
}

func duration(f func(*Settings) *time.Duration) func(*Settings, string) error {
	return func(s *Settings, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("expected a duration like 50ms, got %q", v)
		}
		*f(s) = d
		return nil
	}
}

// supported lists every variable this server reads, with the reference's
// defaults (the SPILLWAY_* ones are its own).
var supported = []variable{
	{"HOST", "0.0.0.0", str(func(s *Settings) *string { return &s.Host })},
	{"PORT", "8080", integer(func(s *Settings) *int { return &s.Port })},
	{"GRPC_HOST", "0.0.0.0", str(func(s *Settings) *string { return &s.GrpcHost })},
	{"GRPC_PORT", "8081", integer(func(s *Settings) *int { return &s.GrpcPort })},
	{"GRPC_UDS", "", str(func(s *Settings) *string { return &s.GrpcUDS })},
	{"DEBUG_HOST", "0.0.0.0", str(func(s *Settings) *string { return &s.DebugHost })},
	{"DEBUG_PORT", "", func(s *Settings, v string) error {
		if v == "" {
			return nil
		}
		return integer(func(s *Settings) *int { return &s.DebugPort })(s, v)
	}},
	{"GRPC_MAX_CONNECTION_AGE", "24h", duration(func(s *Settings) *time.Duration { return &s.GrpcMaxConnectionAge })},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1h", duration(func(s *Settings) *time.Duration { return &s.GrpcMaxConnectionAgeGrace })},
	{"LOG_LEVEL", "WARN", str(func(s *Settings) *string { return &s.LogLevel })},
	{"LOG_FORMAT", "text", str(func(s *Settings) *string { return &s.LogFormat })},
	{"RUNTIME_ROOT", "/srv/runtime_data/current", str(func(s *Settings) *string { return &s.RuntimeRoot })},
	{"RUNTIME_SUBDIRECTORY", "", str(func(s *Settings) *string { return &s.RuntimeSubdirectory })},
	{"RUNTIME_APPDIRECTORY", "config", str(func(s *Settings) *string { return &s.RuntimeAppDirectory })},
	{"RUNTIME_IGNOREDOTFILES", "false", boolean(func(s *Settings) *bool { return &s.RuntimeIgnoreDotFiles })},
	{"RUNTIME_WATCH_ROOT", "true", boolean(func(s *Settings) *bool { return &s.RuntimeWatchRoot })},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "false", boolean(func(s *Settings) *bool { return &s.ForceStart })},
	{"MERGE_DOMAIN_CONFIG", "false", boolean(func(s *Settings) *bool { return &s.MergeDomains })},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", boolean(func(s *Settings) *bool { return &s.HealthyWithConfig })},
	{"REDIS_SOCKET_TYPE", "unix", str(func(s *Settings) *string { return &s.RedisSocketType })},
	{"REDIS_TYPE", "SINGLE", str(func(s *Settings) *string { return &s.RedisType })},
	{"REDIS_URL", "/var/run/nutcracker/ratelimit.sock", str(func(s *Settings) *string { return &s.RedisURL })},
	{"REDIS_AUTH", "", str(func(s *Settings) *string { return &s.RedisAuth })},
	{"REDIS_SENTINEL_AUTH", "", str(func(s *Settings) *string { return &s.RedisSentinelAuth })},
	{"REDIS_POOL_SIZE", "10", integer(func(s *Settings) *int { return &s.RedisPoolSize })},
	{"CACHE_KEY_PREFIX", "", str(func(s *Settings) *string { return &s.CacheKeyPrefix })},
	{"NEAR_LIMIT_RATIO", "0.8", func(s *Settings, v string) error {
		f, err := strconv.ParseFloat(v, 32)
		if err != nil || f < 0 || f > 1 || math.IsNaN(f) {
			return fmt.Errorf("expected a ratio from 0 to 1, got %q", v)
		}
		s.NearLimitRatio = float32(f)
		return nil
	}},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", integer(func(s *Settings) *int { return &s.LocalCacheSizeInBytes })},
	{"SHADOW_MODE", "false", boolean(func(s *Settings) *bool { return &s.GlobalShadowMode })},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "false", boolean(func(s *Settings) *bool { return &s.HeadersEnabled })},
	{"LIMIT_LIMIT_HEADER", "RateLimit-Limit", str(func(s *Settings) *string { return &s.HeaderLimit })},
	{"LIMIT_REMAINING_HEADER", "RateLimit-Remaining", str(func(s *Settings) *string { return &s.HeaderRemaining })},
	{"LIMIT_RESET_HEADER", "RateLimit-Reset", str(func(s *Settings) *string { return &s.HeaderReset })},
	{"USE_PROMETHEUS", "false", boolean(func(s *Settings) *bool { return &s.UsePrometheus })},
	{"PROMETHEUS_ADDR", ":9090", str(func(s *Settings) *string { return &s.PrometheusAddr })},
	{"PROMETHEUS_PATH", "/metrics", str(func(s *Settings) *string { return &s.PrometheusPath })},
	{"SPILLWAY_BUDGET", "50ms", duration(func(s *Settings) *time.Duration { return &s.Budget })},
	{"SPILLWAY_LOCAL_SHARE", "0.2", func(s *Settings, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 1) {
			return fmt.Errorf("expected a share in (0, 1], got %q", v)
		}
		s.LocalShare = f
		return nil
	}},
	{"SPILLWAY_FAIL_MODE", "open", func(s *Settings, v string) error {
		switch strings.ToLower(v) {
		case "open":
			s.FailClosed = false
		case "closed":
			s.FailClosed = true
		default:
			return fmt.Errorf("expected open or closed, got %q", v)
		}
		return nil
	}},
	{"SPILLWAY_RELOAD_INTERVAL", "1s", duration(func(s *Settings) *time.Duration { return &s.ReloadInterval })},
	{"SPILLWAY_COALESCE", "1", integer(func(s *Settings) *int { return &s.Coalesce })},
	{"SPILLWAY_IETF_HEADERS", "true", boolean(func(s *Settings) *bool { return &s.IETFHeaders })},
	{"SPILLWAY_LATE_ANSWER", "error", func(s *Settings, v string) error {
		switch v = strings.ToLower(v); v {
		case "error", "ok", "over_limit":
			s.LateAnswer = v
			return nil
		}
		return fmt.Errorf("expected error, ok or over_limit, got %q", v)
	}},
	// Accepted as the reference has them, and what this server does anyway.
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", noop},
}

func noop(*Settings, string) error { return nil }

// unsupported lists the reference's variables this server does not
// implement, each with what it does instead. One that is set is reported
// at start, unless its value asks for what this server does anyway (ok).
var unsupported = []struct {
	name, why string
	ok        func(v string) bool
}{
	{"GRPC_SERVER_USE_TLS", "no TLS on the gRPC listener: terminate TLS in the mesh (sidecar)", isFalse},
	{"GRPC_SERVER_TLS_CERT", "no TLS on the gRPC listener", nil},
	{"GRPC_SERVER_TLS_KEY", "no TLS on the gRPC listener", nil},
	{"GRPC_CLIENT_TLS_CACERT", "no TLS on the gRPC listener", nil},
	{"GRPC_CLIENT_TLS_SAN", "no TLS on the gRPC listener", nil},
	{"CONFIG_TYPE", "only FILE configs (no xDS config server)", func(v string) bool { return strings.EqualFold(v, "FILE") }},
	{"CONFIG_GRPC_XDS_NODE_ID", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_SERVER_URL", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "no xDS config server", isFalse},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "no xDS config server", nil},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "no xDS config server", nil},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "no xDS config server", nil},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "no xDS config server", nil},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "no xDS config server", nil},
	{"XDS_CLIENT_BACKOFF_JITTER", "no xDS config server", nil},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "no xDS config server", nil},
	{"USE_STATSD", "no statsd sink: the same counters are on the Prometheus endpoint (USE_PROMETHEUS)", isFalse},
	{"STATSD_HOST", "no statsd sink", nil},
	{"STATSD_PORT", "no statsd sink", nil},
	{"USE_DOG_STATSD", "no statsd sink", isFalse},
	{"USE_DOG_STATSD_MOGRIFIERS", "no statsd sink", nil},
	{"EXTRA_TAGS", "no statsd tags", nil},
	{"STATS_FLUSH_INTERVAL", "counters are read at scrape time; nothing to flush", nil},
	{"DISABLE_STATS", "stats are always kept; leave USE_PROMETHEUS off to not serve them", isFalse},
	{"PROMETHEUS_MAPPER_YAML", "the metric names and labels are fixed (the reference's default mapping)", nil},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "no response time histogram", nil},
	{"EXPIRATION_JITTER_MAX_SECONDS", "every key expires exactly when its state is back to full; no jitter needed", nil},
	{"BACKEND_TYPE", "only Redis", func(v string) bool { return strings.EqualFold(v, "redis") }},
	{"REDIS_TLS", "no TLS to Redis", isFalse},
	{"REDIS_TLS_CLIENT_CERT", "no TLS to Redis", nil},
	{"REDIS_TLS_CLIENT_KEY", "no TLS to Redis", nil},
	{"REDIS_TLS_CACERT", "no TLS to Redis", nil},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "no TLS to Redis", nil},
	{"REDIS_PIPELINE_WINDOW", "calls in flight are coalesced into one script call without a timer; no window to set", nil},
	{"REDIS_PIPELINE_LIMIT", "calls are coalesced without a limit to set", nil},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "a request's slots are decided in parallel", nil},
	{"REDIS_PERSECOND", "no second Redis for per-second limits", isFalse},
	{"REDIS_PERSECOND_SOCKET_TYPE", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_TYPE", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_URL", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_POOL_SIZE", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_AUTH", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_TLS", "no second Redis for per-second limits", isFalse},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_TIMEOUT", "no second Redis for per-second limits", nil},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "no second Redis for per-second limits", nil},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "health stays SERVING while Redis is down: calls are answered by the local share", isFalse},
	{"REDIS_TIMEOUT", "a call waits on Redis at most SPILLWAY_BUDGET (default 50ms), then the breaker's local share answers", nil},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "a call waits for a pooled connection within SPILLWAY_BUDGET", func(v string) bool { return strings.EqualFold(v, "WAIT") }},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "the server starts without Redis and answers from the local share until it is reachable", nil},
	{"REDIS_STARTUP_MAX_INTERVAL", "the server starts without Redis", nil},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "the server starts without Redis", nil},
	{"MEMCACHE_HOST_PORT", "only Redis", nil},
	{"MEMCACHE_MAX_IDLE_CONNS", "only Redis", nil},
	{"MEMCACHE_SRV", "only Redis", nil},
	{"MEMCACHE_SRV_REFRESH", "only Redis", nil},
	{"MEMCACHE_TLS", "only Redis", isFalse},
	{"MEMCACHE_TLS_CLIENT_CERT", "only Redis", nil},
	{"MEMCACHE_TLS_CLIENT_KEY", "only Redis", nil},
	{"MEMCACHE_TLS_CACERT", "only Redis", nil},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "only Redis", nil},
	{"QUOTA_MODE", "no quota mode", isFalse},
	{"RESPONSE_DYNAMIC_METADATA", "no dynamic metadata in answers", isFalse},
	{"TRACING_ENABLED", "no OpenTelemetry tracing export", isFalse},
	{"TRACING_SERVICE_NAME", "no tracing export", nil},
	{"TRACING_SERVICE_NAMESPACE", "no tracing export", nil},
	{"TRACING_SERVICE_INSTANCE_ID", "no tracing export", nil},
	{"TRACING_EXPORTER_PROTOCOL", "no tracing export", nil},
	{"TRACING_SAMPLING_RATE", "no tracing export", nil},
}

func isFalse(v string) bool { b, err := strconv.ParseBool(v); return err == nil && !b }

// Env reads the settings from environment variables through lookup
// (os.LookupEnv). It returns the settings, one notice per unsupported
// variable that is set (to be reported at start), and an error naming the
// first variable with a bad value.
func Env(lookup func(string) (string, bool)) (Settings, []string, error) {
	var s Settings
	for _, v := range supported {
		val, ok := lookup(v.name)
		if !ok {
			val = v.def
		}
		if err := v.set(&s, val); err != nil {
			return s, nil, fmt.Errorf("rls: %s: %w", v.name, err)
		}
	}
	var notices []string
	for _, u := range unsupported {
		if val, ok := lookup(u.name); ok && (u.ok == nil || !u.ok(val)) {
			notices = append(notices, fmt.Sprintf("%s is set but not supported: %s", u.name, u.why))
		}
	}
	if v, ok := lookup("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"); ok && isFalse(v) {
		notices = append(notices, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false is not supported: a denied request never charges any limit (all descriptors of a request are decided together)")
	}
	sort.Strings(notices)
	return s, notices, s.validate()
}

// DefaultSettings returns the settings with every variable unset.
func DefaultSettings() Settings {
	s, _, _ := Env(func(string) (string, bool) { return "", false })
	return s
}

func (s *Settings) validate() error {
	switch strings.ToLower(s.RedisType) {
	case "single", "cluster", "sentinel":
	default:
		return fmt.Errorf("rls: REDIS_TYPE: %q is not single, cluster or sentinel", s.RedisType)
	}
	switch strings.ToLower(s.RedisSocketType) {
	case "tcp", "unix":
	default:
		return fmt.Errorf("rls: REDIS_SOCKET_TYPE: %q is not tcp or unix", s.RedisSocketType)
	}
	if strings.ContainsAny(s.CacheKeyPrefix, "{}") {
		return fmt.Errorf("rls: CACHE_KEY_PREFIX: %q must not contain '{' or '}' (they choose Redis Cluster slots)", s.CacheKeyPrefix)
	}
	if s.RedisPoolSize < 0 {
		return fmt.Errorf("rls: REDIS_POOL_SIZE: %d must not be negative", s.RedisPoolSize)
	}
	if s.LocalCacheSizeInBytes < 0 {
		return fmt.Errorf("rls: LOCAL_CACHE_SIZE_IN_BYTES: %d must not be negative", s.LocalCacheSizeInBytes)
	}
	if s.ReloadInterval <= 0 {
		return fmt.Errorf("rls: SPILLWAY_RELOAD_INTERVAL: must be positive")
	}
	if s.Budget <= 0 {
		return fmt.Errorf("rls: SPILLWAY_BUDGET: must be positive")
	}
	switch strings.ToLower(s.LogFormat) {
	case "text", "json":
	default:
		return fmt.Errorf("rls: LOG_FORMAT: %q is not text or json", s.LogFormat)
	}
	return nil
}
