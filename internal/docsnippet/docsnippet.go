// Package docsnippet type-checks the Go snippets of the documentation: the
// "shortest use" block of each package doc and the Go blocks of Markdown
// pages, so that a snippet that names what is not there (a field, a
// function, a second return value it ignores) fails a test. A module's
// tests call Check with the snippets of its packages.
//
// A snippet is one of: a whole file (it starts with "package"); top-level
// declarations; or statements, checked as the body of a function. It may
// start with its own imports ("import "github.com/redis/go-redis/v9""):
// every package outside the standard library and this project must be
// imported there, so that a reader sees its path. The packages of this
// project and of the standard library are imported for it when it names
// them. Statements run in a function that returns an error (err), so
// that a snippet may "return err". The names a snippet takes as given (a
// handler, ctx) are declared by the test, in Snippet.Given. "Declared and
// not used" is not an error in a snippet.
package docsnippet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Snippet is one piece of documented Go code.
type Snippet struct {
	Name  string // where it comes from, for messages: "concurrency/doc.go"
	Code  string
	Given string // top-level declarations of the names the snippet assumes, after their imports
	// Partial leaves the names the snippet neither declares nor is given
	// unchecked ("undefined: x" is not an error; "undefined: pkg.X" is):
	// for a guide's fragment that uses what an earlier one built.
	Partial bool
}

// Module is the import path of this project's root package.
const Module = "github.com/spillway-go/spillway"

// known maps a package name a snippet may use without importing it to its
// path: the standard library's that docs use, and this project's.
var known = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "time": "time", "http": "net/http",
	"sql": "database/sql", "log": "log", "os": "os", "net": "net", "netip": "net/netip",
	"spillway": Module, "clientside": Module + "/clientside", "concurrency": Module + "/concurrency",
	"fallback": Module + "/fallback", "globalceiling": Module + "/globalceiling", "httpx": Module + "/httpx",
	"ratelimit": Module + "/ratelimit", "shedder": Module + "/shedder", "telemetry": Module + "/telemetry",
	"tiers": Module + "/tiers", "grpcx": Module + "/grpcx", "rls": Module + "/rls", "lua": Module + "/lua",
}

// ShortestUse returns the code block that follows "The shortest use:" (or
// "The shortest use, in process:") in
// the package doc of the Go file src (a doc.go), without the comment
// markers and the tab that makes it code.
func ShortestUse(src string) (string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "doc.go", src, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		return "", err
	}
	if f.Doc == nil {
		return "", fmt.Errorf("no package doc")
	}
	text := f.Doc.Text()
	loc := shortestRE.FindStringIndex(text)
	if loc == nil {
		return "", fmt.Errorf(`no "The shortest use…:" in the package doc`)
	}
	i := loc[0]
	var b strings.Builder
	started := false
	for _, line := range strings.Split(text[i:], "\n")[1:] {
		switch {
		case strings.HasPrefix(line, "\t"):
			started = true
			b.WriteString(line[1:])
			b.WriteByte('\n')
		case line == "" && !started:
		case line == "":
			b.WriteByte('\n') // a blank line inside the block, or its end
		default:
			if started {
				return strings.TrimRight(b.String(), "\n") + "\n", nil
			}
			return "", fmt.Errorf("no code block after %q", text[loc[0]:loc[1]])
		}
	}
	if !started {
		return "", fmt.Errorf("no code block after %q", text[loc[0]:loc[1]])
	}
	return strings.TrimRight(b.String(), "\n") + "\n", nil
}

// Block is a fenced block of a Markdown page.
type Block struct {
	Line int    // of the opening fence, 1-based
	Code string // without the fences
}

// GoBlocks returns the ```go blocks of the Markdown page md.
func GoBlocks(md string) []Block {
	return Blocks(md, "go")
}

// Blocks returns the fenced blocks of md whose info string is lang (""
// for blocks with none).
func Blocks(md, lang string) []Block {
	var out []Block
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		info, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		start := i
		var b strings.Builder
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			b.WriteString(lines[i])
			b.WriteByte('\n')
		}
		if strings.TrimSpace(info) == lang {
			out = append(out, Block{Line: start + 1, Code: b.String()})
		}
	}
	return out
}

var (
	shortestRE  = regexp.MustCompile(`(?i)shortest use[^:\n]*:`)
	importLine  = regexp.MustCompile(`^import\s+(?:\w+\s+)?"[^"]+"\s*$`)
	importBlock = regexp.MustCompile(`(?s)^import\s*\(.*?\n\)\s*\n?`)
	selector    = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Za-z_]`)
	// bareUndefined is the error of a name used without a declaration,
	// not of a package's missing member ("undefined: ratelimit.AllowN").
	bareUndefined = regexp.MustCompile(`^undefined: [A-Za-z_][A-Za-z0-9_]*$`)
)

// Source returns the Go file a snippet is checked as.
func Source(s Snippet) string {
	code := s.Code
	if strings.HasPrefix(strings.TrimSpace(code), "package ") {
		return code
	}
	// The snippet's own imports, at its top, and the given's.
	own, code := cutImports(code)
	givenImports, given := cutImports(s.Given)
	ownText := strings.Join(append(own, givenImports...), "\n")
	var body string
	if isStatements(code) {
		// A named error result: a snippet may "return err".
		body = "func _() (err error) {\n" + code + "return\n}\n"
	} else {
		body = code
	}
	// The project's and the standard library's packages it names.
	names := map[string]bool{}
	for _, m := range selector.FindAllStringSubmatch(body+"\n"+given, -1) {
		names[m[1]] = true
	}
	var auto []string
	for n := range names {
		p, ok := known[n]
		if !ok || strings.Contains(ownText, `"`+p+`"`) {
			continue
		}
		auto = append(auto, fmt.Sprintf("import %s %q", n, p))
	}
	sort.Strings(auto)
	var b strings.Builder
	b.WriteString("package snippet\n\n")
	if ownText != "" {
		b.WriteString(ownText + "\n")
	}
	for _, a := range auto {
		b.WriteString(a + "\n")
	}
	b.WriteString("\n" + given + "\n\n" + body)
	return b.String()
}

// cutImports splits the import declarations at the top of code from the
// rest.
func cutImports(code string) (imports []string, rest string) {
	for {
		code = strings.TrimLeft(code, "\n")
		if m := importBlock.FindString(code); m != "" {
			imports = append(imports, strings.TrimSpace(m))
			code = code[len(m):]
			continue
		}
		line, after, _ := strings.Cut(code, "\n")
		if importLine.MatchString(line) {
			imports = append(imports, strings.TrimSpace(line))
			code = after
			continue
		}
		return imports, code
	}
}

// isStatements reports whether code parses as a function body.
func isStatements(code string) bool {
	_, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+code+"\n}\n", 0)
	return err == nil
}

// Check type-checks each snippet against the packages as built from dir
// (the calling test's directory: its module, or the workspace), and
// reports every error but "declared and not used" and unused imports.
func Check(t testing.TB, dir string, snippets ...Snippet) {
	t.Helper()
	fset := token.NewFileSet()
	files := make([]*ast.File, len(snippets))
	paths := map[string]bool{}
	for i, s := range snippets {
		f, err := parser.ParseFile(fset, s.Name, Source(s), 0)
		if err != nil {
			t.Errorf("%s: does not parse: %v\n%s", s.Name, err, numbered(Source(s)))
			continue
		}
		files[i] = f
		for _, imp := range f.Imports {
			paths[strings.Trim(imp.Path.Value, `"`)] = true
		}
	}
	if len(paths) == 0 {
		return
	}
	imp, err := importerFor(fset, dir, paths)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range snippets {
		if files[i] == nil {
			continue
		}
		var errs []string
		conf := types.Config{Importer: imp, Error: func(err error) {
			if te, ok := err.(types.Error); ok && te.Soft && (strings.Contains(te.Msg, "declared and not used") || strings.Contains(te.Msg, "imported and not used")) {
				return
			}
			if te, ok := err.(types.Error); ok && s.Partial && bareUndefined.MatchString(te.Msg) {
				return
			}
			errs = append(errs, err.Error())
		}}
		_, _ = conf.Check("snippet", fset, []*ast.File{files[i]}, nil)
		if len(errs) > 0 {
			t.Errorf("%s does not compile:\n\t%s\nchecked as:\n%s", s.Name, strings.Join(errs, "\n\t"), numbered(Source(s)))
		}
	}
}

// exportData returns the export data file of each package in paths and
// their dependencies, built from dir.
func exportData(dir string, paths map[string]bool) (map[string]string, error) {
	args := []string{"list", "-e", "-export", "-deps", "-json=ImportPath,Export,Error"}
	for p := range paths {
		args = append(args, p)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.String())
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath, Export string
			Error              *struct{ Err string }
		}
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
	}
	return exports, nil
}

func numbered(src string) string {
	var b strings.Builder
	for i, l := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, l)
	}
	return b.String()
}

// importerFor returns an importer of the export data of paths, built from
// dir (go list -export).
func importerFor(fset *token.FileSet, dir string, paths map[string]bool) (types.Importer, error) {
	exports, err := exportData(dir, paths)
	if err != nil {
		return nil, err
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	}), nil
}
