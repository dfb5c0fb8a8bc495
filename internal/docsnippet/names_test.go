package docsnippet_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// project maps the name a reader writes before the dot to the import
// path api/spillway.txt lists the package under.
var project = map[string]string{
	"spillway": "github.com/spillway-go/spillway",
}

func init() {
	for _, p := range []string{"clientside", "concurrency", "fallback", "globalceiling", "grpcx", "httpx", "lua", "ratelimit", "rls", "shedder", "telemetry", "tiers"} {
		project[p] = "github.com/spillway-go/spillway/" + p
	}
}

// exported reads api/spillway.txt: for each package path, its exported
// names, and for each of its types the fields and methods
// ("Settings.FailMode", "Limiter.Reserve").
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	f, err := os.Open("../../api/spillway.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := regexp.MustCompile(`^pkg (\S+), (const|func|var|type|method) (.*)$`)
	method := regexp.MustCompile(`^\(\*?(\w+)\) (\w+)`)
	member := regexp.MustCompile(`^(\w+) (?:struct|interface), (\w+)`)
	api := map[string]map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		names := api[m[1]]
		if names == nil {
			names = map[string]bool{}
			api[m[1]] = names
		}
		if m[2] == "method" {
			if mm := method.FindStringSubmatch(m[3]); mm != nil {
				names[mm[1]+"."+mm[2]] = true
			}
			continue
		}
		if mm := member.FindStringSubmatch(m[3]); mm != nil {
			names[mm[1]+"."+mm[2]] = true
		}
		names[regexp.MustCompile(`^\w+`).FindString(m[3])] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(api) < len(project) {
		t.Fatalf("api/spillway.txt lists %d packages, want %d", len(api), len(project))
	}
	return api
}

// qualified is a project name as prose writes it: "ratelimit.PerKey",
// "fallback.Settings.Share", "spillway.Request.EffectiveCost".
var qualified = regexp.MustCompile(`\b(spillway|clientside|concurrency|fallback|globalceiling|grpcx|httpx|lua|ratelimit|rls|shedder|telemetry|tiers)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)

// option is a bare functional option in code quotes (`WithWindow`): the
// API has none left, so one in the docs names what was removed.
var option = regexp.MustCompile("`(With[A-Z]\\w*)")

// The README and the guides under docs/ name only what the exported API
// has: a qualified name (pkg.Name, pkg.Type.Field, pkg.Type.Method) is in
// api/spillway.txt, and no functional option (`WithX`) is named bare. A
// name cut from the API fails here until the docs stop naming it.
func TestDocsNameExportedAPI(t *testing.T) {
	api := exported(t)
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	sort.Strings(files)
	bare := map[string]bool{}
	for _, names := range api {
		for n := range names {
			bare[n] = true
		}
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(file, "../../")
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range qualified.FindAllStringSubmatch(line, -1) {
				names := api[project[m[1]]]
				switch {
				case !names[m[2]]:
					t.Errorf("%s:%d: %s.%s is not in the exported API (api/spillway.txt)", name, i+1, m[1], m[2])
				case m[3] != "" && !names[m[2]+"."+m[3]] && hasMembers(names, m[2]):
					t.Errorf("%s:%d: %s.%s.%s: %s has no exported field or method %s", name, i+1, m[1], m[2], m[3], m[2], m[3])
				}
			}
			for _, m := range option.FindAllStringSubmatch(line, -1) {
				if !bare[m[1]] {
					t.Errorf("%s:%d: `%s` is not in the exported API (api/spillway.txt)", name, i+1, m[1])
				}
			}
		}
	}
}

// hasMembers reports whether the API lists fields or methods of typ: a
// name after a function or a constant ("spillway.Critical.String") is not
// checked as a member.
func hasMembers(names map[string]bool, typ string) bool {
	for n := range names {
		if strings.HasPrefix(n, typ+".") {
			return true
		}
	}
	return false
}
