package docsnippet_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// otherModule matches a fragment that uses a package the library's module
// does not build (grpc, the OpenTelemetry SDK and exporters): it is left
// to the module that has them.
var otherModule = regexp.MustCompile(`\b(grpc|sdkmetric|sdktrace|otelhttp|otelgrpc|otlptracegrpc|otlpmetricgrpc|attribute|resource|pb)\.`)

// elided turns what a guide leaves out ("if err != nil { … }",
// "Chain(a, …)", "generate(…)") into Go.
var elided = strings.NewReplacer("{ … }", "{}", ", …)", ")", "(…)", "()")

// Every Go block of the guides under docs/ type-checks against the
// library as it is: a function, field, method or argument list it uses is
// there. A guide's fragments use what an earlier one built (chain, rdb,
// store), so names they neither declare nor import are left unchecked;
// a project package's member is always checked ("undefined:
// ratelimit.AllowN" fails).
func TestGuideGoBlocks(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var snippets []docsnippet.Snippet
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, bl := range docsnippet.GoBlocks(string(b)) {
			if otherModule.MatchString(bl.Code) {
				continue
			}
			snippets = append(snippets, docsnippet.Snippet{
				Name:    "docs/" + filepath.Base(file) + ":" + strconv.Itoa(bl.Line),
				Code:    elided.Replace(bl.Code),
				Given:   "var ctx context.Context",
				Partial: true,
			})
		}
	}
	if len(snippets) < 10 {
		t.Fatalf("%d Go blocks in docs/*.md: the guides' blocks were not found", len(snippets))
	}
	docsnippet.Check(t, ".", snippets...)
}
