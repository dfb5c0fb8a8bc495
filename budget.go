package spillway

import (
	"errors"
	"time"
)

// DefaultBudget is how long one request's admission through a Chain may
// wait on shared stores (Redis), in total, across every block of the chain.
const DefaultBudget = 50 * time.Millisecond

// ErrBudgetSpent is the cause of a decision a block made locally, without
// calling its shared store, because the request's budget was already spent
// by the blocks before it. It says nothing about the store's health.
var ErrBudgetSpent = errors.New("spillway: admission budget spent")
