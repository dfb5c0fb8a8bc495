package ratelimit

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestScriptAlgorithmNames checks that the scripts that take an item's
// algorithm in ARGV (ratelimit_batch.lua, ratelimit_refund.lua) branch on
// exactly the names Go sends (Algorithm.String): each algorithm has a
// branch, and no branch names something Go never sends. The scripts get
// names, never Algorithm's ordinal.
func TestScriptAlgorithmNames(t *testing.T) {
	var want []string
	for a := range numAlgorithms {
		want = append(want, a.String())
	}
	slices.Sort(want)
	branch := regexp.MustCompile(`\balg == '([a-z_]+)'`)
	for _, file := range []string{"ratelimit_batch.lua", "ratelimit_refund.lua"} {
		src, err := os.ReadFile("../lua/" + file)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range branch.FindAllStringSubmatch(string(src), -1) {
			got = append(got, m[1])
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s branches on %v, want each of %v once", file, got, want)
		}
		if regexp.MustCompile(`\balg == [0-9]`).Match(src) {
			t.Errorf("%s compares alg to a number", file)
		}
	}
}

// TestScriptConstants checks that the settle replies ratelimit_holds.lua
// names (its consts APPLIED, ALREADY_SETTLED, EXPIRED) have the values
// settleResultOf maps, and map to the SettleResult of the same name.
func TestScriptConstants(t *testing.T) {
	src, err := os.ReadFile("../lua/ratelimit_holds.lua")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^--   consts: APPLIED=(\d+) ALREADY_SETTLED=(\d+) EXPIRED=(\d+)$`).FindStringSubmatch(string(src))
	if m == nil {
		t.Fatal("ratelimit_holds.lua: no line `--   consts: APPLIED=… ALREADY_SETTLED=… EXPIRED=…`")
	}
	for i, want := range []SettleResult{SettleApplied, SettleAlreadySettled, SettleExpired} {
		x, _ := strconv.ParseInt(m[i+1], 10, 64)
		got, err := settleResultOf(i, x)
		if err != nil || got != want {
			t.Errorf("Lua's %s = %d maps to %v (%v), want %v", strings.ToUpper(want.String()), x, got, err, want)
		}
	}
}
