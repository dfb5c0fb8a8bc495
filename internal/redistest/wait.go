package redistest

import (
	"testing"
	"time"
)

// WaitFor polls cond every poll until it holds, and fails the test when
// it does not within 10 s; what names the condition.
func WaitFor(t testing.TB, what string, poll time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(poll)
	}
}
