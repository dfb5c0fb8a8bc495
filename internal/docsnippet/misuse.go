package docsnippet

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"strings"
	"testing"
)

// CompileErrors type-checks s like Check, built from dir, and returns its
// errors (but "declared and not used" and unused imports) instead of
// failing: a test that a misuse of an API does not compile asserts them.
func CompileErrors(t testing.TB, dir string, s Snippet) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, s.Name, Source(s), 0)
	if err != nil {
		t.Fatalf("%s: does not parse: %v\n%s", s.Name, err, numbered(Source(s)))
	}
	paths := map[string]bool{}
	for _, imp := range f.Imports {
		paths[strings.Trim(imp.Path.Value, `"`)] = true
	}
	imp, err := importerFor(fset, dir, paths)
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	conf := types.Config{Importer: imp, Error: func(err error) {
		if te, ok := err.(types.Error); ok && te.Soft && (strings.Contains(te.Msg, "declared and not used") || strings.Contains(te.Msg, "imported and not used")) {
			return
		}
		errs = append(errs, err.Error())
	}}
	_, _ = conf.Check("snippet", fset, []*ast.File{f}, nil)
	return errs
}
