package concurrency_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// TestSettingsMisuseDoesNotCompile: each constructor takes its own
// settings struct, so a Redis-only field in MemorySettings, or a store's
// settings given to New is a compile error.
func TestSettingsMisuseDoesNotCompile(t *testing.T) {
	for _, c := range []struct{ code, want string }{
		{`_ = concurrency.NewMemoryStore(concurrency.MemorySettings{Prefix: "x:"})`, "unknown field Prefix"},
		{`_, _ = concurrency.NewRedisStore(nil, concurrency.RedisSettings{MaxKeys: 10})`, "unknown field MaxKeys"},
		{`_, _ = concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), 2, concurrency.MemorySettings{})`, "cannot use"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: c.code + "\n"})
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), c.want) {
			t.Errorf("%s: errors %q, want one containing %q", c.code, errs, c.want)
		}
	}
	ok := `_ = concurrency.NewMemoryStore(concurrency.MemorySettings{MaxKeys: 10})
_, _ = concurrency.NewRedisStore(nil, concurrency.RedisSettings{Prefix: "x:"})
_, _ = concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), 2, concurrency.Settings{Name: "api"})`
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: ok + "\n"}); len(errs) > 0 {
		t.Errorf("the right settings do not compile: %q", errs)
	}
}
