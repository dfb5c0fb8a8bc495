package ratelimit_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// TestSettingsMisuseDoesNotCompile: each constructor takes its own
// settings struct, so the Redis store's settings passed to the memory
// store, or a Redis-only field in MemorySettings, is a compile error,
// never silently ignored.
func TestSettingsMisuseDoesNotCompile(t *testing.T) {
	for _, c := range []struct{ code, want string }{
		{`_ = ratelimit.NewMemoryStore(ratelimit.RedisSettings{Prefix: "x:"})`, "cannot use"},
		{`_ = ratelimit.NewMemoryStore(ratelimit.MemorySettings{Prefix: "x:"})`, "unknown field Prefix"},
		{`_, _ = ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Limit: 1, Period: time.Second}, ratelimit.MemorySettings{})`, "cannot use"},
		{`_, _ = ratelimit.NewRedisStore(nil, ratelimit.RedisSettings{MaxKeys: 10})`, "unknown field MaxKeys"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: c.code + "\n"})
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), c.want) {
			t.Errorf("%s: errors %q, want one containing %q", c.code, errs, c.want)
		}
	}
	// The right settings compile.
	ok := `_ = ratelimit.NewMemoryStore(ratelimit.MemorySettings{MaxKeys: 10})
_, _ = ratelimit.NewRedisStore(nil, ratelimit.RedisSettings{Prefix: "x:"})
_, _ = ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Limit: 1, Period: time.Second}, ratelimit.Settings{Scope: "api"})`
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: ok + "\n"}); len(errs) > 0 {
		t.Errorf("the right settings do not compile: %q", errs)
	}
}
