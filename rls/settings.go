package rls

import (
	"fmt"
	"math"
	"regexp"
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
	DebugPort      int    // DEBUG_PORT (6070): /rlconfig, /stats, /debug/pprof/ (0: no debug listener)

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
	Coalesce       int           // SPILLWAY_COALESCE: Redis script calls in flight before further calls are coalesced (ratelimit.RedisSettings.Coalescing; 0: off)
	IETFHeaders    bool          // SPILLWAY_IETF_HEADERS: RateLimit and RateLimit-Policy for every descriptor (default true with LIMIT_RESPONSE_HEADERS_ENABLED)

	// Operations: stats sinks (USE_DOG_STATSD_MOGRIFIERS too), shutdown.
	UseStatsd          bool              // USE_STATSD (default true): the reference's stats to STATSD_HOST:STATSD_PORT
	UseDogStatsd       bool              // USE_DOG_STATSD: the same stats in DogStatsD's format, EXTRA_TAGS as its tags
	StatsdHost         string            // STATSD_HOST (localhost)
	StatsdPort         int               // STATSD_PORT (8125)
	StatsdProtocol     string            // STATSD_PROTOCOL: tcp, udp, or unset: tcp, udp when tcp is refused at start
	ExtraTags          map[string]string // EXTRA_TAGS: k1:v1,k2:v2 on every statsd stat
	StatsFlushInterval time.Duration     // STATS_FLUSH_INTERVAL (10s)
	DisableStats       bool              // DISABLE_STATS: no statsd, no Prometheus endpoint
	ResponseTimeMillis bool              // PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS
	Drain              time.Duration     // SPILLWAY_DRAIN (25s): the most a shutdown takes, NOT_SERVING first
	mogrifiers         []mogrifier       // USE_DOG_STATSD_MOGRIFIERS and their DOG_STATSD_MOGRIFIER_* variables

	// Transport: TLS to Redis and on the gRPC listener (tls.go), the
	// reference's variables.
	RedisTLS                              bool   // REDIS_TLS (or a rediss:// REDIS_URL)
	RedisTLSClientCert, RedisTLSClientKey string // REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY: files
	RedisTLSCACert                        string // REDIS_TLS_CACERT: a file of roots, beside the system's
	RedisTLSSkipHostnameVerification      bool   // REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: verify the chain, not the name
	GrpcServerUseTLS                      bool   // GRPC_SERVER_USE_TLS
	GrpcServerTLSCert, GrpcServerTLSKey   string // GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY: files, read again when they change
	GrpcClientTLSCACert                   string // GRPC_CLIENT_TLS_CACERT: require client certificates signed by these (mTLS)
	GrpcClientTLSSAN                      string // GRPC_CLIENT_TLS_SAN: the name a client certificate must carry

	// xDS config (xds.go): CONFIG_TYPE=GRPC_XDS_SOTW and the reference's
	// CONFIG_GRPC_XDS_* and XDS_CLIENT_* settings.
	ConfigType                               string            // CONFIG_TYPE: FILE or GRPC_XDS_SOTW
	XdsNodeID, XdsNodeMetadata, XdsServerURL string            // CONFIG_GRPC_XDS_NODE_ID, _NODE_METADATA (k=v,…), _SERVER_URL
	XdsConnectRetryInterval                  time.Duration     // CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
	XdsHeaders                               map[string]string // CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS (k:v,…)
	XdsServerUseTLS                          bool              // CONFIG_GRPC_XDS_SERVER_USE_TLS
	XdsClientTLSCert, XdsClientTLSKey        string            // CONFIG_GRPC_XDS_CLIENT_TLS_CERT, _KEY
	XdsServerTLSCACert, XdsServerTLSSAN      string            // CONFIG_GRPC_XDS_SERVER_TLS_CACERT, _SAN
	XdsBackoffInitial, XdsBackoffMax         time.Duration     // XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, _MAX_INTERVAL
	XdsBackoffRandomFactor                   float64           // XDS_CLIENT_BACKOFF_RANDOM_FACTOR
	XdsBackoffJitter                         bool              // XDS_CLIENT_BACKOFF_JITTER
	XdsMaxMsgSize                            int               // XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES (0: gRPC's default)

	// ReferenceKeys (SPILLWAY_KEY_FORMAT=reference): fixed-window limits in
	// a reference unit keep their counts under the reference server's keys
	// (refkeys.go), shared with its pods during a rolling swap.
	ReferenceKeys bool

	// SPILLWAY_LATE_ANSWER: what a call whose gRPC deadline has passed
	// before it is decided answers, at once, without deciding it: "error"
	// (default: DEADLINE_EXCEEDED, which Envoy reads through its
	// failure_mode_deny), "ok" (allowed) or "over_limit" (denied).
	LateAnswer string

	// SPILLWAY_MAX_IN_FLIGHT: calls decided at once (0: no bound). Past
	// it, a call waits for a slot in a deadline-aware queue, and one that
	// could not be served by its gRPC deadline is refused at once with
	// the answer LateAnswer says (counted as shed).
	MaxInFlight int
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
	{"DEBUG_PORT", "6070", integer(func(s *Settings) *int { return &s.DebugPort })},
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
	// Transport (tls.go)
	{"REDIS_TLS", "false", boolean(func(s *Settings) *bool { return &s.RedisTLS })},
	{"REDIS_TLS_CLIENT_CERT", "", str(func(s *Settings) *string { return &s.RedisTLSClientCert })},
	{"REDIS_TLS_CLIENT_KEY", "", str(func(s *Settings) *string { return &s.RedisTLSClientKey })},
	{"REDIS_TLS_CACERT", "", str(func(s *Settings) *string { return &s.RedisTLSCACert })},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", boolean(func(s *Settings) *bool { return &s.RedisTLSSkipHostnameVerification })},
	{"GRPC_SERVER_USE_TLS", "false", boolean(func(s *Settings) *bool { return &s.GrpcServerUseTLS })},
	{"GRPC_SERVER_TLS_CERT", "", str(func(s *Settings) *string { return &s.GrpcServerTLSCert })},
	{"GRPC_SERVER_TLS_KEY", "", str(func(s *Settings) *string { return &s.GrpcServerTLSKey })},
	{"GRPC_CLIENT_TLS_CACERT", "", str(func(s *Settings) *string { return &s.GrpcClientTLSCACert })},
	{"GRPC_CLIENT_TLS_SAN", "", str(func(s *Settings) *string { return &s.GrpcClientTLSSAN })},
	{"CONFIG_TYPE", "FILE", func(s *Settings, v string) error {
		switch strings.ToUpper(v) {
		case "FILE", "GRPC_XDS_SOTW":
			s.ConfigType = strings.ToUpper(v)
			return nil
		}
		return fmt.Errorf("expected FILE or GRPC_XDS_SOTW, got %q", v)
	}},
	{"CONFIG_GRPC_XDS_NODE_ID", "default", str(func(s *Settings) *string { return &s.XdsNodeID })},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "", str(func(s *Settings) *string { return &s.XdsNodeMetadata })},
	{"CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", str(func(s *Settings) *string { return &s.XdsServerURL })},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", duration(func(s *Settings) *time.Duration { return &s.XdsConnectRetryInterval })},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", func(s *Settings, v string) error {
		s.XdsHeaders = nil
		for _, kv := range strings.Split(v, ",") {
			if kv == "" {
				continue
			}
			k, val, ok := strings.Cut(kv, ":")
			if !ok {
				return fmt.Errorf("expected key:value pairs separated by commas, got %q", kv)
			}
			if s.XdsHeaders == nil {
				s.XdsHeaders = map[string]string{}
			}
			s.XdsHeaders[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
		return nil
	}},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", boolean(func(s *Settings) *bool { return &s.XdsServerUseTLS })},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", str(func(s *Settings) *string { return &s.XdsClientTLSCert })},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", str(func(s *Settings) *string { return &s.XdsClientTLSKey })},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", str(func(s *Settings) *string { return &s.XdsServerTLSCACert })},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", str(func(s *Settings) *string { return &s.XdsServerTLSSAN })},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", duration(func(s *Settings) *time.Duration { return &s.XdsBackoffInitial })},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", duration(func(s *Settings) *time.Duration { return &s.XdsBackoffMax })},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", func(s *Settings, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return fmt.Errorf("expected a factor from 0 to 1, got %q", v)
		}
		s.XdsBackoffRandomFactor = f
		return nil
	}},
	{"XDS_CLIENT_BACKOFF_JITTER", "true", boolean(func(s *Settings) *bool { return &s.XdsBackoffJitter })},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", func(s *Settings, v string) error {
		if v == "" {
			s.XdsMaxMsgSize = 0
			return nil
		}
		return integer(func(s *Settings) *int { return &s.XdsMaxMsgSize })(s, v)
	}},
	{"SPILLWAY_KEY_FORMAT", "spillway", func(s *Settings, v string) error {
		switch strings.ToLower(v) {
		case "spillway":
			s.ReferenceKeys = false
		case "reference":
			s.ReferenceKeys = true
		default:
			return fmt.Errorf("expected spillway or reference, got %q", v)
		}
		return nil
	}},
	{"SPILLWAY_LATE_ANSWER", "error", func(s *Settings, v string) error {
		switch v = strings.ToLower(v); v {
		case "error", "ok", "over_limit":
			s.LateAnswer = v
			return nil
		}
		return fmt.Errorf("expected error, ok or over_limit, got %q", v)
	}},
	{"SPILLWAY_MAX_IN_FLIGHT", "256", integer(func(s *Settings) *int { return &s.MaxInFlight })},
	// Accepted as the reference has them, and what this server does anyway.
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", noop},

	// Operations: stats sinks and shutdown (the reference's defaults).
	{"USE_STATSD", "true", boolean(func(s *Settings) *bool { return &s.UseStatsd })},
	{"USE_DOG_STATSD", "false", boolean(func(s *Settings) *bool { return &s.UseDogStatsd })},
	{"STATSD_HOST", "localhost", str(func(s *Settings) *string { return &s.StatsdHost })},
	{"STATSD_PORT", "8125", integer(func(s *Settings) *int { return &s.StatsdPort })},
	{"STATSD_PROTOCOL", "", func(s *Settings, v string) error {
		switch v = strings.ToLower(v); v {
		case "", "tcp", "udp", "tcp4", "tcp6", "udp4", "udp6":
			s.StatsdProtocol = v
			return nil
		}
		return fmt.Errorf("expected tcp or udp, got %q", v)
	}},
	{"EXTRA_TAGS", "", func(s *Settings, v string) error {
		s.ExtraTags = map[string]string{}
		if v == "" {
			return nil
		}
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, ":")
			if !ok || k == "" {
				return fmt.Errorf("expected tags like key1:value1,key2:value2, got %q", kv)
			}
			s.ExtraTags[k] = val
		}
		return nil
	}},
	{"STATS_FLUSH_INTERVAL", "10s", duration(func(s *Settings) *time.Duration { return &s.StatsFlushInterval })},
	{"DISABLE_STATS", "false", boolean(func(s *Settings) *bool { return &s.DisableStats })},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false", boolean(func(s *Settings) *bool { return &s.ResponseTimeMillis })},
	{"SPILLWAY_DRAIN", "25s", duration(func(s *Settings) *time.Duration { return &s.Drain })},
	{"USE_DOG_STATSD_MOGRIFIERS", "", noop}, // read with its DOG_STATSD_MOGRIFIER_* by readMogrifiers
}

func noop(*Settings, string) error { return nil }

// unsupported lists the reference's variables this server does not
// implement, each with what it does instead. One that is set is reported
// at start, unless its value asks for what this server does anyway (ok).
var unsupported = []struct {
	name, why string
	ok        func(v string) bool
}{
	{"PROMETHEUS_MAPPER_YAML", "the metric names and labels are fixed (the reference's default mapping)", nil},
	{"EXPIRATION_JITTER_MAX_SECONDS", "every key expires exactly when its state is back to full; no jitter needed", nil},
	{"BACKEND_TYPE", "only Redis", func(v string) bool { return strings.EqualFold(v, "redis") }},
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
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "a call waits for a pooled connection within SPILLWAY_BUDGET (the reference refuses CREATE and ERROR at start too)", func(v string) bool { return strings.EqualFold(v, "WAIT") }},
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
			if f := fatalWhen[u.name]; f != nil && f(val) {
				return s, nil, fmt.Errorf("rls: %s=%s is not supported: %s; unset it (the server would not do what it asks)", u.name, val, u.why)
			}
			notices = append(notices, fmt.Sprintf("%s is set but not supported: %s", u.name, u.why))
		}
	}
	if v, ok := lookup("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"); ok && isFalse(v) {
		notices = append(notices, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false is not supported: a denied request never charges any limit (all descriptors of a request are decided together)")
	}
	sort.Strings(notices)
	if err := s.readMogrifiers(lookup); err != nil {
		return s, nil, err
	}
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
	if s.XdsBackoffInitial <= 0 || s.XdsBackoffMax < s.XdsBackoffInitial {
		return fmt.Errorf("rls: XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, XDS_CLIENT_BACKOFF_MAX_INTERVAL: want 0 < initial <= max")
	}
	if s.Budget <= 0 {
		return fmt.Errorf("rls: SPILLWAY_BUDGET: must be positive")
	}
	if s.MaxInFlight < 0 {
		return fmt.Errorf("rls: SPILLWAY_MAX_IN_FLIGHT: %d must not be negative", s.MaxInFlight)
	}
	switch strings.ToLower(s.LogFormat) {
	case "text", "json":
	default:
		return fmt.Errorf("rls: LOG_FORMAT: %q is not text or json", s.LogFormat)
	}
	return s.validateOps()
}

// validateOps checks the operations settings.
func (s *Settings) validateOps() error {
	switch strings.ToLower(s.LogLevel) {
	case "trace", "debug", "info", "warn", "warning", "error", "fatal", "panic":
	default:
		return fmt.Errorf("rls: LOG_LEVEL: %q is not a log level (trace, debug, info, warn, error, fatal, panic)", s.LogLevel)
	}
	if s.StatsFlushInterval <= 0 && s.UseStatsd {
		return fmt.Errorf("rls: STATS_FLUSH_INTERVAL: must be positive")
	}
	if s.StatsdPort <= 0 || s.StatsdPort > 65535 {
		return fmt.Errorf("rls: STATSD_PORT: %d is not a port", s.StatsdPort)
	}
	return nil
}

// fatalWhen holds the unsupported variables whose value would change what
// is enforced, encrypted or reported: set to such a value (or to one that
// does not parse), the server does not start, with one line naming it.
// The others in unsupported change nothing observable and are warned
// about. A variable that gets implemented leaves unsupported, and so this
// list too.
var fatalWhen = map[string]func(v string) bool{
	"BACKEND_TYPE":                 func(v string) bool { return !strings.EqualFold(v, "redis") && v != "" },
	"REDIS_PERSECOND":              notFalse,                                                     // per-second limits would go to the other Redis
	"QUOTA_MODE":                   notFalse,                                                     // would enforce quota-mode limits
	"RESPONSE_DYNAMIC_METADATA":    notFalse,                                                     // answers would lack the metadata
	"TRACING_ENABLED":              notFalse,                                                     // no traces would be exported
	"PROMETHEUS_MAPPER_YAML":       func(v string) bool { return v != "" },                       // metric names would differ
	"REDIS_POOL_ON_EMPTY_BEHAVIOR": func(v string) bool { return !strings.EqualFold(v, "WAIT") }, // the reference refuses CREATE and ERROR at start
}

func notFalse(v string) bool { return !isFalse(v) }

// mogrifier is one of USE_DOG_STATSD_MOGRIFIERS: a stat whose name
// matches re is sent to DogStatsD as name, with tags; $1 … in either are
// re's submatches.
type mogrifier struct {
	re   *regexp.Regexp
	name string
	tags [][2]string // key, value; sorted by key
}

// readMogrifiers reads USE_DOG_STATSD_MOGRIFIERS (NAME1,NAME2: tried in
// this order, the first that matches applies) and, for each,
// DOG_STATSD_MOGRIFIER_NAME_PATTERN, _NAME and _TAGS (k1:v1,k2:v2), as the
// reference does.
func (s *Settings) readMogrifiers(lookup func(string) (string, bool)) error {
	v, _ := lookup("USE_DOG_STATSD_MOGRIFIERS")
	if v == "" {
		return nil
	}
	for _, m := range strings.Split(v, ",") {
		p := "DOG_STATSD_MOGRIFIER_" + strings.ToUpper(m) + "_"
		pattern, _ := lookup(p + "PATTERN")
		name, _ := lookup(p + "NAME")
		tags, _ := lookup(p + "TAGS")
		if pattern == "" {
			return fmt.Errorf("rls: USE_DOG_STATSD_MOGRIFIERS: no %sPATTERN for mogrifier %s", p, m)
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			return fmt.Errorf("rls: %sPATTERN: %w", p, err)
		}
		if name == "" {
			return fmt.Errorf("rls: USE_DOG_STATSD_MOGRIFIERS: no %sNAME for mogrifier %s", p, m)
		}
		mg := mogrifier{re: re, name: name}
		if tags != "" {
			for _, kv := range strings.Split(tags, ",") {
				k, val, _ := strings.Cut(kv, ":")
				if k == "" || val == "" {
					return fmt.Errorf("rls: %sTAGS: expected tags like key1:$1,key2:value2, got %q", p, kv)
				}
				mg.tags = append(mg.tags, [2]string{k, val})
			}
			sort.Slice(mg.tags, func(i, j int) bool { return mg.tags[i][0] < mg.tags[j][0] })
		}
		s.mogrifiers = append(s.mogrifiers, mg)
	}
	return nil
}
