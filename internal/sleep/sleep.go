// Package sleep waits for a duration or a context, whichever ends first,
// for the client adapters' retries.
package sleep

import (
	"context"
	"time"
)

// Sleep waits d, or returns ctx's error when it ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
