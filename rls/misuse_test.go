package rls_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// Wrong arguments do not compile: a Service takes a store, the settings
// and a logger; a config is loaded from files with LoadOptions.
func TestMisuseDoesNotCompile(t *testing.T) {
	given := "var store ratelimit.Store\nvar yaml []byte"
	for _, tc := range []struct{ code, want string }{
		{"_ = rls.NewService(store, rls.Settings{}, nil, nil)\n", "too many arguments"},
		{"_ = rls.NewService(rls.DefaultSettings(), store, nil)\n", "cannot use"},
		{"_, _ = rls.Load([]rls.File{{Name: \"l.yaml\", Content: yaml}}, true)\n", "cannot use"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: tc.code, Given: given})
		if len(errs) == 0 || !strings.Contains(errs[0], tc.want) {
			t.Errorf("%s: errors %q, want one containing %q", tc.code, errs, tc.want)
		}
	}
	use := "_ = rls.NewService(store, rls.DefaultSettings(), nil)\n" +
		"_, _ = rls.Load([]rls.File{{Name: \"l.yaml\", Content: yaml}}, rls.LoadOptions{MergeDomains: true})\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: use, Given: given}); len(errs) != 0 {
		t.Errorf("right use: %q", errs)
	}
}
