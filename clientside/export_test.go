package clientside

// Counts returns the requests and accepts in the window that ends now (the
// Throttle's Clock), for the external tests.
func (t *Throttle) Counts() (requests, accepts int64) { return t.countsAt(t.now()) }

// Balance returns the tokens available now (the budget's Clock), for the
// external tests.
func (b *RetryBudget) Balance() float64 { return b.balanceAt(b.now()) }
