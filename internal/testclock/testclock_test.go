package testclock

import (
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	c := New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	c.Advance(1500 * time.Millisecond)
	if got, want := c.Now(), start.Add(1500*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after Advance(1.5s): Now = %v, want %v", got, want)
	}
	c.Advance(-2 * time.Second)
	if got, want := c.Now(), start.Add(-500*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after Advance(-2s): Now = %v, want %v", got, want)
	}
	c.Set(start.Add(time.Hour))
	if got, want := c.Now(), start.Add(time.Hour); !got.Equal(want) {
		t.Fatalf("after Set: Now = %v, want %v", got, want)
	}
}

func TestClockStep(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	c := New(start)
	c.SetStep(150 * time.Microsecond)
	for i := 1; i <= 3; i++ {
		if got, want := c.Now(), start.Add(time.Duration(i)*150*time.Microsecond); !got.Equal(want) {
			t.Fatalf("reading %d: Now = %v, want %v", i, got, want)
		}
	}
	c.Advance(time.Second)
	c.SetStep(0)
	want := start.Add(time.Second + 450*time.Microsecond)
	for range 2 {
		if got := c.Now(); !got.Equal(want) {
			t.Fatalf("after SetStep(0): Now = %v, want %v", got, want)
		}
	}
}
