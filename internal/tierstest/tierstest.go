// Package tierstest builds tiers limiters for tests.
package tierstest

import (
	"testing"

	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"
)

// Limiter is a tiers limiter over store from the YAML config yml; a
// config or construction error fails the test.
func Limiter(t testing.TB, yml string, store ratelimit.Store) *tiers.Limiter {
	t.Helper()
	cfg, err := tiers.Parse("limits.yaml", []byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := tiers.New(cfg, store, tiers.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
