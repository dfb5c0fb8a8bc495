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
		"USE_STATSD": "true", "USE_DOG_STATSD": "false", "BACKEND_TYPE": "memcache",
		"REDIS_TIMEOUT": "10s", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false",
	}))
	require.NoError(t, err)
	require.Equal(t, "/data/rl/config", s.ConfigDir())
	require.Len(t, notices, 4)
	require.Contains(t, notices[0], "BACKEND_TYPE is set but not supported")
	require.Contains(t, notices[1], "REDIS_TIMEOUT is set but not supported")
	require.Contains(t, notices[2], "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false is not supported")
	require.Contains(t, notices[3], "USE_STATSD is set but not supported")
}

func TestEnvErrors(t *testing.T) {
	for k, v := range map[string]string{
		"GRPC_PORT": "http", "NEAR_LIMIT_RATIO": "2", "REDIS_TYPE": "ring", "REDIS_SOCKET_TYPE": "udp",
		"CACHE_KEY_PREFIX": "{x}", "SPILLWAY_BUDGET": "soon", "SPILLWAY_LOCAL_SHARE": "0", "LOG_FORMAT": "xml",
		"RUNTIME_WATCH_ROOT": "maybe", "SPILLWAY_FAIL_MODE": "sideways", "SPILLWAY_LATE_ANSWER": "later",
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
