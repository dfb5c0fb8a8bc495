package rls

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestEnvDefaults(t *testing.T) {
	s, notices, err := Env(env(nil))
	require.NoError(t, err)
	require.Empty(t, notices)
	require.Equal(t, "0.0.0.0", s.GrpcHost)
	require.Equal(t, 8081, s.GrpcPort)
	require.Equal(t, 8080, s.Port)
	require.Equal(t, "/srv/runtime_data/current/config", s.ConfigDir())
	require.Equal(t, float32(0.8), s.NearLimitRatio)
	require.Equal(t, 50*time.Millisecond, s.Budget)
	require.Equal(t, "RateLimit-Remaining", s.HeaderRemaining)
	require.True(t, s.RuntimeWatchRoot)
}

func TestEnvReportsUnsupported(t *testing.T) {
	s, notices, err := Env(env(map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "rl", "REDIS_TYPE": "cluster",
		"USE_STATSD": "true", "USE_DOG_STATSD": "false", "BACKEND_TYPE": "redis",
		"REDIS_TIMEOUT": "10s", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false",
	}))
	require.NoError(t, err)
	require.Equal(t, "/data/rl/config", s.ConfigDir())
	require.Len(t, notices, 2)
	require.Contains(t, notices[0], "REDIS_TIMEOUT is set but not supported")
	require.Contains(t, notices[1], "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false is not supported")
}

func TestEnvErrors(t *testing.T) {
	for k, v := range map[string]string{
		"GRPC_PORT": "http", "NEAR_LIMIT_RATIO": "2", "REDIS_TYPE": "ring", "REDIS_SOCKET_TYPE": "udp",
		"CACHE_KEY_PREFIX": "{x}", "SPILLWAY_BUDGET": "soon", "SPILLWAY_LOCAL_SHARE": "0", "LOG_FORMAT": "xml",
		"RUNTIME_WATCH_ROOT": "maybe", "SPILLWAY_FAIL_MODE": "sideways", "SPILLWAY_LATE_ANSWER": "later",
		"CONFIG_TYPE": "GRPC_XDS", "SPILLWAY_KEY_FORMAT": "envoy", "REDIS_TLS": "yes please",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "novalue", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "2",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "0s",
	} {
		_, _, err := Env(env(map[string]string{k: v}))
		require.ErrorContains(t, err, k, "%s=%s", k, v)
	}
}

// TestSettingsDocumented: docs/rls.md lists every variable the server
// reads or reports.
func TestSettingsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/rls.md")
	require.NoError(t, err)
	doc := string(b)
	documented := func(name string) bool {
		if strings.Contains(doc, "`"+name+"`") || strings.Contains(doc, "`"+name+"*`") {
			return true
		}
		for i := range name { // a family: `MEMCACHE_*`, `REDIS_PERSECOND*`
			if name[i] == '_' && (strings.Contains(doc, "`"+name[:i+1]+"*`") || strings.Contains(doc, "`"+name[:i]+"*`")) {
				return true
			}
		}
		return false
	}
	for _, v := range supported {
		require.True(t, documented(v.name), "%s is not in docs/rls.md", v.name)
	}
	for _, u := range unsupported {
		require.True(t, documented(u.name), "%s is not in docs/rls.md", u.name)
	}
}

// referenceSettings is every setting of the reference server (its
// settings.go: 114), a value a team may have it set to, and what this
// server does with it: same (implemented), warn (starts, with one line
// naming it: it changes nothing observable here), or fatal (does not
// start, one line naming it: serving would change what is enforced,
// encrypted or reported). why says why, for warn and fatal.
var referenceSettings = []struct {
	name, value string
	class       settingClass
	why         string
}{
	{"HOST", "127.0.0.1", same, "implemented"},
	{"PORT", "9000", same, "implemented"},
	{"DEBUG_HOST", "127.0.0.1", same, "implemented"},
	{"DEBUG_PORT", "6071", same, "implemented"},
	{"GRPC_UDS", "/tmp/rls.sock", same, "implemented"},
	{"GRPC_HOST", "127.0.0.1", same, "implemented"},
	{"GRPC_PORT", "9001", same, "implemented"},
	{"GRPC_MAX_CONNECTION_AGE", "1h", same, "implemented"},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1m", same, "implemented"},
	{"GRPC_SERVER_USE_TLS", "true", same, "implemented"},
	{"GRPC_SERVER_TLS_CERT", "/tls/cert.pem", same, "implemented"},
	{"GRPC_SERVER_TLS_KEY", "/tls/key.pem", same, "implemented"},
	{"GRPC_CLIENT_TLS_CACERT", "/tls/ca.pem", same, "implemented"},
	{"GRPC_CLIENT_TLS_SAN", "envoy", same, "implemented"},
	{"LOG_LEVEL", "debug", same, "implemented"},
	{"LOG_FORMAT", "json", same, "implemented"},
	{"CONFIG_TYPE", "GRPC_XDS_SOTW", same, "implemented"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "true", same, "implemented"},
	{"CONFIG_GRPC_XDS_NODE_ID", "node", same, "implemented"},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "k=v", same, "implemented"},
	{"CONFIG_GRPC_XDS_SERVER_URL", "xds:18000", same, "implemented"},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "5s", same, "implemented"},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "k:v", same, "implemented"},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", same, "implemented"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c", same, "implemented"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/k", same, "implemented"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca", same, "implemented"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds", same, "implemented"},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s", same, "implemented"},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "10s", same, "implemented"},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.1", same, "implemented"},
	{"XDS_CLIENT_BACKOFF_JITTER", "false", same, "implemented"},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1000", same, "implemented"},
	{"USE_DOG_STATSD", "true", same, "implemented"},
	{"USE_DOG_STATSD_MOGRIFIERS", "HITS", same, "implemented"},
	{"USE_STATSD", "false", same, "implemented"},
	{"STATSD_HOST", "statsd", same, "implemented"},
	{"STATSD_PORT", "9125", same, "implemented"},
	{"EXTRA_TAGS", "env:prod", same, "implemented"},
	{"STATS_FLUSH_INTERVAL", "5s", same, "implemented"},
	{"DISABLE_STATS", "true", same, "implemented"},
	{"USE_PROMETHEUS", "true", same, "implemented"},
	{"PROMETHEUS_ADDR", ":9091", same, "implemented"},
	{"PROMETHEUS_PATH", "/m", same, "implemented"},
	{"PROMETHEUS_MAPPER_YAML", "/mapper.yaml", fatal, "metric names would differ"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true", same, "implemented"},
	{"RUNTIME_ROOT", "/data", same, "implemented"},
	{"RUNTIME_SUBDIRECTORY", "rl", same, "implemented"},
	{"RUNTIME_APPDIRECTORY", "cfg", same, "implemented"},
	{"RUNTIME_IGNOREDOTFILES", "true", same, "implemented"},
	{"RUNTIME_WATCH_ROOT", "false", same, "implemented"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "60", warn, "keys expire when their state is full again"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "1000000", same, "implemented"},
	{"NEAR_LIMIT_RATIO", "0.9", same, "implemented"},
	{"CACHE_KEY_PREFIX", "rl:", same, "implemented"},
	{"BACKEND_TYPE", "memcache", fatal, "only Redis"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true", same, "implemented"},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "true", same, "implemented"},
	{"LIMIT_LIMIT_HEADER", "X-Limit", same, "implemented"},
	{"LIMIT_REMAINING_HEADER", "X-Remaining", same, "implemented"},
	{"LIMIT_RESET_HEADER", "X-Reset", same, "implemented"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true", same, "implemented"},
	{"REDIS_SOCKET_TYPE", "tcp", same, "implemented"},
	{"REDIS_TYPE", "cluster", same, "implemented"},
	{"REDIS_URL", "redis:6379", same, "implemented"},
	{"REDIS_POOL_SIZE", "20", same, "implemented"},
	{"REDIS_AUTH", "secret", same, "implemented"},
	{"REDIS_TLS", "true", same, "implemented"},
	{"REDIS_TLS_CLIENT_CERT", "/c", same, "implemented"},
	{"REDIS_TLS_CLIENT_KEY", "/k", same, "implemented"},
	{"REDIS_TLS_CACERT", "/ca", same, "implemented"},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true", same, "implemented"},
	{"REDIS_PIPELINE_WINDOW", "150us", warn, "calls in flight are coalesced without a timer"},
	{"REDIS_PIPELINE_LIMIT", "8", warn, "calls are coalesced without a limit"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "4", warn, "a request's slots are decided in parallel"},
	{"REDIS_PERSECOND", "true", fatal, "per-second limits would go to the other Redis"},
	{"REDIS_PERSECOND_SOCKET_TYPE", "tcp", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_TYPE", "single", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_URL", "redis2:6379", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_POOL_SIZE", "5", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_AUTH", "secret", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_TLS", "true", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_SENTINEL_AUTH", "secret", same, "implemented"},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "secret", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "150us", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "8", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "4", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true", warn, "health stays SERVING: the local share answers while Redis is down"},
	{"REDIS_TIMEOUT", "1s", warn, "SPILLWAY_BUDGET bounds every Redis call"},
	{"REDIS_PERSECOND_TIMEOUT", "1s", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "CREATE", fatal, "the reference refuses it at start too"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", warn, "nothing without REDIS_PERSECOND"},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "2s", warn, "the server starts without Redis"},
	{"REDIS_STARTUP_MAX_INTERVAL", "10s", warn, "the server starts without Redis"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "1m", warn, "the server starts without Redis"},
	{"MEMCACHE_HOST_PORT", "mc:11211", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_MAX_IDLE_CONNS", "4", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_SRV", "_mc._tcp", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_SRV_REFRESH", "1m", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_TLS", "true", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_TLS_CLIENT_CERT", "/c", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_TLS_CLIENT_KEY", "/k", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_TLS_CACERT", "/ca", warn, "nothing without BACKEND_TYPE=memcache"},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "true", warn, "nothing without BACKEND_TYPE=memcache"},
	{"SHADOW_MODE", "true", same, "implemented"},
	{"QUOTA_MODE", "true", fatal, "quota-mode limits would be enforced"},
	{"RESPONSE_DYNAMIC_METADATA", "true", fatal, "answers would lack the metadata"},
	{"MERGE_DOMAIN_CONFIG", "true", same, "implemented"},
	{"TRACING_ENABLED", "true", fatal, "no traces would be exported"},
	{"TRACING_SERVICE_NAME", "rl", warn, "nothing without TRACING_ENABLED"},
	{"TRACING_SERVICE_NAMESPACE", "ns", warn, "nothing without TRACING_ENABLED"},
	{"TRACING_SERVICE_INSTANCE_ID", "i", warn, "nothing without TRACING_ENABLED"},
	{"TRACING_EXPORTER_PROTOCOL", "grpc", warn, "nothing without TRACING_ENABLED"},
	{"TRACING_SAMPLING_RATE", "0.5", warn, "nothing without TRACING_ENABLED"},
}

type settingClass int

const (
	same settingClass = iota
	warn
	fatal
)

// settingExtras are the variables a setting needs beside it.
var settingExtras = map[string]map[string]string{
	"USE_DOG_STATSD_MOGRIFIERS": {"DOG_STATSD_MOGRIFIER_HITS_PATTERN": `^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
		"DOG_STATSD_MOGRIFIER_HITS_NAME": "ratelimit.service.rate_limit.$3", "DOG_STATSD_MOGRIFIER_HITS_TAGS": "domain:$1,descriptor:$2"},
}

func settingEnv(name, value string) func(string) (string, bool) {
	m := map[string]string{name: value}
	for k, v := range settingExtras[name] {
		m[k] = v
	}
	return env(m)
}

func TestReferenceSettings(t *testing.T) {
	require.Len(t, referenceSettings, 114)
	for _, c := range referenceSettings {
		s, notices, err := Env(settingEnv(c.name, c.value))
		switch c.class {
		case same:
			require.NoError(t, err, c.name)
			require.Empty(t, notices, c.name)
		case warn:
			require.NoError(t, err, c.name)
			require.Len(t, notices, 1, c.name)
			require.True(t, strings.HasPrefix(notices[0], c.name+" is set but not supported: "), notices[0])
		case fatal:
			require.Error(t, err, c.name)
			require.NotContains(t, err.Error(), "\n")
			require.True(t, strings.HasPrefix(err.Error(), "rls: "+c.name+"="+c.value+" is not supported: "), err.Error())
		}
		_ = s
	}
}

// TestReferenceSettingsApplied: the implemented ones change the settings.
func TestReferenceSettingsApplied(t *testing.T) {
	def := DefaultSettings()
	for _, c := range referenceSettings {
		if c.class != same || c.name == "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT" {
			continue
		}
		s, _, err := Env(settingEnv(c.name, c.value))
		require.NoError(t, err)
		require.NotEqual(t, def, s, "%s=%s changes nothing", c.name, c.value)
	}
}

// TestInvalidValuesExit: a value the reference would not start with is
// an error naming the variable.
func TestInvalidValuesExit(t *testing.T) {
	for k, v := range map[string]string{
		"LOG_LEVEL": "loud", "USE_STATSD": "yes please", "STATSD_PORT": "x", "EXTRA_TAGS": "novalue",
		"STATS_FLUSH_INTERVAL": "often", "DEBUG_PORT": "x", "SPILLWAY_DRAIN": "later", "STATSD_PROTOCOL": "sctp",
		"REDIS_TLS": "maybe", "CONFIG_TYPE": "CONSUL", "BACKEND_TYPE": "etcd", "USE_DOG_STATSD_MOGRIFIERS": "NOPATTERN",
	} {
		_, _, err := Env(env(map[string]string{k: v}))
		require.ErrorContains(t, err, k, "%s=%s", k, v)
	}
	for _, v := range []string{"warning", "WARN", "trace", "Error", "panic"} {
		_, _, err := Env(env(map[string]string{"LOG_LEVEL": v}))
		require.NoError(t, err, v)
	}
}
