package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// The harness proves the library's chain, so it must not decide admission
// itself: every Admit in loadtest/ (a method, or a func given to
// block.LimiterFunc) hands the request to a library block (it calls an
// Admit, Allow or AllowN) and builds no Decision of its own, and nothing
// implements a Pool's learner (Learn; concurrency.Algorithm is sealed, so
// the compiler keeps the harness from implementing one), or sizes a block from outside (SetSlots,
// SetCap, SetCapacity, Raise, Overdue: the library's Pool and
// CapacityWatcher do that; checked in chains/). The deliberately wrong configurations, "none"
// and "naive" (buildNone, buildNaive), are exempt. CI runs this test
// (scripts/test.sh runs it by name as well).
func TestNoAdmissionOutsideTheLibrary(t *testing.T) {
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		n++
		for _, p := range admissionFindings(fset, f, strings.HasPrefix(filepath.ToSlash(path), "chains/")) {
			t.Error(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("checked %d files: the walk did not find the harness's sources", n)
	}
}

// The check finds what it is meant to find.
func TestAdmissionCheckFails(t *testing.T) {
	for name, src := range map[string]string{
		"an Admit that decides": `package x
type lim struct{ n int }
func (l *lim) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	l.n++
	return spillway.Decision{Allowed: l.n < 10}, spillway.Noop, nil
}`,
		"an Admit that overrides the block": `package x
type wrap struct{ inner spillway.Limiter }
func (w wrap) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	d, done, err := w.inner.Admit(ctx, r)
	d.Allowed = true
	return d, done, err
}`,
		"a LimiterFunc that decides": `package x
func buildFull() spillway.Limiter {
	return block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{}, spillway.Noop, nil
	})
}`,
		"a pool that sizes itself": `package x
func (p *pool) resize() { _ = p.q.SetSlots(p.alg.Limit()) }`,
		"a Learner": `package x
type learner struct{}
func (l *learner) Learn(start time.Time, rtt time.Duration, inFlight int, o spillway.Outcome) {}`,
	} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "x.go", src, 0)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(admissionFindings(fset, f, true)) == 0 {
			t.Errorf("%s: not found", name)
		}
	}
	// and passes what it is meant to pass.
	ok := `package x
type tagged struct{ block string; inner spillway.Limiter }
func (t tagged) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	d, done, err := t.inner.Admit(ctx, r)
	if err == nil && !d.Allowed {
		d.Limiter = t.block
	}
	return d, done, err
}
func buildNaive() spillway.Limiter {
	return block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		return spillway.Decision{Allowed: true}, spillway.Noop, nil
	})
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "ok.go", ok, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p := admissionFindings(fset, f, true); len(p) > 0 {
		t.Errorf("a wrapper that hands on, and naive: %v", p)
	}
}

// exemptBuilders build the deliberately wrong configurations, which may
// decide for themselves.
var exemptBuilders = map[string]bool{"buildNone": true, "buildNaive": true}

// admissionFindings lists, in f, the admission decided outside the
// library's blocks; with sizing (the chains), also the calls that size a
// block from outside (the simulated database's capacity is set by the
// phases, elsewhere).
func admissionFindings(fset *token.FileSet, f *ast.File, sizing bool) []string {
	var out []string
	report := func(n ast.Node, format string) {
		out = append(out, fset.Position(n.Pos()).String()+": "+format)
	}
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil || exemptBuilders[fd.Name.Name] {
			continue
		}
		if fd.Recv != nil {
			switch fd.Name.Name {
			case "Admit":
				if why := decides(fd.Body); why != "" {
					report(fd, "Admit "+why)
				}
			case "Learn":
				if paramOfType(fd.Type, "spillway", "Outcome") {
					report(fd, "Learn(…, spillway.Outcome): implements a Pool's learner")
				}
			}
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sizing {
				switch sel.Sel.Name {
				case "SetSlots", "SetCap", "SetCapacity", "Raise", "Overdue":
					report(call, fd.Name.Name+" calls "+sel.Sel.Name+": sizes a block itself")
				}
			}
			if !isSelector(call.Fun, "block", "LimiterFunc") || len(call.Args) != 1 {
				return true
			}
			if lit, ok := call.Args[0].(*ast.FuncLit); ok {
				if why := decides(lit.Body); why != "" {
					report(lit, "block.LimiterFunc in "+fd.Name.Name+" "+why)
				}
			}
			return true
		})
	}
	return out
}

// decides says why body decides by itself ("" when it hands the request
// on): it calls no Admit, Allow or AllowN, builds a spillway.Decision, or
// sets a Decision's Allowed.
func decides(body *ast.BlockStmt) string {
	handsOn, why := false, ""
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
				switch sel.Sel.Name {
				case "Admit", "Allow", "AllowN":
					handsOn = true
				}
			}
		case *ast.CompositeLit:
			if isSelector(n.Type, "spillway", "Decision") && why == "" {
				why = "builds a spillway.Decision of its own"
			}
		case *ast.AssignStmt:
			for _, lhs := range n.Lhs {
				if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "Allowed" && why == "" {
					why = "sets Allowed itself"
				}
			}
		}
		return true
	})
	if why == "" && !handsOn {
		why = "does not hand the request to a library block (no Admit, Allow or AllowN)"
	}
	return why
}

func isSelector(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

func paramOfType(ft *ast.FuncType, pkg, name string) bool {
	for _, p := range ft.Params.List {
		if isSelector(p.Type, pkg, name) {
			return true
		}
	}
	return false
}
