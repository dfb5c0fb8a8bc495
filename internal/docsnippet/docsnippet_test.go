package docsnippet_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
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
	"ratelimit":     "var ctx context.Context\nvar clientIP string\nvar lim *ratelimit.Limiter\nvar apiKey string\nfunc generate() int64",
	"shedder":       "var ctx context.Context\nvar rateLimits spillway.Limiter\nvar req *http.Request",
	"telemetry":     "var chain spillway.Limiter",
	"tiers":         "var ctx context.Context\nvar clientIP string",
}

// The package doc of every package of this module has a shortest use,
// and every code block of it (the shortest use and any other) compiles.
func TestPackageDocSnippets(t *testing.T) {
	var snippets []docsnippet.Snippet
	for _, pkg := range []string{".", "clientside", "concurrency", "fallback", "globalceiling", "httpx", "lua", "ratelimit", "shedder", "telemetry", "tiers"} {
		src, err := os.ReadFile(filepath.Join("../..", pkg, "doc.go"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := docsnippet.ShortestUse(string(src)); err != nil {
			t.Errorf("%s/doc.go: %v", pkg, err)
		}
		blocks, err := docBlocks(string(src))
		if err != nil {
			t.Fatalf("%s/doc.go: %v", pkg, err)
		}
		for i, code := range blocks {
			snippets = append(snippets, docsnippet.Snippet{Name: fmt.Sprintf("%s/doc.go, code block %d", pkg, i+1), Code: code, Given: given[pkg]})
		}
	}
	docsnippet.Check(t, ".", snippets...)
}

// docBlocks returns the code blocks (the lines indented by a tab) of the
// package doc of the Go file src.
func docBlocks(src string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", src, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		return nil, err
	}
	if f.Doc == nil {
		return nil, fmt.Errorf("no package doc")
	}
	var out []string
	var b strings.Builder
	for _, line := range strings.Split(f.Doc.Text(), "\n") {
		switch {
		case strings.HasPrefix(line, "\t"):
			b.WriteString(line[1:] + "\n")
		case line == "" && b.Len() > 0:
			b.WriteString("\n")
		case b.Len() > 0:
			out = append(out, b.String())
			b.Reset()
		}
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out, nil
}
