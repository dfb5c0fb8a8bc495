package globalceiling_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// New is configured by one Settings struct: a setting that is not a
// ceiling's does not compile, nor does the functional option of another
// package; NewGuard takes no options.
func TestMisuseDoesNotCompile(t *testing.T) {
	given := "var rdb *redis.Client\nvar ceil *globalceiling.Ceiling"
	for _, tc := range []struct{ code, want string }{
		{"_, _ = globalceiling.New(rdb, \"db\", 10, time.Second, globalceiling.Settings{K: 3})", "unknown field K"},
		{"_, _ = globalceiling.New(rdb, \"db\", 10, time.Second)", "not enough arguments"},
		{"_, _ = globalceiling.NewGuard(ceil, globalceiling.Settings{})", "too many arguments"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: "import \"github.com/redis/go-redis/v9\"\n" + tc.code + "\n", Given: given})
		if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
			t.Errorf("%s: errors %q, want one containing %q", tc.code, errs, tc.want)
		}
	}
	use := "import \"github.com/redis/go-redis/v9\"\n_, _ = globalceiling.New(rdb, \"db\", 10, time.Second, globalceiling.Settings{Mode: globalceiling.Cached})\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: use, Given: given}); len(errs) != 0 {
		t.Errorf("right use: %q", errs)
	}
}
