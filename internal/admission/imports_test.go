package admission

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The adapters stand on the contract: outside their tests, httpx and grpcx
// import of this module only the root package, clientside and internal
// packages — never a block (tiers, shedder, fallback, …).
func TestAdaptersImportOnlyTheContract(t *testing.T) {
	const module = "github.com/spillway-go/spillway"
	allowed := func(path string) bool {
		return path == module || path == module+"/clientside" || strings.HasPrefix(path, module+"/internal/")
	}
	for _, dir := range []string{"../../httpx", "../../grpcx"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(path, module) && !allowed(path) {
					t.Errorf("%s imports %s: adapters import only the root package, clientside and internal packages", f, path)
				}
			}
		}
	}
}
