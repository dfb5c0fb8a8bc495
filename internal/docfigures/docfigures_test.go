// Package docfigures holds one documentation check, a test only: a figure
// measured in README.md has at most one home besides the README
// (docs/measurements.md, docs/loadtest.md or the package page that holds
// its raw log), so that a rerun changes one file, not several.
// scripts/test.sh runs it with the checks, before the tests.
package docfigures

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// figureRE matches a figure: a number (decimals, thousands separators),
// optionally a range ("2.5–4×"), a space or none, and a unit. A figure in
// seconds counts only with a fraction ("1.13 s"): whole seconds in the
// README are durations the reader sets (90 s of load, a 60 s window).
var figureRE = regexp.MustCompile(`(\d+(?:[.,]\d+)*(?:[ \x{a0}]?[–-][ \x{a0}]?\d+(?:[.,]\d+)*)?)[ \x{a0}]?([µμ]s|ns|ms|s|%|×)`)

// bounds mark a target: a figure right after one of them ("≥ 1.5×",
// "within 5%", "under 1 ms", "budget + 20 ms") is a bound the project sets,
// not a figure a run produced. A "+" counts only with a space after it:
// "+262 µs" is a measured difference.
var bounds = []string{"≥", "≤", "<", ">", "within", "under", "at most"}

// allowed are figures of the README that are neither measured nor stated
// as bounds and that other files repeat on purpose. Keep it short.
var allowed = map[string]string{
	"10×":      "the harness's spike, a scenario parameter",
	"70%":      "the uneven scenario's share of traffic on one server, a parameter",
	"20%":      "defaults: the fleet shedder's Critical reserve, fallback's local share",
	"50 ms":    "the chain's default budget per request",
	"200ms":    "the quickstart's printed retry_after, fixed by its policy",
	"250 ms":   "the harness's gauge interval, a flag default",
	"0.8–1.2×": "the accuracy target's source rates, a test parameter",
}

// figures returns the figures of the README that are not stated as
// bounds, each once, sorted.
func figures(readme string) []string {
	seen := map[string]bool{}
	for _, m := range figureRE.FindAllStringSubmatchIndex(readme, -1) {
		start, end := m[0], m[1]
		number, unit := readme[m[2]:m[3]], readme[m[4]:m[5]]
		if !boundary(readme, start, end) || unit == "s" && !strings.Contains(number, ".") {
			continue // inside a word or a number, or whole seconds
		}
		pre := strings.ReplaceAll(readme[max(0, start-16):start], "\n", " ")
		if strings.HasSuffix(pre, "+ ") || hasBound(strings.TrimRight(pre, " \u00a0")) {
			continue
		}
		seen[readme[start:end]] = true
	}
	out := make([]string, 0, len(seen))
	for f := range seen {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

func hasBound(pre string) bool {
	for _, b := range bounds {
		if strings.HasSuffix(pre, b) {
			return true
		}
	}
	return false
}

// boundary reports whether text[start:end] stands alone: not inside a
// number or a word before it ("11.5×" holds no "1.5×", "0.8–1.2×" no
// "1.2×", "−6%" no "6%"), nor followed by a letter or digit ("3×3", "5 msg").
func boundary(text string, start, end int) bool {
	if start > 0 {
		r, _ := utf8.DecodeLastRuneInString(text[:start])
		if unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune(".,-–−", r) {
			return false
		}
	}
	if end < len(text) {
		r, _ := utf8.DecodeRuneInString(text[end:])
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			return false
		}
	}
	return true
}

// contains reports whether text holds fig verbatim, standing alone.
func contains(text, fig string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], fig)
		if j < 0 {
			return false
		}
		if boundary(text, i+j, i+j+len(fig)) {
			return true
		}
		i += j + 1
	}
}

// duplicates returns, for each figure of the README that is not allowed,
// the files other than the README that hold it, when there are more than
// one: each finding is a figure with more than one home.
func duplicates(readme string, files map[string]string) []string {
	var out []string
	for _, fig := range figures(readme) {
		if _, ok := allowed[fig]; ok {
			continue
		}
		var in []string
		for name, text := range files {
			if contains(text, fig) {
				in = append(in, name)
			}
		}
		if len(in) > 1 {
			sort.Strings(in)
			out = append(out, fmt.Sprintf("%q is in %d files besides README.md: %s", fig, len(in), strings.Join(in, ", ")))
		}
	}
	return out
}

// TestReadmeFiguresHaveOneHome fails when a figure measured in README.md
// (a number with µs, ns, ms, a fraction of s, % or ×, not stated as a
// bound and not allowed above) is in more than one other file git tracks.
// Keep such a figure in docs/measurements.md (or the page with its raw log)
// and link to it from the others, or state a target or a ratio instead.
func TestReadmeFiguresHaveOneHome(t *testing.T) {
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse --show-toplevel: %v (the check reads the files git tracks)", err)
	}
	root := strings.TrimSpace(string(top))
	list, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		if name == "README.md" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree, not yet in the index
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
			continue // binary (plots)
		}
		files[name] = string(b)
	}
	if len(files) < 100 {
		t.Fatalf("read %d tracked files: git ls-files did not list the repository", len(files))
	}
	figs := figures(string(readme))
	have := map[string]bool{}
	for _, f := range figs {
		have[f] = true
	}
	for f := range allowed {
		if !have[f] {
			t.Errorf("allowed figure %q is no longer in README.md: remove it from the allow-list", f)
		}
	}
	for _, d := range duplicates(string(readme), files) {
		t.Error(d)
	}
	t.Logf("%d figures of README.md checked against %d files: %q", len(figs), len(files), figs)
}

// The check finds what it is meant to find, and passes over what it must.
func TestReadmeFiguresCheckFails(t *testing.T) {
	readme := "Decisions/s: 2.53× the reference (≥ 2× targeted), p99 +262 µs; a lone caller within\n" +
		"5%, done ≤ 20 µs, budget + 20 ms, under 1 ms; a 3×3 Cluster; 90 s of load; closed 1.13 s after.\n"
	if got, want := figures(readme), []string{"1.13 s", "2.53×", "262 µs"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("figures = %q, want %q", got, want)
	}
	files := map[string]string{
		"docs/measurements.md": "**2.53×** (2.75 2.53 2.42); p99 +262 µs",
		"docs/ratelimit.md":    "decisions/s 2.53× redis_rate's; 12.53× elsewhere; 1.13 s",
		"bench/README.md":      "262 µsec; 0.262 µs; 1.13 seconds",
	}
	got := duplicates(readme, files)
	if len(got) != 1 || !strings.HasPrefix(got[0], `"2.53×" is in 2 files`) {
		t.Fatalf("duplicates = %q, want one finding, for 2.53×", got)
	}
	delete(files, "docs/ratelimit.md")
	if got := duplicates(readme, files); len(got) != 0 {
		t.Fatalf("one home each: duplicates = %q, want none", got)
	}
}
