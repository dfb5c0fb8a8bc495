package spillway_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// A Limiter is a type with an Admit method: a bare function is not one,
// and the blocks' plumbing (budgets, Once) is not part of the package.
func TestMisuseDoesNotCompile(t *testing.T) {
	for _, tc := range []struct{ code, want string }{
		{"_ = spillway.Chain(func(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) { return spillway.Decision{}, spillway.Noop, nil })", "cannot use"},
		{"_ = spillway.WithBudget(ctx, time.Second)", "undefined"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: tc.code + "\n", Given: "var ctx context.Context"})
		if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
			t.Errorf("%s: errors %q, want one containing %q", tc.code, errs, tc.want)
		}
	}
	use := "_ = spillway.ChainBudget(20*time.Millisecond, spillway.Chain())\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: use, Given: "var ctx context.Context"}); len(errs) != 0 {
		t.Errorf("right use: %q", errs)
	}
}
