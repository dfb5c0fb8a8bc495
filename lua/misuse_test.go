package lua_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway/internal/docsnippet"
	"github.com/spillway-go/spillway/lua"
)

// The scripts are reached only through Script: there is no package
// variable to run or to overwrite, so reaching for one is a compile error.
func TestMisuseDoesNotCompile(t *testing.T) {
	const imp = "import \"github.com/spillway-go/spillway/lua\"\n"
	for _, tc := range []struct{ code, want string }{
		{"_ = lua.RateLimitHold", "undefined: lua.RateLimitHold"},
		{"lua.Script = nil", "cannot assign"},
	} {
		errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "misuse", Code: imp + tc.code + "\n"})
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), tc.want) {
			t.Errorf("%s: errors %q, want one containing %q", tc.code, errs, tc.want)
		}
	}
	use := imp + "_ = lua.Script(\"ratelimit_hold\").Hash()\n"
	if errs := docsnippet.CompileErrors(t, ".", docsnippet.Snippet{Name: "use", Code: use}); len(errs) != 0 {
		t.Errorf("right use: %q", errs)
	}
}

// A name no script has (a typo, or the file's name with its extension)
// panics at the call, naming the name and the scripts there are, rather
// than handing back nil to fail later inside go-redis.
func TestUnknownScriptPanicsNamingIt(t *testing.T) {
	for _, name := range []string{"ratelimit_hold.lua", "ratelimit_holds", "ratelimt_hold", ""} {
		msg := func() (msg string) {
			defer func() {
				if r := recover(); r != nil {
					msg, _ = r.(string)
				}
			}()
			lua.Script(name)
			return ""
		}()
		want := `lua: no script "` + name + `" (the scripts: ceiling_charge, ceiling_refund, concurrency_acquire, ratelimit_batch, ratelimit_buckets, ratelimit_fixed, ratelimit_hold, ratelimit_refund, ratelimit_settle, ratelimit_token_bucket, shedder_fleet)`
		if msg != want {
			t.Errorf("Script(%q): panic %q, want %q", name, msg, want)
		}
	}
}
