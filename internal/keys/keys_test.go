package keys

import (
	"strings"
	"testing"
)

func TestKey(t *testing.T) {
	cases := []struct{ scope, entity, want string }{
		{"login", "ip=10.0.0.1", "sp:login:{ip=10.0.0.1}"},
		{"login", "user={evil}", "sp:login:{user=%7Bevil%7D}"},
		{"a{b}", "x", "sp:a%7Bb%7D:{x}"},
		{"s", "#abc", "sp:s:{%23abc}"},
		{"s", "50%", "sp:s:{50%25}"},
	}
	for _, c := range cases {
		if got := Key("sp:", c.scope, c.entity); got != c.want {
			t.Errorf("Key(%q, %q) = %q, want %q", c.scope, c.entity, got, c.want)
		}
	}
}

func TestLongValuesAreHashed(t *testing.T) {
	long := strings.Repeat("a", MaxPart+1)
	got := Escape(long)
	if len(got) != 23 || got[0] != '#' {
		t.Fatalf("Escape(long) = %q, want '#' + 22 chars", got)
	}
	if Escape(long+"b") == got {
		t.Fatal("different long values hashed alike")
	}
	if Escape(strings.Repeat("a", MaxPart)) != strings.Repeat("a", MaxPart) {
		t.Fatal("value of exactly MaxPart bytes was changed")
	}
	// A value that escapes past the bound is hashed too.
	if e := Escape(strings.Repeat("{", 30)); e[0] != '#' || len(e) != 23 {
		t.Fatalf("escaped-long value = %q, want a hash", e)
	}
}

func TestTagIsTheEntity(t *testing.T) {
	k := Key("p:", "rule{x}", "user=}{")
	if tag := Tag(k); tag != "user=%7D%7B" {
		t.Fatalf("Tag(%q) = %q", k, tag)
	}
	if err := ValidatePrefix("bad{"); err == nil {
		t.Fatal("prefix with a brace accepted")
	}
}

func FuzzKeyStructure(f *testing.F) {
	f.Add("scope", "entity")
	f.Add("{", "}")
	f.Fuzz(func(t *testing.T, scope, entity string) {
		k := Key("p:", scope, entity)
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Fatalf("key %q has user-controlled braces", k)
		}
		// an empty entity leaves "{}", which Redis Cluster does not
		// take as a tag: the whole key is hashed (Tag says so, and slot
		// agrees with CLUSTER KEYSLOT)
		if want := Escape(entity); (want != "" && Tag(k) != want) || (want == "" && Tag(k) != k) {
			t.Fatalf("tag of %q is %q, want the entity (the whole key when it is empty)", k, Tag(k))
		}
		if len(k) > len("p:")+2*(MaxPart)+3 {
			t.Fatalf("key %q is longer than the bound", k)
		}
	})
}

// Digest is short, key-safe, stable and tells policies apart.
func TestDigest(t *testing.T) {
	a, b := Digest("token_bucket 100/1s burst 50"), Digest("token_bucket 100/1s burst 51")
	if len(a) != DigestLen || Escape(a) != a || a == b || a != Digest("token_bucket 100/1s burst 50") {
		t.Fatalf("Digest: %q, %q", a, b)
	}
	if a != "QmCX23" { // base64url of the first 6 bytes of the SHA-256
		t.Fatalf("Digest = %q, want QmCX23", a)
	}
	if got := Key("spillway:", a, "user:12345"); len(got) != 28 {
		t.Fatalf("default key %q is %d bytes, want 28", got, len(got))
	}
}

// KeyWith's separator makes a layout of its own: the same scope and entity
// give another key with the same hash tag, and no scope (escaped) can make
// a key of one layout equal one of the other.
func TestKeyWithSeparator(t *testing.T) {
	a, b := Key("sp:", "s", "e"), KeyWith("sp:", "s", ';', "e")
	if a != "sp:s:{e}" || b != "sp:s;{e}" || Tag(a) != Tag(b) {
		t.Fatalf("Key %q, KeyWith %q (tags %q, %q)", a, b, Tag(a), Tag(b))
	}
	if k := KeyWith("sp:", "s;{e}", ':', "x"); k == KeyWith("sp:", "s", ';', "e}:{x") || strings.Count(k, "{") != 1 {
		t.Fatalf("a scope with a separator and braces made %q", k)
	}
}

// TestKeySuffixMatchesKey: KeySuffix is Key + the suffix, whatever the
// scope and entity need (escapes, hashing of long parts).
func TestKeySuffixMatchesKey(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, sc := range []string{"api", "", "a{b}", "#h", "50%", long} {
		for _, k := range []string{"alice", "", "{x}", "#1", long} {
			if got, want := KeySuffix("p:", sc, k, ":fw"), Key("p:", sc, k)+":fw"; got != want {
				t.Fatalf("KeySuffix(%q, %q) = %q, want %q", sc, k, got, want)
			}
		}
	}
}
