package lua

import (
	"io/fs"
	"os"
	"strings"
	"testing"
)

// TestScriptNames: Script knows every script by its file's name (the
// helper files ratelimit_holds.lua and ratelimit_subwindows.lua are parts
// of others, not scripts).
func TestScriptNames(t *testing.T) {
	files, err := fs.Glob(os.DirFS("."), "*.lua")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		name := strings.TrimSuffix(f, ".lua")
		if name == "ratelimit_holds" || name == "ratelimit_subwindows" {
			if _, ok := scripts[name]; ok {
				t.Errorf("Script(%q): a helper is not a script", name)
			}
			continue
		}
		n++
		if Script(name) == nil {
			t.Errorf("Script(%q) = nil", name)
		}
	}
	if n != len(scripts) || n != 11 {
		t.Errorf("%d script files, %d scripts; want 11", n, len(scripts))
	}
}
