package fallback_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// TestSettingsMisuseDoesNotCompile: NewHealth takes HealthSettings and
// NewStore Settings, and TuneOptions only the option structs it knows, so
// a wrong one is a compile error, never silently ignored.
func TestSettingsMisuseDoesNotCompile(t *testing.T) {
	const given = "import \"github.com/redis/go-redis/v9\"\n\nvar client *redis.Client\nvar inner ratelimit.Store"
	for _, c := range []struct{ code, want string }{
		{`_, _ = fallback.NewStore(inner, fallback.HealthSettings{})`, "cannot use"},
		{`_, _ = fallback.NewHealth(client, fallback.Settings{})`, "cannot use"},
		{`fallback.TuneOptions(&redis.ClusterOptions{})`, "does not satisfy"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: c.code + "\n", Given: given})
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), c.want) {
			t.Errorf("%s: errors %q, want one containing %q", c.code, errs, c.want)
		}
	}
	ok := `_, _ = fallback.NewHealth(client, fallback.HealthSettings{})
_, _ = fallback.NewStore(inner, fallback.Settings{})
fallback.TuneOptions(&redis.Options{})
fallback.TuneOptions(&redis.FailoverOptions{})
fallback.TuneOptions(&redis.UniversalOptions{})
`
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: ok, Given: given}); len(errs) > 0 {
		t.Errorf("the right settings do not compile: %q", errs)
	}
}
