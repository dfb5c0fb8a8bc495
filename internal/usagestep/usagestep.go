// Package usagestep lets the blocks that charge the actual cost of a
// request follow its spillway.Usage step by step; a handler only reports
// (Usage.Add, Usage.Set) and never registers a step itself.
package usagestep

// OnStep registers f with u, a *spillway.Usage: f is called with the
// running total after every Add or Set (from the goroutine that reports),
// and an error from f is returned to the reporter. Package spillway sets
// it; it does not import spillway so that spillway can.
var OnStep func(u any, f func(total int64) error)
