package share

import "testing"

func TestShare(t *testing.T) {
	var s State
	if got := s.Share(); got != Unknown {
		t.Fatalf("unknown fleet: %v, want %v", got, Unknown)
	}
	s.SetServers(1)
	if got := s.Share(); got != 1 {
		t.Fatalf("lone server: %v, want 1", got)
	}
	s.SetServers(4)
	if got := s.Share(); got != 0.25 {
		t.Fatalf("four servers: %v, want 0.25", got)
	}
	s.SetServers(0) // ignored: the last count stays
	s.SetServers(100)
	if got := s.Share(); got != Floor {
		t.Fatalf("100 servers: %v, want the floor %v", got, Floor)
	}
	s.SetOverride(0.01)
	if got := s.Share(); got != 0.01 || !s.Fixed() {
		t.Fatalf("override: %v, want 0.01", got)
	}
	s.SetOverride(0)
	if got := s.Share(); got != Floor || s.Fixed() {
		t.Fatalf("override removed: %v", got)
	}
	if a, b := Of(nil), Of(nil); a == b {
		t.Fatal("Of(nil) shared a State")
	}
	k := new(int)
	if a, b := Of(k), Of(k); a != b {
		t.Fatal("Of(k) made two States")
	}
}

func TestScale(t *testing.T) {
	for _, c := range []struct {
		n     int64
		share float64
		want  int64
	}{
		{100, 0.29, 29}, {5, 0.2, 1}, {3, 0.2, 1}, {50, 1, 50}, {30, 0.5, 15}, {0, 0.5, 0},
		{1 << 62, 0.5, 1 << 61}, {7, 0.000001, 1},
	} {
		if got := Scale(c.n, c.share); got != c.want {
			t.Errorf("Scale(%d, %v) = %d, want %d", c.n, c.share, got, c.want)
		}
	}
}
