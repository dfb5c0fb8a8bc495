package grpcx_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// A setting that does not apply to an interceptor does not compile against
// it: the server's settings are not the client's, and the other way round.
func TestMisuseDoesNotCompile(t *testing.T) {
	given := "var chain spillway.Limiter\nvar c *clientside.Client"
	for _, tc := range []struct{ code, want string }{
		{"_ = grpcx.UnaryClientInterceptor(c, grpcx.ClientSettings{APIKeyMetadata: \"x-api-key\"})\n", "unknown field APIKeyMetadata"},
		{"_ = grpcx.UnaryServerInterceptor(chain, grpcx.ServerSettings{Retryable: func(string) bool { return false }})\n", "unknown field Retryable"},
		{"_ = grpcx.StreamServerInterceptor(chain, grpcx.ClientSettings{})\n", "cannot use"},
		{"_ = grpcx.UnaryClientInterceptor(grpcx.ClientSettings{})\n", "not enough arguments"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: tc.code, Given: given})
		if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
			t.Errorf("%s: errors %q, want one containing %q", tc.code, errs, tc.want)
		}
	}
	use := "_ = grpcx.UnaryServerInterceptor(chain, grpcx.ServerSettings{APIKeyMetadata: \"x-api-key\"})\n" +
		"_ = grpcx.UnaryClientInterceptor(c, grpcx.ClientSettings{NoPriorityPropagation: true})\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: use, Given: given}); len(errs) != 0 {
		t.Errorf("right use: %q", errs)
	}
}
