package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// apiCounts counts, per package (its last path element; "spillway" for the
// root), what api/spillway.txt records: names (top-level types, funcs and
// vars), consts, and methods (methods of exported types, interface methods
// included). A struct's field lines count for nothing.
func apiCounts(t *testing.T, path string) map[string][3]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := regexp.MustCompile(`^pkg github\.com/spillway-go/spillway(/[a-z]+)?, (const|func|var|method|type) (\S+)( interface,| struct,)?`)
	counts := map[string][3]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "#") || sc.Text() == "" {
			continue
		}
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			t.Fatalf("%s: a line this test does not read: %q", path, sc.Text())
		}
		pkg := strings.TrimPrefix(m[1], "/")
		if pkg == "" {
			pkg = "spillway"
		}
		c := counts[pkg]
		switch {
		case m[2] == "const":
			c[1]++
		case m[2] == "method" || m[4] == " interface,":
			c[2]++
		case m[4] == " struct,":
		default:
			c[0]++
		}
		counts[pkg] = c
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return counts
}

// TestDocsAPICounts checks that docs/api.md's counts (names, consts,
// methods per package and in all) are those of api/spillway.txt, so the
// table cannot drift from the frozen surface.
func TestDocsAPICounts(t *testing.T) {
	counts := apiCounts(t, "../../"+golden)
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| (?:`([a-z]+)`|\\*\\*all\\*\\*) \\|.*\\| \\**(\\d+)\\** \\| \\**(\\d+)\\** \\| \\**(\\d+)\\** \\|$")
	var total [3]int
	for _, c := range counts {
		for i := range c {
			total[i] += c[i]
		}
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(string(doc), "\n") {
		m := row.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		want, pkg := total, "all"
		if m[1] != "" {
			pkg = m[1]
			c, ok := counts[pkg]
			if !ok {
				t.Errorf("docs/api.md has a row for %s, which api/spillway.txt does not record", pkg)
				continue
			}
			want = c
		}
		seen[pkg] = true
		if got := fmt.Sprintf("%s %s %s", m[2], m[3], m[4]); got != fmt.Sprintf("%d %d %d", want[0], want[1], want[2]) {
			t.Errorf("docs/api.md, %s: names consts methods %s; api/spillway.txt: %d %d %d", pkg, got, want[0], want[1], want[2])
		}
	}
	for pkg := range counts {
		if !seen[pkg] {
			t.Errorf("docs/api.md has no row for %s", pkg)
		}
	}
	if !seen["all"] {
		t.Error("docs/api.md has no row for all")
	}
}
