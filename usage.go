package spillway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/spillway-go/spillway/internal/usagestep"
)

// Usage carries the actual cost of an admitted request, known only while
// or after the work runs (tokens a model generated, bytes streamed, rows
// scanned), from the handler to the blocks that charge it.
//
// The caller (an adapter such as httpx or grpcx) puts a Usage in
// Request.Usage before Admit, and in the handler's context
// (ContextWithUsage). Request.Cost is then the estimate: a block whose
// limit is charged on the actual cost (a tiers rule with "cost: response")
// holds the estimate at admission and, when done runs, settles it to
// Total — a refund when the work cost less, an extra charge (possibly
// into debt) when it cost more. When nothing was reported, the estimate
// stands.
//
// The handler reports with Add (each step of a streaming response) or Set
// (the total, once known). A block may follow the steps to settle
// as the work goes; when it refuses to go on (the limit is spent), Add
// returns its error, and the handler should stop the work.
//
// A Usage is safe for concurrent use. The zero value is ready to use.
type Usage struct {
	mu       sync.Mutex
	total    int64
	reported bool
	steps    []func(total int64) error
}

// ErrInvalidUsage is wrapped by the errors of Add and Set for a negative
// cost.
var ErrInvalidUsage = errors.New("spillway: invalid usage")

// Add adds n (≥ 0) to the actual cost, saturating at math.MaxInt64, then
// calls the step functions blocks registered with the new total, in order. It returns the
// first error one of them returns (the work should stop: its limit is
// spent), or an error wrapping ErrInvalidUsage for a negative n (nothing
// is added).
func (u *Usage) Add(n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: cost %d is negative", ErrInvalidUsage, n)
	}
	u.mu.Lock()
	if n > math.MaxInt64-u.total {
		u.total = math.MaxInt64
	} else {
		u.total += n
	}
	u.reported = true
	total, steps := u.total, u.steps
	u.mu.Unlock()
	return runSteps(steps, total)
}

// Set sets the actual cost to n (≥ 0), replacing what was added, and calls
// the step functions with it, as Add does.
func (u *Usage) Set(n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: cost %d is negative", ErrInvalidUsage, n)
	}
	u.mu.Lock()
	u.total, u.reported = n, true
	steps := u.steps
	u.mu.Unlock()
	return runSteps(steps, n)
}

func runSteps(steps []func(int64) error, total int64) error {
	for _, f := range steps {
		if err := f(total); err != nil {
			return err
		}
	}
	return nil
}

// Total returns the actual cost reported so far, and whether anything was
// reported (false: the estimate stands).
func (u *Usage) Total() (int64, bool) {
	if u == nil {
		return 0, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total, u.reported
}

func init() {
	usagestep.OnStep = func(u any, f func(total int64) error) { u.(*Usage).onStep(f) }
}

// onStep registers f, called with the running total after every Add or
// Set (from the goroutine that reports). Blocks call it during Admit
// (internal/usagestep) to settle in steps; an error from f is returned to
// the reporter.
func (u *Usage) onStep(f func(total int64) error) {
	u.mu.Lock()
	// Copy on write: a reporter running the old slice is not disturbed.
	u.steps = append(u.steps[:len(u.steps):len(u.steps)], f)
	u.mu.Unlock()
}

type usageKey struct{}

// ContextWithUsage returns ctx carrying u, for the handler to report the
// actual cost (UsageFrom).
func ContextWithUsage(ctx context.Context, u *Usage) context.Context {
	return context.WithValue(ctx, usageKey{}, u)
}

// UsageFrom returns the Usage of the request being served, or nil when its
// cost is not metered.
func UsageFrom(ctx context.Context) *Usage {
	u, _ := ctx.Value(usageKey{}).(*Usage)
	return u
}

// ReportUsage adds n to the actual cost of the request being served (see
// Usage.Add); it does nothing and returns nil when its cost is not
// metered.
func ReportUsage(ctx context.Context, n int64) error {
	if u := UsageFrom(ctx); u != nil {
		return u.Add(n)
	}
	return nil
}
