package rls

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigRefusedAsReference: every config the reference's own config
// tests refuse is refused here, with the reference's message, the file
// and the line.
func TestConfigRefusedAsReference(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		merge bool
		err   string
	}{
		{"empty domain", []string{"descriptors:\n"}, false, "f0.yaml:1: config file cannot have empty domain"},
		{"duplicate domain", []string{"domain: d\ndescriptors:\n  - key: k\n", "domain: d\ndescriptors:\n"}, false,
			"f1.yaml:1: duplicate domain 'd' in config file"},
		{"empty key", []string{"domain: d\ndescriptors:\n  - value: v\n"}, false, "f0.yaml:3: descriptor has empty key"},
		{"duplicate key", []string{"domain: d\ndescriptors:\n  - key: k\n    value: v\n\n  - key: k\n    value: v\n"}, false,
			"f0.yaml:6: duplicate descriptor composite key 'd.k_v'"},
		{"duplicate key across merged files", []string{
			"domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
			"domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"}, true,
			"f1.yaml:3: duplicate descriptor composite key 'd.k_v'"},
		{"bad limit unit", []string{"domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n"}, false,
			"f0.yaml:6: invalid rate limit unit 'foo'"},
		{"replaces self", []string{"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: s\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n"}, false,
			"f0.yaml:9: replaces should not contain name of same descriptor"},
		{"replaces empty", []string{"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: s\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n"}, false,
			"f0.yaml:9: should not have an empty replaces entry"},
		{"bad yaml", []string{"'''\n"}, false, "f0.yaml:2: error loading config file: found unexpected end of stream"},
		{"misspelled key", []string{"domain: d\ndescriptors:\n  - key: k\n    value: v\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n"}, false,
			"f0.yaml:5: config error, unknown key 'ratelimit'"},
		{"misspelled key 2", []string{"domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n"}, false,
			"f0.yaml:7: config error, unknown key 'requestsperunit'"},
		{"non-string key", []string{"0.25: d\ndescriptors:\n  - key: k\n"}, false, "f0.yaml:1: config error, key is not of type string: 0.25"},
		{"non-map list", []string{"domain: d\ndescriptors:\n  - a\n  - b\n"}, false,
			"f0.yaml:3: config error, yaml file contains list of type other than map: a"},
		{"unlimited with unit", []string{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n"}, false,
			"f0.yaml:5: should not specify rate limit unit when unlimited"},
		// what the reference's loader refuses beyond its tests
		{"unknown key inside an ignored one", []string{"domain: d\ndescriptors:\n  - key: k\n    name: {foo: 1}\n"}, false,
			"f0.yaml:4: config error, unknown key 'foo'"},
		{"a float", []string{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n"}, false,
			"f0.yaml:4: requests_per_unit: \"1.5\" is not a string, an integer or a boolean"},
		{"a quoted count", []string{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}\n"}, false,
			"f0.yaml:4: requests_per_unit: expected an integer"},
		{"a list of scalars where maps belong, in an ignored key", []string{"domain: d\ndescriptors:\n  - key: k\n    replaces: [x]\n"}, false,
			"f0.yaml:4: config error, yaml file contains list of type other than map: x"},
		{"an alias cycle", []string{"domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n"}, false,
			"f0.yaml:4: error loading config file: anchor 'a' value contains itself"},
		{"a key the reference does not know, holding anchors", []string{"domain: d\nx-templates: &t {key: k}\ndescriptors: [*t]\n"}, false,
			"f0.yaml:2: config error, unknown key 'x-templates'"},
		{"an alias bomb", []string{"domain: d\nname: &a0 [{name: x}]\n" + func() string {
			b := ""
			for i := 1; i <= 12; i++ {
				p := "*a" + string(rune('a'+i-1))
				if i == 1 {
					p = "*a0"
				}
				b += "replaces: &a" + string(rune('a'+i)) + " [{replaces: " + p + "}, {replaces: " + p + "}, {replaces: " + p + "}, {replaces: " + p + "}]\n"
			}
			return b
		}()}, false, "aliases expand to more than"},
		{"a merge of a scalar", []string{"domain: d\ndescriptors:\n  - <<: x\n    key: k\n"}, false,
			"map merge requires map or sequence of maps"},
		// spillway's extension keys at a level they do not belong to
		{"period on a descriptor", []string{"domain: d\ndescriptors:\n  - key: k\n    period: 1s\n"}, false,
			"f0.yaml:4: config error, key 'period' belongs in a rate_limit"},
		{"rate_limits in a rate_limit", []string{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, rate_limits: []}\n"}, false,
			"f0.yaml:4: config error, key 'rate_limits' belongs in a descriptor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := make([]File, len(tc.files))
			for i, f := range tc.files {
				fs[i] = File{Name: "f" + string(rune('0'+i)) + ".yaml", Content: []byte(f)}
			}
			_, err := Load(fs, LoadOptions{MergeDomains: tc.merge})
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.err)
		})
	}
}

// refYAML is a config in the reference's format that uses what its YAML
// library resolves (anchors, aliases, merge keys) and keys it accepts and
// ignores at levels where its config structs have no field for them.
const refYAML = `
domain: anchors
# a known key where the reference ignores it
name: ignored-at-the-root
descriptors:
  - key: base
    name: "a descriptor's name: accepted and ignored"
    unit: hour
    rate_limit: &perMinute5
      unit: minute
      requests_per_unit: 5
  - key: alias
    rate_limit: *perMinute5
  - &userTree
    key: user
    domain: also-ignored
    descriptors:
      - key: plan
        value: free
        rate_limit: {<<: *perMinute5, requests_per_unit: 2}
  - <<: *userTree
    key: member
  - key: merged
    rate_limit:
      <<: [{unit: day, requests_per_unit: 7, name: first}, {unit: hour, name: second, requests_per_unit: 1}]
  - key: replacing
    rate_limit:
      unit: second
      requests_per_unit: 3
      replaces: [{name: first, unit: ignored}]
      descriptors: []
  - key: dup
    rate_limit: {unit: hour, requests_per_unit: 1}
    rate_limit: {unit: hour, requests_per_unit: 9}
  - key: meta
    metadata: {any: [1, 2.5, {nested: true}]}
    rate_limit: {unit: hour, requests_per_unit: 4, unlimited: no}
`

// TestConfigAsReferenceReadsIt: refYAML loads (it did not: the loader
// walked nodes without resolving aliases) and every descriptor gets the
// limit the reference gives it.
func TestConfigAsReferenceReadsIt(t *testing.T) {
	c, err := load(t, refYAML)
	require.NoError(t, err)
	for _, tc := range []struct {
		entries []string
		limit   uint32
		unit    string
		name    string
	}{
		{[]string{"base", "x"}, 5, "MINUTE", ""},
		{[]string{"alias", "x"}, 5, "MINUTE", ""},
		{[]string{"user", "u", "plan", "free"}, 2, "MINUTE", ""},
		{[]string{"member", "u", "plan", "free"}, 2, "MINUTE", ""}, // the merged tree, under its own key
		{[]string{"merged", "x"}, 7, "DAY", "first"},               // the first merged mapping wins
		{[]string{"replacing", "x"}, 3, "SECOND", ""},
		{[]string{"dup", "x"}, 9, "HOUR", ""}, // a key twice: the last, as the reference reads it
		{[]string{"meta", "x"}, 4, "HOUR", ""},
	} {
		r, err := c.lookup("anchors", entries(tc.entries...))
		require.NoError(t, err)
		require.NotNil(t, r, "%v", tc.entries)
		require.Len(t, r.Limits, 1)
		require.Equal(t, tc.limit, r.Limits[0].RequestsPerUnit, "%v", tc.entries)
		require.Equal(t, tc.unit, r.Limits[0].Unit.String(), "%v", tc.entries)
		require.Equal(t, tc.name, r.Name, "%v", tc.entries)
	}
	r, _ := c.lookup("anchors", entries("replacing", "x"))
	require.Equal(t, []string{"first"}, r.Replaces)
	// the parent of the merged tree has no limit of its own
	r, _ = c.lookup("anchors", entries("member", "u"))
	require.Nil(t, r)
}
