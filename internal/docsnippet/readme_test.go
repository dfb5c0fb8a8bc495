package docsnippet_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
)

// readmeGiven declares the names the README's fragments take as given:
// the blocks a service built (each section of the README shows how) and
// the root package's types, for the block that quotes its declarations.
const readmeGiven = `var (
	rateTiers *tiers.Limiter
	conc      *concurrency.Limiter
	fleet     *shedder.Fleet
	worker    *shedder.Worker
	ceiling   *globalceiling.Ceiling
	mux       *http.ServeMux
)

type (
	Request  = spillway.Request
	Decision = spillway.Decision
	Done     = spillway.Done
)`

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every Go block of the README compiles.
func TestReadmeGoBlocks(t *testing.T) {
	blocks := docsnippet.GoBlocks(readme(t))
	if len(blocks) == 0 {
		t.Fatal("no Go block in README.md")
	}
	var snippets []docsnippet.Snippet
	for _, b := range blocks {
		snippets = append(snippets, docsnippet.Snippet{Name: "README.md:" + strconv.Itoa(b.Line), Code: b.Code, Given: readmeGiven})
	}
	docsnippet.Check(t, ".", snippets...)
}

// The quickstart prints what the README says it prints: its program is
// run, and its output compared with the block that follows it.
func TestReadmeQuickstartOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	md := readme(t)
	i := strings.Index(md, "## Quickstart")
	if i < 0 {
		t.Fatal("README.md has no Quickstart section")
	}
	section := md[i:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	progs, outs := docsnippet.GoBlocks(section), docsnippet.Blocks(section, "text")
	if len(progs) != 1 || len(outs) != 1 {
		t.Fatalf("the Quickstart section has %d Go blocks and %d text blocks; want one program and its output", len(progs), len(outs))
	}
	// The program runs as a file of this module (an overlay: nothing is
	// written to the tree).
	dir := t.TempDir()
	main := filepath.Join(dir, "main.go")
	if err := os.WriteFile(main, []byte(progs[0].Code), 0o644); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(wd, "quickstart_overlay", "main.go")
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {target: main}})
	if err := os.WriteFile(filepath.Join(dir, "overlay.json"), overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "-overlay", filepath.Join(dir, "overlay.json"), target)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	want := strings.Split(strings.TrimRight(outs[0].Code, "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("the quickstart printed\n%s\nthe README says\n%s", out, outs[0].Code)
	}
	for k := range want {
		if got[k] == want[k] {
			continue
		}
		// A retry_after counts from the decision: the microseconds
		// between the first call and the denial may take the last
		// millisecond off (durations are rounded up to milliseconds).
		if gm, wm := retryRE.FindStringSubmatch(got[k]), retryRE.FindStringSubmatch(want[k]); gm != nil && wm != nil && gm[1] == wm[1] {
			g, _ := strconv.Atoi(gm[2])
			w, _ := strconv.Atoi(wm[2])
			if g <= w && g >= w-10 {
				continue
			}
		}
		t.Errorf("line %d: the quickstart printed %q, the README says %q", k+1, got[k], want[k])
	}
}

var retryRE = regexp.MustCompile(`^(.*retry_after=)(\d+)ms$`)
