package spillway_test

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/budget"
)

func TestWithBudgetNeverExtends(t *testing.T) {
	ctx := context.Background()
	if _, ok := budget.End(ctx); ok {
		t.Fatal("background context carries a budget")
	}
	if got := budget.With(ctx, 0); got != ctx {
		t.Fatal("WithBudget(0) changed the context")
	}
	short := budget.With(ctx, 10*time.Millisecond)
	end, ok := budget.End(short)
	if !ok || time.Until(end) > 10*time.Millisecond {
		t.Fatalf("budget ends in %v, ok %v; want within 10ms", time.Until(end), ok)
	}
	if got := budget.With(short, time.Hour); got != short {
		t.Fatal("a longer budget replaced a shorter one")
	}
	shorter := budget.With(short, time.Millisecond)
	if e2, _ := budget.End(shorter); !e2.Before(end) {
		t.Fatalf("a shorter budget was not taken: %v, then %v", end, e2)
	}
	// Values of the parent stay visible.
	type key struct{}
	v := budget.With(context.WithValue(ctx, key{}, "x"), time.Second)
	if v.Value(key{}) != "x" {
		t.Fatal("the budget context hides its parent's values")
	}
}

func TestBudgetDeadline(t *testing.T) {
	ctx := context.Background()
	if dl, ok := budget.Deadline(ctx, 0); !dl.IsZero() || !ok {
		t.Fatalf("no budget, no own bound: %v %v; want zero, ok", dl, ok)
	}
	before := time.Now()
	if dl, ok := budget.Deadline(ctx, time.Second); !ok || dl.Before(before.Add(time.Second)) || dl.After(time.Now().Add(time.Second)) {
		t.Fatalf("own bound only: %v %v", dl, ok)
	}
	b := budget.With(ctx, time.Hour)
	end, _ := budget.End(b)
	if dl, ok := budget.Deadline(b, 0); !ok || !dl.Equal(end) {
		t.Fatalf("budget only: %v %v; want the budget's end %v", dl, ok, end)
	}
	if dl, ok := budget.Deadline(b, time.Millisecond); !ok || !dl.Before(end) {
		t.Fatalf("own bound sooner than the budget: %v %v", dl, ok)
	}
	spent := budget.With(ctx, time.Nanosecond)
	time.Sleep(time.Millisecond)
	if _, ok := budget.Deadline(spent, time.Second); ok {
		t.Fatal("a spent budget reported ok")
	}
}

// budgetProbe records the budget each limiter of a chain saw.
type budgetProbe struct {
	ends []time.Time
}

func (p *budgetProbe) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	end, ok := budget.End(ctx)
	if !ok {
		end = time.Time{}
	}
	p.ends = append(p.ends, end)
	return spillway.Decision{Allowed: true}, spillway.Noop, nil
}

func TestChainPassesOneBudget(t *testing.T) {
	p := &budgetProbe{}
	r := &spillway.Request{Priority: spillway.Critical}
	start := time.Now()
	if _, _, err := spillway.Chain(p, p, p).Admit(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	if len(p.ends) != 3 || p.ends[0].IsZero() || !p.ends[1].Equal(p.ends[0]) || !p.ends[2].Equal(p.ends[0]) {
		t.Fatalf("budgets seen %v; want one budget shared by the three", p.ends)
	}
	if p.ends[0].Before(start.Add(spillway.DefaultBudget)) || p.ends[0].After(end.Add(spillway.DefaultBudget)) {
		t.Fatalf("budget ends %v after the call began; want DefaultBudget (%v) from when Admit ran", p.ends[0].Sub(start), spillway.DefaultBudget)
	}
	// A caller's shorter budget wins; ChainBudget(0) starts none.
	p.ends = nil
	ctx := budget.With(context.Background(), time.Millisecond)
	caller, _ := budget.End(ctx)
	spillway.Chain(p, p).Admit(ctx, r)
	spillway.ChainBudget(0, p, p).Admit(context.Background(), r)
	if !p.ends[0].Equal(caller) || !p.ends[1].Equal(caller) || !p.ends[2].IsZero() || !p.ends[3].IsZero() {
		t.Fatalf("budgets seen %v; want the caller's twice, then none", p.ends)
	}
}

func TestPauseBudgetExcludesTheWait(t *testing.T) {
	ctx := budget.With(context.Background(), 20*time.Millisecond)
	before, _ := budget.End(ctx)
	t0 := time.Now()
	resume := budget.Pause(ctx)
	inner := budget.Pause(ctx) // nested: the span counts once
	time.Sleep(40 * time.Millisecond)
	inner()
	resume()
	wall := time.Since(t0)
	after, _ := budget.End(ctx)
	if shift := after.Sub(before); shift < 40*time.Millisecond || shift > wall {
		t.Fatalf("budget moved by %v over a paused span of at least 40ms and at most %v", shift, wall)
	}
	resume() // a second resume changes nothing
	if again, _ := budget.End(ctx); !again.Equal(after) {
		t.Fatalf("a second resume moved the budget from %v to %v", after, again)
	}
	// No budget: nothing to pause, and resume is safe.
	budget.Pause(context.Background())()
}

func TestPauseBudgetPausesEnclosingBudgets(t *testing.T) {
	outer := budget.With(context.Background(), time.Hour)
	inner := budget.With(outer, 10*time.Millisecond)
	o0, _ := budget.End(outer)
	i0, _ := budget.End(inner)
	resume := budget.Pause(inner)
	time.Sleep(30 * time.Millisecond)
	resume()
	o1, _ := budget.End(outer)
	i1, _ := budget.End(inner)
	if o1.Sub(o0) < 30*time.Millisecond || i1.Sub(i0) != o1.Sub(o0) {
		t.Fatalf("inner moved %v, outer %v; want both the same, at least 30ms", i1.Sub(i0), o1.Sub(o0))
	}
}

// A request's budget (budget.Request) is one for the whole request: the
// first chain starts it with its length, a later chain under it spends
// what is left (not a fresh budget), and the time between admissions (the
// handler's work) is not spent.
func TestRequestBudgetIsOnePerRequest(t *testing.T) {
	ctx := budget.Request(context.Background())
	if _, ok := budget.End(ctx); ok || budget.Total(ctx) != 0 {
		t.Fatal("a request budget no chain started has a length")
	}
	if budget.Request(ctx) != ctx {
		t.Fatal("budget.Request on a request budget made another")
	}
	var left time.Duration
	spend := block.LimiterFunc(func(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
		end, ok := budget.End(ctx)
		if !ok {
			t.Fatal("no budget inside the chain")
		}
		left = time.Until(end)
		time.Sleep(20 * time.Millisecond) // a slow store
		return spillway.Decision{Allowed: true}, spillway.Noop, nil
	})
	r := &spillway.Request{Priority: spillway.Critical}
	if _, _, err := spillway.ChainBudget(100*time.Millisecond, spend, spend).Admit(ctx, r); err != nil {
		t.Fatal(err)
	}
	if budget.Total(ctx) != 100*time.Millisecond {
		t.Fatalf("total %v, want the first chain's 100ms", budget.Total(ctx))
	}
	if left > 80*time.Millisecond || left < 40*time.Millisecond {
		t.Fatalf("second block of the first chain had %v left, want about 80ms", left)
	}
	time.Sleep(50 * time.Millisecond) // the handler's work: not spent
	if _, _, err := spillway.Chain(spend).Admit(ctx, r); err != nil {
		t.Fatal(err)
	}
	if left > 60*time.Millisecond || left < 20*time.Millisecond {
		t.Fatalf("a nested chain after the handler's work had %v left, want about 60ms (not a fresh 50ms, nor less the handler's 50ms)", left)
	}
	// Spent: a chain under it finds nothing left.
	if _, _, err := spillway.ChainBudget(100*time.Millisecond, spend, spend, spend).Admit(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, ok := budget.Deadline(ctx, 0); ok {
		t.Fatal("the budget is spent but budget.Deadline allows a call")
	}
}
