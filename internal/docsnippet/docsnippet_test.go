package docsnippet_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// given declares the names the snippets of each package take as given:
// what the caller has at hand (a context, a key, a handler, the chain it
// built), never a value of a package the snippet should show how to make.
var given = map[string]string{
	".": "var ctx context.Context",
	"clientside": `var errThrottled error
var retryAfter time.Duration
func call() (*http.Response, error)
func overloaded(*http.Response, error) bool
func retryable(*http.Response, error) bool`,
	"concurrency":   "var ctx context.Context\nvar userID string",
	"globalceiling": "var ctx context.Context\nvar db *sql.DB",
	"httpx":         "var chain spillway.Limiter\nvar mux *http.ServeMux\nvar searchHandler http.Handler",
	"ratelimit":     "var ctx context.Context\nvar clientIP string",
	"shedder":       "var ctx context.Context\nvar rateLimits spillway.Limiter\nvar req *http.Request",
	"telemetry":     "var chain spillway.Limiter",
	"tiers":         "var ctx context.Context\nvar clientIP string",
}

// The shortest use in the package doc of every package of this module
// compiles.
func TestPackageDocSnippets(t *testing.T) {
	var snippets []docsnippet.Snippet
	for _, pkg := range []string{".", "clientside", "concurrency", "fallback", "globalceiling", "httpx", "ratelimit", "shedder", "telemetry", "tiers"} {
		src, err := os.ReadFile(filepath.Join("../..", pkg, "doc.go"))
		if err != nil {
			t.Fatal(err)
		}
		code, err := docsnippet.ShortestUse(string(src))
		if err != nil {
			t.Errorf("%s/doc.go: %v", pkg, err)
			continue
		}
		snippets = append(snippets, docsnippet.Snippet{Name: pkg + "/doc.go", Code: code, Given: given[pkg]})
	}
	docsnippet.Check(t, ".", snippets...)
}
