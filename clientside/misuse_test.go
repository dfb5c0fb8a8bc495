package clientside_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// A setting that does not apply to a constructor does not compile against
// it: a retry budget has no K, a throttle no Ratio.
func TestMisuseDoesNotCompile(t *testing.T) {
	for _, tc := range []struct{ code, want string }{
		{"_, _ = clientside.NewRetryBudget(clientside.RetryBudgetSettings{K: 3})\n", "unknown field K"},
		{"_, _ = clientside.NewThrottle(clientside.ThrottleSettings{Ratio: 0.2})\n", "unknown field Ratio"},
		{"_, _ = clientside.NewThrottle(clientside.RetryBudgetSettings{})\n", "cannot use"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: tc.code})
		if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
			t.Errorf("%s: errors %q, want one containing %q", tc.code, errs, tc.want)
		}
	}
	use := "_, _ = clientside.NewThrottle(clientside.ThrottleSettings{K: 3})\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: use}); len(errs) != 0 {
		t.Errorf("right use: %q", errs)
	}
}
