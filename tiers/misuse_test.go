package tiers_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// TestOptionMisuseDoesNotCompile: New takes Settings and Limiter.Watch
// WatchSettings, so the settings of one passed to the other are a compile
// error, never silently ignored.
func TestOptionMisuseDoesNotCompile(t *testing.T) {
	const given = "var cfg *tiers.Config\nvar ctx context.Context"
	for _, c := range []struct{ code, want string }{
		{`_, _ = tiers.New(cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), tiers.WatchSettings{Interval: time.Second})`, "cannot use"},
		{`lim, _ := tiers.New(cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), tiers.Settings{})
_ = lim.Watch(ctx, "limits.yaml", tiers.Settings{Name: "api"})`, "cannot use"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: c.code + "\n", Given: given})
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), c.want) {
			t.Errorf("%s: errors %q, want one containing %q", c.code, errs, c.want)
		}
	}
	ok := `lim, _ := tiers.New(cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), tiers.Settings{Name: "api"})
_ = lim.Watch(ctx, "limits.yaml", tiers.WatchSettings{Interval: time.Second})
`
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: ok, Given: given}); len(errs) > 0 {
		t.Errorf("the right options do not compile: %q", errs)
	}
}
