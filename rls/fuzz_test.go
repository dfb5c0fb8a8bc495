package rls

import (
	"errors"
	"testing"
)

// FuzzLoad: no config file makes the loader panic; every refusal is a
// *ConfigError naming the file.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		"domain: d\ndescriptors:\n  - key: k\n    value: v*\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limits: [{unit: 30s, requests_per_unit: 5, algorithm: gcra, burst: 9}]\n    descriptors: [{key: s, rate_limit: {unlimited: true}}]\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 0, name: a, replaces: [{name: b}]}\n",
		"domain: [1]", "{}", "- 1", "domain: d\ndescriptors: {a: b}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Load([]File{{Name: "f.yaml", Content: []byte(s)}}, LoadOptions{})
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.File != "f.yaml" {
				t.Fatalf("error %v is not a *ConfigError naming the file", err)
			}
			return
		}
		for _, r := range c.allRules() {
			for _, l := range r.Limits {
				if !l.denyAll && l.Policy.Validate() != nil {
					t.Fatalf("loaded an invalid policy %v", l.Policy)
				}
			}
		}
	})
}
