package retryafter

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	now := time.Date(2015, 10, 21, 7, 27, 0, 0, time.UTC)
	cases := []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{"Wed, 21 Oct 2015 07:28:00 GMT", time.Minute, true},
		{"Wednesday, 21-Oct-15 07:28:30 GMT", 90 * time.Second, true},
		{"Wed Oct 21 07:29:00 2015", 2 * time.Minute, true},
		{"Wed, 21 Oct 2015 07:00:00 GMT", 0, true}, // in the past
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"99999999999999999999", 0, false},
	}
	for _, c := range cases {
		got, ok := Parse(c.v, now)
		if got != c.want || ok != c.ok {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "120", "Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15 07:28:00 GMT", "Wed Oct 21 07:28:00 2015", "-1", "1e3", ""} {
		f.Add(s)
	}
	now := time.Date(2015, 10, 21, 7, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := Parse(s, now)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("Parse(%q) = %v, %v", s, d, ok)
		}
	})
}
