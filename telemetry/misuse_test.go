package telemetry_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// TestOptionMisuseDoesNotCompile: only Instrument takes Settings, so an
// Instrument setting passed to NewHoldMetrics or ObserveBreaker is a
// compile error, never silently ignored.
func TestOptionMisuseDoesNotCompile(t *testing.T) {
	for _, code := range []string{
		`_ = telemetry.NewHoldMetrics("api", telemetry.Settings{ChildSpan: true})`,
		`_, _ = telemetry.ObserveBreaker("redis", nil, telemetry.Settings{Clock: time.Now})`,
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: code + "\n"})
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), "cannot use") {
			t.Errorf("%s: errors %q, want a \"cannot use\"", code, errs)
		}
	}
	ok := "_ = telemetry.NewHoldMetrics(\"api\", nil)\nvar l spillway.Limiter\n_ = telemetry.Instrument(l, \"api\", telemetry.Settings{ChildSpan: true})\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: ok}); len(errs) > 0 {
		t.Errorf("the right options do not compile: %q", errs)
	}
}
