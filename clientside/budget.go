package clientside

import (
	"fmt"
	"sync"
	"time"
)

// unit is one token in the budget's fixed-point arithmetic: exact for
// ratios with up to six decimals, no drifting floats.
const unit = 1_000_000

// RetryBudget keeps a client's retries under a fraction of its requests.
// Every request deposits Ratio tokens (default 0.1), every retry spends one
// token, and the budget also gains MinRetriesPerSecond tokens per second
// (default 1) so a quiet client can still retry. It holds at most MaxTokens
// (default 10) and starts full. Over any stretch of time, retries are thus
// at most MaxTokens + Ratio·requests + MinRetriesPerSecond·seconds.
//
// A RetryBudget is safe for concurrent use.
type RetryBudget struct {
	deposit int64 // units per request
	rate    int64 // units per second
	max     int64 // units
	now     func() time.Time

	mu      sync.Mutex
	balance int64
	last    time.Time
}

// NewRetryBudget returns a full RetryBudget configured by s
// (RetryBudgetSettings{} for the defaults); an invalid setting is an error
// naming it.
func NewRetryBudget(s RetryBudgetSettings) (*RetryBudget, error) {
	c := budgetConfig(s)
	if err := c.validate(); err != nil {
		return nil, err
	}
	if !(c.ratio >= 0 && c.ratio <= 1) {
		return nil, fmt.Errorf("clientside: retry ratio %v must be in [0, 1]", c.ratio)
	}
	if !(c.minPerSec >= 0) || bad(c.minPerSec) || c.minPerSec > 1e6 {
		return nil, fmt.Errorf("clientside: min retries per second %v must be in [0, 1e6]", c.minPerSec)
	}
	if !(c.maxTokens >= 1) || bad(c.maxTokens) || c.maxTokens > 1e9 {
		return nil, fmt.Errorf("clientside: max tokens %v must be in [1, 1e9]", c.maxTokens)
	}
	b := &RetryBudget{
		deposit: int64(c.ratio*unit + 0.5),
		rate:    int64(c.minPerSec*unit + 0.5),
		max:     int64(c.maxTokens*unit + 0.5),
		now:     c.now,
	}
	b.balance = b.max
	b.last = c.now()
	return b, nil
}

// Deposit records one request (a first attempt, not a retry) at the time
// of the budget's Clock.
func (b *RetryBudget) Deposit() { b.depositAt(b.now()) }

func (b *RetryBudget) depositAt(now time.Time) {
	b.mu.Lock()
	b.refill(now)
	b.balance = min(b.balance+b.deposit, b.max)
	b.mu.Unlock()
}

// TryRetry spends one token, at the time of the budget's Clock, if the
// budget has one and reports whether the retry may go ahead. A refused
// retry spends nothing.
func (b *RetryBudget) TryRetry() bool { return b.tryRetryAt(b.now()) }

func (b *RetryBudget) tryRetryAt(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	if b.balance < unit {
		return false
	}
	b.balance -= unit
	return true
}

// balanceAt returns the tokens available at now.
func (b *RetryBudget) balanceAt(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	return float64(b.balance) / unit
}

// refill adds the time-based minimum since last. Time going backwards adds
// nothing and moves last back, so it is never credited twice.
func (b *RetryBudget) refill(now time.Time) {
	if b.rate == 0 {
		b.last = now
		return
	}
	elapsed := now.Sub(b.last)
	if elapsed <= 0 {
		if elapsed < 0 {
			b.last = now
		}
		return
	}
	if b.balance >= b.max {
		b.last = now
		return
	}
	need := b.max - b.balance
	gained := int64(float64(elapsed) * float64(b.rate) / float64(time.Second))
	if gained >= need {
		b.balance = b.max
		b.last = now
		return
	}
	// Credit whole units and advance last by exactly the time they took,
	// so the fraction of a unit carries over to the next call.
	b.balance += gained
	b.last = b.last.Add(time.Duration(float64(gained) * float64(time.Second) / float64(b.rate)))
}
