package shedder_test

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMisappliedOptionDoesNotCompile type-checks calls that give a
// constructor an option of another: each must be a compile error naming
// the constructor's option type, and the same calls with options that
// apply must compile.
func TestMisappliedOptionDoesNotCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const pkg = "github.com/spillway-go/spillway/shedder"
	out, err := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Export", pkg, "time").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	exports := map[string]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
	}
	check := func(stmt string) []string {
		src := "package p\nimport (\n\t\"time\"\n\t\"github.com/spillway-go/spillway/shedder\"\n)\nvar _ = time.Now\nfunc _() {\n" + stmt + "\n}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "snippet.go", src, 0)
		if err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
		var errs []string
		conf := types.Config{Importer: imp, Error: func(err error) { errs = append(errs, err.Error()) }}
		_, _ = conf.Check("p", fset, []*ast.File{f}, nil)
		return errs
	}
	for _, c := range []struct{ bad, good, want string }{
		{`shedder.NewWorker(10, shedder.WithReservations())`, `shedder.NewWorker(10, shedder.WithReserve(0.1))`, "WorkerOption"},
		{`shedder.NewQueue(4, shedder.WithFleet(nil))`, `shedder.NewPool(nil, shedder.WithFleet(nil))`, "QueueOption"},
		{`shedder.NewFleet(nil, "f", 10, shedder.WithName("db"))`, `shedder.NewFleet(nil, "f", 10, shedder.WithServerID("a"))`, "FleetOption"},
		{`shedder.NewPool(nil, shedder.WithReserve(0.1))`, `shedder.NewPool(nil, shedder.WithMaxWait(time.Second))`, "PoolOption"},
		{`shedder.NewCapacityWatcher(nil, nil, nil, shedder.WithClock(time.Now))`, `shedder.NewCapacityWatcher(nil, nil, nil, shedder.WithInterval(time.Second))`, "WatcherOption"},
	} {
		errs := check(c.bad)
		if len(errs) != 1 || !strings.Contains(errs[0], "does not implement shedder."+c.want) {
			t.Errorf("%s: got errors %q, want one naming shedder.%s", c.bad, errs, c.want)
		}
		if errs := check(c.good); len(errs) != 0 {
			t.Errorf("%s: does not compile: %q", c.good, errs)
		}
	}
}
