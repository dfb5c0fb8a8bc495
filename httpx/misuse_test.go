package httpx_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// A setting that does not apply to a constructor does not compile against
// it: the client side's retries are not a Middleware setting, and
// Middleware takes no functional options.
func TestMisuseDoesNotCompile(t *testing.T) {
	for _, tc := range []struct{ code, want string }{
		{"_ = httpx.Middleware(chain, httpx.Settings{MaxRetries: 2})", "unknown field MaxRetries"},
		{"_ = httpx.Middleware(chain)", "not enough arguments"},
		{"_ = &httpx.Transport{APIKeyHeader: \"X-API-Key\"}", "unknown field APIKeyHeader"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: tc.code + "\n", Given: "var chain spillway.Limiter"})
		if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
			t.Errorf("%s: errors %q, want one containing %q", tc.code, errs, tc.want)
		}
	}
	// The right use compiles.
	use := "_ = httpx.Middleware(chain, httpx.Settings{APIKeyHeader: \"X-API-Key\"})\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: use, Given: "var chain spillway.Limiter"}); len(errs) != 0 {
		t.Errorf("right use: %q", errs)
	}
}
