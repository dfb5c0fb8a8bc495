package docsnippet

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"strings"
	"testing"
)

// CompileErrors type-checks one snippet as Check does and returns its
// errors (none when it compiles): a package's test shows with it that a
// misuse of its API (an option of one constructor passed to another) does
// not compile.
func CompileErrors(t testing.TB, dir string, s Snippet) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, s.Name, Source(s), 0)
	if err != nil {
		return []string{err.Error()}
	}
	paths := map[string]bool{}
	for _, imp := range f.Imports {
		paths[strings.Trim(imp.Path.Value, `"`)] = true
	}
	exports, err := exportData(dir, paths)
	if err != nil {
		t.Fatal(err)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
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
