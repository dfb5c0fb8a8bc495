package spillway_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/usagestep"
)

func TestUsageAddSetTotal(t *testing.T) {
	var u spillway.Usage
	if n, ok := u.Total(); n != 0 || ok {
		t.Fatalf("fresh Usage: %d %v, want 0 false", n, ok)
	}
	var steps []int64
	usagestep.OnStep(&u, func(total int64) error { steps = append(steps, total); return nil })
	for _, n := range []int64{3, 0, 4} {
		if err := u.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	if n, ok := u.Total(); n != 7 || !ok {
		t.Fatalf("after 3+0+4: %d %v", n, ok)
	}
	if err := u.Add(-1); !errors.Is(err, spillway.ErrInvalidUsage) {
		t.Fatalf("Add(-1): %v", err)
	}
	if err := u.Set(-5); !errors.Is(err, spillway.ErrInvalidUsage) {
		t.Fatalf("Set(-5): %v", err)
	}
	if n, _ := u.Total(); n != 7 {
		t.Fatalf("a negative report changed the total to %d", n)
	}
	if err := u.Set(2); err != nil {
		t.Fatal(err)
	}
	if err := u.Add(math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if n, _ := u.Total(); n != math.MaxInt64 {
		t.Fatalf("saturation: %d", n)
	}
	want := []int64{3, 3, 7, 2, math.MaxInt64}
	if len(steps) != len(want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Fatalf("steps %v, want %v", steps, want)
		}
	}
}

func TestUsageStepErrorStopsTheWork(t *testing.T) {
	var u spillway.Usage
	spent := errors.New("limit spent")
	calls := 0
	usagestep.OnStep(&u, func(total int64) error {
		if total > 10 {
			return spent
		}
		return nil
	})
	usagestep.OnStep(&u, func(int64) error { calls++; return nil })
	if err := u.Add(10); err != nil {
		t.Fatal(err)
	}
	if err := u.Add(1); !errors.Is(err, spent) {
		t.Fatalf("Add past the limit: %v, want the step's error", err)
	}
	if calls != 1 {
		t.Fatalf("the step after a refusing one ran %d times, want 1", calls)
	}
	if n, _ := u.Total(); n != 11 {
		t.Fatalf("total %d: what was reported is counted even when refused", n)
	}
}

func TestUsageContext(t *testing.T) {
	ctx := context.Background()
	if spillway.UsageFrom(ctx) != nil {
		t.Fatal("UsageFrom of a bare context")
	}
	if err := spillway.ReportUsage(ctx, 5); err != nil {
		t.Fatalf("ReportUsage without a Usage: %v", err)
	}
	u := new(spillway.Usage)
	ctx = spillway.ContextWithUsage(ctx, u)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if err := spillway.ReportUsage(ctx, 1); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if n, ok := u.Total(); n != 800 || !ok {
		t.Fatalf("8×100 concurrent reports: %d %v", n, ok)
	}
	var nilUsage *spillway.Usage
	if n, ok := nilUsage.Total(); n != 0 || ok {
		t.Fatal("nil Usage reports a total")
	}
}
